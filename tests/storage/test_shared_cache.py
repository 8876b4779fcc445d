"""A node cache users can share and forget: fitted limits, private directory, data-only records,
damaged entries fetched again, and every file the cache keeps listed, cleared and verified."""

from __future__ import annotations

import errno
import json
import os
import pickle
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from loaderkit.errors import CacheDamageError, CacheRepairWarning, ConfigError
from loaderkit.storage import ObjectInfo, SessionCache, entries, stat_objects
from loaderkit.storage.datarecords import RecordCodec, RecordError, decode_dtype, encode_dtype
from loaderkit.storage.limits import DiskUsage, GiB, fit_cache_limits, fit_to_sessions
from tests.storage.conftest import Bucket
from tests.storage.helpers import payload

KIB = 1024
DISK = DiskUsage(total=100 * GiB, free=50 * GiB, cached=0)


def test_an_unset_prefetch_is_fitted_to_max_bytes_with_its_reason() -> None:
    sizes = [GiB] * 8
    fitted = fit_to_sessions(fit_cache_limits(DISK, max_bytes=2 * GiB), DISK, sizes)
    assert fitted.prefetch.value == 1
    assert "fitted to max_bytes 2.0 GiB: 2 ahead would need 3.0 GiB" in fitted.prefetch.reason
    two_ranks = fit_to_sessions(fit_cache_limits(DISK, max_bytes=2 * GiB), DISK, sizes, 2)
    assert two_ranks.prefetch.value == 0 and "session read only" in two_ranks.prefetch.reason
    roomy = fit_cache_limits(DISK, max_bytes=8 * GiB)
    assert fit_to_sessions(roomy, DISK, sizes) == roomy  # nothing to fit: the default stays


def test_explicit_values_that_cannot_fit_stay_errors_naming_both_sizes() -> None:
    sizes = [GiB] * 8
    explicit = fit_cache_limits(DISK, max_bytes=2 * GiB, prefetch=2)
    with pytest.raises(ConfigError, match=r"max_bytes=2\.0 GiB\) is smaller than the prefetch"):
        fit_to_sessions(explicit, DISK, sizes)
    with pytest.raises(ConfigError, match=r"smaller than one session per reader \(3\.0 GiB"):
        fit_to_sessions(fit_cache_limits(DISK, max_bytes=2 * GiB), DISK, sizes, readers=3)


def test_an_unset_max_bytes_is_raised_to_one_session_per_reader_when_the_disk_allows() -> None:
    disk = DiskUsage(total=10 * GiB, free=4 * GiB, cached=0)  # default max_bytes 2.4 GiB
    limits = fit_cache_limits(disk, min_free=GiB)
    fitted = fit_to_sessions(limits, disk, [3 * GiB] * 2)
    assert fitted.max_bytes.value == 3 * GiB and "raised from 2.4 GiB" in fitted.max_bytes.reason
    assert fitted.prefetch.value == 0


def test_the_cache_refits_from_its_defaults_for_each_dataset(cache_dir: Path) -> None:
    cache = SessionCache(cache_dir, max_bytes=2 * KIB, min_free=0)
    assert cache.check_limits([KIB] * 8).prefetch.value == 1
    assert cache.prefetch == 1 and "fitted" in cache.describe()
    assert cache.check_limits([KIB // 2] * 8).prefetch.value == 2  # smaller sessions: 2 again


def test_the_cache_directory_is_made_private(tmp_path: Path) -> None:
    cache = SessionCache(tmp_path / "new" / "cache", max_bytes=KIB, min_free=0)
    for path in (cache.dir, cache.dir / "objects"):
        assert path.stat().st_mode & 0o777 == 0o700, path


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777])
def test_a_directory_others_can_write_is_refused_by_name(tmp_path: Path, mode: int) -> None:
    shared = tmp_path / "team"
    shared.mkdir()
    os.chmod(shared, mode)
    with pytest.raises(ConfigError) as info:
        SessionCache(shared, max_bytes=KIB, min_free=0)
    text = str(info.value)
    assert str(shared) in text and f"mode {mode & 0o7777:04o}" in text and "shared=True" in text
    assert "its group" in text
    assert not (shared / "objects").exists()  # nothing written there
    opted = SessionCache(shared, max_bytes=KIB, min_free=0, shared=True)
    assert opted.shared and "shared=True" in repr(opted)
    assert pickle.loads(pickle.dumps(opted)).shared


def test_a_directory_another_user_owns_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a directory to another user needs root")
    other = tmp_path / "theirs"
    other.mkdir(mode=0o700)
    os.chown(other, 4321, 4321)
    with pytest.raises(ConfigError, match=r"owned by uid 4321, not by you \(root \(uid 0\)\)"):
        SessionCache(other, max_bytes=KIB, min_free=0)
    SessionCache(other, max_bytes=KIB, min_free=0, shared=True)


