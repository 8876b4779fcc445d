"""Batch-native reads: rows go from the file into one batch tensor; collation keeps it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

from loaderkit import DataLoader, HDF5SessionDataset, detect_platform, worker_rng
from loaderkit.hdf5.read.reader import SessionReader
from loaderkit.workers.collate import RowBatch, collate
from tests.hdf5.helpers import Scaled, ScaledRows, expected, write_sessions

ORDERS = {
    "runs": [3, 4, 5, 6, 20, 21, 22, 0],
    "random": [17, 2, 29, 8, 8, 13, 0, 25],
    "single": [11],
}


def _per_item(ds: HDF5SessionDataset, indices: list[int]) -> torch.Tensor:
    return torch.stack([torch.as_tensor(np.asarray(expected(ds, i))) for i in indices])


@pytest.mark.parametrize("layout", ["contiguous", "chunked", "gzip"])
@pytest.mark.parametrize("order", list(ORDERS))
def test_rows_land_in_one_tensor_in_request_order(tmp_path: Path, layout: str, order: str) -> None:
    options: dict[str, Any] = {
        "contiguous": {},
        "chunked": {"chunks": 4},
        "gzip": {"chunks": 4, "compression": "gzip"},
    }[layout]
    ds = HDF5SessionDataset(write_sessions(tmp_path, [10, 12, 9], **options), key="betas")
    indices = ORDERS[order]
    batch = ds.__getitems__(indices)
    assert isinstance(batch, RowBatch)
    assert torch.equal(batch.tensor, _per_item(ds, indices))
    assert collate(batch) is batch.tensor  # no split, no re-stack, no copy
    # any other collate_fn sees per-sample numpy rows, as per-item reads give
    assert all(isinstance(row, np.ndarray) for row in batch)
    assert torch.equal(default_collate(list(batch)), batch.tensor)
    assert batch[0].__array_interface__["data"][0] == batch.tensor.data_ptr()


@pytest.mark.parametrize("memory_map", [False, True])
def test_a_batch_takes_each_sessions_file_once(tmp_path: Path, memory_map: bool) -> None:
    """Rows that alternate between sessions: one lease of each session's file per batch."""
    ds = HDF5SessionDataset(
        write_sessions(tmp_path, [10, 12, 9]), key="betas", memory_map=memory_map
    )
    indices = [0, 10, 22, 1, 11, 23, 5, 15, 25, 2]  # sessions 0, 1, 2, 0, 1, 2, ...
    ds.__getitems__(indices)  # opens the three files
    before = ds.handles.file_pool_info()
    batch = ds.__getitems__(indices)
    after = ds.handles.file_pool_info()
    assert torch.equal(batch.tensor, _per_item(ds, indices))
    assert (after.hits - before.hits, after.misses - before.misses) == (3, 0)


def test_scalar_rows_and_integer_dtypes(tmp_path: Path) -> None:
    path = tmp_path / "s.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(20, dtype="i2"))
    ds = HDF5SessionDataset([path], key="x")
    batch = ds.__getitems__([4, 2, 9])
    assert batch.tensor.dtype == torch.int16 and batch.tensor.tolist() == [4, 2, 9]
    loader = DataLoader(ds, batch_size=5)
    assert next(iter(loader)).tolist() == [0, 1, 2, 3, 4]


def test_non_native_byte_order_keeps_the_batched_path(tmp_path: Path) -> None:
    path = tmp_path / "be.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(12, dtype=">f4").reshape(6, 2))
    ds = HDF5SessionDataset([path], key="x")
    assert ds.handles.read_path[0] == "batch-native"
    samples = ds.__getitems__([1, 3])
    assert isinstance(samples, RowBatch) and samples.tensor.dtype == torch.float32
    assert [s.tolist() for s in samples] == [[2.0, 3.0], [6.0, 7.0]]
    assert all(s.dtype.isnative for s in samples) and ds[1].dtype.isnative

    class Plus(HDF5SessionDataset):
        def transform(self, sample: Any, index: int) -> Any:
            return sample + 100

    plus = Plus([path], key="x")  # transformed once, by the item and the batch paths alike
    assert plus[1].tolist() == [102.0, 103.0]
    assert [s.tolist() for s in plus.__getitems__([1, 3])] == [[102.0, 103.0], [106.0, 107.0]]
    seeded = plus.loader_support().read_seeded([1], lambda i: None)
    assert [s.tolist() for s in seeded] == [[102.0, 103.0]]


def test_in_a_worker_the_batch_is_allocated_in_shared_memory(tmp_path: Path) -> None:
    ds = HDF5SessionDataset(write_sessions(tmp_path, [30, 30]), key="betas")
    loader = DataLoader(ds, batch_size=8, num_workers=2)
    assert loader.collate_fn is collate
    assert loader.plan["read_path"].value == "batch-native"
    shared, batches = [], []
    for batch in loader:  # the loop lets each batch go: every one crosses in a slot
        shared.append(batch.is_shared())
        batches.append(batch.clone())
    loader.close()
    assert all(shared)
    assert torch.equal(torch.cat(batches), _per_item(ds, list(range(60))))


def _record_types(batch: list[Any]) -> list[str]:
    return [type(sample).__name__ for sample in batch]


