"""Worker threads against worker processes: the same contract, real threads, real processes.

Every test of a behaviour both carriers share runs for ``"process"`` (forked workers) and
``"thread"``; the rest test what only threads do (the dataset object shared, bounded close of
a stuck thread, the Windows policy, the per-thread RNG rules).
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from loaderkit import check_determinism, create_dataloader, worker_rng
from loaderkit.errors import ConfigError, PerformanceHint
from loaderkit.workers import threadworkers as worker_threads
from tests.conftest import WINDOWS, fake_platform
from tests.helpers import (
    CountingIterable,
    SlowDataset,
    SquareDataset,
    child_pids,
    needs_in_order,
    write_h5_sessions,
)

METHODS = ["process", "thread"]


def _batches(loader: Any) -> list[Any]:
    return [[t.tolist() if isinstance(t, torch.Tensor) else t for t in b] for b in loader]


class InfoDataset(Dataset):
    """Sample i: (i, worker id, num_workers, seed, dataset is this object, pid, thread name)."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> tuple[Any, ...]:
        info = get_worker_info()
        assert info is not None
        return (
            i,
            info.id,
            info.num_workers,
            info.seed,
            info.dataset is self,
            os.getpid(),
            threading.current_thread().name,
        )


class AugmentDataset(Dataset):
    """Sample i: i plus draws from worker_rng and the thread-safe torch generator."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor(
            [float(i), float(worker_rng().random()), _torch_draw()], dtype=torch.float64
        )


def _torch_draw() -> float:
    """A torch draw from the thread's own generator; a worker_rng() draw where torch has none.

    Before ``torch.thread_safe_generator`` a torch draw in a worker thread comes from the
    default generator every thread shares (docs/threads.md).
    """
    make = getattr(torch, "thread_safe_generator", None)
    if make is None:
        return float(worker_rng().random())
    return float(torch.rand(1, generator=make()))


class GlobalDrawDataset(Dataset):
    """Draws from Python's shared ``random`` module."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> float:
        time.sleep(0.001)
        return random.random()