def test_a_sticky_world_writable_parent_is_fine(tmp_path: Path) -> None:
    parent = tmp_path / "tmp"
    parent.mkdir()
    os.chmod(parent, 0o1777)
    cache = SessionCache(parent / "mine", max_bytes=KIB, min_free=0)
    assert cache.dir.stat().st_mode & 0o777 == 0o700


class Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch /nonexistent-never",))


@pytest.mark.parametrize(
    "dtype",
    [
        np.dtype("<f4"),
        np.dtype(">i2"),
        np.dtype([("a", "<i2"), ("b", ">f8", (2, 3))]),
        np.dtype((np.dtype("<u1"), (4,))),
        np.dtype("O", metadata={"vlen": str}),
        np.dtype("O", metadata={"vlen": np.dtype(">i4")}),
        np.dtype("S6", metadata={"h5py_encoding": "utf-8"}),
        np.dtype("<i1", metadata={"enum": {"FALSE": 0, "TRUE": 1}}),
    ],
)
def test_dtypes_round_trip_with_their_metadata(dtype: np.dtype) -> None:
    back = decode_dtype(encode_dtype(dtype))
    assert back == dtype and back.metadata == dtype.metadata


def test_records_decode_to_data_or_are_refused() -> None:
    codec = RecordCodec("test", 1, classes=(ObjectInfo,))
    value = {"info": ObjectInfo("s3://b/k", 3, "e"), "t": (1, None), "l": [np.int64(2)]}
    text = codec.dumps("k", value)
    assert codec.loads("k", text) == {**value, "l": [2]}
    with pytest.raises(RecordError, match="is not kept"):
        codec.dumps("k", Evil())
    for bad in (
        pickle.dumps({"x": 1}),
        b"not json",
        text.replace('"version":1', '"version":0'),
        text.replace("ObjectInfo", "Popen"),
        '{"format":"test","version":1,"key":"k","value":{"$":"dtype","v":{"str":"O8"}}}',
    ):
        with pytest.raises(RecordError):
            codec.loads("k", bad)


def _put(bucket: Bucket, count: int, size: int) -> list[ObjectInfo]:
    urls = [bucket.put(f"h/s{i}.h5", payload(i, size)) for i in range(count)]
    return list(stat_objects(urls, bucket.options).values())


def _overwrite(path: Path, offset: int, data: bytes) -> None:
    time.sleep(0.02)  # past the filesystem's timestamp granularity
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


@pytest.mark.parametrize("damage", ["truncate", "overwrite"])
def test_a_damaged_entry_is_fetched_again_once_then_refused(
    bucket: Bucket, cache_dir: Path, damage: str
) -> None:
    (info,) = _put(bucket, 1, 64 * KIB)
    cache = SessionCache(cache_dir, max_bytes=GiB, min_free=0)
    path = cache.lease(info, bucket.options)
    path.close()

    def hurt() -> None:
        if damage == "truncate":
            time.sleep(0.02)
            os.truncate(path.path, 10 * KIB)
        else:
            _overwrite(path.path, 30 * KIB, b"\xff" * 100)

    hurt()
    with pytest.warns(CacheRepairWarning, match=r"s0\.h5: the cache's copy .* was damaged"):
        with cache.lease(info, bucket.options) as cached:
            assert cached.path.read_bytes() == payload(0, 64 * KIB)
    assert len([g for g in bucket.server.object_gets("h/s0.h5") if g.range is None]) == 2
    hurt()
    with pytest.raises(CacheDamageError, match=r"s0\.h5: the cache's copy .* fetched again") as e:
        cache.lease(info, bucket.options)
    assert e.value.errno == errno.EIO and "cache verify" in str(e.value)


def test_repair_after_a_failed_open_uses_the_checksum(bucket: Bucket, cache_dir: Path) -> None:
    (info,) = _put(bucket, 1, 64 * KIB)
    cache = SessionCache(cache_dir, max_bytes=GiB, min_free=0)
    cached = cache.lease(info, bucket.options)
    assert cache.repair(cached, "refused") is cached  # its MD5 matches: the object's bytes
    before = cached.path.stat()
    _overwrite(cached.path, 100, b"\0" * 8)
    os.utime(cached.path, ns=(before.st_atime_ns, before.st_mtime_ns))  # no trace but the bytes
    assert cache.check_entry(info) == ""
    with pytest.warns(CacheRepairWarning, match="its MD5 is"):
        fresh = cache.repair(cached, "refused", bucket.options)
    assert cached.closed and fresh.path.read_bytes() == payload(0, 64 * KIB)
    fresh.close()


