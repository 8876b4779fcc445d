"""``io_uring`` reads: many scattered reads in one system call, and a batch's rows through them.

The ring tests run where this kernel lets a process make a ring (they skip visibly elsewhere);
the reader tests run everywhere and check the same rows either way.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loaderkit import HDF5SessionDataset
from loaderkit.errors import HDF5FileError
from loaderkit.hdf5.read import uring
from tests.hdf5.helpers import expected, run_in_threads, write_sessions

ORDER = [17, 2, 29, 8, 8, 13, 0, 25, 31, 30, 29, 3, 4, 5, 40, 36]  # all sessions, interleaved


@pytest.fixture
def data_file(tmp_path: Path) -> tuple[int, np.ndarray]:
    data = np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8)
    path = tmp_path / "bytes.bin"
    path.write_bytes(data.tobytes())
    fd = os.open(path, os.O_RDONLY)
    yield fd, data
    os.close(fd)


@pytest.fixture
def ring() -> uring.Ring:
    """This thread's ring (the tests using it skip where the process has none)."""
    made = uring.thread_ring()
    if made is None:
        pytest.skip("no io_uring for this process")
    return made


def _batch(ds: HDF5SessionDataset, order: list[int]) -> np.ndarray:
    return np.stack([np.asarray(x) for x in ds.__getitems__(order)])


def _want(ds: HDF5SessionDataset, order: list[int]) -> np.ndarray:
    return np.stack([expected(ds, i) for i in order])


def _ring_calls(monkeypatch: pytest.MonkeyPatch, count: Any = len) -> list[Any]:
    """Record ``count(reads)`` of every ring call (``Ring.read_table``) from now on."""
    calls: list[Any] = []
    real = uring.Ring.read_table

    def counted(ring: uring.Ring, buffer: np.ndarray, reads: np.ndarray) -> np.ndarray:
        calls.append(count(reads))
        return real(ring, buffer, reads)

    monkeypatch.setattr(uring.Ring, "read_table", counted)
    return calls


def test_scattered_reads_land_where_asked(
    data_file: tuple[int, np.ndarray], ring: uring.Ring
) -> None:
    fd, data = data_file
    rng = np.random.default_rng(1)
    for count in (1, 7, ring.entries, ring.entries * 3 + 5):  # one call and several
        sizes = rng.integers(1, 5000, count)
        offsets = rng.integers(0, data.size - 5000, count)
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        out = np.zeros(int(sizes.sum()), np.uint8)
        reads = list(
            zip([fd] * count, offsets.tolist(), starts.tolist(), sizes.tolist(), strict=True)
        )
        assert ring.read(out, reads) == sizes.tolist()
        for offset, start, size in zip(offsets, starts, sizes, strict=True):
            assert np.array_equal(out[start : start + size], data[offset : offset + size])


def test_reads_past_the_end_or_failing_count_what_they_read(
    data_file: tuple[int, np.ndarray], ring: uring.Ring
) -> None:
    fd, data = data_file
    out = np.zeros(300, np.uint8)
    closed = os.open(os.devnull, os.O_RDONLY)
    os.close(closed)  # a descriptor that is not open: the read fails with EBADF
    end = data.size - 10
    reads = [(fd, end, 0, 100), (closed, 0, 100, 100), (fd, 0, 200, 0), (fd, 5, 200, 100)]
    done = ring.read(out, reads)
    assert done == [10, 0, 0, 100]
    assert np.array_equal(out[:10], data[-10:]) and np.array_equal(out[200:], data[5:105])


def test_a_read_outside_the_buffer_is_refused_before_the_kernel_sees_it(
    data_file: tuple[int, np.ndarray], ring: uring.Ring
) -> None:
    fd, _ = data_file
    with pytest.raises(ValueError, match="outside the buffer of 8 bytes"):
        ring.read(np.zeros(8, np.uint8), [(fd, 0, 4, 5)])
    with pytest.raises(ValueError, match="C-contiguous and writable"):
        ring.read(np.zeros(8, np.uint8)[::2], [(fd, 0, 0, 1)])
    assert ring.read(np.zeros(8, np.uint8), [(fd, 0, 0, 8)]) == [8]  # the ring still works


