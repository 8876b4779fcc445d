"""``Prefetcher``: in order, bounded, holding what the window needs, closing promptly."""

from __future__ import annotations

import multiprocessing
import pickle
import time
from pathlib import Path

import pytest

from loaderkit.storage import ObjectInfo, Prefetcher, SessionCache, fetch_many, stat_objects
from loaderkit.storage.limits import GiB
from tests.storage import helpers
from tests.storage.conftest import Bucket

KIB = 1024


def _put(bucket: Bucket, count: int, size: int) -> dict[str, ObjectInfo]:
    urls = [bucket.put(f"p/s{i}.h5", helpers.payload(i, size)) for i in range(count)]
    infos = stat_objects(urls, bucket.options)
    bucket.server.requests.clear()
    bucket.server.peak = 0
    return infos


def _fetch_order(bucket: Bucket) -> list[str]:
    return [r.path.rsplit("/", 1)[1] for r in bucket.server.log() if r.path.endswith(".h5")]


def test_fetches_the_window_in_order_bounded_and_holds_it(bucket: Bucket, cache_dir: Path) -> None:
    infos = _put(bucket, 6, 64 * KIB)
    urls = list(infos)
    bucket.server.throttle = 0.005
    cache = SessionCache(cache_dir, max_bytes=GiB, min_free=0, prefetch=3)
    with Prefetcher(cache, infos, bucket.options, threads=1) as fetcher:
        assert fetcher._threads == []  # no thread before the first ahead()
        fetcher.ahead([urls[4], urls[1], urls[1], urls[5], urls[0]])  # window: s4, s1, s5
        for url in (urls[4], urls[1], urls[5]):
            assert fetcher.wait(url, timeout=30)
        assert fetcher.held() == [urls[4], urls[1], urls[5]]
        assert _fetch_order(bucket) == ["s4.h5", "s1.h5", "s5.h5"]
        assert bucket.server.peak == 1
        assert {e.url for e in cache.ls() if e.in_use} == {urls[4], urls[1], urls[5]}
        fetcher.ahead([urls[5], urls[2]])  # the window moved: s4 and s1 released
        assert fetcher.wait(urls[2], timeout=30)
        assert {e.url for e in cache.ls() if e.in_use} == {urls[5], urls[2]}
    assert not [e for e in cache.ls() if e.in_use]
    assert not fetcher.errors()
    bucket.server.peak = 0
    bucket.server.throttle = 0.02  # 80 ms per object: two threads overlap
    with Prefetcher(cache, infos, bucket.options, threads=2, window=3) as fetcher:
        fetcher.ahead([urls[0], urls[2], urls[3]])  # three downloads, two at a time
        assert all(fetcher.wait(url, timeout=30) for url in (urls[0], urls[2], urls[3]))
        assert bucket.server.peak == 2


def test_close_cancels_a_download_in_flight_promptly(bucket: Bucket, cache_dir: Path) -> None:
    infos = _put(bucket, 1, 1024 * KIB)
    bucket.server.throttle = 0.05  # 64 chunks: 3 s
    cache = SessionCache(cache_dir, max_bytes=GiB, min_free=0)
    fetcher = Prefetcher(cache, infos, bucket.options)
    fetcher.ahead(list(infos))
    objects = cache_dir / "objects"
    deadline = time.monotonic() + 10
    while not list(objects.glob("*.part")) and time.monotonic() < deadline:
        time.sleep(0.01)
    started = time.monotonic()
    fetcher.close(timeout=5)
    assert time.monotonic() - started < 1.0
    assert not any(worker.is_alive() for worker in fetcher._threads)
    assert not list(objects.glob("*.data")) and not list(objects.glob("*.part"))
    fetcher.close()  # idempotent


def test_travels_as_configuration_and_a_forked_child_starts_no_thread(
    bucket: Bucket, cache_dir: Path
) -> None:
    infos = _put(bucket, 2, 8 * KIB)
    cache = SessionCache(cache_dir, max_bytes=GiB, min_free=0)
    with Prefetcher(cache, infos, bucket.options, window=1) as fetcher:
        fetcher.ahead(list(infos))
        assert fetcher.wait(next(iter(infos)), timeout=30)
        copy = pickle.loads(pickle.dumps(fetcher))
        assert copy.held() == [] and copy._threads == [] and copy.window == 1
        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        child = context.Process(target=_child_state, args=(fetcher, queue))
        child.start()
        assert queue.get(timeout=30) == ([], 0)
        child.join(10)


def _child_state(fetcher: Prefetcher, queue: object) -> None:
    queue.put((fetcher.held(), len(fetcher._threads)))  # type: ignore[attr-defined]


def test_fetch_many_reports_progress(bucket: Bucket, cache_dir: Path) -> None:
    infos = _put(bucket, 3, 20 * KIB)
    cache = SessionCache(cache_dir, max_bytes=GiB, min_free=0)
    done: list[int] = []
    paths = fetch_many(cache, list(infos.values()), bucket.options, progress=done.append)
    assert [path.read_bytes() for path in paths] == [helpers.payload(i, 20 * KIB) for i in range(3)]
    assert sum(done) == 60 * KIB
    assert fetch_many(cache, list(infos.values()), bucket.options) == paths  # all hits
    assert len(_fetch_order(bucket)) == 3


def test_a_failed_prefetch_is_kept_not_raised(bucket: Bucket, cache_dir: Path) -> None:
    missing = ObjectInfo(bucket.url("p/gone.h5"), 10)
    cache = SessionCache(cache_dir, max_bytes=GiB, min_free=0)
    with Prefetcher(cache, {missing.url: missing}, bucket.options) as fetcher:
        fetcher.ahead([missing.url])
        assert not fetcher.wait(missing.url, timeout=30)
        assert isinstance(fetcher.errors()[missing.url], FileNotFoundError)
        with pytest.raises(KeyError, match="not among"):
            fetcher.ahead(["s3://elsewhere/x.h5"])
