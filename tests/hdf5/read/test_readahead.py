"""Reading ahead in the sampler's order: real files evicted from the page cache, real threads.

Advice only fills the page cache, so every check reads residency: ``os.preadv`` with
``RWF_NOWAIT`` succeeds only where the page is there.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from loaderkit import DataLoader
from loaderkit.hdf5 import HDF5SessionDataset
from loaderkit.hdf5.anndata.ahead import CSRAhead
from loaderkit.hdf5.anndata.csrplan import AROUND
from loaderkit.hdf5.read.mapped import FileMaps
from loaderkit.hdf5.read.readahead import (
    Advisor,
    SamplerReadAhead,
    Windows,
    ahead_plan,
    merge_reads,
)

sp = pytest.importorskip("scipy.sparse")
pytest.importorskip("anndata")

from tests.conftest import fake_platform  # noqa: E402
from tests.hdf5.h5adfiles import uniform, write_csr  # noqa: E402

needs_nowait = pytest.mark.skipif(
    not hasattr(os, "RWF_NOWAIT") or not hasattr(os, "POSIX_FADV_WILLNEED"),
    reason="residency is read with RWF_NOWAIT and asked with posix_fadvise (Linux)",
)


def evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def resident(fd: int, offset: int) -> bool:
    """Whether the page at ``offset`` is in the page cache (``mincore``: reads nothing).

    Not ``os.preadv(RWF_NOWAIT)``: on a miss it starts the kernel's own read-ahead.
    """
    page = mmap.PAGESIZE
    with mmap.mmap(fd, page, access=mmap.ACCESS_COPY, offset=offset - offset % page) as mm:
        vec = (ctypes.c_ubyte * 1)()
        address = ctypes.addressof(ctypes.c_char.from_buffer(mm))
        assert _LIBC.mincore(ctypes.c_void_p(address), ctypes.c_size_t(page), vec) == 0
        del address
        return bool(vec[0] & 1)


_LIBC = ctypes.CDLL(None, use_errno=True)


def wait_resident(fd: int, offsets: list[int], seconds: float = 10.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if all(resident(fd, at) for at in offsets):
            return True
        time.sleep(0.01)
    return False


@pytest.fixture
def big(tmp_path: Path) -> tuple[Path, sp.csr_matrix]:
    """4,000 cells, 200 values each, contiguous: ~6 MiB of ``data`` and ``indices``."""
    m = uniform(0, cells=4000, genes=3000, per=200)
    return write_csr(tmp_path / "big.h5ad", m), m


def test_plan_bounds_what_is_asked_ahead() -> None:
    fits = ahead_plan(file_bytes=512 << 20, around=AROUND, row_bytes=6400)
    assert fits.max_bytes == 512 << 20 and "asked once" in fits.reason
    over = ahead_plan(file_bytes=512 << 30, around=0, row_bytes=6400)
    assert over.samples * 8192 == over.max_bytes <= 64 << 20
    assert f"{over.max_bytes >> 20:,} MiB" in over.reason
    assert ahead_plan(512 << 30, 0, 50 << 20).samples == 256  # wide rows: a floor


def test_windows_are_asked_once_and_done_when_the_data_is_covered() -> None:
    seen = Windows(4096)
    seen.add("f", 40_000, np.array([8192, 30_000]), np.array([16_384, 32_000]))
    assert not seen.done
    first = seen.new("f", np.array([8192, 9000, 12_288, 30_500]), np.array([10, 10, 10, 10]))
    assert first.tolist() == [True, False, True, True]
    assert seen.done  # windows 2, 3 and 7: all the data
    assert not seen.new("f", np.array([8192]), np.array([1])).any()


def test_a_wide_read_marks_every_window_it_spans() -> None:
    seen = Windows(4096)
    seen.add("f", 40_000, np.array([0]), np.array([40_000]))  # windows 0..9
    assert seen.new("f", np.array([100]), np.array([20_000])).tolist() == [True]  # 0..4
    assert not seen.done
    assert seen.new("f", np.array([4096 * 5, 4096 * 2]), np.array([5, 5])).tolist() == [
        True,
        False,
    ]
    assert not seen.done  # 6..9 left
    seen.new("f", np.array([4096 * 6]), np.array([4096 * 4]))
    assert seen.done


@needs_nowait
def test_advisor_brings_pages_in_on_its_own_thread(big: tuple[Path, sp.csr_matrix]) -> None:
    path, _ = big
    evict(path)
    fd = os.open(path, os.O_RDONLY)
    advisor = Advisor(1 << 30)
    try:
        assert not resident(fd, 1 << 20)
        assert advisor.ask(np.array([fd]), np.array([1 << 20]), np.array([1 << 16])) == 1 << 16
        assert wait_resident(fd, [1 << 20, (1 << 20) + (1 << 16) - 1])
        names = [t.name for t in threading.enumerate()]
        assert "loaderkit-read-ahead" in names
    finally:
        advisor.close()
        os.close(fd)
    assert "loaderkit-read-ahead" not in [t.name for t in threading.enumerate()]
    assert advisor.ask(np.array([0]), np.array([0]), np.array([1])) == 0  # closed: nothing


def test_advice_beyond_the_bound_drops_the_oldest() -> None:
    advisor = Advisor(100)
    advisor._closed = False
    with advisor._ready:  # the thread cannot take anything while this holds the lock
        for _ in range(2):
            advisor._queue.append((np.array([0]), np.array([0]), np.array([60]), 60))
            advisor._queued += 60
    advisor.ask(np.array([-1]), np.array([0]), np.array([60]))
    advisor.close()
    assert advisor.dropped >= 60


def test_watcher_asks_in_draw_order_and_retries_what_it_could_not_plan() -> None:
    asked: list[list[int]] = []
    unplanned = {11}

    def advise(keys: np.ndarray) -> np.ndarray:
        asked.append(keys.tolist())
        return np.array([int(k) in unplanned for k in keys], bool)

    watcher = SamplerReadAhead(advise, lambda: False, np.array([10, 11, 12, 13]), 4, group=1)
    watcher.drawn([[0], [1]])
    assert asked == [[10, 11]]  # what was drawn at once is asked at once
    unplanned.clear()  # its file was opened meanwhile
    watcher.reading()  # batch 0 handed on: its file is open now, batch 1 is asked again
    assert asked[1:] == [[11]]
    watcher.drawn([[2]])
    assert asked[2:] == [[12]]
    watcher.reading()
    watcher.drawn([[3, -9]])  # a bad index is left to the reader
    assert asked[3:] == [[13]]


def test_watcher_gathers_a_group_while_the_reads_asked_cover_as_many() -> None:
    asked: list[list[int]] = []

    def advise(keys: np.ndarray) -> np.ndarray:
        asked.append(keys.tolist())
        return np.zeros(keys.size, bool)

    watcher = SamplerReadAhead(advise, lambda: False, np.arange(100), 16, group=4)
    watcher.drawn([[0, 1], [2, 3], [4, 5], [6, 7]])  # the pass's first horizon: asked at once
    assert asked == [[0, 1, 2, 3, 4, 5, 6, 7]]
    watcher.reading()
    watcher.drawn([[8, 9]])  # 6 samples asked still to come: this batch waits for company
    assert len(asked) == 1
    watcher.reading()
    watcher.drawn([[10, 11]])  # a group of 4: asked together, the reads that touch as one
    assert asked[1:] == [[8, 9, 10, 11]]
    watcher.reading()
    watcher.drawn([[12]])  # the pass's last batch
    watcher.reading()
    assert len(asked) == 2  # 4 samples asked still to come
    watcher.reading()  # 2 left: the lone batch is asked before its turn comes
    assert asked[2:] == [[12]]


def test_reads_that_touch_in_a_file_are_asked_as_one() -> None:
    fds = np.array([5, 5, 6, 5, 5, 6])
    at = np.array([8192, 0, 0, 4096, 65536, 4096])
    size = np.array([4096, 4096, 4096, 4096, 100, 10])
    got = merge_reads(fds, at, size)
    assert [g.tolist() for g in got] == [[5, 6, 5], [0, 0, 65536], [12288, 4106, 100]]
    lone = merge_reads(np.array([3]), np.array([7]), np.array([1]))
    assert [g.tolist() for g in lone] == [[3], [7], [1]]
    far = merge_reads(np.array([1, 2]), np.array([1 << 61, 0]), np.array([10, 1 << 61]))
    assert [g.tolist() for g in far] == [[1, 2], [1 << 61, 0], [10, 1 << 61]]  # no shifting


@needs_nowait
def test_a_loader_reads_the_next_batches_ahead(big: tuple[Path, sp.csr_matrix]) -> None:
    path, m = big
    batches = [list(range(i * 80, i * 80 + 16)) for i in range(50)]  # far apart in the file
    with HDF5SessionDataset([path], key="X") as ds:
        loader = DataLoader(ds, batch_sampler=batches, num_workers=0)
        it = iter(loader)
        first = next(it)  # opens the file; later batches were drawn ahead
        assert np.array_equal(first.to_dense().numpy(), m[batches[0]].toarray())
        evict(path)  # what the first read brought in is gone: only advice brings pages now
        next(it)  # batch 1 is read, batch 2.. are asked for again as they are drawn
        reader = ds.handles.reader.matrix  # the CSR matrix part
        fd = os.open(path, os.O_RDONLY)
        try:
            with __import__("h5py").File(path, "r") as f:
                base = f["X/data"].id.get_offset()
            row = batches[40][0]
            assert wait_resident(fd, [base + int(m.indptr[row]) * 4])
        finally:
            os.close(fd)
        assert reader._ahead is not None and reader._ahead.advisor.asked > 0
        rest = [b.to_dense().numpy() for b in it]
        assert all(
            np.array_equal(b, m[rows].toarray()) for b, rows in zip(rest, batches[2:], strict=True)
        )
    assert "loaderkit-read-ahead" not in [t.name for t in threading.enumerate()]


def test_a_second_pass_asks_nothing_once_every_window_was(
    big: tuple[Path, sp.csr_matrix],
) -> None:
    path, _ = big
    with HDF5SessionDataset([path], key="X") as ds:
        loader = DataLoader(ds, batch_size=64, shuffle=True, num_workers=0)
        for _ in loader:
            pass
        reader = ds.handles.reader.matrix  # the CSR matrix part
        assert reader.around[0]  # a small file: it fits in memory
        assert reader._ahead is not None and reader._ahead.windows is not None
        assert reader._ahead.windows.done
        assert ds.handles.reader.read_ahead_watcher() is None


def test_nothing_is_asked_while_the_reads_come_from_the_page_cache(
    big: tuple[Path, sp.csr_matrix], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(FileMaps, "SLOW", float("inf"))  # a busy machine's copy stays warm
    path, _ = big
    with HDF5SessionDataset([path], key="X") as ds:
        reader = ds.handles.reader.matrix  # the CSR matrix part
        rows = list(range(0, 3000, 11))
        for _ in range(-(-FileMaps.WARM_READS // (2 * len(rows))) + 1):
            ds.__getitems__(rows)  # the file was just written: in the page cache
        assert reader.reads_warm()
        ahead = CSRAhead(reader, reader.ahead_plan, reader.around[0])
        asked: list[object] = []
        monkeypatch.setattr(ahead.advisor, "ask", lambda *args: asked.append(args) or 0)
        keys = np.asarray(ds.handles.reader.index[:64], np.int64)
        assert not ahead.advise(keys).any() and not asked  # warm: nothing to ask
        reader._maps.missed(1, 1)  # a read missed the page cache: asked again
        assert not ahead.advise(keys).any() and asked
        ahead.close()


def test_rows_too_big_for_memory_ask_their_own_pages(big: tuple[Path, sp.csr_matrix]) -> None:
    path, m = big
    with HDF5SessionDataset([path], key="X") as ds:
        reader = ds.handles.reader.matrix  # the CSR matrix part
        small = fake_platform(memory_bytes=path.stat().st_size * 2, memory_source="a job")
        loader = DataLoader(ds, batch_size=64, shuffle=True, num_workers=0, platform=small)
        assert reader.around[0] == 0 and "of files over a quarter" in reader.around[1]
        assert "(a job)" in loader.plan["hdf5_reads"].reason  # the figure's source is said
        got = np.concatenate([b.to_dense().numpy().sum(axis=1) for b in loader])
        assert reader._ahead is not None and reader._ahead.windows is None
        assert reader._ahead.advisor.asked > 0
        assert np.isclose(got.sum(), m.sum())


def test_a_watcher_whose_files_are_read_elsewhere_goes_quiet() -> None:
    calls: list[int] = []
    watcher = SamplerReadAhead(
        lambda keys: calls.append(keys.size) or np.ones(keys.size, bool),
        lambda: False,
        np.arange(100),
        40,
    )
    watcher.drawn([[i, i + 1] for i in range(0, 20, 2)])
    for _ in range(30):
        watcher.reading()
        watcher.drawn([[1, 2]])
    assert len(calls) <= 12  # one try a batch, the first of those waiting, then none


def test_thread_workers_and_processes_read_the_same_rows(big: tuple[Path, sp.csr_matrix]) -> None:
    path, m = big
    for kwargs in ({"num_workers": 2, "worker_method": "thread"}, {"num_workers": 2}):
        with HDF5SessionDataset([path], key="X") as ds:
            loader = DataLoader(ds, batch_size=128, shuffle=False, **kwargs)
            got = np.concatenate([b.to_dense().numpy() for b in loader])
        assert np.array_equal(got, m.toarray()), kwargs


def test_batches_larger_than_the_horizon_all_come(big: tuple[Path, sp.csr_matrix]) -> None:
    path, m = big
    with HDF5SessionDataset([path], key="X") as ds:
        reader = ds.handles.reader.matrix  # the CSR matrix part
        reader.ahead_plan = reader.ahead_plan._replace(samples=16)  # a horizon below one batch
        loader = DataLoader(ds, batch_size=300, shuffle=True, num_workers=0)
        sizes = [batch.shape[0] for batch in loader]
        assert sum(sizes) == m.shape[0] and len(sizes) == len(loader)


def test_merged_reads_cover_exactly_the_bytes_asked() -> None:
    """Against a byte map per file: the same bytes, no two merged reads touching."""
    rng = np.random.default_rng(5)
    for _ in range(50):
        n = int(rng.integers(1, 40))
        fds = rng.integers(0, 3, n)
        at, size = rng.integers(0, 200, n), rng.integers(0, 30, n)
        got_fds, got_at, got_size = merge_reads(fds, at, size)
        for fd in range(3):
            want, have = np.zeros(260, bool), np.zeros(260, bool)
            for a, b in zip(at[fds == fd], size[fds == fd], strict=True):
                want[a : a + b] = True
            mine = sorted(zip(got_at[got_fds == fd], got_size[got_fds == fd], strict=True))
            for a, b in mine:
                have[a : a + b] = True
            assert np.array_equal(want, have)
            ends = [a + b for a, b in mine]
            assert all(a > e for (a, _), e in zip(mine[1:], ends[:-1], strict=True))