def test_an_interrupted_call_keeps_its_buffer_and_the_next_call_waits_for_it(
    data_file: tuple[int, np.ndarray], monkeypatch: pytest.MonkeyPatch, ring: uring.Ring
) -> None:
    fd, data = data_file
    real = ring._enter

    def submit_then_interrupt(submit: int, wait: int) -> int:
        real(submit, 0)  # the reads are in the kernel's hands, nobody waits for them
        raise KeyboardInterrupt

    monkeypatch.setattr(ring, "_enter", submit_then_interrupt)
    out = np.zeros(4096, np.uint8)
    with pytest.raises(KeyboardInterrupt):
        ring.read(out, [(fd, 0, 0, 4096)])
    assert ring._keep is out  # the kernel may still write there: the ring holds it
    monkeypatch.undo()
    again = np.zeros(16, np.uint8)
    assert ring.read(again, [(fd, 100, 0, 16)]) == [16]
    assert ring._keep is None and np.array_equal(again, data[100:116])
    assert np.array_equal(out, data[:4096])


@pytest.mark.usefixtures("ring")
def test_each_thread_reads_through_its_own_ring(data_file: tuple[int, np.ndarray]) -> None:
    fd, data = data_file
    rings: list[Any] = []
    lock = threading.Lock()

    def read(part: range) -> None:
        (seed,) = part
        ring = uring.thread_ring()
        with lock:
            rings.append(ring)
        rng = np.random.default_rng(seed)
        out = np.zeros(64 * 1024, np.uint8)
        for _ in range(50):
            offsets = rng.integers(0, 255, 64) * 4096
            reads = [(fd, int(o), i * 1024, 1024) for i, o in enumerate(offsets)]
            assert ring is not None and ring.read(out, reads) == [1024] * 64
            for i, o in enumerate(offsets):
                assert np.array_equal(out[i * 1024 : (i + 1) * 1024], data[o : o + 1024])

    run_in_threads(read, 4, 4)
    assert len({id(r) for r in rings}) == 4


def test_a_forked_child_makes_its_own_ring(
    data_file: tuple[int, np.ndarray], ring: uring.Ring
) -> None:
    fd, data = data_file
    parent = ring
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        child = uring.thread_ring()
        out = np.zeros(64, np.uint8)
        ok = child is not parent and child.read(out, [(fd, 7, 0, 64)]) == [64]
        os._exit(0 if ok and np.array_equal(out, data[7:71]) else 1)
    assert os.waitpid(pid, 0)[1] == 0
    assert parent is uring.thread_ring() and parent.read(np.zeros(1, np.uint8), [(fd, 0, 0, 1)])


def test_disable_leaves_every_thread_without_a_ring(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uring, "_off", None)
    uring.disable("a test")
    got: list[Any] = []
    run_in_threads(lambda _: got.append(uring.thread_ring()), 2, 2)
    assert got == [None, None] and uring.thread_ring() is None


@pytest.mark.usefixtures("ring", "several_readers")
def test_a_batch_over_sessions_is_one_ring_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = write_sessions(tmp_path, [20, 12, 9])
    ds = HDF5SessionDataset(paths, key="betas")
    _batch(ds, [0, 20, 35])  # every file open
    calls = _ring_calls(monkeypatch, lambda reads: len(set(reads[:, 0].tolist())))  # files
    assert np.array_equal(_batch(ds, ORDER), _want(ds, ORDER))
    assert calls == [3]  # one call, three files
    ds.close()


@pytest.mark.parametrize("ring", ["ring", "no ring"])
def test_more_sessions_than_open_files_are_read_in_turns_by_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ring: str
) -> None:
    """Leases held for one ring call never wait: a miss reads what is pending first."""
    if ring == "no ring":
        monkeypatch.setattr(uring, "thread_ring", lambda: None)
    paths = write_sessions(tmp_path, [7, 9, 6, 8, 10])
    ds = HDF5SessionDataset(paths, key="betas", max_open_files=2)
    rng = np.random.default_rng(3)
    orders = [rng.integers(0, len(ds), 24).tolist() for _ in range(24)]
    wants = {i: _want(ds, order) for i, order in enumerate(orders)}

    def read(part: range) -> None:
        for i in part:
            assert np.array_equal(_batch(ds, orders[i]), wants[i])

    run_in_threads(read, len(orders), 4)
    assert ds._reader.files.file_pool.max_open == 2
    ds.close()


