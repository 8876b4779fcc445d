"""loaderkit's worker hand-off: batches in long-lived slots, never changed, never leaked.

Real worker processes (fork, spawn, forkserver), real SIGKILL, ``/dev/shm`` counts and the
process's own memory maps (``/proc/self/maps``: every slot segment is a ``memfd`` mapping named
``loaderkit-batches``). No test here measures speed (``benchmarks/handoff.py`` does).
"""

from __future__ import annotations

import gc
import os
import signal
import time
from collections import namedtuple
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, TensorDataset

from loaderkit import create_dataloader
from loaderkit.workers import handoff as handoff_module
from loaderkit.workers.handoff import HandoffCounts, Receiver
from loaderkit.workers.wire import FREE, HEADER, SlotBatch
from loaderkit.workers.worker import HandoffConfig, WorkerPool
from tests.conftest import fake_platform
from tests.helpers import START_METHODS, child_pids, needs_in_order, tiered, wait_children_gone

#: Fast tier: fork (slots inherited) and spawn (slots sent to a fresh interpreter); forkserver
#: sends them the way spawn does and runs in the slow tier.
CONTEXTS = tiered(START_METHODS, {"fork", "spawn"})
#: A killed worker: fork in the fast tier (the same teardown path under every start method).
KILLED_CONTEXTS = tiered(START_METHODS, {"fork"})
Pair = namedtuple("Pair", ["x", "y"])


def slot_mappings() -> int:
    """Slot segments mapped in this process."""
    return Path("/proc/self/maps").read_text().count("loaderkit-batches")


def shm_entries() -> set[str]:
    """``/dev/shm`` entries other than multiprocessing's short-lived semaphores."""
    return {name for name in os.listdir("/dev/shm") if not name.startswith("sem.")}


def rows(n: int = 400, width: int = 256) -> TensorDataset:
    data = torch.arange(n * width, dtype=torch.float32).view(n, width)
    return TensorDataset(data, torch.arange(n))


class DictSamples(Dataset[dict[str, Any]]):
    def __len__(self) -> int:
        return 200

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {
            "x": np.full((3, 8), i, np.float32),
            "pair": Pair(torch.tensor(i), torch.full((4,), i, dtype=torch.int16)),
            "name": f"s{i}",
        }


class Words(Dataset[str]):
    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> str:
        return f"word{i}"


class Slow(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 2000

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.001)
        return torch.full((4096,), float(i))


def check_rows(x: torch.Tensor, y: torch.Tensor, width: int = 256) -> None:
    expected = y.to(torch.float32)[:, None] * width + torch.arange(width, dtype=torch.float32)
    assert torch.equal(x, expected)


@pytest.mark.parametrize("context", CONTEXTS)
def test_keeping_every_batch_changes_none(context: str) -> None:
    before = shm_entries()
    loader = create_dataloader(
        rows(), batch_size=16, num_workers=2, multiprocessing_context=context, seed=0,
        training=True,
    )  # fmt: skip
    kept = [(x, y, x.clone(), y.clone()) for x, y in loader]
    assert len(kept) == 25
    for x, y, x0, y0 in kept:
        assert torch.equal(x, x0) and torch.equal(y, y0)
        check_rows(x, y)
    stats = loader.handoff_stats()
    assert stats.path == "slots" and stats.slots == 5
    assert stats.pooled == 25 and stats.fallback == 0 and stats.batches == 25
    # the loop holds 3 slots of each worker (HANDOFF_HELD); past those, batches are copied out
    assert stats.kept == 25 - 2 * 3
    del kept
    gc.collect()
    for x, y in loader:  # slots free again, and the loop keeps nothing: every batch pooled
        check_rows(x, y)
    assert loader.handoff_stats().pooled == stats.pooled + 25
    loader.close()
    del x, y
    gc.collect()
    assert slot_mappings() == 0
    assert shm_entries() <= before


