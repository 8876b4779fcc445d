"""Copies out of whole-file maps: real files, truncated, replaced, reused descriptors, threads."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from loaderkit import DataLoader
from loaderkit.errors import ConfigError, HDF5FileError
from loaderkit.hdf5 import HDF5SessionDataset
from loaderkit.hdf5.read.mapped import FileMaps


def _file(path: Path, data: bytes) -> int:
    path.write_bytes(data)
    return os.open(path, os.O_RDONLY)


def _table(fd: int, reads: list[tuple[int, int, int]]) -> np.ndarray:
    return np.array([(fd, *r) for r in reads], np.int64).reshape(-1, 4)


def test_copies_equal_the_bytes_of_every_read(tmp_path: Path) -> None:
    data = np.random.default_rng(0).integers(0, 255, 1 << 16, dtype=np.uint8).tobytes()
    fd = _file(tmp_path / "a", data)
    maps = FileMaps(2)
    try:
        rng = np.random.default_rng(1)
        where = rng.integers(0, len(data) - 100, 50)
        nbytes = rng.integers(0, 100, 50)
        into = np.concatenate(([0], np.cumsum(nbytes)[:-1]))
        out = np.zeros(int(nbytes.sum()), np.uint8)
        assert maps.copy(out, np.stack([np.full(50, fd), where, into, nbytes], axis=1))
        truth = b"".join(data[w : w + b] for w, b in zip(where, nbytes, strict=True))
        assert out.tobytes() == truth
    finally:
        maps.close()
        os.close(fd)


def test_a_truncated_file_is_refused_not_a_fault(tmp_path: Path) -> None:
    path = tmp_path / "t"
    fd = _file(path, bytes(8192))
    maps = FileMaps(2)
    out = np.zeros(16, np.uint8)
    try:
        assert maps.copy(out, _table(fd, [(8000, 0, 16)]))
        os.truncate(path, 4096)  # under the map: a copy of byte 8000 would be SIGBUS
        assert not maps.copy(out, _table(fd, [(8000, 0, 16)]))
        assert maps.copy(out, _table(fd, [(100, 0, 16)]))  # what is left still reads
    finally:
        maps.close()
        os.close(fd)


def test_a_reused_descriptor_and_a_grown_file_are_mapped_again(tmp_path: Path) -> None:
    maps = FileMaps(4)
    out = np.zeros(4, np.uint8)
    fd = _file(tmp_path / "a", b"aaaa" * 1024)
    assert maps.copy(out, _table(fd, [(0, 0, 4)])) and out.tobytes() == b"aaaa"
    os.close(fd)
    other = _file(tmp_path / "b", b"bbbb" * 1024)
    try:
        assert other == fd  # the lowest free number: the same one, another file
        assert maps.copy(out, _table(other, [(0, 0, 4)])) and out.tobytes() == b"bbbb"
        with open(tmp_path / "b", "ab") as f:
            f.write(b"cccc")
        assert maps.copy(out, _table(other, [(4096, 0, 4)])) and out.tobytes() == b"cccc"
    finally:
        maps.close()
        os.close(other)


def test_maps_serve_only_warm_tables_and_stop_after_a_slow_copy(tmp_path: Path) -> None:
    fd = _file(tmp_path / "a", bytes(range(256)) * 16)
    maps = FileMaps(1)
    out = np.zeros(4, np.uint8)
    table = _table(fd, [(1, 0, 4)])
    try:
        assert not maps.serve(out, table)
        maps.missed(0, FileMaps.WARM_READS - 1)
        maps.missed(3, 64)  # a miss starts the count again
        maps.missed(0, FileMaps.WARM_READS - 1)
        assert not maps.warm
        maps.missed(0, 1)  # reads in a row, however many tables they came in
        assert maps.serve(out, table) and out.tolist() == [1, 2, 3, 4]
        maps.missed(0, FileMaps.WARM_READS)  # warm again, whatever that copy's time was
        maps.SLOW = 0.0  # every copy is "slow": as if a page came from the disk
        assert maps.serve(out, table) and not maps.warm
        assert not maps.serve(out, table)
    finally:
        maps.close()
        os.close(fd)


@pytest.mark.usefixtures("no_slow_copies")  # a descheduled copy on a busy machine ends warm
def test_at_most_max_files_maps_are_kept_and_threads_copy_at_once(tmp_path: Path) -> None:
    fds = [_file(tmp_path / f"f{i}", bytes([i]) * 4096) for i in range(4)]
    maps = FileMaps(2)
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        out = np.zeros(8, np.uint8)
        rng = np.random.default_rng(seed)
        try:
            for _ in range(300):
                i = int(rng.integers(0, 4))
                assert maps.copy(out, _table(fds[i], [(10, 0, 8)]))
                assert (out == i).all()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(3)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert len(maps._maps) <= 2
    finally:
        maps.close()
        for fd in fds:
            os.close(fd)


sp = pytest.importorskip("scipy.sparse")


def _csr_file(path: Path) -> tuple[Path, Any]:
    from tests.hdf5.h5adfiles import uniform, write_csr

    m = uniform(3, cells=2000, genes=500, per=40)
    return write_csr(path, m, chunks=4096), m


@pytest.fixture
def no_slow_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    """No copy counts as slow: on a busy machine a descheduled copy would end the warm state."""
    monkeypatch.setattr(FileMaps, "SLOW", float("inf"))


@pytest.mark.usefixtures("no_slow_copies")
def test_a_csr_reader_copies_warm_batches_out_of_maps_and_rows_stay_equal(
    tmp_path: Path,
) -> None:
    path, m = _csr_file(tmp_path / "m.h5ad")
    with HDF5SessionDataset([path], key="X") as ds:
        assert ds.memory_map  # unset: loaderkit's choice, maps for warm CSR batches
        served = []
        reader = ds.handles.reader.matrix  # the CSR matrix part
        perm = np.random.default_rng(0).permutation(2000)
        batches = [perm[i : i + 32].tolist() for i in range(0, 2000, 32)] * 2
        loader = DataLoader(ds, batch_sampler=batches, num_workers=0)
        for rows, batch in zip(batches, loader, strict=True):
            assert np.array_equal(batch.to_dense().numpy(), m[rows].toarray())
            served.append(reader._maps is not None and reader._maps.warm)
        assert sum(served) > len(served) // 2  # most batches came out of the maps
        assert "whole-file maps" in str(loader.describe())


def test_memory_map_false_reads_every_piece_with_preadv(tmp_path: Path) -> None:
    path, _ = _csr_file(tmp_path / "m.h5ad")
    with HDF5SessionDataset([path], key="X", memory_map=False) as ds:
        assert not ds.memory_map
        for _ in range(3):
            for _batch in DataLoader(ds, batch_size=64, shuffle=True):
                pass
        assert ds.handles.reader.matrix._maps is None
    with pytest.raises(ConfigError, match="memory_map='yes'"):
        HDF5SessionDataset([path], key="X", memory_map="yes")  # type: ignore[arg-type]


@pytest.mark.usefixtures("no_slow_copies")
def test_a_file_truncated_while_maps_serve_is_a_named_error_not_sigbus(tmp_path: Path) -> None:
    path, _ = _csr_file(tmp_path / "m.h5ad")
    with HDF5SessionDataset([path], key="X") as ds:
        reader = ds.handles.reader.matrix  # the CSR matrix part
        rows = list(range(1500, 2000, 3))
        for _ in range(-(-FileMaps.WARM_READS // (2 * len(rows))) + 2):  # two reads a row
            ds.__getitems__(rows)
        assert reader._maps is not None and reader._maps.warm
        with h5py.File(path, "r") as f:
            start = f["X/data"].id.get_chunk_info(0).byte_offset
        os.truncate(path, start + 4096)  # rows 1500.. lie past the new end
        with pytest.raises(HDF5FileError, match=r"m\.h5ad"):
            ds.__getitems__(rows)


def test_files_that_do_not_fit_memory_are_never_copied_out_of_maps(tmp_path: Path) -> None:
    """Out of core a copy out of a map that meets a lost page waits for the disk one page at a
    time: where the files are over a quarter of memory, every table is read page cache first."""
    from tests.conftest import fake_platform

    path, m = _csr_file(tmp_path / "m.h5ad")
    size = path.stat().st_size
    perm = np.random.default_rng(0).permutation(2000)
    batches = [perm[i : i + 32].tolist() for i in range(0, 2000, 32)] * 2
    with HDF5SessionDataset([path], key="X") as ds:
        loader = DataLoader(ds, batch_sampler=batches, platform=fake_platform(memory_bytes=size))
        assert not ds.memory_map  # unset, and the files do not fit: no maps
        for rows, batch in zip(batches, loader, strict=True):
            assert np.array_equal(batch.to_dense().numpy(), m[rows].toarray())
        assert ds.handles.reader.matrix._maps is None
        said = " ".join(loader.describe().split())
        assert "page cache first: the files do not fit" in said
        loader.close()
        # the same dataset fitted again to a memory it fits: maps again
        loader = DataLoader(
            ds, batch_sampler=batches, platform=fake_platform(memory_bytes=size * 8)
        )
        assert ds.memory_map
        for _batch in loader:
            pass
        assert ds.handles.reader.matrix._maps is not None
        loader.close()
