"""memory_map=True: contiguous rows copied out of a read-only map, bounded and released.

A batch is gathered with one ``np.take`` per session (interleaved sessions: into a scratch
batch, then scattered into request order), never run by run.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from loaderkit import DataLoader, HDF5SessionDataset
from loaderkit.hdf5.read import reader
from loaderkit.hdf5.read.rawio import map_rows, raw_location
from loaderkit.hdf5.read.sessionfiles import SessionFiles
from loaderkit.support import LoaderShape
from tests.hdf5.helpers import expected, hdf5_fds, run_in_threads, write_sessions

ORDERS = [
    list(range(3, 40)),  # block-like: long runs in one session
    [17, 2, 29, 8, 8, 13, 0, 25, 31, 30, 29],  # scattered, duplicates
    [5],
]


@pytest.mark.parametrize("order", ORDERS)
def test_mapped_reads_equal_the_stored_rows(tmp_path: Path, order: list[int]) -> None:
    paths = write_sessions(tmp_path, [20, 12, 9])
    ds = HDF5SessionDataset(paths, key="betas", memory_map=True)
    want = np.stack([expected(ds, i) for i in order])
    assert np.array_equal(np.stack(list(ds.__getitems__(order))), want)
    assert np.array_equal(np.stack([ds[i] for i in order]), want)
    assert ds._reader.files.file_pool.get(0).maps[0] is not None  # really mapped
    ds.close()
    assert hdf5_fds(tmp_path) == []  # maps and files released


def test_items_are_copies_not_views_of_the_map(tmp_path: Path) -> None:
    ds = HDF5SessionDataset(write_sessions(tmp_path, [4]), key="betas", memory_map=True)
    sample = ds[1]
    assert sample.flags.writeable and sample.base is None
    ds.close()
    assert sample.sum() == expected(ds, 1).sum()  # still readable after the map is gone


def test_each_open_file_holds_two_descriptors_and_the_bound_counts_them(tmp_path: Path) -> None:
    paths = write_sessions(tmp_path, [5] * 6)
    ds = HDF5SessionDataset(paths, key="betas", memory_map=True, max_open_files=2)
    assert ds.budgets.fds_per_file == 2
    for i in (0, 7, 14, 21, 0, 28, 7):  # sessions 0 1 2 4 0 5 1: evictions all along
        ds.__getitems__([i, i + 1])
        assert len(hdf5_fds(tmp_path)) <= 2 * 2
    budget = ds.budgets.file_budget(
        LoaderShape(1, open_files_soft=100)
    )  # per process: 6 files x 2 fit what a worker has left
    assert budget.files == 6 and "x 2 descriptors" in budget.reason
    assert ds.budgets.file_budget(LoaderShape(1, open_files_soft=70)).files < 6
    mapped = HDF5SessionDataset(paths, key="betas", memory_map=True)
    wide = mapped.budgets.file_budget(LoaderShape(3, open_files_soft=1024))
    assert "x 2 descriptors" in wide.reason
    ds.close()


def test_chunked_data_is_not_mapped(tmp_path: Path) -> None:
    paths = write_sessions(tmp_path, [12], chunks=4)
    ds = HDF5SessionDataset(paths, key="betas", memory_map=True)
    assert ds.budgets.fds_per_file == 1
    assert np.array_equal(ds[5], expected(ds, 5))
    assert ds._reader.files.file_pool.get(0).maps[0] is None
    ds.close()


def test_a_file_shorter_than_its_data_is_not_mapped(tmp_path: Path) -> None:
    path = tmp_path / "short.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(64, dtype="f4").reshape(16, 4))
    with h5py.File(path, "r") as f:
        raw = raw_location(f, f["x"])
        assert raw is not None
        assert map_rows(raw, (10**6, 4), np.dtype("f4")) is None  # past the end of the file
        assert map_rows(raw, (0, 4), np.dtype("f4")) is None  # nothing to map


def test_loader_with_mapped_workers(tmp_path: Path) -> None:
    paths = write_sessions(tmp_path, [30, 30])
    ds = HDF5SessionDataset(paths, key="betas", memory_map=True)
    loader = DataLoader(ds, batch_size=8, shuffle="block", seed=0, num_workers=2)
    order = list(loader.sampler)
    got = torch.cat(list(loader))
    loader.close()
    want = torch.stack([torch.as_tensor(expected(ds, i)) for i in order])
    assert torch.equal(got, want)
    assert hdf5_fds(tmp_path) == []


INTERLEAVED = [40, 1, 25, 33, 2, 39, 26, 0, 34, 3, 27, 38, 0, 35, 4, 28]  # sessions alternate


def test_interleaved_sessions_are_gathered_session_by_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = write_sessions(tmp_path, [20, 12, 9])
    ds = HDF5SessionDataset(paths, key="betas", memory_map=True)
    want = np.stack([expected(ds, i) for i in INTERLEAVED])
    takes: list[int] = []
    real_take = np.take

    def counted(*args: object, **kwargs: object) -> object:
        takes.append(1)
        return real_take(*args, **kwargs)  # type: ignore[call-overload]

    def no_row_by_row(*args: object) -> None:
        raise AssertionError("an interleaved batch was copied run by run")

    monkeypatch.setattr(SessionFiles, "fill_run", no_row_by_row)
    monkeypatch.setattr(reader.np, "take", counted)
    assert np.array_equal(np.stack(list(ds.__getitems__(INTERLEAVED))), want)
    assert len(takes) == 3  # one per session, not one per row
    ds.close()


def test_interleaved_big_endian_rows_are_converted(tmp_path: Path) -> None:
    paths = write_sessions(tmp_path, [20, 12, 9], dtype=">f4")
    ds = HDF5SessionDataset(paths, key="betas", memory_map=True)
    got = np.stack(list(ds.__getitems__(INTERLEAVED)))
    assert got.dtype == np.dtype("f4")  # native order, as torch needs
    assert np.array_equal(got, np.stack([expected(ds, i) for i in INTERLEAVED]))
    ds.close()


def test_threads_gathering_from_maps_get_their_own_rows(tmp_path: Path) -> None:
    paths = write_sessions(tmp_path, [40, 33, 27, 50])
    ds = HDF5SessionDataset(paths, key="betas", memory_map=True)
    rng = np.random.default_rng(0)
    orders = [rng.integers(0, len(ds), 32).tolist() for _ in range(60)]
    wrong: list[int] = []

    def read(part: range) -> None:
        for i in part:
            want = np.stack([expected(ds, j) for j in orders[i]])
            if not np.array_equal(np.stack(list(ds.__getitems__(orders[i]))), want):
                wrong.append(i)

    run_in_threads(read, 60, 3)
    assert not wrong
    ds.close()
