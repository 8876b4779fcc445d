"""The hand-off switch, batches the loop keeps, and pinned slots under queued copies.

* ``handoff=`` is a public argument: ``"torch"`` rules the slot pool out (the plan says so),
  ``"slots"`` is refused where the pool cannot work, anything else is refused.
* A loop that keeps every batch gets every batch unchanged, with no batch on torch's path and
  no descriptor per kept batch: past the slots the loop may hold, batches are copied out of
  their slot in the training process. Keeping 6,000 batches from 2 workers under
  ``ulimit -n 1024`` finishes (torch's own hand-off dies there, shown with ``handoff="torch"``).
* Slots registered with CUDA (a fake backend here) are lent as they are only to a
  ``DevicePrefetcher``, which keeps each source batch until its copy's event has completed: a
  slot is never freed while that event is pending. Any other loop gets torch's pinned copy.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import os
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from torch.utils.data import Dataset, TensorDataset

from loaderkit import ConfigError, DevicePrefetcher, _torch, create_dataloader
from loaderkit.passes import LoaderPass
from loaderkit.workers import handoff as handoff_module
from loaderkit.workers.handoff import HandoffCounts, Receiver
from loaderkit.workers.wire import FREE, SlotBatch
from loaderkit.workers.worker import HandoffConfig, WorkerPool
from tests.conftest import fake_platform
from tests.helpers import tiered
from tests.workers.test_handoff import FakePin, _pickle_in_worker

REPO = Path(__file__).resolve().parents[2]


class Numbered(Dataset[torch.Tensor]):
    """Sample ``i`` is a row of 64 copies of ``i`` (a batch says which samples it holds)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((64,), float(i))


# --------------------------------------------------------------------------- the switch


def test_handoff_torch_rules_the_slot_pool_out() -> None:
    ds = TensorDataset(torch.arange(32.0))
    with create_dataloader(ds, batch_size=4, num_workers=2, handoff="torch") as loader:
        got = torch.cat([b for (b,) in loader])
        stats = loader.handoff_stats()
    assert torch.equal(got, torch.arange(32.0))
    row = loader.plan["handoff"]
    assert (row.requested, row.value) == ("torch", "torch")
    assert "as given" in row.reason
    assert stats.path == "torch" and stats.pooled == 0 and stats.batches == 8
    assert loader.handoff == "torch"


def test_handoff_auto_is_the_default_and_the_plan_says_why() -> None:
    with create_dataloader(list(range(8)), batch_size=2, num_workers=1) as loader:
        _ = list(loader)
    assert loader.handoff == "auto"
    assert loader.plan["handoff"].value.startswith("slot pool")
    assert loader.handoff_stats().path == "slots"


def test_handoff_slots_is_refused_where_the_pool_cannot_work() -> None:
    darwin = fake_platform(os_name="Darwin")
    with pytest.raises(ConfigError, match="handoff='slots' cannot work here: Darwin"):
        create_dataloader(list(range(8)), num_workers=2, handoff="slots", platform=darwin)
    auto = create_dataloader(list(range(8)), num_workers=2, platform=darwin)
    assert auto.plan["handoff"].value == "torch"


def test_an_unknown_handoff_is_refused_naming_the_choices() -> None:
    with pytest.raises(ConfigError, match="'auto', 'slots', 'torch'"):
        create_dataloader(list(range(8)), handoff="fast")  # type: ignore[arg-type]


def test_a_loader_rebuilt_from_its_attributes_keeps_the_switch() -> None:
    """Lightning rebuilds loaders from attributes named like the __init__ parameters."""
    loader = create_dataloader(list(range(8)), batch_size=2, num_workers=1, handoff="torch")
    names = [p for p in inspect.signature(type(loader).__init__).parameters if p != "self"]
    kwargs = {name: getattr(loader, name) for name in names if hasattr(loader, name)}
    kwargs.pop("batch_sampler", None), kwargs.pop("sampler", None)
    rebuilt = type(loader)(**kwargs)
    assert rebuilt.handoff == "torch" and rebuilt.plan["handoff"].value == "torch"


# ------------------------------------------------------------------------ kept batches


def _fds() -> int:
    return psutil.Process().num_fds()


