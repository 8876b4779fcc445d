"""``SessionCache`` in one process: limits, hits and misses, LRU, stale objects, verification."""

from __future__ import annotations

import errno
import json
import pickle
import shutil
import warnings
from pathlib import Path

import pytest

from loaderkit.errors import ConfigError, LoaderkitWarning, StorageError
from loaderkit.storage import ObjectInfo, SessionCache, stat_objects
from loaderkit.storage.limits import (
    DiskUsage,
    GiB,
    check_limits,
    fit_cache_limits,
    fit_to_workers,
)
from tests.storage.conftest import Bucket
from tests.storage.helpers import payload

KIB = 1024


def test_defaults_fitted_to_the_disk_with_reasons() -> None:
    limits = fit_cache_limits(DiskUsage(total=200 * GiB, free=40 * GiB, cached=10 * GiB))
    assert limits.min_free.value == 10 * GiB and "5 %" in limits.min_free.reason
    assert limits.max_bytes.value == int(0.8 * (50 - 10) * GiB)
    assert "40.0 GiB free + 10.0 GiB cached" in limits.max_bytes.reason
    assert limits.prefetch.value == 2
    small = fit_cache_limits(DiskUsage(total=4 * GiB, free=3 * GiB, cached=0))
    assert small.min_free.value == GiB  # at least 1 GiB
    mine = fit_cache_limits(DiskUsage(1, 1, 0), max_bytes=5, min_free=0, prefetch=0)
    assert (mine.max_bytes.value, mine.min_free.value, mine.prefetch.value) == (5, 0, 0)
    assert mine.max_bytes.reason == "set by the caller"
    with pytest.raises(ConfigError, match="max_bytes must be an int >= 1"):
        fit_cache_limits(DiskUsage(1, 1, 0), max_bytes=0)


@pytest.mark.parametrize(
    ("max_bytes", "sizes", "readers", "match"),
    [
        (100, [150, 10], 1, r"max_bytes=100 B\) is smaller than the largest session \(150 B"),
        (250, [100, 100, 100], 1, r"smaller than the prefetch window \(300 B, 300 bytes: 1 reader"),
        (700, [100] * 8, 2, r"prefetch window \(600 B, 600 bytes: 2 readers on this node"),
    ],
)
def test_impossible_limits_name_both_sizes(
    max_bytes: int, sizes: list[int], readers: int, match: str
) -> None:
    disk = DiskUsage(total=10**6, free=10**6, cached=0)
    limits = fit_cache_limits(disk, max_bytes=max_bytes, min_free=0, prefetch=2)
    if max_bytes == 700:
        check_limits(limits, disk, sizes[:4], readers=1)
        return
    with pytest.raises(ConfigError, match=match):
        check_limits(limits, disk, sizes, readers)


def test_a_disk_too_small_for_the_largest_session_is_refused() -> None:
    disk = DiskUsage(total=10**6, free=500, cached=0)
    limits = fit_cache_limits(disk, max_bytes=10**6, min_free=100, prefetch=0)
    with pytest.raises(ConfigError, match=r"room for 400 B .* largest session \(1000 B\)"):
        check_limits(limits, disk, [1000])


def test_an_unset_min_free_is_lowered_to_leave_room_for_the_sessions() -> None:
    # The default (5 % of a 252 GiB disk: 12.6 GiB) is more than this disk has free: the
    # cache takes room for one session per reader and leaves the rest free.
    disk = DiskUsage(total=252 * GiB, free=12 * GiB + 400 * 2**20, cached=0)
    limits = fit_cache_limits(disk)
    assert limits.min_free.value > disk.free and limits.max_bytes.value == 0
    fitted = check_limits(limits, disk, [793_264] * 8, readers=2)
    assert fitted.min_free.value == disk.free - 2 * 793_264
    assert fitted.min_free.reason.startswith("lowered from 12.6 GiB (5 % of the 252.0 GiB disk")
    assert "one session per reader (2 x up to 774.7 KiB)" in fitted.min_free.reason
    assert fitted.max_bytes.value == 2 * 793_264 and fitted.prefetch.value == 0
    # Never below 1 GiB (or 5 % of a small disk): a disk that full is refused, naming both.
    full = DiskUsage(total=252 * GiB, free=GiB + 2**20, cached=0)
    floor = check_limits(fit_cache_limits(full), full, [2**20])
    assert floor.min_free.value == GiB and "at least 1.0 GiB stays free" in floor.min_free.reason
    with pytest.raises(ConfigError, match=r"room for 1.0 MiB .* min_free=1.0 GiB\), less than"):
        check_limits(fit_cache_limits(full), full, [2 * 2**20])
    tiny = DiskUsage(total=2 * GiB, free=300 * 2**20, cached=0)
    assert check_limits(fit_cache_limits(tiny), tiny, [2**20]).min_free.value == 299 * 2**20
    # What the caller set is kept, and checked.
    with pytest.raises(ConfigError, match=r"room for 0 B .* min_free=12.6 GiB"):
        check_limits(fit_cache_limits(disk, min_free=int(12.6 * GiB)), disk, [793_264])