def test_views_and_slices_keep_their_batch() -> None:
    with create_dataloader(rows(), batch_size=16, num_workers=1, persistent_workers=True) as lo:
        for _ in range(2):
            slices = [(x[3:5], x[0].view(16, 16), y) for x, y in lo]
            for part, first, y in slices:
                check_rows(part, y[3:5])
                assert torch.equal(first.reshape(-1), part.new_tensor(range(256)) + 256 * y[0])
            stats = lo.handoff_stats()
            assert stats.kept > 0 and stats.fallback == 0  # views kept: their batches copied out


def test_default_collate_structures_are_pooled_in_place() -> None:
    with create_dataloader(DictSamples(), batch_size=10, num_workers=2) as loader:
        for k, batch in enumerate(loader):
            ids = torch.arange(k * 10, k * 10 + 10)
            assert batch["name"] == [f"s{i}" for i in ids.tolist()]
            assert torch.equal(batch["x"], ids.float()[:, None, None].expand(10, 3, 8))
            assert isinstance(batch["pair"], Pair)
            assert torch.equal(batch["pair"].x, ids)
            assert batch["pair"].y.dtype == torch.int16
        stats = loader.handoff_stats()
    assert stats.pooled == 20 and stats.fallback == 0 and stats.other == 0
    assert stats.copied <= 2  # the first batch of each worker sizes its slots


def test_batches_without_tensors_take_torchs_path() -> None:
    with create_dataloader(Words(), batch_size=4, num_workers=2) as loader:
        batches = list(loader)
        stats = loader.handoff_stats()
    assert batches[0] == ["word0", "word1", "word2", "word3"]
    assert stats.pooled == 0 and stats.other == 10


def test_tensors_requiring_grad_take_torchs_path() -> None:
    def collate(batch: list[Any]) -> torch.Tensor:
        return torch.tensor(batch, dtype=torch.float32).requires_grad_()

    # fork: the collate function is local to the test
    fork = {"multiprocessing_context": "fork"}
    with create_dataloader(
        list(range(20)), batch_size=5, num_workers=1, collate_fn=collate, **fork
    ) as lo:
        got = list(lo)
        assert lo.handoff_stats().other == 4
    assert got[1].requires_grad and got[1].tolist() == [5, 6, 7, 8, 9]


def test_batches_that_grow_get_bigger_slots() -> None:
    sizes = [[0], list(range(1, 40)), [40, 41], list(range(42, 142))]
    with create_dataloader(rows(), batch_sampler=sizes * 3, num_workers=1) as loader:
        got = [(x.clone(), y.clone()) for x, y in loader]
        stats = loader.handoff_stats()
    assert [len(y) for _, y in got] == [len(s) for s in sizes] * 3
    for x, y in got:
        check_rows(x, y)
    assert stats.slot_bytes >= 100 * 256 * 4 and stats.fallback == 0


def test_custom_collate_is_copied_into_a_slot() -> None:
    def collate(batch: list[Any]) -> dict[str, torch.Tensor]:
        xs, ys = zip(*batch, strict=True)
        return {"x": torch.stack(xs) * 2, "y": torch.stack(ys)}

    # fork: the collate function is local to the test
    with create_dataloader(
        rows(), batch_size=20, num_workers=2, collate_fn=collate, multiprocessing_context="fork"
    ) as loader:
        for batch in loader:
            check_rows(batch["x"] / 2, batch["y"])
        stats = loader.handoff_stats()
    assert stats.pooled == 20 and stats.copied == 20


@needs_in_order
def test_out_of_order_and_resume() -> None:
    loader = create_dataloader(rows(), batch_size=16, num_workers=2, in_order=False)
    seen = sorted(int(y[0]) for _, y in loader)
    assert seen == list(range(0, 400, 16))
    loader.close()
    first = create_dataloader(rows(), batch_size=16, num_workers=2, shuffle=True, seed=3)
    iterator = iter(first)
    taken = [next(iterator)[1].clone() for _ in range(5)]
    state = first.state_dict()
    rest = [y.clone() for _, y in iterator]
    first.close()
    resumed = create_dataloader(rows(), batch_size=16, num_workers=2, shuffle=True, seed=3)
    resumed.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(rest, [y for _, y in resumed], strict=True))
    assert len(taken) + len(rest) == 25
    resumed.close()


