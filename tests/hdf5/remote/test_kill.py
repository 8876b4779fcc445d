"""SIGKILL of the process downloading a session of a remote dataset, mid-file.

A loader reads a remote dataset in a child process (the victim) from a throttled S3 server on
127.0.0.1; the test kills, with SIGKILL, the very process writing the download (the ``.part``
file names its pid): the victim's main process (its prefetcher thread) or a DataLoader worker
leasing the session itself. Meanwhile every file under a final name is checked to be whole (the
only names a lease hands to h5py are final ones). The next run completes with the local files'
samples and removes the dead download's leftover.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loaderkit import DataLoader, HDF5SessionDataset, SessionCache
from tests.hdf5 import remotefiles as files
from tests.hdf5.remotefiles import Remote, rows

SESSIONS = 3
KIB = 1024


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Remote]:
    yield from files.start(tmp_path_factory.mktemp("remote"), SESSIONS)


def _epoch(names: list[str], options: Any, cache: Any, workers: int) -> list[Any]:
    ds = HDF5SessionDataset(names, key="x", storage_options=options, cache=cache)
    with DataLoader(ds, batch_size=16, shuffle="block", seed=5, num_workers=workers) as loader:
        return [rows(batch) for batch in loader]


def _victim(urls: list[str], options: dict[str, Any], directory: str, workers: int) -> None:
    """In the child: read an epoch; the test kills the downloading process first."""
    cache = SessionCache(directory, prefetch=0 if workers else 2, room_timeout=20)
    _epoch(urls, options, cache, workers)
    os._exit(0)  # pragma: no cover - the test kills it first


def _digests(s3: Remote) -> set[str]:
    return {hashlib.md5(Path(path).read_bytes()).hexdigest() for path in s3.paths}


def _whole(objects: Path, digests: set[str]) -> None:
    """Every file under a final name is a complete session (size and bytes)."""
    for data in objects.glob("*.data"):
        try:
            body = data.read_bytes()
        except FileNotFoundError:
            continue
        assert hashlib.md5(body).hexdigest() in digests, f"partial {data} ({len(body)} bytes)"


@pytest.mark.parametrize(
    ("workers", "who"),
    [pytest.param(0, "prefetcher", id="main-prefetcher"), pytest.param(2, "worker", id="worker")],
)
def test_sigkill_of_the_downloading_process_mid_file(
    s3: Remote, tmp_path: Path, workers: int, who: str
) -> None:
    directory = tmp_path / "cache"
    objects = directory / "objects"
    reference = _epoch(s3.paths, None, None, 0)
    # the metadata records first: the victim's construction then reads no object
    HDF5SessionDataset(s3.urls, key="x", storage_options=s3.options, cache=SessionCache(directory))
    digests = _digests(s3)
    s3.server.throttle = 0.03  # 48 blocks of 16 KiB per session: ~1.5 s each
    victim = multiprocessing.get_context("fork").Process(
        target=_victim, args=(s3.urls, s3.options, str(directory), workers)
    )
    victim.start()
    killed = None
    try:
        deadline = time.monotonic() + 60
        while killed is None and time.monotonic() < deadline:
            _whole(objects, digests)
            for part in objects.glob("*.part"):
                try:
                    written = part.stat().st_size
                except FileNotFoundError:
                    continue
                pid = int(part.name.split(".")[2])
                if written > 64 * KIB and written < min(s3.sizes) // 2:
                    os.kill(pid, signal.SIGKILL)
                    killed = pid
                    break
            time.sleep(0.005)
        assert killed is not None, "no download seen in flight"
        assert (killed == victim.pid) == (who == "prefetcher")
        time.sleep(0.3)
        _whole(objects, digests)
        assert list(objects.glob("*.part"))  # the dead download's leftover
    finally:
        if victim.is_alive():
            os.kill(victim.pid, signal.SIGKILL)  # type: ignore[arg-type]
        victim.join(30)
        s3.server.throttle = 0.0
    assert victim.exitcode == -signal.SIGKILL or who == "worker"
    again = _epoch(s3.urls, s3.options, SessionCache(directory, room_timeout=20), workers)
    assert again == reference
    assert not list(objects.glob("*.part"))  # removed by the next download of that entry
    _whole(objects, digests)
    assert len(list(objects.glob("*.data"))) == SESSIONS