def test_one_session_per_worker_process_is_fitted_or_refused() -> None:
    mib = 2**20
    disk = DiskUsage(total=252 * GiB, free=12 * GiB, cached=0)  # min_free 12.6 GiB: max_bytes 0
    sessions = check_limits(fit_cache_limits(disk), disk, [mib] * 8)
    assert sessions.max_bytes.value == mib and sessions.prefetch.value == 0
    fitted = fit_to_workers(sessions, disk, ranks=2, workers=3, largest=mib)
    assert fitted.max_bytes.value == 6 * mib and fitted.min_free.value == 12 * GiB - 6 * mib
    assert "2 ranks on this node x 3 worker processes, up to 1.0 MiB each" in (
        fitted.max_bytes.reason
    )
    assert fit_to_workers(fitted, disk, ranks=2, workers=3, largest=mib) is fitted
    full = DiskUsage(total=252 * GiB, free=GiB + 2 * mib, cached=0)
    with pytest.raises(ConfigError, match=r"room for 2.0 MiB .* each of the 4 processes"):
        fit_to_workers(check_limits(fit_cache_limits(full), full, [mib]), full, 1, 4, mib)
    with pytest.raises(ConfigError, match=r"holds 2 sessions .* at least 3145728 bytes"):
        fit_to_workers(fit_cache_limits(disk, max_bytes=2 * mib), disk, 1, 3, mib)


def test_construction_dir_default_and_picklable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOADERKIT_CACHE", str(tmp_path / "env"))
    cache = SessionCache(max_bytes=10 * KIB, min_free=0)
    assert cache.dir == tmp_path / "env" and (cache.dir / "CACHEDIR.TAG").is_file()
    assert "max_bytes=10240" in repr(cache)
    cache.stats()
    copy = pickle.loads(pickle.dumps(cache))
    assert (copy.dir, copy.limits, copy.layout) == (cache.dir, cache.limits, cache.layout)
    with pytest.raises(ConfigError, match="layout must be"):
        SessionCache(tmp_path, layout="columns")  # type: ignore[arg-type]


def _put(bucket: Bucket, count: int, size: int) -> list[ObjectInfo]:
    urls = [bucket.put(f"p/s{i}.h5", payload(i, size)) for i in range(count)]
    infos = list(stat_objects(urls, bucket.options).values())
    bucket.server.requests.clear()
    return infos


def test_miss_then_hit_one_get_and_a_sidecar(bucket: Bucket, cache_dir: Path) -> None:
    (info,) = _put(bucket, 1, 100 * KIB)
    cache = SessionCache(cache_dir, max_bytes=GiB, min_free=0)
    with cache.lease(info, bucket.options) as first:
        assert first.path.read_bytes() == payload(0, 100 * KIB)
        assert "leased" in repr(first)
    assert first.closed
    with cache.lease(info, bucket.options) as second:
        assert second.path == first.path
        with pytest.raises(TypeError, match="belongs to its process"):
            pickle.dumps(second)
    gets = bucket.server.object_gets("p/s0.h5")
    assert len(gets) == 1 and gets[0].range is None
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.bytes_fetched) == (1, 1, 100 * KIB)
    sidecar = json.loads(first.path.with_suffix(".json").read_text())
    assert sidecar["url"] == info.url and sidecar["etag"] == info.etag
    assert sidecar["layout"] == "stored"
    (entry,) = cache.ls()
    assert (entry.url, entry.size, entry.in_use) == (info.url, 100 * KIB, False)
    assert cache.du() == 100 * KIB and "1 hits, 1 misses" in cache.describe()