class FailingDataset(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        if i == 5:
            raise ValueError(f"bad sample {i}")
        return i


class Blocking(Dataset):
    """Index 3 blocks until ``release`` is set (a read that does not return)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        if i == 3:
            self.release.wait(60)
        return i


INIT_CALLS: list[int] = []


def record_init(worker_id: int) -> None:
    INIT_CALLS.append(worker_id)
    info = get_worker_info()
    assert info is not None and info.id == worker_id


# ------------------------------------------------------------------ shared behaviour


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("in_order", [True, pytest.param(False, marks=needs_in_order)])
def test_order_matches_zero_workers(method: str, in_order: bool) -> None:
    expected = _batches(create_dataloader(SquareDataset(23), batch_size=3, shuffle=True, seed=4))
    loader = create_dataloader(
        SquareDataset(23),
        batch_size=3,
        shuffle=True,
        seed=4,
        num_workers=2,
        worker_method=method,
        in_order=in_order,
        prefetch_factor=3,
    )
    got = _batches(loader)
    assert (got == expected) if in_order else sorted(got) == sorted(expected)
    assert loader.plan["worker_method"].value == method


@pytest.mark.parametrize("method", METHODS)
def test_worker_info_and_seeds_match_processes(method: str) -> None:
    loader = create_dataloader(
        InfoDataset(),
        batch_size=2,
        num_workers=2,
        worker_method=method,
        seed=11,
        collate_fn=list,
    )
    rows = [sample for batch in loader for sample in batch]
    assert [r[1] for r in rows] == [0, 0, 1, 1] * 3  # round robin, 2 per batch
    assert {r[2] for r in rows} == {2}
    seeds = {r[1]: r[3] for r in rows}
    assert seeds[1] == seeds[0] + 1  # base_seed + id, as torch seeds processes
    if method == "thread":
        assert all(bool(r[4]) for r in rows)  # the caller's object, not a copy
        assert {int(r[5]) for r in rows} == {os.getpid()}
        assert {r[6] for r in rows} == {"loaderkit-worker-0", "loaderkit-worker-1"}
    else:
        assert os.getpid() not in {int(r[5]) for r in rows}
    assert get_worker_info() is None


@pytest.mark.parametrize("method", METHODS)
def test_iterable_dataset_is_sharded(method: str) -> None:
    loader = create_dataloader(
        CountingIterable(11), batch_size=2, num_workers=3, worker_method=method
    )
    got = sorted(int(x) for batch in loader for x in batch)
    assert got == list(range(11))


@pytest.mark.parametrize("method", METHODS)
def test_persistent_workers_and_worker_init_fn_once_per_worker(method: str) -> None:
    INIT_CALLS.clear()
    loader = create_dataloader(
        SquareDataset(9),
        batch_size=2,
        num_workers=2,
        worker_method=method,
        persistent_workers=True,
        worker_init_fn=record_init,
    )
    first, second = _batches(loader), _batches(loader)
    assert first == second == _batches(create_dataloader(SquareDataset(9), batch_size=2))
    if method == "thread":  # the caller's process: its list is the workers' list
        assert sorted(INIT_CALLS) == [0, 1]
    loader.close()


@pytest.mark.parametrize("method", METHODS)
def test_dataset_error_names_worker_and_keeps_type(method: str) -> None:
    loader = create_dataloader(FailingDataset(), batch_size=2, num_workers=2, worker_method=method)
    with pytest.raises(ValueError, match="bad sample 5") as info:
        list(loader)
    text = str(info.value) + "\n".join(getattr(info.value, "__notes__", []))
    if method == "thread":
        assert "worker thread 0 of 2" in text and "[4, 5]" in text
    else:
        assert "DataLoader worker process 0" in text
    loader.close()


@pytest.mark.parametrize("method", METHODS)
def test_timeout(method: str) -> None:
    dataset = SlowDataset(n=8, delay=3.0)
    loader = create_dataloader(
        dataset, batch_size=1, num_workers=1, timeout=0.5, worker_method=method
    )
    with pytest.raises(RuntimeError, match=r"timed out after 0\.5 seconds"):
        next(iter(loader))
    loader.close()


@pytest.mark.parametrize("method", METHODS)
def test_sample_seeding_bit_identical_across_methods(method: str) -> None:
    def make(workers: int, how: str | None) -> Any:
        return create_dataloader(
            AugmentDataset(),
            batch_size=4,
            shuffle=True,
            seed=3,
            sample_seeding=True,
            num_workers=workers,
            worker_method=how,
        )

    reference = [b.tolist() for b in make(0, None)]
    assert [b.tolist() for b in make(2, method)] == reference
    assert [b.tolist() for b in make(3, method)] == reference


def _augmenting(workers: int, method: str | None, persistent: bool = False) -> Any:
    return create_dataloader(
        AugmentDataset(),
        batch_size=3,
        shuffle=True,
        seed=5,
        sample_seeding=True,
        num_workers=workers,
        worker_method=method,
        persistent_workers=persistent and workers > 0,
    )


def _split_pass(first: Any, second: Any) -> tuple[list[Any], Any]:
    """Three batches from ``first``, its state loaded into ``second``, and the rest from it."""
    it = iter(first)
    head = [next(it).tolist() for _ in range(3)]
    state = first.state_dict()
    first.close()
    second.load_state_dict(state)
    return head + [b.tolist() for b in second], second


@pytest.mark.parametrize(("saved", "resumed"), [("process", "thread"), ("thread", "process")])
def test_resume_across_methods(saved: str, resumed: str) -> None:
    full = [b.tolist() for b in _augmenting(2, "process")]
    got, second = _split_pass(_augmenting(2, saved), _augmenting(2, resumed))
    assert got == full
    second.close()


@pytest.mark.parametrize(("before", "after"), [(2, 0), (0, 3), (3, 1)])
@pytest.mark.parametrize("persistent", [False, True])
def test_resume_across_thread_counts(before: int, after: int, persistent: bool) -> None:
    reference = _augmenting(0, None)
    full = [b.tolist() for b in reference]
    later = [b.tolist() for b in reference]  # the pass after
    got, second = _split_pass(
        _augmenting(before, "thread" if before else None, persistent),
        _augmenting(after, "thread" if after else None, persistent),
    )
    assert got == full
    assert [b.tolist() for b in second] == later
    second.close()


def failing_init(worker_id: int) -> None:
    raise KeyError(f"no config for worker {worker_id}")


@pytest.mark.parametrize("method", METHODS)
def test_worker_init_fn_error_reaches_the_caller(method: str) -> None:
    loader = create_dataloader(
        SquareDataset(8), batch_size=2, num_workers=2, worker_method=method,
        worker_init_fn=failing_init,
    )  # fmt: skip
    with pytest.raises(KeyError, match="no config for worker 0"):
        list(loader)
    loader.close()


# ------------------------------------------------------------------ threads only


class SeededInfo(Dataset):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> bool:
        info = get_worker_info()
        return info is not None and info.dataset is SEEDED


SEEDED = SeededInfo()


def test_worker_info_dataset_is_the_callers_with_sample_seeding() -> None:
    loader = create_dataloader(
        SEEDED, batch_size=3, num_workers=2, worker_method="thread", seed=0, sample_seeding=True
    )
    assert all(bool(x) for batch in loader for x in batch)


def test_close_is_bounded_while_a_thread_is_stuck(monkeypatch, caplog) -> None:
    monkeypatch.setattr(worker_threads, "JOIN_S", 0.3)
    dataset = Blocking()
    before = threading.active_count()
    loader = create_dataloader(dataset, batch_size=1, num_workers=2, worker_method="thread")
    it = iter(loader)
    assert [int(next(it)) for _ in range(3)] == [0, 1, 2]
    start = time.monotonic()
    loader.close()
    assert time.monotonic() - start < 2.0
    assert "did not end" in caplog.text  # the stuck one is named, left as a daemon
    dataset.release.set()
    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert threading.active_count() == before  # it ended once its read returned


def test_keyboard_interrupt_reaches_the_caller_and_threads_end() -> None:
    before = threading.active_count()
    loader = create_dataloader(
        SlowDataset(n=200, delay=0.02), batch_size=2, num_workers=2, worker_method="thread"
    )
    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        for _ in loader:
            pass
    loader.close()
    assert threading.active_count() == before


def test_threads_start_no_process_and_no_pickling() -> None:
    lock = threading.Lock()  # unpicklable: fine, nothing is pickled
    before = child_pids()
    loader = create_dataloader(
        SquareDataset(6),
        batch_size=2,
        num_workers=2,
        worker_method="thread",
        multiprocessing_context="spawn",
        collate_fn=lambda b, lock=lock: len(b),
    )
    assert list(loader) == [2, 2, 2]
    assert child_pids() == before
    assert "start_method" not in loader.plan and "pickled_dataset" not in loader.plan


def test_shared_rng_named_by_check_determinism() -> None:
    report = check_determinism(
        lambda: create_dataloader(
            GlobalDrawDataset(), batch_size=4, num_workers=2, worker_method="thread", seed=0
        )
    )
    assert not report.deterministic
    assert "Python's random module" in str(report)


def test_worker_rng_is_per_thread() -> None:
    def make() -> Any:
        return create_dataloader(
            AugmentDataset(), batch_size=4, num_workers=2, worker_method="thread", seed=9
        )

    report = check_determinism(make)
    assert report.deterministic, str(report)
    draws = torch.cat(list(make()))[:, 1]
    assert len(set(draws.tolist())) == len(draws)


# ------------------------------------------------------------------ policy


def test_windows_policy_loads_with_threads() -> None:
    win = fake_platform(**WINDOWS)
    loader = create_dataloader(SquareDataset(6), batch_size=2, num_workers=2, platform=win)
    assert loader.plan["worker_method"].value == "thread"
    assert "Windows" in loader.plan["worker_method"].reason
    assert loader.num_workers == 2 and len(_batches(loader)) == 3


def _worker_count_advice(make: Callable[[], Any]) -> list[warnings.WarningMessage]:
    """The warnings about the number of workers while a loader is built, iterated, closed."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = make()
        _batches(loader)
        loader.close()
    return [w for w in caught if "suggested max number" in str(w.message)]


def test_too_many_worker_threads_are_advised_in_words_for_threads() -> None:
    # the CPUs come from the PlatformInfo: 2 here, whatever this machine has
    two = fake_platform(usable_cpus=2)
    for make in (
        lambda: create_dataloader(
            SquareDataset(8), batch_size=2, num_workers=4, worker_method="thread", platform=two
        ),
        # the Windows policy: its worker processes become threads, advised the same way
        lambda: create_dataloader(
            SquareDataset(8),
            batch_size=2,
            num_workers=4,
            platform=fake_platform(**WINDOWS, usable_cpus=2),
        ),
    ):
        advice = _worker_count_advice(make)
        assert len(advice) == 2  # built, and the pass (torch warns of processes the same)
        assert all(w.category is PerformanceHint for w in advice), advice
        text = str(advice[0].message)
        assert "This DataLoader will run 4 worker threads in this process" in text
        assert "suggested max number of worker threads on this system is 2" in text
        assert "Lower num_workers to 2 or fewer" in text
        assert not any("worker processes" in str(w.message) for w in advice)
    enough = _worker_count_advice(
        lambda: create_dataloader(
            SquareDataset(8), batch_size=2, num_workers=2, worker_method="thread", platform=two
        )
    )
    assert enough == []


def test_too_many_worker_processes_keep_torchs_own_advice() -> None:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    n = (cpus or 1) + 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        create_dataloader(SquareDataset(8), num_workers=n, worker_method="process").close()
    advice = [w for w in caught if "suggested max number" in str(w.message)]
    assert len(advice) == 1 and advice[0].category is UserWarning
    assert str(advice[0].message).startswith(
        f"This DataLoader will create {n} worker processes in total. Our suggested max number "
        f"of worker in current system is {cpus}, which is smaller than what this DataLoader is "
        "going to create."
    )


def test_windows_explicit_choices_win() -> None:
    win = fake_platform(**WINDOWS)
    with pytest.warns(UserWarning, match="became 0"):
        zero = create_dataloader(
            SquareDataset(6), num_workers=2, platform=win, force_zero_workers_on_windows=True
        )
    assert zero.num_workers == 0
    kept = create_dataloader(SquareDataset(6), num_workers=2, platform=win, worker_method="process")
    assert kept.plan["worker_method"].value == "process"


def test_elsewhere_unset_stays_processes_and_auto_states_its_rule() -> None:
    loader = create_dataloader(SquareDataset(6), num_workers=2)
    assert loader.plan["worker_method"].value == "process"
    forked = create_dataloader(
        SquareDataset(6), num_workers=2, worker_method="auto", multiprocessing_context="fork"
    )
    assert forked.plan["worker_method"].value == "process"
    safe = SquareDataset(6)
    safe.thread_safe = True  # type: ignore[attr-defined]
    spawned = create_dataloader(
        safe, num_workers=2, worker_method="auto", multiprocessing_context="spawn"
    )
    assert spawned.plan["worker_method"].value == "thread"
    with pytest.raises(ConfigError, match="worker_method='threads'"):
        create_dataloader(SquareDataset(6), num_workers=2, worker_method="threads")  # type: ignore[arg-type]


def test_thread_rng_streams_are_the_threads_own() -> None:
    class Draws(IterableDataset):
        def __iter__(self):
            info = get_worker_info()
            rng = getattr(info, "rng", None)
            if rng is not None:
                yield rng.torch_generator is torch.thread_safe_generator()
            yield isinstance(worker_rng(), np.random.Generator)

    loader = create_dataloader(Draws(), batch_size=None, num_workers=1, worker_method="thread")
    assert all(bool(x) for x in loader)


# ------------------------------------------------------------------ real HDF5 files


def _gzip_sessions(root: Any) -> list[str]:
    import h5py

    paths = []
    for s in range(3):
        path = os.path.join(root, f"gz_session{s + 1:02d}.hdf5")
        data = (s * 1000 + np.arange(50, dtype=np.float32))[:, None].repeat(8, axis=1)
        with h5py.File(path, "w") as f:
            f.create_dataset("betas", data=data, chunks=(4, 8), compression="gzip")
        paths.append(path)
    return paths


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("shuffle", [True, "block"])
def test_hdf5_sessions_match_zero_workers(tmp_path, method: str, shuffle: Any) -> None:
    from loaderkit import HDF5SessionDataset

    paths = write_h5_sessions(tmp_path) + _gzip_sessions(tmp_path)
    contiguous, gzipped = paths[:3], paths[3:]
    for files in (contiguous, gzipped):

        def make(workers: int, how: str | None, files: list[str] = files) -> Any:
            dataset = HDF5SessionDataset(files, key="betas")
            return create_dataloader(
                dataset, batch_size=8, shuffle=shuffle, seed=1, num_workers=workers,
                worker_method=how,
            )  # fmt: skip

        expected = [b.tolist() for b in make(0, None)]
        with make(2, method) as loader:
            assert [b.tolist() for b in loader] == expected
            assert [b.tolist() for b in loader] != expected  # the next epoch's order
            if method == "thread":  # one process: budgets fitted to it alone
                assert "1 process" in loader.plan["max_open_files"].reason or (
                    "0 worker" in loader.plan["max_open_files"].reason
                )


def test_thread_batches_are_ordinary_memory() -> None:
    loader = create_dataloader(
        SquareDataset(8), batch_size=4, num_workers=2, worker_method="thread"
    )
    assert all(not t.is_shared() for batch in loader for t in batch)
    assert torch.utils.data.default_collate([torch.ones(2)]).is_shared() is False


def test_auto_picks_threads_for_hdf5_under_spawn(tmp_path) -> None:
    from loaderkit import HDF5SessionDataset

    dataset = HDF5SessionDataset(write_h5_sessions(tmp_path), key="betas")
    loader = create_dataloader(dataset, num_workers=2, worker_method="auto",
                               multiprocessing_context="spawn")  # fmt: skip
    assert loader.plan["worker_method"].value == "thread"
    assert "spawn" in loader.plan["worker_method"].reason
    assert len(list(loader)) == 120


class PinProbe(Dataset):
    """Sample i: i; records which threads pinned a batch (``Tensor.pin_memory`` calls)."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((4,), float(i))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_pin_memory_in_the_worker_thread(monkeypatch) -> None:
    pinned_by: list[str] = []
    original = torch.Tensor.pin_memory

    def recording(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        pinned_by.append(threading.current_thread().name)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "pin_memory", recording)
    loader = create_dataloader(
        PinProbe(), batch_size=4, num_workers=2, worker_method="thread", pin_memory=True
    )
    batches = list(loader)
    assert [b[:, 0].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11],
                                                   [12, 13, 14, 15]]  # fmt: skip
    assert all(b.is_pinned() for b in batches)
    assert pinned_by and set(pinned_by) <= {"loaderkit-worker-0", "loaderkit-worker-1"}
    assert "pin_memory" not in {t.name for t in threading.enumerate()}


def test_profiler_sees_each_batch_and_no_operator_runs_without_one(monkeypatch) -> None:
    loader = create_dataloader(
        SquareDataset(12), batch_size=3, num_workers=2, worker_method="thread"
    )
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        assert len(list(loader)) == 4
    spans = [e.name for e in prof.events() if e.name.startswith("enumerate(DataLoader)")]
    # torch's span per call, as with worker processes: 4 batches and the end of the pass
    assert len(spans) == 5, spans

    expected = _batches(create_dataloader(SquareDataset(12), batch_size=3))
    entered: list[str] = []
    real = torch.autograd.profiler.record_function

    class Counting(real):  # type: ignore[misc, valid-type]
        def __enter__(self) -> Any:
            entered.append(self.name)
            return super().__enter__()

    monkeypatch.setattr(torch.autograd.profiler, "record_function", Counting)
    assert _batches(loader) == expected
    # no span while nothing records: its operator calls release the GIL every batch
    assert entered == []
