"""close() releases every descriptor of persistent, pinned loaders (torch's DataLoader keeps 4).

Pinning needs an accelerator, so on a CPU machine torch would warn and turn it off. These tests
fake only the accelerator: ``torch.accelerator`` reports a CUDA device and the pin function
returns the batch unchanged, so torch's real pin-memory thread runs with its real queues,
between real worker processes, exactly as on a CUDA host. Descriptors are counted with psutil
and, to be immune to unrelated descriptors closing meanwhile (garbage of earlier tests), listed
by what they point to (``/proc/self/fd``: ``pipe:[inode]``...): growth is what was opened during
the measurement and is still open.

Where the 4 descriptors come from: with ``pin_memory=True`` torch reads the workers' results on
a pin-memory thread and, for persistent workers, registers the iterator for an ``atexit`` clean
up (older releases register every worker ``Process`` itself, so it is never freed). torch's
``_shutdown_workers`` stops the workers and closes the queues, but each worker's ``Popen`` keeps
its two pipe ends (the sentinel pair) until the ``Process`` object is garbage collected, which
never happens while the iterator or the worker is referenced: 2 per worker, 4 for 2 workers.
"""

from __future__ import annotations

import gc
import inspect
import multiprocessing.queues
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.utils.data._utils.pin_memory as torch_pin_memory
from torch.utils.data.dataloader import _BaseDataLoaderIter, _MultiProcessingDataLoaderIter

from loaderkit import create_dataloader
from loaderkit.memory.resources import snapshot
from loaderkit.workers.queues import DirectQueue
from tests.helpers import SquareDataset

LOADERS = 6  # a leak is per loader: 6 loaders show it as well as 20
WORKERS = 2


class _FakeCuda:
    type = "cuda"


@pytest.fixture
def fake_pinning(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """torch pins as on a CUDA host; the pin function counts the batches it was given."""
    pinned: list[int] = []

    def pin(data: Any, device: Any = None) -> Any:
        pinned.append(1)
        return data

    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:  # torch 2.6+ has torch.accelerator
        monkeypatch.setattr(accelerator, "is_available", lambda: True)
        monkeypatch.setattr(accelerator, "current_accelerator", lambda *a, **k: _FakeCuda())
        monkeypatch.setattr(accelerator, "current_device_index", lambda: 0)
        monkeypatch.setattr(accelerator, "set_device_index", lambda index: None)
    if "torch.cuda.is_available()" in inspect.getsource(_BaseDataLoaderIter.__init__):
        # torch before 2.7 decides whether an iterator pins by asking torch.cuda
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch_pin_memory, "pin_memory", pin)
    yield pinned


def _fds() -> int:
    count = snapshot(children=False).num_fds
    assert count is not None
    return count


def _targets() -> Counter[str]:
    """What each open descriptor points to (pipes and sockets carry their inode)."""
    out: Counter[str] = Counter()
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[os.readlink(f"/proc/self/fd/{fd}")] += 1
        except OSError:  # closed meanwhile (the listing's own descriptor)
            continue
    return out


class _Descriptors:
    """Descriptors opened since the baseline and still open, after a settled baseline."""

    def __init__(self) -> None:
        gc.collect()
        count = _fds()
        for _ in range(40):  # let earlier tests' exiting workers and threads finish closing
            time.sleep(0.05)
            count, previous = _fds(), count
            if count == previous:
                break
        self.count = count
        self.targets = _targets()

    def growth(self) -> tuple[int, int]:
        """(still-open new descriptors, psutil count difference)."""
        gc.collect()  # everything measured is still referenced: only unrelated garbage goes
        new = _targets() - self.targets
        return sum(new.values()), _fds() - self.count


def _two_passes(loader: Any) -> _MultiProcessingDataLoaderIter:
    iterators = []
    for _ in range(2):
        iterator = iter(loader)
        iterators.append(iterator)
        assert sum(len(batch[0]) for batch in iterator) == 8
    assert iterators[0] is iterators[1], "persistent workers: one iterator for both passes"
    assert isinstance(iterators[0], _MultiProcessingDataLoaderIter)
    return iterators[0]


def _growth(build_and_close: Callable[[], Any]) -> tuple[int, int, list[Any]]:
    """Descriptors gained over LOADERS loaders, each built, used and closed by the callable.

    What the callable returns is kept alive (as a framework, a traceback or older torch's
    ``atexit`` registration would keep it), so nothing is left to garbage collection.
    """
    kept = [build_and_close()]  # warm-up: one-time imports, signal handlers, allocator pools
    before = _Descriptors()
    for _ in range(LOADERS):
        kept.append(build_and_close())
    new, counted = before.growth()
    return new, counted, kept


def _loaderkit_persistent_pinned() -> tuple[Any, _MultiProcessingDataLoaderIter]:
    loader = create_dataloader(
        SquareDataset(8), batch_size=4, num_workers=WORKERS, persistent_workers=True,
        pin_memory=True,
    )  # fmt: skip
    iterator = _two_passes(loader)
    assert iterator._pin_memory and iterator._pin_memory_thread is not None
    loader.close()
    return loader, iterator