def test_lru_eviction_stays_within_max_bytes(bucket: Bucket, cache_dir: Path) -> None:
    infos = _put(bucket, 5, 40 * KIB)
    cache = SessionCache(cache_dir, max_bytes=100 * KIB, min_free=0)
    for info in infos[:2]:
        cache.lease(info, bucket.options).close()
    cache.lease(infos[0], bucket.options).close()  # s0 used last: s1 is the LRU
    cache.lease(infos[2], bucket.options).close()
    assert {entry.url for entry in cache.ls()} == {infos[0].url, infos[2].url}
    for info in infos[3:]:
        cache.lease(info, bucket.options).close()
        assert cache.du() <= 100 * KIB
    assert cache.stats().evictions == 3
    assert [entry.url for entry in cache.ls()] == [infos[3].url, infos[4].url]


def test_an_entry_in_use_is_never_evicted(bucket: Bucket, cache_dir: Path) -> None:
    infos = _put(bucket, 3, 40 * KIB)
    cache = SessionCache(cache_dir, max_bytes=100 * KIB, min_free=0, room_timeout=0.3)
    held = cache.lease(infos[0], bucket.options)
    cache.lease(infos[1], bucket.options).close()
    cache.lease(infos[2], bucket.options).close()  # evicts s1, not the leased s0
    assert held.path.read_bytes() == payload(0, 40 * KIB)
    assert [e.in_use for e in cache.ls()] == [True, False]
    second = cache.lease(infos[2], bucket.options)
    big = _put(bucket, 4, 60 * KIB)[3]
    with pytest.raises(StorageError, match=r"s3\.h5 \(60\.0 KiB\) does not fit .* in use"):
        cache.lease(big, bucket.options)  # s0 and s2 leased: no room within max_bytes
    assert cache.stats().seconds_waiting > 0.2
    result = cache.clear()
    assert result.removed == 0 and set(result.in_use) == {infos[0].url, infos[2].url}
    held.close()
    second.close()
    assert cache.clear().removed == 2 and cache.du() == 0


def test_an_object_larger_than_max_bytes_is_a_config_error(bucket: Bucket, cache_dir: Path) -> None:
    (info,) = _put(bucket, 1, 40 * KIB)
    cache = SessionCache(cache_dir, max_bytes=30 * KIB, min_free=0)
    with pytest.raises(ConfigError, match=r"40\.0 KiB, 40960 bytes\) is larger than .*30720"):
        cache.lease(info, bucket.options)
    with pytest.raises(ConfigError, match="largest session"):
        cache.check_limits([info.size])


def test_a_replaced_object_is_fetched_again_with_one_warning(
    bucket: Bucket, cache_dir: Path
) -> None:
    (old,) = _put(bucket, 1, 10 * KIB)
    cache = SessionCache(cache_dir, max_bytes=GiB, min_free=0)
    cache.lease(old, bucket.options).close()
    bucket.put("p/s0.h5", payload(99, 12 * KIB))
    (new,) = stat_objects([old.url], bucket.options).values()
    assert new.identity != old.identity
    with pytest.warns(LoaderkitWarning, match=r"s0\.h5 changed in the store .*fetching it again"):
        with cache.lease(new, bucket.options) as cached:
            assert cached.path.read_bytes() == payload(99, 12 * KIB)
    assert [entry.size for entry in cache.ls()] == [12 * KIB]  # the old copy is gone
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cache.lease(new, bucket.options).close()  # a hit: no second warning


@pytest.mark.parametrize("wrong", ["size", "md5"])
def test_bytes_that_do_not_match_the_listing_are_never_kept(
    bucket: Bucket, cache_dir: Path, wrong: str
) -> None:
    (info,) = _put(bucket, 1, 10 * KIB)
    if wrong == "size":
        claimed = ObjectInfo(info.url, info.size + 1, None, info.mtime)
    else:
        claimed = ObjectInfo(info.url, info.size, "0" * 32, info.mtime)
    cache = SessionCache(cache_dir, max_bytes=GiB, min_free=0)
    with pytest.raises(StorageError, match=r"s0\.h5: .*changed during the download") as error:
        cache.lease(claimed, bucket.options)
    assert error.value.errno == errno.EIO
    assert not list((cache_dir / "objects").glob("*.data"))
    assert not list((cache_dir / "objects").glob("*.part"))


