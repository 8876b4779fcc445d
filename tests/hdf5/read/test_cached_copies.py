"""Contiguous rows without io_uring: page-cache copies take turns (``readtable.read_table``).

Where threads read batches at once and a thread has no ring (``uring.thread_ring`` is
``None``: not Linux, or a kernel or sandbox without ``io_uring``), a batch's table of reads is
first copied with ``os.preadv(..., RWF_NOWAIT)`` under one process-wide lock (one thread's
copies at a time, instead of a GIL hand-off per row between threads); what the page cache does
not hold is read afterwards, outside it. The primitive's own tests are in ``test_readtable``;
these read batches through the dataset.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from loaderkit import HDF5SessionDataset
from loaderkit.hdf5.read import readtable, uring
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
def test_rows_the_page_cache_lacks_are_read_outside_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = _write_large(tmp_path, [20, 12, 9], (64, 64))
    ds = HDF5SessionDataset(paths, key="betas")
    ds.__getitems__([0, 20, 32])  # files open (their metadata read)
    want = _want_large(ds, paths, ORDER)
    calls: list[tuple[int, bool]] = []  # (flags, copy turn held) of every read
    real = os.preadv

    def watched(fd: int, buffers: Any, offset: int, flags: int = 0) -> int:
        calls.append((flags, readtable._COPY_TURN.locked()))
        return real(fd, buffers, offset, flags)

    monkeypatch.setattr(os, "preadv", watched)
    # the kernel can keep pages a busy machine just read (per-CPU lists not yet drained when
    # POSIX_FADV_DONTNEED ran): drop and read again, a few times at most
    for _ in range(5):
        calls.clear()
        _drop_from_page_cache(paths)
        assert np.array_equal(_batch(ds, ORDER), want)
        if any(flags == 0 for flags, _ in calls):
            break
    plain = [held for flags, held in calls if flags == 0]
    if not plain:
        pytest.skip("this filesystem keeps the pages (POSIX_FADV_DONTNEED dropped nothing)")
    assert not any(plain)  # the disk's reads: outside the lock
    assert all(held for flags, held in calls if flags != 0)  # the copies: in turn
    ds.close()


def test_a_partial_copy_is_finished_at_the_right_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = write_sessions(tmp_path, [20, 12, 9])
    ds = HDF5SessionDataset(paths, key="betas")
    copies: list[int] = []
    real = os.preadv

    def partly(fd: int, buffers: list[memoryview], offset: int, flags: int = 0) -> int:
        if not flags:
            return real(fd, buffers, offset)
        view = buffers[0][: buffers[0].nbytes // 2 + 3]  # a prefix that ends inside an element
        copies.append(real(fd, [view], offset, flags))
        return copies[-1]

    monkeypatch.setattr(os, "preadv", partly)
    assert np.array_equal(_batch(ds, ORDER), _want(ds, ORDER))
    assert copies and all(n % 4 == 3 for n in copies)  # really split inside a float
    ds.close()


def test_without_rwf_nowait_every_row_is_read_plainly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(readtable, "NOWAIT", None)
    paths = write_sessions(tmp_path, [20, 12, 9])
    ds = HDF5SessionDataset(paths, key="betas")
    assert np.array_equal(_batch(ds, ORDER), _want(ds, ORDER))
    ds.close()


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
    assert not readtable._COPY_TURN.locked()
    ds.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_while_a_thread_copies_can_copy(tmp_path: Path) -> None:
    paths = _write_large(tmp_path, [20], (8, 8))
    ds = HDF5SessionDataset(paths, key="betas")
    want = _want_large(ds, paths, [3, 17, 5])
    with readtable._COPY_TURN:  # a worker thread of the parent is copying at the fork
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