def _torch_persistent_pinned() -> tuple[Any, _MultiProcessingDataLoaderIter]:
    loader = torch.utils.data.DataLoader(
        SquareDataset(8), batch_size=4, num_workers=WORKERS, persistent_workers=True,
        pin_memory=True,
    )  # fmt: skip
    iterator = _two_passes(loader)
    assert iterator._pin_memory and iterator._pin_memory_thread is not None
    iterator._shutdown_workers()  # torch's own clean-up: what its atexit hook and __del__ run
    return loader, iterator


def test_close_leaves_no_descriptor_where_torch_keeps_four_per_loader(
    fake_pinning: list[int], record_property: Callable[[str, object], None]
) -> None:
    ours, ours_counted, kept = _growth(_loaderkit_persistent_pinned)
    assert fake_pinning, "the pin-memory thread did not run: the test would prove nothing"
    theirs, theirs_counted, kept_torch = _growth(_torch_persistent_pinned)
    per_loader = {"loaderkit": ours / LOADERS, "torch": theirs / LOADERS}
    record_property("fds_per_loader", per_loader)
    print(
        f"\nnew descriptors still open per persistent pinned loader ({WORKERS} workers, "
        f"{LOADERS} loaders): {per_loader}; psutil count change over {LOADERS} loaders: "
        f"loaderkit {ours_counted:+d}, torch {theirs_counted:+d}"
    )
    assert ours == 0, f"close() left {ours} descriptors over {LOADERS} loaders"
    assert theirs >= ours  # torch 2.13 on Linux/Python 3.11: 4 per loader (2 per worker)
    assert len(kept) == len(kept_torch) == LOADERS + 1


def test_closed_iterator_owns_nothing(fake_pinning: list[int]) -> None:
    _, iterator = _loaderkit_persistent_pinned()
    assert not iterator._pin_memory_thread.is_alive()
    queues = [iterator._worker_result_queue, *iterator._index_queues]
    # loaderkit's slot loaders use DirectQueue (loaderkit.workers.queues), others torch's queues
    assert all(isinstance(q, (multiprocessing.queues.Queue, DirectQueue)) for q in queues)
    for q in queues:
        assert q._reader.closed and q._writer.closed
        if isinstance(q, DirectQueue) and q._nonblocking is not None:
            assert q._nonblocking.fd < 0  # its non-blocking descriptor is closed too
    for worker in iterator._workers:
        assert worker.exitcode is not None and not worker.is_alive()
        assert worker._popen.finalizer is None or not worker._popen.finalizer.still_active()
        worker.join(0)  # the Process object stays usable after its pipe ends are closed
    assert iterator._data_queue.empty() and not iterator._task_info


def test_abandoned_iterators_and_plain_pinned_loaders_leak_nothing(
    fake_pinning: list[int],
) -> None:
    def non_persistent() -> Any:
        loader = create_dataloader(
            SquareDataset(8), batch_size=2, num_workers=WORKERS, pin_memory=True
        )
        for _ in range(2):
            assert len(list(loader)) == 4
        abandoned = iter(loader)  # left after one batch, still referenced
        next(abandoned)
        loader.close()
        return loader, abandoned

    growth, _, _ = _growth(non_persistent)
    assert growth == 0


def test_iterating_again_after_close_starts_fresh_workers(fake_pinning: list[int]) -> None:
    before = _Descriptors()
    loader = create_dataloader(
        SquareDataset(8), batch_size=4, num_workers=WORKERS, persistent_workers=True,
        pin_memory=True,
    )  # fmt: skip
    first = _two_passes(loader)
    loader.close()
    second = _two_passes(loader)  # fresh workers, fresh queues, pinned again
    assert second is not first
    assert [b[0].tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    loader.close()
    loader.close()  # idempotent
    assert before.growth()[0] == 0


def test_workers_held_by_an_atexit_hook_as_in_older_torch(
    fake_pinning: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch before the WeakSet of iterators: ``atexit.register(_clean_up_worker, w)`` for every
    # worker of a persistent pinned iterator, so the Process objects live until exit.
    held: list[Any] = []

    def register(self: _MultiProcessingDataLoaderIter) -> None:
        held.extend(self._workers)

    # torch 2.13 and later: simulate it; older torch (2.4) does it for real
    simulated = hasattr(_MultiProcessingDataLoaderIter, "_register_persistent_workers_atexit")
    if simulated:
        monkeypatch.setattr(
            _MultiProcessingDataLoaderIter, "_register_persistent_workers_atexit", register
        )

    def build_and_close() -> None:
        _loaderkit_persistent_pinned()  # the loader and its iterator are dropped here

    growth, _, _ = _growth(build_and_close)
    assert growth == 0
    if simulated:
        assert len(held) == (LOADERS + 1) * WORKERS
    for worker in held:  # what that atexit hook does at exit still works, silently
        worker.join(timeout=0.01)
        assert not worker.is_alive()