# spawn keeps batches the way fork does (its slots: tests/workers/test_handoff.py, fast); slow tier
@pytest.mark.parametrize("context", tiered(["fork", "spawn"], {"fork"}))
def test_a_loop_keeping_every_batch_gets_them_unchanged_and_holds_no_descriptor(
    context: str,
) -> None:
    loader = create_dataloader(
        Numbered(400),
        batch_size=4,
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context=context,
    )
    with loader:
        list(loader)  # the workers are up, the slots mapped: the descriptors a loader needs
        before = _fds()
        kept = [batch for _ in range(2) for batch in loader]
        during = _fds()
        stats = loader.handoff_stats()
    expected = torch.arange(400.0).repeat_interleave(64).view(400, 64)
    for epoch in range(2):
        got = torch.cat(kept[epoch * 100 : (epoch + 1) * 100])
        assert torch.equal(got, expected), f"epoch {epoch}: a kept batch changed"
    assert stats.fallback == 0  # no batch went through a new shared-memory segment
    assert stats.kept >= 2 * 100 - 2 * stats.slots  # past the slots, copied out here
    assert during - before <= 4, (before, during)  # not one descriptor per kept batch


def _stock_threads() -> list[str]:
    import threading

    return [t.name for t in threading.enumerate() if t.name == "loaderkit-kept-batches"]


def test_a_loop_that_lets_its_batches_go_copies_none_out() -> None:
    with create_dataloader(Numbered(400), batch_size=4, num_workers=2) as loader:
        iterator = iter(loader)
        total = sum(float(batch.sum()) for batch in iterator)
        stats = loader.handoff_stats()
        hooks = _torch.hooks_of(iterator)
        assert isinstance(hooks, LoaderPass) and hooks.receiver is not None
        assert hooks.receiver.stock._thread is None  # no memory faulted in for nobody
    assert total == 64 * sum(range(400))
    assert stats.kept == 0 and stats.fallback == 0 and stats.pooled == 100


def test_the_stock_of_blocks_for_kept_batches() -> None:
    stock = handoff_module._Stock(depth=2)
    first = stock.take(1000)
    assert first.numel() == 1000 and first.dtype == torch.uint8
    assert len(_stock_threads()) == 1  # started by the first batch kept
    import time

    deadline = time.monotonic() + 10
    while len(stock._ready) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    ready = list(stock._ready)
    assert len(ready) == 2 and all(b.numel() >= 1000 for b in ready)
    block = stock.take(1000)
    assert any(block.data_ptr() == b.data_ptr() for b in ready)  # from the stock
    bigger = stock.take(5000)  # a bigger batch: the stock's smaller blocks are not used
    assert bigger.numel() == 5000 and bigger.data_ptr() not in {b.data_ptr() for b in ready}
    stock.close()
    deadline = time.monotonic() + 10
    while _stock_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _stock_threads() == [] and stock._ready == []
    assert stock.take(10).numel() == 10  # still serves, without a stock


_KEEP_UNDER_ULIMIT = """
import resource, sys
import torch
from torch.utils.data import Dataset
from loaderkit import create_dataloader

class Numbered(Dataset):
    def __len__(self):
        return 6000 * 2
    def __getitem__(self, i):
        return torch.full((16,), float(i))

if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
    loader = create_dataloader(Numbered(), batch_size=2, num_workers=2, handoff=sys.argv[1])
    kept = []
    try:
        for batch in loader:
            kept.append(batch)
    except Exception as error:
        print(f"died after {len(kept)} batches: {type(error).__name__}: {error}"[:300])
        sys.exit(3)
    changed = sum(
        not torch.equal(b, torch.arange(2 * k, 2 * k + 2.0).repeat_interleave(16).view(2, 16))
        for k, b in enumerate(kept)
    )
    print(f"kept {len(kept)} batches, {changed} changed, {loader.handoff_stats()}")
    loader.close()
    sys.exit(0 if changed == 0 and len(kept) == 6000 else 4)
"""


def _keep_under_ulimit(tmp_path: Path, handoff: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "keep.py"
    script.write_text(textwrap.dedent(_KEEP_UNDER_ULIMIT))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), *sys.path]))}
    return subprocess.run(
        [sys.executable, str(script), handoff],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
    )


@pytest.mark.slow  # a soak: 6,000 kept batches in a fresh interpreter under ulimit -n 1024
def test_keeping_6000_batches_under_ulimit_1024_finishes(tmp_path: Path) -> None:
    result = _keep_under_ulimit(tmp_path, "auto")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "kept 6000 batches, 0 changed" in result.stdout
    assert "fallback=0" in result.stdout


def test_torchs_own_handoff_runs_out_of_descriptors_there(tmp_path: Path) -> None:
    """The same loop with torch's hand-off: one descriptor per kept batch, until EMFILE."""
    result = _keep_under_ulimit(tmp_path, "torch")
    assert result.returncode == 3, result.stdout[-2000:] + result.stderr[-3000:]
    assert "died after" in result.stdout
    assert "Too many open files" in result.stdout + result.stderr or "received 0 items" in (
        result.stdout + result.stderr
    )


# ------------------------------------------------------- pinned slots and queued copies