def test_a_missing_object_at_download_names_its_url(bucket: Bucket, cache_dir: Path) -> None:
    info = ObjectInfo(bucket.url("p/gone.h5"), 10, None, None)
    cache = SessionCache(cache_dir, max_bytes=GiB, min_free=0)
    with pytest.raises(FileNotFoundError, match=r"p/gone\.h5"):
        cache.lease(info, bucket.options)


def test_a_full_disk_mid_download_is_named_and_leaves_nothing(
    bucket: Bucket, cache_dir: Path
) -> None:
    # a real ENOSPC from the kernel, portable to any Linux: the transform writes to /dev/full
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full")
    (info,) = _put(bucket, 1, 10 * KIB)
    cache = SessionCache(cache_dir, max_bytes=GiB, min_free=0, layout="rows")

    def to_dev_full(src: Path, dst: Path) -> None:
        shutil.copyfile(src, "/dev/full")

    with pytest.raises(StorageError, match=r"s0\.h5: the disk of the cache .* filled up") as error:
        cache.lease(info, bucket.options, transform=to_dev_full)
    assert error.value.errno == errno.ENOSPC and "LOADERKIT_CACHE" in str(error.value)
    assert not [p for p in (cache_dir / "objects").iterdir() if p.suffix in (".data", ".part")]


def test_min_free_refuses_a_download_the_disk_cannot_hold(bucket: Bucket, cache_dir: Path) -> None:
    (info,) = _put(bucket, 1, 10 * KIB)
    # the whole disk kept free: no download fits, however much other processes free meanwhile
    total = shutil.disk_usage(cache_dir).total
    cache = SessionCache(cache_dir, max_bytes=GiB, min_free=total, room_timeout=5)
    with pytest.raises(StorageError, match="does not fit the cache") as error:
        cache.lease(info, bucket.options)  # nothing to evict, nothing in use: no waiting
    assert error.value.errno == errno.ENOSPC and cache.stats().seconds_waiting == 0


def test_rows_layout_keeps_what_the_transform_wrote(bucket: Bucket, cache_dir: Path) -> None:
    (info,) = _put(bucket, 1, 10 * KIB)
    cache = SessionCache(cache_dir, max_bytes=GiB, min_free=0, layout="rows")

    def reverse(src: Path, dst: Path) -> None:
        dst.write_bytes(src.read_bytes()[::-1])

    with cache.lease(info, bucket.options, transform=reverse) as cached:
        assert cached.path.read_bytes() == payload(0, 10 * KIB)[::-1]
    assert cache.ls()[0].layout == "rows"


def test_a_killed_transforms_scratch_directory_is_removed_when_unlocked(
    bucket: Bucket, cache_dir: Path
) -> None:
    from loaderkit.storage import entries
    from loaderkit.storage.locks import mutex

    first, second = _put(bucket, 2, 10 * KIB)
    cache = SessionCache(cache_dir, max_bytes=GiB, min_free=0, layout="rows")
    files = entries.EntryFiles(cache_dir / "objects", entries.entry_key(first, "rows"))
    scratch = Path(f"{files.part(first.size)}.d")  # as RowsTransform names it beside its output
    (scratch / "nested").mkdir(parents=True)
    (scratch / "nested" / "s0.h5").write_bytes(bytes(3 * KIB))
    assert cache.du() == 3 * KIB  # counted while it is there
    with mutex(files.lock):  # its download alive elsewhere: kept
        cache.lease(second, bucket.options, transform=shutil.copyfile).close()
        assert scratch.is_dir()
        cache.clear()
        assert scratch.is_dir()
    cache.clear()  # the lock free: a dead one's leftover
    assert not scratch.exists()
    (scratch / "nested").mkdir(parents=True)  # and the entry's own download removes it
    with cache.lease(first, bucket.options, transform=shutil.copyfile) as cached:
        assert cached.path.read_bytes() == payload(0, 10 * KIB)
    assert not scratch.exists()
    assert not [p for p in (cache_dir / "objects").iterdir() if ".part" in p.name]