def test_a_shared_cache_checks_entries_against_the_store(bucket: Bucket, tmp_path: Path) -> None:
    (info,) = _put(bucket, 1, 16 * KIB)
    directory = tmp_path / "team"
    directory.mkdir()
    os.chmod(directory, 0o2770)
    writer = SessionCache(directory, max_bytes=GiB, min_free=0, shared=True)
    with writer.lease(info, bucket.options) as cached:
        data = cached.path
    # another member rewrites the copy and its sidecar to match: only the store can tell
    (data.parent / (data.stem + ".tmp")).write_bytes(b"\0" * info.size)
    os.replace(data.parent / (data.stem + ".tmp"), data)
    sidecar = entries.read_sidecar(entries.EntryFiles(data.parent, data.stem))
    sidecar.update(file_mtime_ns=data.stat().st_mtime_ns, md5=None)
    data.with_suffix(".json").write_text(json.dumps(sidecar))
    reader = SessionCache(directory, max_bytes=GiB, min_free=0, shared=True)
    with pytest.warns(CacheRepairWarning, match="the store's ETag is"):
        with reader.lease(info, bucket.options) as cached:
            assert cached.path.read_bytes() == payload(0, 16 * KIB)


def test_every_file_the_cache_keeps_is_in_its_layout_and_cleared(
    bucket: Bucket, cache_dir: Path
) -> None:
    infos = _put(bucket, 2, 8 * KIB)
    cache = SessionCache(cache_dir, max_bytes=GiB, min_free=0)
    held = cache.lease(infos[0], bucket.options)
    cache.lease(infos[1], bucket.options).close()
    meta = cache_dir / "meta"
    meta.mkdir()
    (meta / "0123.json").write_text('{"format":"x","version":1,"key":"0123","value":1}')
    (meta / "0456.pkl").write_bytes(pickle.dumps(Evil()))
    (cache_dir / "stats" / "999999999-dead.bin").write_bytes(b"\0" * 40)
    every = [p.relative_to(cache_dir).as_posix() for p in cache_dir.rglob("*") if p.is_file()]
    assert [name for name in every if entries.classify(name) is None] == []
    usage = cache.usage()
    assert usage["entries"] > 16 * KIB and usage["meta"] > 0 and usage["stats"] >= 40
    result = cache.clear()
    assert result.removed == 1 and result.in_use == (infos[0].url,)
    assert dict(result.other)["meta"] == 2 and dict(result.other)["stats"] == 1
    assert not list(meta.iterdir())
    assert [p.name for p in (cache_dir / "stats").iterdir()] == [cache._totals.path.name]
    held.close()


def test_verify_removes_damaged_entries_and_foreign_records(
    bucket: Bucket, cache_dir: Path
) -> None:
    infos = _put(bucket, 3, 8 * KIB)
    cache = SessionCache(cache_dir, max_bytes=GiB, min_free=0)
    paths = []
    for info in infos:
        with cache.lease(info, bucket.options) as cached:
            paths.append(cached.path)
    time.sleep(0.02)
    os.truncate(paths[0], 100)
    before = paths[1].stat()
    _overwrite(paths[1], 10, b"\1\2\3")
    os.utime(paths[1], ns=(before.st_atime_ns, before.st_mtime_ns))
    (cache_dir / "meta").mkdir()
    (cache_dir / "meta" / "abc.pkl").write_bytes(pickle.dumps(Evil()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = cache.verify()
    assert result.checked == 3
    assert sorted(url for url, _, _ in result.damaged) == [infos[0].url, infos[1].url]
    assert any("its size is 100 bytes" in why for _, _, why in result.damaged)
    assert any("MD5" in why for _, _, why in result.damaged)
    assert [Path(p).name for p in result.records] == ["abc.pkl"]
    assert [entry.url for entry in cache.ls()] == [infos[2].url]


def test_an_older_loaderkits_entry_is_fetched_again_quietly(
    bucket: Bucket, cache_dir: Path
) -> None:
    (info,) = _put(bucket, 1, 8 * KIB)
    cache = SessionCache(cache_dir, max_bytes=GiB, min_free=0)
    with cache.lease(info, bucket.options) as cached:
        sidecar = cached.path.with_suffix(".json")
    record = json.loads(sidecar.read_text())
    for key in ("version", "file_size", "file_mtime_ns", "md5"):
        del record[key]  # what loaderkit wrote before the sidecar recorded the file
    sidecar.write_text(json.dumps(record))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with cache.lease(info, bucket.options) as cached:
            assert cached.path.read_bytes() == payload(0, 8 * KIB)
    assert len([g for g in bucket.server.object_gets("h/s0.h5") if g.range is None]) == 2


def test_the_cli_refuses_a_shared_directory_unless_told(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from loaderkit.cli import main

    team = tmp_path / "team"
    team.mkdir()
    os.chmod(team, 0o775)
    assert main(["cache", "ls", str(team)]) == 1
    assert f"the cache directory {team}" in capsys.readouterr().err
    assert main(["cache", "ls", str(team), "--shared"]) == 0
    assert main(["cache", "verify", str(team), "--shared"]) == 0
    assert "0 entries match their records" in capsys.readouterr().out
