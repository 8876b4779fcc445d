"""A chunk index read from the file's own version-1 B-tree: exactly what HDF5 reports.

Every case compares ``btree1.chunk_records`` with HDF5's own ``H5Dchunk_iter`` on a real
file written by h5py (trees of one, two and three levels, rows of several axes, bands of
rows, byte orders, filters, unlimited axes, unwritten chunks, attributes that move header
messages into continuation blocks); formats it does not read give ``None``; a map whose
index disagrees with HDF5's lookup is not used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from loaderkit.hdf5.meta import btree1
from loaderkit.hdf5.meta.btree1 import ChunkRecords, chunk_records
from loaderkit.hdf5.read import rawio
from loaderkit.hdf5.read.readtable import read_table
from loaderkit.hdf5.read.widerows import read_rows_raw


def _iterated(dset: h5py.Dataset) -> ChunkRecords:
    got: list[Any] = []
    dset.id.chunk_iter(got.append)
    rank = len(dset.shape)
    return ChunkRecords(
        np.array([g.byte_offset for g in got], np.int64),
        np.array([g.chunk_offset for g in got], np.int64).reshape(len(got), rank),
        np.array([g.size for g in got], np.int64),
        np.array([g.filter_mask for g in got], np.int64),
    )


def _same(a: ChunkRecords, b: ChunkRecords) -> None:
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


CASES: dict[str, dict[str, Any]] = {
    "one level": dict(shape=(10, 50), chunks=(10, 1)),
    "two levels": dict(shape=(6, 3000), chunks=(6, 1)),
    "three levels": dict(shape=(4, 300_000), chunks=(4, 1)),
    "volume": dict(shape=(8, 6, 7, 5), chunks=(8, 1, 1, 1)),
    "bands": dict(shape=(40, 300), chunks=(16, 1)),
    "big endian": dict(shape=(10, 400), chunks=(10, 1), dtype=">f4"),
    "gzip": dict(shape=(10, 400), chunks=(10, 1), compression="gzip"),
    "unlimited": dict(shape=(10, 400), chunks=(10, 1), maxshape=(None, None)),
    "square chunks": dict(shape=(64, 64), chunks=(8, 8)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_records_are_hdf5s(tmp_path: Path, case: str) -> None:
    spec = dict(CASES[case])
    dtype = spec.pop("dtype", "<i2")
    path = tmp_path / "x.h5"
    data = (np.arange(int(np.prod(spec["shape"]))) % 30000).astype(dtype).reshape(spec["shape"])
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, **spec)
    with h5py.File(path, "r") as f:
        got = chunk_records(f, f["x"], read_table)
        assert got is not None
        _same(got, _iterated(f["x"]))


def test_unwritten_chunks_and_header_continuations(tmp_path: Path) -> None:
    path = tmp_path / "x.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset("x", shape=(10, 500), dtype="<i2", chunks=(10, 1))
        d[:, 7:300] = 1  # chunks 0-6 and 300-499 never written
        for i in range(40):  # attributes past the first header block: continuation messages
            d.attrs[f"a{i:02d}"] = np.arange(20.0) + i
    with h5py.File(path, "r") as f:
        got = chunk_records(f, f["x"], read_table)
        assert got is not None and got.addresses.shape[0] == 293
        _same(got, _iterated(f["x"]))
        assert rawio.chunk_map(f, f["x"]) is None  # unwritten chunks: HDF5 fills them


def test_unwritten_chunks_are_no_map_without_iterating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "x.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset("x", shape=(10, 500), dtype="<i2", chunks=(10, 1))
        d[:, 7:300] = 1
        f.create_dataset("y", data=np.ones((10, 500), "<i2"), chunks=(10, 1))

    def iterated(*args: Any) -> Any:
        raise AssertionError("HDF5 iterated an index already read")

    monkeypatch.setattr(rawio, "_iterated", iterated)
    with h5py.File(path, "r") as f:
        assert rawio.chunk_map(f, f["x"]) is None
        assert rawio.chunk_map(f, f["y"]) is not None  # every chunk written: a map


@pytest.mark.parametrize("how", ["latest format", "user block", "nothing written", "contiguous"])
def test_other_formats_are_left_to_hdf5(tmp_path: Path, how: str) -> None:
    path = tmp_path / "x.h5"
    options: dict[str, Any] = {
        "latest format": {"libver": "latest"},
        "user block": {"userblock_size": 512},
    }.get(how, {})
    with h5py.File(path, "w", **options) as f:
        if how == "contiguous":
            f.create_dataset("x", data=np.zeros((10, 40), "<i2"))
        else:
            d = f.create_dataset("x", shape=(10, 40), dtype="<i2", chunks=(10, 1))
            if how != "nothing written":
                d[...] = 3
    with h5py.File(path, "r") as f:
        assert chunk_records(f, f["x"], read_table) is None


def test_a_map_is_built_from_the_file_and_rows_read_through_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "x.h5"
    data = np.random.default_rng(0).integers(-999, 999, (30, 5000), dtype=np.int16)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=(30, 1))
    asked: list[int] = []
    iterated = rawio._iterated
    monkeypatch.setattr(rawio, "_iterated", lambda *a: asked.append(1) or iterated(*a))
    with h5py.File(path, "r") as f:
        cmap = rawio.chunk_map(f, f["x"])
        assert cmap is not None and not asked  # HDF5 was not asked for every chunk
        out = np.empty((3, 5000), np.int16)
        read_rows_raw(cmap, np.array([0, 17, 29]), out)
        np.testing.assert_array_equal(out, data[[0, 17, 29]])


def test_an_index_that_disagrees_with_hdf5_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "x.h5"
    data = np.arange(20 * 700, dtype="<i2").reshape(20, 700)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=(20, 1))
    real = chunk_records

    def wrong(f: h5py.File, dset: h5py.Dataset, read: Any) -> ChunkRecords | None:
        got = real(f, dset, read)
        assert got is not None
        addresses = got.addresses.copy()
        addresses[-1], addresses[-2] = addresses[-2], addresses[-1]  # the last one is checked
        return got._replace(addresses=addresses)

    monkeypatch.setattr(rawio, "chunk_records", wrong)
    asked: list[int] = []
    iterated = rawio._iterated
    monkeypatch.setattr(rawio, "_iterated", lambda *a: asked.append(1) or iterated(*a))
    with h5py.File(path, "r") as f:
        cmap = rawio.chunk_map(f, f["x"])
        assert cmap is not None and asked  # from HDF5's iteration instead
        out = np.empty((20, 700), "<i2")
        read_rows_raw(cmap, np.arange(20), out)
        np.testing.assert_array_equal(out, data)


def test_the_header_is_found_without_walking_the_index(tmp_path: Path, monkeypatch: Any) -> None:
    # h5o.get_info sums the chunk index's size, reading every B-tree node through HDF5
    # (0.28 s for a cold 300,000-chunk file): the header's address is asked another way
    path = tmp_path / "x.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("a", data=np.zeros((4, 10), "i2"), chunks=(4, 1))
        f.create_dataset("b", data=np.arange(6 * 3000).reshape(6, 3000) % 99, chunks=(6, 1))
    with h5py.File(path, "r") as f:
        want = {name: h5py.h5o.get_info(f[name].id).addr for name in ("a", "b")}
        iterated = _iterated(f["b"])

        def walks(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("h5o.get_info walks the chunk index")

        monkeypatch.setattr(h5py.h5o, "get_info", walks)
        assert {name: btree1._header_address(f[name]) for name in ("a", "b")} == want
        got = chunk_records(f, f["b"], read_table)
        assert got is not None
        _same(got, iterated)
