"""Policies as pure functions, and their effect through create_dataloader with fake platforms."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch.utils.data import DistributedSampler

from loaderkit import ConfigError, LoaderkitWarning, create_dataloader
from loaderkit.machine.distributed import DistInfo
from loaderkit.plan import UNSET, Plan, PlanEntry
from loaderkit.policy import (
    MAX_AUTO_WORKERS,
    DatasetFacts,
    LoaderRequest,
    resolve,
    resolve_num_workers,
    resolve_persistent_workers,
    resolve_pin_memory,
    resolve_shuffle,
)
from loaderkit.policy.budgets import check_open_file_budget, check_shared_memory
from tests.conftest import LINUX_314, MACOS, WINDOWS
from tests.helpers import CountingIterable, SquareDataset, Transform, TransformDataset

# ---------------------------------------------------------------- pure decisions


def test_num_workers_auto_and_explicit(make_platform) -> None:
    linux = make_platform(usable_cpus=6, is_windows=False, local_world_size=None)
    assert resolve_num_workers("auto", linux).value == 5
    assert "6 usable CPUs" in resolve_num_workers("auto", linux).reason
    assert resolve_num_workers(3, linux).value == 3
    assert resolve_num_workers(0, linux).value == 0
    big = make_platform(usable_cpus=128, is_windows=False, local_world_size=None)
    assert resolve_num_workers("auto", big).value == MAX_AUTO_WORKERS
    assert resolve_num_workers("auto", big, local_world_size=32).value == 3
    with pytest.raises(ConfigError, match="'auto'"):
        resolve_num_workers("many", linux)


def test_num_workers_windows(make_platform) -> None:
    win = make_platform(**WINDOWS)
    assert resolve_num_workers(4, win).value == 0
    assert "Windows" in resolve_num_workers(4, win).reason
    assert resolve_num_workers("auto", win).value == 0
    assert resolve_num_workers(4, win, force_zero_workers_on_windows=False).value == 4


def test_persistent_workers_follow_training() -> None:
    assert resolve_persistent_workers(None, training=True, num_workers=2).value is True
    assert resolve_persistent_workers(None, training=True, num_workers=0).value is False
    assert resolve_persistent_workers(None, training=False, num_workers=2).value is False
    assert resolve_persistent_workers(None, training=None, num_workers=2).value is False
    assert resolve_persistent_workers(True, training=False, num_workers=2).value is True
    assert resolve_persistent_workers(False, training=True, num_workers=2).value is False


def test_shuffle_follows_training_unless_given() -> None:
    kw = {"iterable": False, "has_sampler": False, "has_batch_sampler": False}
    assert resolve_shuffle(None, training=True, **kw).value is True
    assert resolve_shuffle(None, training=False, **kw).value is False
    assert resolve_shuffle(None, training=None, **kw).value is None
    assert resolve_shuffle(False, training=True, **kw).value is False
    assert resolve_shuffle(True, training=False, **kw).value is True
    assert resolve_shuffle("block", training=None, **kw).value == "block"
    assert (
        resolve_shuffle(
            None, training=True, iterable=True, has_sampler=False, has_batch_sampler=False
        ).value
        is None
    )
    assert (
        resolve_shuffle(
            None, training=True, iterable=False, has_sampler=True, has_batch_sampler=False
        ).value
        is None
    )
    with pytest.raises(ConfigError):
        resolve_shuffle("random", training=None, **kw)


def test_pin_memory_follows_cuda(make_platform) -> None:
    assert resolve_pin_memory(None, make_platform(cuda_available=True)).value is True
    assert resolve_pin_memory(None, make_platform(cuda_available=False)).value is False
    assert resolve_pin_memory(False, make_platform(cuda_available=True)).value is False
    assert resolve_pin_memory(True, make_platform(cuda_available=False)).value is True


def test_pin_memory_stays_off_where_cuda_cannot_be_initialised(make_platform) -> None:
    # A child forked after its parent initialised CUDA sees the devices but cannot use them.
    bad_fork = make_platform(cuda_available=True, cuda_device_count=1, cuda_bad_fork=True)
    assert not bad_fork.cuda_usable
    decision = resolve_pin_memory(None, bad_fork)
    assert decision.value is False
    assert "forked" in decision.reason and "initialise" in decision.reason
    assert resolve_pin_memory(True, bad_fork).value is True  # explicit wins, as in torch
    usable = make_platform(cuda_available=True, cuda_device_count=1, cuda_bad_fork=False)
    assert usable.cuda_usable and resolve_pin_memory(None, usable).value is True
    # Without CUDA a bad fork changes nothing (the "no CUDA" reason stays).
    no_cuda = make_platform(cuda_available=False, cuda_bad_fork=True)
    assert "no CUDA" in resolve_pin_memory(None, no_cuda).reason


def test_open_file_budget_levels() -> None:
    """Each process against its own limit: main = 10 + 16 margin + 2 x 16 + files."""
    assert check_open_file_budget(2, 8, 1024, main_fds=10).level == "ok"
    warn = check_open_file_budget(2, 460, 1024, main_fds=10)  # 58 + 460 = 518 > 512
    assert warn.level == "warn" and "ulimit -n" in warn.message
    assert warn.needed == 518
    error = check_open_file_budget(4, 1000, 1024, main_fds=10, hard_limit=1 << 20)
    assert error.level == "error"
    assert "max_open_files <= 934" in error.message and "ulimit -n 4096" in error.message
    assert str(error.limit) in error.message
    assert check_open_file_budget(64, 64, None).level == "ok"


def test_shared_memory_check() -> None:
    mib = 2**20
    assert check_shared_memory(4, 2, 1 * mib, 64 * mib).level == "ok"
    small = check_shared_memory(8, 2, 16 * mib, 64 * mib)
    assert small.level == "warn" and "file_system" in small.message
    assert check_shared_memory(0, None, 16 * mib, 64 * mib).level == "ok"
    assert check_shared_memory(4, 2, None, 64 * mib).level == "ok"


def test_resolve_records_every_decision(make_platform) -> None:
    res = resolve(
        LoaderRequest(num_workers="auto", training=True),
        DatasetFacts(),
        make_platform(usable_cpus=4, is_windows=False, local_world_size=None),
    )
    names = [e.name for e in res.entries]
    for name in ("num_workers", "persistent_workers", "shuffle", "pin_memory", "worker_init_fn"):
        assert name in names
    assert res.values["num_workers"] == 3
    assert res.values["persistent_workers"] is True
    assert res.values["shuffle"] is True


def test_resolve_distributed_choices(make_platform) -> None:
    p = make_platform()
    dist = DistInfo(initialized=True, rank=1, world_size=2)
    train = resolve(LoaderRequest(training=True), DatasetFacts(), p, dist)
    assert train.sampler_choice == "distributed" and train.sampler_shuffle is True
    evaluate = resolve(LoaderRequest(training=False), DatasetFacts(), p, dist)
    assert evaluate.sampler_choice == "exact_shard" and evaluate.sampler_shuffle is False
    off = resolve(LoaderRequest(training=True, distributed=False), DatasetFacts(), p, dist)
    assert off.sampler_choice == "default"
    iterable = resolve(LoaderRequest(), DatasetFacts(iterable=True), p, dist)
    assert iterable.sampler_choice == "default"
    with pytest.raises(ConfigError, match="init_process_group"):
        resolve(LoaderRequest(distributed=True), DatasetFacts(), p, DistInfo(initialized=False))
    with pytest.raises(ConfigError):
        resolve(LoaderRequest(distributed="yes"), DatasetFacts(), p, dist)


def test_sample_seeding_rejects_iterable_datasets(make_platform) -> None:
    with pytest.raises(ConfigError, match="map-style"):
        resolve(LoaderRequest(sample_seeding=True), DatasetFacts(iterable=True), make_platform())


# ---------------------------------------------------------------- through create_dataloader


def test_windows_policy_forces_zero_workers(make_platform) -> None:
    win = make_platform(**WINDOWS)
    with pytest.warns(LoaderkitWarning, match="num_workers=4 became 0"):
        loader = create_dataloader(
            SquareDataset(),
            batch_size=2,
            num_workers=4,
            persistent_workers=True,
            prefetch_factor=4,
            timeout=5,
            multiprocessing_context="spawn",
            platform=win,
            force_zero_workers_on_windows=True,  # given: the zero-worker policy, not threads
        )
    assert loader.num_workers == 0
    assert loader.persistent_workers is False
    assert loader.prefetch_factor is None
    assert loader.timeout == 0
    assert loader.multiprocessing_context is None
    assert loader.plan["num_workers"].requested == 4 and loader.plan["num_workers"].value == 0
    assert "Windows" in loader.plan["num_workers"].reason
    # torch raises nothing and the loader works in the main process.
    assert len(list(loader)) == 5


def test_windows_policy_opt_out(make_platform) -> None:
    win = make_platform(**WINDOWS)
    with warnings.catch_warnings():
        warnings.simplefilter("error", LoaderkitWarning)
        loader = create_dataloader(
            SquareDataset(), num_workers=2, platform=win, force_zero_workers_on_windows=False
        )
    assert loader.num_workers == 2


def test_windows_auto_workers_is_zero_without_warning(make_platform) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", LoaderkitWarning)
        loader = create_dataloader(
            SquareDataset(),
            num_workers="auto",
            platform=make_platform(**WINDOWS),
            force_zero_workers_on_windows=True,
        )
    assert loader.num_workers == 0


def test_windows_auto_workers_unset_policy_are_threads(make_platform) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", LoaderkitWarning)
        loader = create_dataloader(
            SquareDataset(), num_workers="auto", platform=make_platform(**WINDOWS, usable_cpus=4)
        )
    assert loader.num_workers == 3 and loader.plan["worker_method"].value == "thread"


@pytest.mark.parametrize(
    ("platform_fields", "context"),
    [(MACOS, None), (LINUX_314, "forkserver"), ({**LINUX_314, "cuda_initialized": True}, None)],
    ids=["macos", "linux-3.14-explicit", "linux-3.14-cuda"],
)
def test_spawning_platforms_run_the_preflight(make_platform, platform_fields, context) -> None:
    platform = make_platform(**platform_fields)
    with pytest.raises(ConfigError, match=r"dataset\.transform\.fn") as info:
        create_dataloader(
            TransformDataset(Transform(_Holder.lambda_fn)),
            num_workers=2,
            platform=platform,
            multiprocessing_context=context,
        )
    assert platform_fields["start_method"] in str(info.value)
    # On a fork platform the same dataset is fine (nothing is pickled).
    fork = make_platform(start_method="fork", start_method_source="default", is_windows=False)
    loader = create_dataloader(
        TransformDataset(Transform(_Holder.lambda_fn)), num_workers=2, platform=fork
    )
    assert loader.plan["start_method"].value == "fork"


def test_python_314s_default_forks_an_unpicklable_dataset_on_linux(make_platform) -> None:
    # forkserver left to the interpreter, Linux, no CUDA: what ran under 3.13's fork keeps running
    platform = make_platform(**LINUX_314, cuda_initialized=False)
    with pytest.warns(LoaderkitWarning, match=r"dataset\.transform\.fn cannot be pickled"):
        loader = create_dataloader(
            TransformDataset(Transform(_Holder.lambda_fn)), num_workers=2, platform=platform
        )
    row = loader.plan["start_method"]
    assert row.value == "fork" and "forkserver" in row.reason
    assert sorted(int(x) for index, _ in loader for x in index) == list(range(len(loader.dataset)))
    loader.close()


def test_explicit_context_beats_the_platform_default(make_platform) -> None:
    mac = make_platform(**MACOS)
    loader = create_dataloader(
        TransformDataset(Transform(_Holder.lambda_fn)),
        num_workers=1,
        multiprocessing_context="fork",
        platform=mac,
    )
    assert loader.plan["start_method"].value == "fork"
    assert loader.plan["start_method"].reason.startswith("multiprocessing_context")


def test_training_defaults_through_the_factory() -> None:
    train = create_dataloader(SquareDataset(), num_workers=2, training=True)
    assert train.persistent_workers is True
    assert isinstance(train.sampler, torch.utils.data.RandomSampler)
    assert train.plan["shuffle"].requested is UNSET
    evaluate = create_dataloader(SquareDataset(), num_workers=2, training=False)
    assert evaluate.persistent_workers is False
    assert isinstance(evaluate.sampler, torch.utils.data.SequentialSampler)
    explicit = create_dataloader(
        SquareDataset(), num_workers=2, training=True, shuffle=False, persistent_workers=False
    )
    assert explicit.persistent_workers is False
    assert isinstance(explicit.sampler, torch.utils.data.SequentialSampler)
    for loader in (train, evaluate, explicit):
        loader.close()


def test_training_with_iterable_dataset_leaves_shuffle_unset() -> None:
    loader = create_dataloader(CountingIterable(), training=True, batch_size=2)
    assert sorted(torch.cat(list(loader)).tolist()) == list(range(7))


def test_pin_memory_none_is_false_without_cuda(make_platform) -> None:
    loader = create_dataloader(SquareDataset(), platform=make_platform(cuda_available=False))
    assert loader.pin_memory is False
    assert "no CUDA" in loader.plan["pin_memory"].reason


def test_pin_memory_none_is_true_with_cuda(make_platform) -> None:
    loader = create_dataloader(
        SquareDataset(), platform=make_platform(cuda_available=True, cuda_bad_fork=False)
    )
    assert loader.pin_memory is True
    assert "CUDA is available" in loader.plan["pin_memory"].reason


def test_pin_memory_none_is_false_in_a_bad_fork(make_platform) -> None:
    platform = make_platform(cuda_available=True, cuda_device_count=1, cuda_bad_fork=True)
    loader = create_dataloader(SquareDataset(), batch_size=4, num_workers=2, platform=platform)
    assert loader.pin_memory is False
    entry = loader.plan["pin_memory"]
    assert entry.value is False and "forked" in entry.reason
    assert "pin_memory" in loader.describe()
    with loader:
        assert len(list(loader)) == 3


def test_user_sampler_under_distributed_is_kept_with_a_warning(make_platform) -> None:
    from loaderkit.policy import resolve as resolve_

    res = resolve_(
        LoaderRequest(sampler=[0, 1, 2]),
        DatasetFacts(),
        make_platform(),
        DistInfo(initialized=True, rank=0, world_size=2),
    )
    assert res.sampler_choice == "user"
    assert any("does not split data" in w for w in res.warnings)
    sharded = resolve_(
        LoaderRequest(sampler=DistributedSampler(range(4), num_replicas=2, rank=0)),
        DatasetFacts(),
        make_platform(),
        DistInfo(initialized=True, rank=0, world_size=2),
    )
    assert not sharded.warnings


def test_open_file_budget_is_checked(make_platform) -> None:
    class ManyFiles(SquareDataset):
        max_open_files = 1000

    class SomeFiles(SquareDataset):
        max_open_files = 450

    # fork: the datasets' classes are local to the test
    tight = make_platform(
        open_files_soft=1024, open_fds=10, start_method="fork", start_method_source="argument"
    )
    with pytest.raises(ConfigError, match="Too many open files"):
        create_dataloader(ManyFiles(), num_workers=4, platform=tight)
    with pytest.warns(LoaderkitWarning, match="over half the limit"):
        create_dataloader(SomeFiles(), num_workers=4, platform=tight)
    # Per process, not summed: 5 processes x 300 files is no error.
    create_dataloader(
        type("F", (SquareDataset,), {"max_open_files": 300})(), num_workers=4, platform=tight
    )


def test_plan_describe_lists_requested_used_and_reason() -> None:
    loader = create_dataloader(SquareDataset(), num_workers="auto", training=True, seed=3)
    text = loader.describe()
    assert text.splitlines()[1].split() == ["setting", "requested", "used", "reason"]
    assert "'auto'" in text and "training=True" in text
    changed = {entry.name for entry in loader.plan.changes()}
    assert {"num_workers", "shuffle", "generator"} <= changed
    loader.close()


class _Holder:
    @staticmethod
    def lambda_fn(x):  # replaced below by a real lambda
        return x


_Holder.lambda_fn = lambda x: x


@pytest.mark.parametrize("method", ["process", "thread"])
def test_describe_fits_100_columns_with_a_legend_and_counts_in_words(
    tmp_path: Path, method: str
) -> None:
    """A 2-worker HDF5 loader (363 columns wide before) and a 1-worker one."""
    import h5py
    import numpy as np

    from loaderkit import HDF5SessionDataset

    paths = []
    for s in range(3):
        paths.append(str(tmp_path / f"s{s}.h5"))
        with h5py.File(paths[-1], "w") as f:
            f.create_dataset("betas", data=np.zeros((40, 16), "f4"))
    ds = HDF5SessionDataset(paths, key="betas")
    for workers in (1, 2):
        with create_dataloader(
            ds, batch_size=8, num_workers=workers, worker_method=method, training=True, seed=0
        ) as loader:
            text = loader.describe()
        assert max(len(line) for line in text.splitlines()) <= 100, text
        assert "\nterms:\n" in text
        legend = text.split("\nterms:\n")[1]
        assert "max_open_files" in legend and "read_path" in legend
        if method == "process":
            assert "slot pool" in legend and "gc_freeze" in legend
        flat = " ".join(text.split())
        assert "1 processes" not in flat and "1 workers" not in flat and "(s)" not in flat
        # a wrapped reason is still the plan's reason, word for word
        assert " ".join(loader.plan["max_open_files"].reason.split()) in flat
    ds.close()


def test_plan_describe_puts_a_long_value_s_reason_below_it() -> None:
    plan = Plan(
        [
            PlanEntry("num_workers", 2, 2, "as given"),
            PlanEntry("collate_fn", None, "x" * 50, "a reason " * 30),
        ]
    )
    lines = plan.describe().splitlines()
    assert max(map(len, lines)) <= 100
    assert lines[1].split() == ["num_workers", "2", "2", "as", "given"]
    assert lines[2].split()[-1] == repr("x" * 50) and lines[3].lstrip().startswith("a reason")
    # a narrow terminal: every reason under its row
    narrow = plan.describe(width=60).splitlines()
    assert max(map(len, narrow)) <= 60 and narrow[3] == "    as given"
    assert all(line.startswith(" ") for line in lines[3:])
