"""The cache shared by real processes: fetched once per node, leases across processes, SIGKILL."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from loaderkit.storage import ObjectInfo, SessionCache, stat_objects
from loaderkit.storage.limits import GiB
from tests.storage import helpers
from tests.storage.conftest import Bucket

KIB = 1024


def _put(bucket: Bucket, count: int, size: int) -> list[ObjectInfo]:
    urls = [bucket.put(f"p/s{i}.h5", helpers.payload(i, size)) for i in range(count)]
    infos = list(stat_objects(urls, bucket.options).values())
    bucket.server.requests.clear()
    return infos


def _full_gets(bucket: Bucket, infos: list[ObjectInfo]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for info in infos:
        key = info.url.split("/", 3)[3]
        counts[key] = len(bucket.server.object_gets(key))
    return counts


@pytest.mark.parametrize(
    ("method", "processes"),
    [
        pytest.param("fork", 4, id="fork-4"),
        pytest.param("spawn", 2, id="spawn-2", marks=pytest.mark.slow),
    ],
)
def test_each_object_is_fetched_once_per_node(
    bucket: Bucket, cache_dir: Path, method: str, processes: int
) -> None:
    infos = _put(bucket, 3, 256 * KIB)
    bucket.server.throttle = 0.002  # ~16 chunks of 16 KiB per object: the races overlap
    cache = SessionCache(cache_dir, max_bytes=GiB, min_free=0)
    context = multiprocessing.get_context(method)
    start = time.time() + (1.0 if method == "fork" else 4.0)
    with ProcessPoolExecutor(processes, mp_context=context) as pool:
        futures = [
            pool.submit(helpers.lease_all, cache, infos, bucket.options, start)
            for _ in range(processes)
        ]
        results = [future.result(timeout=120) for future in futures]
    for result in results:
        assert result == [(info.url, info.size) for info in infos]
    assert set(_full_gets(bucket, infos).values()) == {1}
    assert all(r.range is None for r in bucket.server.log() if r.path.endswith(".h5"))
    assert cache.du() == 3 * 256 * KIB


def test_a_lease_held_by_another_process_is_never_evicted(bucket: Bucket, cache_dir: Path) -> None:
    infos = _put(bucket, 4, 40 * KIB)
    cache = SessionCache(cache_dir, max_bytes=100 * KIB, min_free=0)
    context = multiprocessing.get_context("fork")
    ready, release = context.Event(), context.Event()
    holder = context.Process(
        target=helpers.hold_lease, args=(cache, infos[0], bucket.options, ready, release)
    )
    holder.start()
    try:
        assert ready.wait(30)
        for info in infos[1:]:
            cache.lease(info, bucket.options).close()
            assert cache.du() <= 100 * KIB
        urls = {entry.url: entry.in_use for entry in cache.ls()}
        assert urls == {infos[0].url: True, infos[3].url: False}
    finally:
        release.set()
        holder.join(30)
    assert [entry.in_use for entry in cache.ls()] == [False, False]  # released at exit


def test_sigkill_mid_download_leaves_no_partial_file(bucket: Bucket, cache_dir: Path) -> None:
    (info,) = _put(bucket, 1, 512 * KIB)
    cache = SessionCache(cache_dir, max_bytes=GiB, min_free=0)
    objects = cache_dir / "objects"
    bucket.server.throttle = 0.01  # 32 chunks: ~0.3 s
    context = multiprocessing.get_context("fork")
    child = context.Process(target=helpers.download_forever, args=(cache, info, bucket.options))
    child.start()
    deadline = time.monotonic() + 30
    seen_part = False
    while time.monotonic() < deadline:
        assert not list(objects.glob("*.data")), "a partial file under the final name"
        parts = list(objects.glob("*.part"))
        if parts and parts[0].stat().st_size > 32 * KIB:
            seen_part = True
            break
        time.sleep(0.005)
    assert seen_part, "the download never started"
    os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
    child.join(10)
    assert not list(objects.glob("*.data")) and list(objects.glob("*.part"))
    bucket.server.throttle = 0.0
    with cache.lease(info, bucket.options) as cached:  # the dead process's locks are gone
        assert cached.path.read_bytes() == helpers.payload(0, 512 * KIB)
    assert not list(objects.glob("*.part"))  # its leftover removed