@pytest.mark.parametrize("context", KILLED_CONTEXTS)
# fast: persistent workers (the pool kept across passes); the other cell is a second SIGKILL trial
@pytest.mark.parametrize("persistent", tiered([True, False], {True}))
def test_killed_worker_leaves_nothing(context: str, persistent: bool) -> None:
    before_shm = shm_entries()
    before = child_pids()
    loader = create_dataloader(
        Slow(), batch_size=8, num_workers=2, multiprocessing_context=context,
        persistent_workers=persistent,
    )  # fmt: skip
    iterator = iter(loader)
    kept = [next(iterator) for _ in range(3)]
    victim = sorted(child_pids() - before)[0]
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(RuntimeError, match=r"killed by signal|SIGKILL|exited unexpectedly"):
        for _ in iterator:
            pass
    _ = None  # the last batch the loop saw
    loader.close()
    del iterator
    assert wait_children_gone(before) == set()
    assert torch.equal(kept[0][:, 0], torch.arange(8, dtype=torch.float32))  # still readable
    del kept
    gc.collect()
    assert slot_mappings() == 0
    assert shm_entries() <= before_shm


@pytest.mark.parametrize("persistent", [True, False])
def test_exception_in_the_loop_then_close_releases_slots(persistent: bool) -> None:
    loader = create_dataloader(rows(), batch_size=8, num_workers=2, persistent_workers=persistent)
    with pytest.raises(ZeroDivisionError):
        for k, _ in enumerate(loader):
            if k == 3:
                raise ZeroDivisionError
    assert slot_mappings() > 0
    _ = None
    loader.close()
    gc.collect()
    assert slot_mappings() == 0


def test_abandoned_epoch_frees_slots_for_the_next() -> None:
    with create_dataloader(rows(), batch_size=8, num_workers=2, persistent_workers=True) as lo:
        for k, _ in enumerate(lo):
            if k == 2:
                break
        assert [int(y[0]) for _, y in lo] == list(range(0, 400, 8))
        stats = lo.handoff_stats()
    assert stats.fallback == 0


def test_interpreter_exit_leaves_nothing(tmp_path: Path) -> None:
    script = tmp_path / "run.py"
    script.write_text(
        "import torch\n"
        "from torch.utils.data import TensorDataset\n"
        "from loaderkit import create_dataloader\n"
        "if __name__ == '__main__':\n"
        "    ds = TensorDataset(torch.zeros(400, 1024))\n"
        "    loader = create_dataloader(ds, batch_size=16, num_workers=2,\n"
        "                               persistent_workers=True, multiprocessing_context='spawn')\n"
        "    kept = [b for b in loader]\n"
        "    it = iter(loader); next(it)\n"
        "    print(loader.handoff_stats().pooled)\n"
    )
    before = shm_entries()
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True
    )
    assert int(out.stdout.split()[-1]) > 0
    assert shm_entries() <= before


def test_plan_row_and_torch_path_elsewhere() -> None:
    linux = create_dataloader(rows(), batch_size=8, num_workers=2)
    assert linux.plan["handoff"].value == "slot pool (5 per worker)"
    assert "slot" in linux.plan["handoff"].reason
    mac = create_dataloader(
        rows(), batch_size=8, num_workers=2, platform=fake_platform(os_name="Darwin")
    )
    assert mac.plan["handoff"].value == "torch"
    assert mac.handoff_stats().path == "torch"
    got = list(mac)
    assert mac.handoff_stats().pooled == 0 and len(got) == 50
    mac.close()
    none = create_dataloader(rows(), batch_size=8)
    assert "handoff" not in none.plan
    assert none.handoff_stats().path == "torch"


# --------------------------------------------------------------------------- pinning seam


class FakePin:
    """Stands in for cudaHostRegister / cudaHostUnregister."""

    def __init__(self, accept: bool = True) -> None:
        self.accept = accept
        self.registered: dict[int, int] = {}
        self.unregistered: list[int] = []

    def register(self, address: int, size: int) -> bool:
        if self.accept:
            self.registered[address] = size
        return self.accept

    def unregister(self, address: int) -> None:
        self.unregistered.append(address)


