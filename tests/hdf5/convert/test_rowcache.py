"""``layout="rows"`` and fork: the rechunk runs h5py in a prefetch thread of the main process.

A fork while that thread is inside h5py would hand the child h5py's global lock held by a thread
it does not have. ``loaderkit.hdf5.convert.rowcache.FORK_GUARD`` makes a fork wait for a running
transform: checked directly (a fork during a rechunk returns only after it), and end to end
(non-persistent fork workers over a rows-layout remote dataset whose sessions are evicted and
rechunked again every epoch, prefetch on: every epoch completes, in bounded time).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import h5py
import numpy as np
import pytest

from loaderkit import DataLoader, HDF5SessionDataset, SessionCache
from loaderkit.hdf5.convert.rowcache import RowsTransform
from tests.hdf5 import remotefiles as files
from tests.hdf5.remotefiles import Remote, rows

SESSIONS = 6


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Remote]:
    yield from files.start(tmp_path_factory.mktemp("remote"), SESSIONS)


@pytest.mark.timeout(60)
def test_a_fork_waits_for_a_running_rechunk(tmp_path: Path) -> None:
    src, dst = tmp_path / "nsd.h5", tmp_path / "rows.h5"
    with h5py.File(src, "w") as f:  # NSD's layout: one chunk per voxel, ~0.3 s to rechunk
        f.create_dataset("betas", data=np.ones((750, 20000), np.int16), chunks=(750, 1))
    worker = threading.Thread(target=RowsTransform("betas"), args=(src, dst))
    worker.start()
    scratch = Path(f"{dst}.d")
    deadline = time.monotonic() + 30
    while not scratch.exists() and worker.is_alive() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert scratch.exists(), "the rechunk did not start"
    pid = os.fork()
    if pid == 0:  # the child: h5py works (its lock is free), then leave at once
        try:
            with h5py.File(src, "r") as f:
                code = 0 if f["betas"][0, :4].tolist() == [1, 1, 1, 1] else 1
        except BaseException:
            code = 2
        os._exit(code)
    finished = dst.exists() and not scratch.exists()  # the fork came after the transform
    _, status = os.waitpid(pid, 0)
    worker.join(30)
    assert finished
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.timeout(120)
def test_fork_workers_over_a_rows_cache_with_prefetch_complete_every_epoch(
    s3: Remote, tmp_path: Path
) -> None:
    size = max(s3.sizes)
    cache = SessionCache(
        tmp_path / "cache", layout="rows", max_bytes=4 * size, prefetch=1, room_timeout=30
    )
    ds = HDF5SessionDataset(s3.urls, key="x", storage_options=s3.options, cache=cache)
    loader = DataLoader(
        ds,
        batch_size=16,
        shuffle="block",
        seed=2,
        num_workers=2,
        multiprocessing_context="fork",
        persistent_workers=False,
    )
    started = time.monotonic()
    with loader:
        for epoch in range(3):
            loader.set_epoch(epoch)
            got = sorted(sample for batch in loader for sample in rows(batch))
            assert got == [(s, r) for s in range(SESSIONS) for r in range(files.ROWS)]
    assert time.monotonic() - started < 60
    assert cache.stats().evictions > 0  # sessions were fetched and rechunked again
    assert {entry.layout for entry in cache.ls()} == {"rows"}
