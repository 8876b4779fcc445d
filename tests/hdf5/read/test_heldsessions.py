"""Held sessions stay within their budget when threads meet at a session boundary.

Worker threads share one ``HeldSessions``. In block order, one thread still copies the last
batch of a session while another starts the next: the next is read into the dropped
session's buffer once its readers are done (one buffer where the budget holds one), and a
thread that wants a session while another is being read in its place reads its rows without
holding them. Real threads, real files.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from loaderkit import DataLoader, HDF5SessionDataset
from loaderkit.hdf5.read import widekeys
from loaderkit.hdf5.read.heldsessions import HeldSession, HeldSessions
from tests.hdf5.helpers import write_wide

pytestmark = pytest.mark.filterwarnings("ignore::loaderkit.errors.PerformanceHint")


def _address(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def test_the_next_session_reuses_the_buffer_once_its_last_reader_is_done() -> None:
    held = HeldSessions(1000)
    assert held.reserve(1000)
    first = held.buffer((500,), np.dtype("i2"))
    held.put(0, HeldSession([first], size=1, mtime_ns=0, readers=0), reserved=1000)
    reading = held.acquire(0)  # another thread copies a batch out of session 0
    assert reading is not None
    assert held.reserve(1000)  # session 1 replaces it: 0 is dropped, still read
    assert held.get(0, touch=False) is None
    got: list[np.ndarray] = []
    waiter = threading.Thread(target=lambda: got.append(held.buffer((500,), np.dtype("i2"))))
    waiter.start()
    time.sleep(0.2)
    assert not got  # no second buffer while session 0 is read
    held.release(reading)
    waiter.join(5)
    assert got and _address(got[0]) == _address(first)


def test_no_room_beside_a_session_being_read_whole() -> None:
    held = HeldSessions(1000)
    assert held.reserve(600)
    assert not held.reserve(600)  # a second thread: its rows are read, not held
    held.unreserve(600)  # the first read failed
    assert held.reserve(600)
    held.put(0, HeldSession([np.zeros(300, "i2")], size=1, mtime_ns=0), reserved=600)
    assert held.reserve(600)  # session 0 is dropped for it
    assert len(held) == 0 and held.info().evictions == 1


def test_a_buffer_of_another_size_is_not_waited_for_and_nothing_is_kept() -> None:
    held = HeldSessions(1000)
    assert held.reserve(1000)
    held.put(0, HeldSession([np.zeros(500, "i2")], size=1, mtime_ns=0), reserved=1000)
    reading = held.acquire(0)
    assert reading is not None and held.reserve(800)
    begun = time.monotonic()
    other = held.buffer((400,), np.dtype("i2"))  # not session 0's size: allocated at once
    assert other.nbytes == 800 and time.monotonic() - begun < 1
    held.release(reading)
    assert not held._draining  # the dropped session is not kept alive


def test_worker_threads_share_one_session_buffer_in_block_order(tmp_path: Path) -> None:
    paths, arrays = write_wide(tmp_path, 4, 40, (3000,))
    session = arrays[0].nbytes
    ds = HDF5SessionDataset(paths, key="betas", max_session_bytes=session)
    seen: set[int] = set()
    real = ds.handles.reader.files.held.buffer

    def buffer(*args: object, **kwargs: object) -> np.ndarray:
        out = real(*args, **kwargs)  # type: ignore[arg-type]
        seen.add(_address(out))
        return out

    ds.handles.reader.files.held.buffer = buffer  # type: ignore[method-assign]
    loader = DataLoader(
        ds, batch_size=7, shuffle="block", num_workers=2, worker_method="thread", seed=0
    )
    for epoch in range(2):
        order = loader.sampler.indices() if epoch == 0 else None
        rows = np.concatenate([np.asarray(b) for b in loader])
        assert rows.shape == (160, 3000)
        for k, i in enumerate(order if order is not None else []):
            s, row = ds.locate(int(i))
            np.testing.assert_array_equal(rows[k], arrays[int(s)][row])
    info = ds.budgets.held_info()
    assert info.held_bytes <= session and info.loads >= 4
    assert len(seen) == 1  # every session read into the one buffer
    loader.close()


def _watchers(monkeypatch: pytest.MonkeyPatch) -> list[widekeys.WideAhead]:
    made: list[widekeys.WideAhead] = []
    real = widekeys.WideAhead.__init__

    def init(self: widekeys.WideAhead, *args: Any, **kwargs: Any) -> None:
        real(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(widekeys.WideAhead, "__init__", init)
    return made


def test_block_order_readies_the_next_session_while_one_is_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths, arrays = write_wide(tmp_path, 4, 40, (3000,))
    made = _watchers(monkeypatch)
    asked: list[tuple[str, int, int]] = []
    real_advise = os.posix_fadvise

    def advise(fd: int, offset: int, length: int, advice: int) -> None:
        if threading.current_thread().name == "loaderkit-wide-ahead":
            asked.append((os.readlink(f"/proc/self/fd/{fd}"), offset, length))
        real_advise(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", advise)
    ds = HDF5SessionDataset(paths, key="betas", max_session_bytes=arrays[0].nbytes)

    def collate(samples: list[Any]) -> np.ndarray:
        time.sleep(0.02)  # a training step: the next session is readied meanwhile
        return np.stack(samples)

    loader = DataLoader(
        ds, batch_size=8, shuffle="block", num_workers=0, seed=0, collate_fn=collate
    )
    order = loader.sampler.indices()
    rows = np.concatenate([np.asarray(b) for b in loader])
    for k, i in enumerate(order):
        s, row = ds.locate(int(i))
        np.testing.assert_array_equal(rows[k], arrays[int(s)][row])
    (watcher,) = made
    sessions = list(dict.fromkeys(int(ds.locate(int(i))[0]) for i in order))
    assert not watcher.quiet and watcher.readied == sessions[1:]  # all but the first
    assert watcher.asked == sessions[1:]
    for (path, offset, length), pos in zip(asked, sessions[1:], strict=True):
        assert Path(path).resolve() == Path(paths[pos]).resolve()
        with h5py.File(paths[pos], "r") as f:
            first = min(f["betas"].id.get_chunk_info(c).byte_offset for c in range(3000))
        assert offset == first and 0 < length <= Path(paths[pos]).stat().st_size
    loader.close()


def test_readying_ahead_is_quiet_where_it_cannot_help(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths, arrays = write_wide(tmp_path, 4, 40, (3000,))
    made = _watchers(monkeypatch)
    ds = HDF5SessionDataset(paths, key="betas", max_session_bytes=arrays[0].nbytes)
    with DataLoader(ds, batch_size=8, shuffle=True, num_workers=0, seed=0) as loader:
        assert sum(len(b) for b in loader) == 160  # batches mix sessions: not block order
    assert made[-1].quiet and not made[-1].readied
    with DataLoader(
        ds, batch_size=4, shuffle="block", num_workers=1, multiprocessing_context="fork", seed=0
    ) as loader:
        assert sum(len(b) for b in loader) == 160  # a worker process reads the files
    assert made[-1].quiet and made[-1].readied == []


@pytest.mark.timeout(60)
def test_readying_ahead_with_one_file_open_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the watcher's thread holds no lease while it waits: the reads' leases never wait on it
    paths, arrays = write_wide(tmp_path, 4, 40, (3000,))
    made = _watchers(monkeypatch)
    ds = HDF5SessionDataset(
        paths, key="betas", max_session_bytes=arrays[0].nbytes, max_open_files=1
    )
    with DataLoader(ds, batch_size=8, shuffle="block", num_workers=0, seed=0) as loader:
        order = loader.sampler.indices()  # the first pass's
        for epoch in range(2):
            rows = np.concatenate([np.asarray(b) for b in loader])
            assert rows.shape == (160, 3000)
            for k, i in enumerate(order if epoch == 0 else []):
                s, row = ds.locate(int(i))
                np.testing.assert_array_equal(rows[k], arrays[int(s)][row])
    assert len(made) == 2 and all(not w.quiet for w in made)
