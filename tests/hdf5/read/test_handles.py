"""Threads of one process reading one dataset at once: leases, evictions, close, held sessions.

Real threads (``ThreadPoolExecutor``) call ``__getitems__`` / ``ds[i]`` on real files; every
result is compared with a serial read, and the files this process has open are counted from
``/proc/self/fd``.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from h5py import h5f

from loaderkit import HDF5SessionDataset
from loaderkit.errors import PerformanceHint
from loaderkit.hdf5.read.handles import FilePool, Handle
from tests.hdf5.helpers import write_wide

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")


def _open_under(root: Path) -> int:
    """Files under ``root`` this process holds a descriptor of (a memory map holds a second)."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(root)):
            found.add(target)
    return len(found)


def _hdf5_files_under(root: Path) -> list[str]:
    """Files under ``root`` HDF5 has open in this process (one closing meanwhile counts not)."""
    found = []
    for fid in h5f.get_obj_ids(h5f.OBJ_ALL, h5f.OBJ_FILE):
        try:
            name = fid.name.decode()
        except ValueError:  # closed since the list was taken
            continue
        if name.startswith(str(root)):
            found.append(name)
    return found


def _write_files(root: Path, sessions: int, kwargs: dict[str, Any]) -> list[Path]:
    paths = []
    for s in range(sessions):
        path = root / f"s{s:02d}.h5"
        data = (np.arange(40 * 32, dtype="f4").reshape(40, 32) + s * 1e5).astype(">f4")
        with h5py.File(path, "w") as f:
            f.create_dataset("x", data=data, **kwargs)
        paths.append(path)
    return paths


LAYOUTS = {
    "contiguous": {},
    "raw chunks": {"chunks": (8, 32)},
    "gzip": {"chunks": (8, 32), "compression": "gzip", "shuffle": True},
    "h5py": {"chunks": (8, 32), "compression": "lzf"},
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_many_threads_over_more_files_than_max_open_read_what_one_thread_reads(
    tmp_path: Path, layout: str
) -> None:
    paths = _write_files(tmp_path, 10, LAYOUTS[layout])
    with HDF5SessionDataset(paths, key="x", max_open_files=3, memory_map=False) as serial:
        want = np.stack(serial.__getitems__(list(range(len(serial)))))
    ds = HDF5SessionDataset(paths, key="x", max_open_files=3)
    rng = np.random.default_rng(0)
    n = len(ds)
    disjoint = np.array_split(rng.permutation(n), 40)
    overlapping = [rng.integers(0, n, 64) for _ in range(40)]
    batches = [b.tolist() for pair in zip(disjoint, overlapping, strict=True) for b in pair]
    peak = [0]
    done = threading.Event()

    def watch() -> None:  # these files HDF5 has open in this process (one snapshot)
        # only this test's files: a file an earlier test left to garbage collection counts not
        while not done.is_set():
            peak[0] = max(peak[0], len(_hdf5_files_under(tmp_path)))
            time.sleep(0.0005)

    def read(k: int) -> tuple[list[int], np.ndarray]:
        batch = batches[k]
        if k % 5 == 0:
            return batch, np.stack([np.asarray(ds[i]) for i in batch])
        return batch, np.stack(ds.__getitems__(batch))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(read, range(len(batches))))
    finally:
        done.set()
        watcher.join()
    for batch, got in results:
        assert got.tobytes() == want[batch].tobytes()
    info = ds.handles.file_pool_info()
    assert info.evictions > 0
    assert 0 < peak[0] <= 3  # never more than max_open_files, not even for a moment
    ds.close()
    assert _open_under(tmp_path) == 0


def test_close_while_threads_read_leaves_no_descriptor(tmp_path: Path) -> None:
    paths = _write_files(tmp_path, 6, LAYOUTS["gzip"])
    with HDF5SessionDataset(paths, key="x", max_open_files=2) as serial:
        want = np.stack(serial.__getitems__(list(range(len(serial)))))
    ds = HDF5SessionDataset(paths, key="x", max_open_files=2)
    stop = threading.Event()
    errors: list[BaseException] = []
    counts = [0] * 4

    def read(seed: int) -> None:
        rng = np.random.default_rng(seed)
        while not stop.is_set():
            batch = rng.integers(0, len(ds), 32).tolist()
            try:
                got = np.stack(ds.__getitems__(batch))
            except Exception as exc:  # pragma: no cover - the assertion below reports it
                errors.append(exc)
                return
            assert got.tobytes() == want[batch].tobytes()
            counts[seed] += 1

    closes = 0
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(read, s) for s in range(4)]
        deadline = time.monotonic() + 30
        while (min(counts) < 5 or closes < 30) and time.monotonic() < deadline and not errors:
            ds.close()  # while every thread reads
            closes += 1
            time.sleep(0.002)
        stop.set()
        for future in futures:
            future.result()
    assert not errors, errors
    assert min(counts) >= 5 and closes >= 30
    ds.close()
    assert _open_under(tmp_path) == 0
    assert ds.handles.open_files == 0