def _one_batch(pin: Any, *, lend: bool = False) -> tuple[Receiver, Any, WorkerPool]:
    """A batch packed by a worker pool in this process, then received as the main process.

    ``lend``: the receiver lends pinned slots as they are (a ``DevicePrefetcher`` consumes).
    """
    counts = HandoffCounts()
    receiver = Receiver(counts, pin)
    receiver.lend_pinned = lend
    pool = WorkerPool(HandoffConfig(receiver.token, 2), worker_id=0)
    message = pool.pack({"x": torch.arange(6.0).view(2, 3), "n": 7})
    assert isinstance(message, SlotBatch)
    received = __import__("pickle").loads(__import__("pickle").dumps(message))
    return receiver, received, pool


class Lend:
    """A ``DupFd`` for one process: the descriptor itself, duplicated."""

    def __init__(self, fd: int) -> None:
        self.fd = os.dup(fd)

    def detach(self) -> int:
        return self.fd


def _pickle_in_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    # a DupFd outside a spawning process needs the resource sharer; in one process, lend the fd
    import multiprocessing.reduction

    monkeypatch.setattr(multiprocessing.reduction, "DupFd", Lend)


def test_pinned_slots_lent_to_a_prefetcher_are_returned_without_a_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _pickle_in_worker(monkeypatch)
    copies: list[Any] = []
    monkeypatch.setattr(handoff_module._torch, "pin_memory", lambda b, d=None: copies.append(b))
    pin = FakePin()
    receiver, received, pool = _one_batch(pin, lend=True)
    assert received.pinned and len(pin.registered) == 1
    (address,) = pin.registered
    batch = received.pin_memory()
    assert copies == []  # torch's pin step did not copy
    assert batch["n"] == 7 and torch.equal(batch["x"], torch.arange(6.0).view(2, 3))
    assert address <= batch["x"].data_ptr() < address + pin.registered[address]
    assert receiver.counts.pinned and receiver.counts.pooled == 1
    segment = pool.segment
    assert segment is not None and segment.state(0) != FREE
    receiver.poll()
    assert segment.state(0) != FREE  # the batch is alive
    del batch, received
    receiver.poll()
    assert segment.state(0) == FREE  # the slot is free once the batch is gone
    receiver.close()
    gc.collect()
    assert pin.unregistered == [address]  # unpinned when the last lease went


def test_unpinned_slots_are_copied_then_freed(monkeypatch: pytest.MonkeyPatch) -> None:
    _pickle_in_worker(monkeypatch)
    monkeypatch.setattr(
        handoff_module._torch, "pin_memory", lambda b, d=None: {k: (v.clone() if
        isinstance(v, torch.Tensor) else v) for k, v in b.items()}
    )  # fmt: skip
    receiver, received, pool = _one_batch(FakePin(accept=False))
    assert not received.pinned
    batch = received.pin_memory()
    del received
    receiver.poll()
    segment = pool.segment
    assert segment is not None and segment.state(0) == FREE  # freed right after the copy
    assert torch.equal(batch["x"], torch.arange(6.0).view(2, 3))
    receiver.close()


def test_worker_pool_never_reuses_a_busy_slot() -> None:
    pool = WorkerPool(HandoffConfig(1, 2), worker_id=0)
    first = pool.pack(torch.ones(4))
    second = pool.pack(torch.ones(4))
    third = pool.pack(torch.ones(4))
    assert isinstance(first, SlotBatch) and isinstance(second, SlotBatch)
    assert {first.slot, second.slot} == {0, 1}
    assert type(third).__name__ == "FallbackBatch"
    segment = pool.segment
    assert segment is not None
    segment.set_state(1, FREE)
    assert pool.pack(torch.ones(4)).slot == 1
    assert HEADER % 4096 == 0


def test_a_held_storage_keeps_its_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    _pickle_in_worker(monkeypatch)
    receiver, received, pool = _one_batch(None)
    batch = received.materialize()
    assert batch["x"].is_shared()
    storage = batch["x"].untyped_storage()
    del batch, received
    receiver.poll()
    segment = pool.segment
    assert segment is not None and segment.state(0) != FREE  # the storage is still visible
    del storage
    receiver.poll()
    assert segment.state(0) == FREE
    receiver.close()
