"""Contiguous rows without io_uring: page-cache copies take turns (``pread_cached``).

Where threads read batches at once and a thread has no ring (``uring.thread_ring`` is
``None``: not Linux, or a kernel or sandbox without ``io_uring``), a batch's rows of one
session are first copied with ``os.preadv(..., RWF_NOWAIT)`` under one process-wide lock (one
thread's copies at a time, instead of a GIL hand-off per row between threads); what the page
cache does not hold is read afterwards with ``pread``, outside it.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from loaderkit import HDF5SessionDataset
from loaderkit.hdf5.read import pieceio, rawio, reader, uring
from loaderkit.hdf5.read.rawio import pread_cached
from tests.hdf5.helpers import expected, run_in_threads, write_sessions

NOWAIT = pytest.mark.skipif(
    getattr(os, "RWF_NOWAIT", None) is None, reason="no os.RWF_NOWAIT on this platform"
)
ORDER = [17, 2, 29, 8, 8, 13, 0, 25, 31, 30, 29, 3, 4, 5]  # scattered, duplicates, a run


@pytest.fixture(autouse=True)
def _no_ring(monkeypatch: pytest.MonkeyPatch, several_readers: None) -> None:
    """The path these tests check: threads reading at once, without a ring."""
    monkeypatch.setattr(uring, "thread_ring", lambda: None)


def _batch(ds: HDF5SessionDataset, order: list[int]) -> np.ndarray:
    return np.stack([np.asarray(x) for x in ds.__getitems__(order)])


def _want(ds: HDF5SessionDataset, order: list[int]) -> np.ndarray:
    return np.stack([expected(ds, i) for i in order])


def _write_large(root: Path, rows: list[int], row_shape: tuple[int, ...]) -> list[Path]:
    """Sessions whose rows are larger than a page, every element unique to session and row."""
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for s, n in enumerate(rows):
        path = root / f"large{s}.h5"
        size = int(np.prod(row_shape))
        data = (np.arange(n * size, dtype="f4") + s * 1e6).reshape(n, *row_shape)
        with h5py.File(path, "w") as f:
            f.create_dataset("betas", data=data)
        paths.append(path)
    return paths


def _want_large(ds: HDF5SessionDataset, paths: list[Path], order: list[int]) -> np.ndarray:
    out = []
    for i in order:
        session, row = ds.locate(i)
        with h5py.File(paths[int(session)], "r") as f:
            out.append(f["betas"][row])
    return np.stack(out)


def _drop_from_page_cache(paths: list[Path]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)  # written pages must be clean to be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


@NOWAIT
def test_cached_bytes_are_copied_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "rows.bin"
    path.write_bytes(np.arange(64, dtype="i4").tobytes())
    path.read_bytes()  # in the page cache
    fd = os.open(path, os.O_RDONLY)
    try:
        out = np.zeros(6, "i4")
        assert pread_cached((fd, 16), out, [(0, 0, 16), (40, 16, 8)]) == [16, 8]
        assert out.tolist() == [4, 5, 6, 7, 14, 15]
    finally:
        os.close(fd)


@NOWAIT
def test_rows_the_page_cache_lacks_are_read_outside_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = _write_large(tmp_path, [20, 12, 9], (64, 64))
    ds = HDF5SessionDataset(paths, key="betas")
    ds.__getitems__([0, 20, 32])  # files open (their metadata read)
    _drop_from_page_cache(paths)
    fd = os.open(paths[0], os.O_RDONLY)
    try:
        probe = np.zeros(64 * 64, "f4")
        location = ds._reader.file_pool.get(0).raws[0]
        reads = [(probe.nbytes * 5, 0, probe.nbytes)]
        if pread_cached((fd, location[1]), probe, reads)[0] == probe.nbytes:
            pytest.skip("this filesystem keeps the pages (POSIX_FADV_DONTNEED dropped nothing)")
    finally:
        os.close(fd)
    locked_during: list[bool] = []
    real = reader.pread

    def watched(*args: Any) -> None:
        locked_during.append(rawio._COPY_TURN.locked())
        real(*args)

    want = _want_large(ds, paths, ORDER)
    monkeypatch.setattr(reader, "pread", watched)
    # the kernel can keep pages a busy machine just read (per-CPU lists not yet drained when
    # POSIX_FADV_DONTNEED ran): drop and read again, a few times at most
    for _ in range(5):
        _drop_from_page_cache(paths)
        assert np.array_equal(_batch(ds, ORDER), want)
        if locked_during:
            break
    assert locked_during, "no row came from the disk: the test read nothing outside the lock"
    assert not any(locked_during)
    ds.close()


def test_a_partial_copy_is_finished_by_pread_at_the_right_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = write_sessions(tmp_path, [20, 12, 9])
    ds = HDF5SessionDataset(paths, key="betas")
    copies: list[int] = []

    def partly(
        raw: tuple[int, int], buffer: np.ndarray, reads: list[tuple[int, int, int]]
    ) -> list[int]:
        flat = buffer.reshape(-1).view(np.uint8)
        done = []
        for offset, start, nbytes in reads:  # a prefix that ends inside an element
            view = flat[start : start + nbytes // 2 + 3]
            done.append(os.preadv(raw[0], [view.data], raw[1] + offset))
        copies.extend(done)
        return done

    monkeypatch.setattr(rawio, "pread_cached", partly)
    assert np.array_equal(_batch(ds, ORDER), _want(ds, ORDER))
    assert copies and all(n % 4 == 3 for n in copies)  # really split inside a float
    ds.close()


def test_without_rwf_nowait_every_row_is_read_by_pread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rawio, "NOWAIT", None)
    paths = write_sessions(tmp_path, [20, 12, 9])
    ds = HDF5SessionDataset(paths, key="betas")
    assert pread_cached(ds._reader.file_pool.get(0).raws[0], np.zeros(3, "f4"), [(0, 0, 12)]) == [0]
    assert np.array_equal(_batch(ds, ORDER), _want(ds, ORDER))
    ds.close()


def _refuses_nowait(path: Path) -> bool:
    path.write_bytes(bytes(8192))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.preadv(fd, [bytearray(8)], 0, os.RWF_NOWAIT)
    except OSError as exc:
        return exc.errno == errno.EOPNOTSUPP
    finally:
        os.close(fd)
        path.unlink()
    return False


@NOWAIT
def test_a_filesystem_that_refuses_the_flag_is_remembered_per_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shm = Path("/dev/shm")
    probe = shm / f"loaderkit-nowait-{os.getpid()}"
    if not shm.is_dir() or not _refuses_nowait(probe) or _refuses_nowait(tmp_path / "probe"):
        pytest.skip("needs a tmpfs /dev/shm that refuses RWF_NOWAIT and a tmp_path that allows it")
    calls: list[int] = []
    real_preadv = os.preadv

    def counting(fd: int, buffers: Any, offset: int, flags: int = 0) -> int:
        calls.append(flags)
        return real_preadv(fd, buffers, offset, flags)

    monkeypatch.setattr(rawio.os, "preadv", counting)
    monkeypatch.setattr(pieceio, "_NO_NOWAIT", {})  # nothing learnt yet
    rows = np.arange(16, dtype="i4").tobytes()
    refusing, allowing = shm / f"loaderkit-rows-{os.getpid()}", tmp_path / "rows.bin"
    refusing.write_bytes(rows)
    allowing.write_bytes(rows)
    allowing.read_bytes()  # in the page cache
    out, reads = np.zeros(4, "i4"), [(0, 0, 8), (8, 8, 8)]
    fd = os.open(refusing, os.O_RDONLY)
    try:
        assert pread_cached((fd, 0), out, reads) == [0, 0]
        assert pread_cached((fd, 0), out, reads) == [0, 0]
        assert calls == [os.RWF_NOWAIT]  # refused once, then never asked again for that file
    finally:
        os.close(fd)
        refusing.unlink()
    again = os.open(allowing, os.O_RDONLY)  # the lowest free number: the same one
    try:
        assert again == fd
        assert pread_cached((again, 0), out, reads) == [8, 8]  # another file: asked, copied
        assert out.tolist() == [0, 1, 2, 3]
    finally:
        os.close(again)


def test_threads_reading_at_once_get_their_own_rows(tmp_path: Path) -> None:
    paths = _write_large(tmp_path, [40, 33, 27, 50], (32, 32))
    ds = HDF5SessionDataset(paths, key="betas")
    rng = np.random.default_rng(0)
    orders = [rng.integers(0, len(ds), 32).tolist() for _ in range(40)]
    wants = [_want_large(ds, paths, order) for order in orders]
    wrong: list[int] = []

    def read(part: range) -> None:
        for i in part:
            if not np.array_equal(_batch(ds, orders[i]), wants[i]):
                wrong.append(1)

    run_in_threads(read, 40, 4)
    assert not wrong
    assert not rawio._COPY_TURN.locked()
    ds.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_while_a_thread_copies_can_copy(tmp_path: Path) -> None:
    paths = _write_large(tmp_path, [20], (8, 8))
    ds = HDF5SessionDataset(paths, key="betas")
    want = _want_large(ds, paths, [3, 17, 5])
    with rawio._COPY_TURN:  # a worker thread of the parent is copying at the fork
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            ok = np.array_equal(_batch(ds, [3, 17, 5]), want)
            os._exit(0 if ok else 1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.02)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child's read waited for a lock its parent's thread held")
    assert os.waitstatus_to_exitcode(status) == 0
    ds.close()


@NOWAIT
def test_long_reads_are_left_to_pread_in_parallel(tmp_path: Path) -> None:
    size = rawio.TURN_MAX_BYTES + 4096
    path = tmp_path / "rows.bin"
    data = np.arange(2 * size // 4, dtype="i4")
    path.write_bytes(data.tobytes())
    path.read_bytes()  # in the page cache
    fd = os.open(path, os.O_RDONLY)
    try:
        out = np.zeros(2 * size // 4 + 2, "i4")
        done = pread_cached((fd, 0), out, [(0, 0, size), (size, size, 8)])
        assert done == [0, 8]  # the long copy is pread's; the short one is copied here
        assert out[size // 4 : size // 4 + 2].tolist() == data[size // 4 : size // 4 + 2].tolist()
    finally:
        os.close(fd)