def test_an_eviction_waits_for_the_reader_of_the_file(tmp_path: Path) -> None:
    a, b = _write_files(tmp_path, 2, {})
    pool = FilePool(
        lambda k: Handle(h5py.File([a, b][k], "r")), max_open=1, path_of=[a, b].__getitem__
    )
    first = pool.lease(0)
    other: list[Handle] = []
    thread = threading.Thread(target=lambda: other.append(pool.lease(1)))
    thread.start()
    thread.join(0.3)
    assert thread.is_alive()  # waits: the bound is full and its only file is being read
    assert first.file.id.valid and first.file["x"][3, 0] == np.float32(3 * 32)
    assert _open_under(tmp_path) == 1
    pool.release(first)  # the last reader: the evicted file is closed, the waiter opens
    thread.join(5)
    assert not thread.is_alive() and not first.file.id.valid
    assert other[0].file["x"][0, 0] == np.float32(1e5)
    assert pool.info().evictions == 1 and _open_under(tmp_path) == 1
    pool.release(other[0])
    pool.close()
    assert _open_under(tmp_path) == 0


def test_lease_open_leases_every_open_file_or_none_and_release_all_gives_back(
    tmp_path: Path,
) -> None:
    paths = _write_files(tmp_path, 3, {})
    pool = FilePool(
        lambda k: Handle(h5py.File(paths[k], "r")), max_open=2, path_of=paths.__getitem__
    )
    assert pool.lease_open([0]) is None  # never opens
    pool.release(pool.lease(0))
    pool.release(pool.lease(1))
    assert pool.lease_open([1, 2]) is None  # one not open: nothing leased
    held = pool.lease_open([1, 0])
    assert held is not None and [h.readers for h in held] == [1, 1]
    assert held[0].file.filename == str(paths[1])
    evicting = threading.Thread(target=lambda: pool.release(pool.lease(2)))
    evicting.start()  # evicts the least recently used file; it waits for its reader
    evicting.join(0.3)
    assert evicting.is_alive() and _open_under(tmp_path) == 2
    pool.release_all(held)  # the last reader of the retired file closes it
    evicting.join(5)
    assert not evicting.is_alive() and [h.readers for h in held] == [0, 0]
    assert _open_under(tmp_path) == 2  # never more than max_open
    pool.close()
    assert _open_under(tmp_path) == 0


def test_a_held_session_is_one_copy_shared_by_the_threads(tmp_path: Path) -> None:
    paths, arrays = write_wide(tmp_path, 2, 60, (40,), chunk_rows=60)
    with pytest.warns(PerformanceHint, match="spans 40 chunks"):
        ds = HDF5SessionDataset(paths, key="betas", max_session_bytes=1 << 20)
    barrier = threading.Barrier(4)

    def read(k: int) -> np.ndarray:
        barrier.wait()
        batch = list(range(k * 10, k * 10 + 20))
        return np.stack(ds.__getitems__(batch))

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(read, range(4)))
    for k, rows in enumerate(got):
        assert rows.tobytes() == arrays[0][k * 10 : k * 10 + 20].tobytes()
    info = ds.budgets.held_info()
    assert info.loads == 1  # one copy of session 0 for every thread, not one each
    assert info.hits >= 3
    ds.close()


def test_a_batch_reads_its_other_sessions_while_another_thread_reads_one_whole(
    tmp_path: Path,
) -> None:
    """Two threads whose batches need the same sessions read different ones whole at once."""
    paths, arrays = write_wide(tmp_path, 2, 60, (40,), chunk_rows=60)
    with pytest.warns(PerformanceHint, match="spans 40 chunks"):
        ds = HDF5SessionDataset(paths, key="betas", max_session_bytes=1 << 20)
    held = ds._reader.files.held
    batch = [0, 1, 60, 61]  # rows of session 0 and session 1
    pool = ThreadPoolExecutor(1)
    other = held.building(0)
    other.acquire()  # as if another thread read session 0 whole now
    try:
        assert held.reading(0) and not held.reading(1)
        pending = pool.submit(ds.__getitems__, batch)
        deadline = time.monotonic() + 60
        while held.get(1, touch=False) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        # session 1 was read whole first; the batch now waits for session 0
        assert held.get(1, touch=False) is not None and held.get(0, touch=False) is None
        assert not pending.done()
    finally:
        other.release()
        pool.shutdown(wait=True)
    rows = np.stack(pending.result(timeout=60))
    assert not held.reading(0)
    expected = np.concatenate([arrays[0][[0, 1]], arrays[1][[0, 1]]])
    assert rows.tobytes() == expected.tobytes()
    assert ds.budgets.held_info().loads == 2
    ds.close()


def test_the_hook_lock_knows_its_holder() -> None:
    """``held()`` is true in the holding thread only, through nested holds, until the last."""
    import threading

    from loaderkit.hdf5.read.hooklock import HookLock

    freed: list[bool] = []
    lock = HookLock(lambda: freed.append(True))
    seen: list[bool] = []
    assert not lock.held()
    with lock:
        with lock:
            assert lock.held()
            other = threading.Thread(target=lambda: seen.append(lock.held()))
            other.start()
            other.join()
        assert lock.held() and not freed  # the inner release is not the outermost
    assert not lock.held() and freed == [True] and seen == [False]