def test_a_user_collate_fn_gets_per_sample_rows(tmp_path: Path) -> None:
    ds = HDF5SessionDataset(write_sessions(tmp_path, [10]), key="betas")
    loader = DataLoader(ds, batch_size=4, num_workers=1, collate_fn=_record_types)
    assert loader.collate_fn is _record_types  # explicit values win
    assert "collate_fn" not in loader.plan
    assert next(iter(loader)) == ["ndarray"] * 4
    loader.close()


def test_the_plan_names_each_read_path(tmp_path: Path) -> None:
    paths = write_sessions(tmp_path, [10])
    cases = {
        HDF5SessionDataset: "batch-native",
        Noisy: "batch-native",
        Scaled: "per-sample",
        ScaledRows: "runs",
    }
    # Where torch refuses numpy bools (or warns it soon will: torch 2.4 and 2.6 under newer
    # numpy), per-sample paths collate with loaderkit.workers.collate too
    # (loaderkit._torch.collate).
    every_path = not detect_platform().numpy_bools_collate
    for cls, path in cases.items():
        loader = DataLoader(cls(paths, key="betas"), batch_size=2)
        assert loader.plan["read_path"].value == path, cls
        assert ("collate_fn" in loader.plan) == (every_path or path == "batch-native"), cls


# ------------------------------------------------------------------ seeded per-sample transform


class Noisy(HDF5SessionDataset):
    """A random per-sample transform drawing from worker_rng, torch and numpy."""

    def transform(self, sample: Any, index: int) -> Any:
        flip = worker_rng().random() < 0.5
        noise = torch.randn(sample.shape).numpy() + np.random.rand(*sample.shape)
        out = (sample[..., ::-1] if flip else sample) + noise.astype(sample.dtype)
        return torch.from_numpy(np.ascontiguousarray(out)) + index


class NoisyPerItem(HDF5SessionDataset):
    """The same transform through __getitem__ (the per-sample read path)."""

    def __getitem__(self, index: int) -> Any:
        return Noisy.transform(self, super().__getitem__(index), int(index))  # type: ignore[arg-type]


def test_transform_applies_to_items_and_batches(tmp_path: Path) -> None:
    class Plus(HDF5SessionDataset):
        def transform(self, sample: Any, index: int) -> Any:
            return sample + index

    ds = Plus(write_sessions(tmp_path, [6, 6]), key="betas")
    assert np.array_equal(ds[7], expected(ds, 7) + 7)
    batch = ds.__getitems__([7, 1])
    assert [np.array_equal(b, expected(ds, i) + i) for b, i in zip(batch, [7, 1], strict=True)] == [
        True
    ] * 2


def _epochs(cls: type, paths: list[Path], workers: int, batches: int = 0) -> list[torch.Tensor]:
    loader = DataLoader(
        cls(paths, key="betas"),
        batch_size=5,
        shuffle="block",
        seed=3,
        sample_seeding=True,
        num_workers=workers,
    )
    out = [b.clone() for _ in range(2) for b in loader]
    loader.close()
    return out


def test_sample_seeding_keeps_batched_reads_and_matches_per_sample_seeding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = write_sessions(tmp_path, [13, 9, 11])
    calls: list[int] = []
    original = SessionReader.read_batch

    def counting(self: SessionReader, idx: np.ndarray, keys: np.ndarray) -> Any:
        calls.append(idx.size)
        return original(self, idx, keys)

    monkeypatch.setattr(SessionReader, "read_batch", counting)
    batched = _epochs(Noisy, paths, 0)
    assert len(calls) == len(batched) and sum(calls) == 2 * 33  # one read per batch
    # bit-identical to the per-sample path and across worker counts (fork inherits the patch)
    assert all(
        torch.equal(a, b) for a, b in zip(batched, _epochs(NoisyPerItem, paths, 0), strict=True)
    )
    for workers in (1, 3):
        again = _epochs(Noisy, paths, workers)
        assert all(torch.equal(a, b) for a, b in zip(batched, again, strict=True))


class ReportsSharing(HDF5SessionDataset):
    """Tags each batch with whether its buffer was allocated in shared memory."""

    def __getitems__(self, indices: list[int]) -> Any:
        batch = super().__getitems__(indices)
        assert isinstance(batch, RowBatch)
        return [batch.tensor.is_shared(), batch.tensor]


def test_only_a_loader_that_keeps_the_batch_allocates_it_in_shared_memory(tmp_path: Path) -> None:
    """Shared memory when the buffer is what torch sends; a private buffer otherwise."""
    # fork: the collate functions are local to the test (a spawn-like default cannot send them)
    ds = ReportsSharing(write_sessions(tmp_path, [20]), key="betas")

    def first(batch: list[Any]) -> bool:
        return bool(batch[0])

    ours = DataLoader(ds, batch_size=4, num_workers=1, multiprocessing_context="fork")
    ours.collate_fn = first  # what the worker allocated, as seen by loaderkit's own setup
    assert ours.worker_init_fn.shared_batches  # type: ignore[union-attr]
    assert all(next(iter(ours)) for _ in range(2))
    ours.close()
    other = DataLoader(
        ds, batch_size=4, num_workers=1, collate_fn=first, multiprocessing_context="fork"
    )
    assert not other.worker_init_fn.shared_batches  # type: ignore[union-attr]
    assert not next(iter(other))
    other.close()
    plain = torch.utils.data.DataLoader(
        ds, batch_size=4, num_workers=1, collate_fn=first, multiprocessing_context="fork"
    )
    assert not next(iter(plain))