def test_a_truncated_file_is_named_after_a_ring_read(tmp_path: Path) -> None:
    paths = write_sessions(tmp_path, [20, 12, 9])
    ds = HDF5SessionDataset(paths, key="betas")
    _batch(ds, [0, 20, 35])
    size = os.path.getsize(paths[1])
    os.truncate(paths[1], size - 2 * 64)  # its last rows are gone
    with pytest.raises(HDF5FileError, match=r"truncated|changed") as caught:
        _batch(ds, [0, 31, 35])  # row 31 is session 2's last
    assert paths[1].name in str(caught.value)
    ds.close()


@pytest.mark.usefixtures("ring", "several_readers")
def test_long_runs_and_few_reads_are_left_to_pread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = write_sessions(tmp_path, [40, 12], row_shape=(64, 64))  # 32 KiB rows (float64)
    ds = HDF5SessionDataset(paths, key="betas")
    calls = _ring_calls(monkeypatch)
    for order, ring_reads in (
        ([0, 1, 2, 3, 41], []),  # a 128 KiB run and one row: pread both
        ([5, 40, 20], []),  # 3 short reads: fewer than RING_MIN_READS
        ([5, 40, 7, 41, 9, 20, 30, 1], [8]),  # 8 short reads: one ring call
        ([5, 6, 7, 8, 40, 20, 30, 1], [4]),  # the 128 KiB run by pread, 4 rows by the ring
    ):
        calls.clear()
        got = _batch(ds, order)
        want = np.stack([np.full((64, 64), float(i >= 40)) for i in order])
        assert np.array_equal(got, want) and calls == ring_reads, order
    ds.close()


@pytest.mark.usefixtures("ring")
def test_one_thread_reads_each_run_with_its_own_preadv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Alone, a thread hands over the GIL to nobody: a ``preadv`` a run costs less than a ring."""
    paths = write_sessions(tmp_path, [20, 12, 9])
    ds = HDF5SessionDataset(paths, key="betas")
    _batch(ds, [0, 20, 35])  # every file open
    calls = _ring_calls(monkeypatch)
    assert np.array_equal(_batch(ds, ORDER), _want(ds, ORDER))
    assert calls == []
    ds.close()


@pytest.mark.usefixtures("ring")
def test_a_thread_reading_beside_another_reads_through_the_ring(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While one thread is inside a batch read, another's batch of short runs is one ring call."""
    paths = write_sessions(tmp_path, [20, 12, 9])
    ds = HDF5SessionDataset(paths, key="betas")
    _batch(ds, [0, 20, 35])
    entered, leave = threading.Event(), threading.Event()
    calls = _ring_calls(monkeypatch)
    real_preadv = os.preadv
    blocked: list[threading.Thread] = []

    def held(fd: int, buffers: Any, offset: int, *flags: int) -> int:
        if threading.current_thread() in blocked:  # the first thread stays inside its read
            entered.set()
            assert leave.wait(30)
        return real_preadv(fd, buffers, offset, *flags)

    monkeypatch.setattr(os, "preadv", held)
    got: list[np.ndarray] = []
    first = threading.Thread(target=lambda: got.append(_batch(ds, [1, 2, 3, 21])))
    blocked.append(first)
    first.start()
    try:
        assert entered.wait(30)
        assert ds._reader.threads_reading() == 1  # the first thread, not this one
        assert np.array_equal(_batch(ds, ORDER), _want(ds, ORDER))
        assert calls == [len(ORDER) - 2]  # runs: 3, 4, 5 is one run of three
    finally:
        leave.set()
        first.join()
    assert np.array_equal(got[0], _want(ds, [1, 2, 3, 21])) and calls == [len(ORDER) - 2]
    ds.close()