def _copy_torch_pins(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """torch's pinning, faked on CPU: a copy into other memory (as the caching allocator's)."""
    copies: list[Any] = []

    def pin(batch: Any, device: Any = None) -> Any:
        copies.append(sorted(batch))  # what was copied, not the batch (it would keep the slot)
        return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    monkeypatch.setattr(handoff_module._torch, "pin_memory", pin)
    return copies


def test_a_plain_loop_gets_torchs_pinned_copy_and_the_slot_back_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``.to(non_blocking=True)`` may still read after the batch is dropped: not from a slot."""
    _pickle_in_worker(monkeypatch)
    copies = _copy_torch_pins(monkeypatch)
    pin = FakePin()
    receiver = Receiver(HandoffCounts(), pin)
    pool = WorkerPool(HandoffConfig(receiver.token, 2), worker_id=0)
    message = pool.pack({"x": torch.arange(6.0)})
    received = pickle.loads(pickle.dumps(message))
    assert len(pin.registered) == 1  # registered once all the same, for a prefetcher later
    assert not received.pinned  # but not lent as pinned: no prefetcher orders its reuse
    batch = received.pin_memory()  # what torch's pin-memory thread does
    assert len(copies) == 1 and torch.equal(batch["x"], torch.arange(6.0))
    del received
    receiver.poll()
    segment = pool.segment
    assert segment is not None and segment.state(0) == FREE  # before any copy from it is queued
    receiver.close()


class _Iterator:
    """What a loaderkit loader's iterator gives ``DevicePrefetcher``: batches and its hooks."""

    def __init__(self, batches: Iterator[Any], hooks: LoaderPass) -> None:
        self.batches = batches
        self.loaderkit_hooks = hooks

    def __iter__(self) -> _Iterator:
        return self

    def __next__(self) -> Any:
        return next(self.batches)


class _SlotLoader:
    """Batches a worker pool packs into slots and a pin-memory thread would pass on."""

    def __init__(self, n: int, pin: FakePin) -> None:
        self.n = n
        self.hooks = LoaderPass(dataset=None)
        self.receiver = Receiver(HandoffCounts(), pin)
        self.hooks.receiver = self.receiver
        self.pool = WorkerPool(HandoffConfig(self.receiver.token, 3), worker_id=0)
        self.slots: list[int] = []

    def _batches(self) -> Iterator[Any]:
        from tests.device.test_transfer import FakeHostTensor

        for i in range(self.n):
            self.receiver.poll()  # as the iterator does at every next
            message = self.pool.pack({"x": torch.full((2,), float(i))})
            assert isinstance(message, SlotBatch), "the prefetcher let no slot go back"
            self.slots.append(message.slot)
            batch = pickle.loads(pickle.dumps(message)).pin_memory()
            yield {"x": batch["x"].as_subclass(FakeHostTensor)}

    def __iter__(self) -> _Iterator:
        return _Iterator(self._batches(), self.hooks)

    def state(self, k: int) -> int:
        segment = self.pool.segment
        assert segment is not None
        return segment.state(self.slots[k])


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from tests.device import test_transfer

    backend = test_transfer.FakeBackend()
    monkeypatch.setattr(test_transfer, "BACKEND", backend)
    monkeypatch.setattr(DevicePrefetcher, "_backend", backend)
    _pickle_in_worker(monkeypatch)
    test_transfer.LOG.clear()
    yield backend
    test_transfer.LOG.clear()


def test_the_prefetcher_frees_a_pinned_slot_only_after_its_copy_completed(fake_gpu: Any) -> None:
    pin = FakePin()
    loader = _SlotLoader(6, pin)
    events: list[Any] = []
    new_event = fake_gpu.new_event

    def pending_event() -> Any:
        event = new_event()
        event.done = False  # the GPU is busy: the copy stays queued until the test says
        events.append(event)
        return event

    fake_gpu.new_event = pending_event
    with contextlib.closing(iter(DevicePrefetcher(loader, "cuda"))) as batches:
        first = next(batches)
        assert loader.receiver.lend_pinned  # lent as pinned: the prefetcher issues the copies
        assert int(first["x"][0]) == 0
        del first
        gc.collect()
        loader.receiver.poll()
        assert loader.state(0) != FREE  # dropped by the loop, but its copy may still read it
        events[0].done = True  # the copy of batch 0 completed
        second = next(batches)
        assert int(second["x"][0]) == 1
        loader.receiver.poll()
        assert loader.state(0) == FREE  # reused only now
        assert loader.state(1) != FREE  # batch 1's copy is still pending
        for event in events:
            event.done = True
        rest = [int(b["x"][0]) for b in batches]
    assert rest == [2, 3, 4, 5]
    assert not loader.receiver.lend_pinned  # the pass is over: plain loops get copies again
    loader.receiver.close()
