"""HDF5SessionDataset over remote files (moto's S3 on 127.0.0.1, s3fs) and through a cache.

What is counted is the server's own request log: metadata by range reads only, a second
construction lists once and reads nothing, samples equal the local files', errors name the URL.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loaderkit import DataLoader, HDF5SessionDataset, SessionCache
from loaderkit.errors import ConfigError, HDF5FileError, LoaderkitWarning, StorageAccessError
from tests.hdf5 import remotefiles as files
from tests.hdf5.remotefiles import Remote, rows
from tests.storage.s3server import REFUSED_KEY


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Remote]:
    yield from files.start(tmp_path_factory.mktemp("remote"))


@pytest.fixture(scope="module")
def warm(s3: Remote, tmp_path_factory: pytest.TempPathFactory) -> SessionCache:
    """A cache that holds every session (and their metadata) already."""
    cache = SessionCache(tmp_path_factory.mktemp("warm"), room_timeout=20)
    with HDF5SessionDataset(s3.urls, key="x", storage_options=s3.options, cache=cache) as ds:
        ds.__getitems__(list(range(len(ds))))
    return cache


def _cache(tmp_path: Path, **kwargs: Any) -> SessionCache:
    return SessionCache(tmp_path / "cache", room_timeout=20, **kwargs)


def test_the_index_is_built_from_range_reads_and_kept(s3: Remote, tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    s3.server.requests.clear()
    ds = HDF5SessionDataset(s3.urls, key="x", storage_options=s3.options, cache=cache)
    assert len(ds) == files.SESSIONS * files.ROWS
    assert ds.files == dict(enumerate(s3.urls))  # URLs stay the URLs
    for url, size in zip(s3.urls, s3.sizes, strict=True):
        assert s3.whole_gets(url) == 0  # nothing downloaded whole
        fetched = sum(
            int(b) - int(a) + 1 for a, b in (r[6:].split("-") for r in s3.range_gets(url))
        )
        assert 0 < fetched < size
    assert len(s3.server.listings(files.BUCKET)) == 1
    assert len(list((cache.dir / "meta").glob("*.json"))) == files.SESSIONS
    assert cache.ls() == []  # no session fetched yet
    s3.server.requests.clear()
    again = HDF5SessionDataset(s3.urls, key="x", storage_options=s3.options, cache=cache)
    log = s3.server.log()
    assert [(r.method, r.path) for r in log] == [("GET", f"/{files.BUCKET}")]  # one listing
    assert again.locate(len(again) - 1) == (files.SESSIONS - 1, files.ROWS - 1)


def test_a_glob_expands_sorted_and_key_none_is_found_remotely(s3: Remote, warm: Any) -> None:
    s3.server.requests.clear()
    pattern = f"s3://{files.BUCKET}/betas_session0[0-2].h5"
    with HDF5SessionDataset([pattern], key="x", storage_options=s3.options, cache=warm) as ds:
        assert list(ds.files.values()) == s3.urls[:3]
    assert all(s3.whole_gets(url) == 0 for url in s3.urls)
    with pytest.raises(ConfigError, match="holds 2 datasets"):
        HDF5SessionDataset(s3.urls[:1], storage_options=s3.options, cache=warm)
    with pytest.raises(ConfigError, match="a mapping names one file"):
        HDF5SessionDataset({"a": pattern}, key="x", storage_options=s3.options, cache=warm)


def test_samples_equal_the_local_files(s3: Remote, warm: SessionCache) -> None:
    local = HDF5SessionDataset(s3.paths, key=("x", "label"))
    ds = HDF5SessionDataset(s3.urls, key=("x", "label"), storage_options=s3.options, cache=warm)
    misses = warm.stats().misses
    order = np.random.default_rng(0).permutation(len(ds))[:50].tolist()
    for i in order[:10]:
        got, want = ds[i], local[i]
        assert all(np.array_equal(got[k], want[k]) for k in want)
    batch, expected = ds.__getitems__(order), local.__getitems__(order)
    for got, want in zip(batch, expected, strict=True):
        assert all(np.array_equal(got[k], want[k]) for k in want)
    ours, theirs = ds.cached_sessions.stats(), warm.stats()
    assert ours is not None and theirs.misses == misses  # all cached
    # the disk's free bytes move with every other process writing on it
    assert dataclasses.replace(ours, free_bytes=theirs.free_bytes) == theirs
    ds.close()
    local.close()


def _epoch(ds: HDF5SessionDataset, **kwargs: Any) -> list[list[tuple[int, int]]]:
    with DataLoader(ds, batch_size=16, shuffle=True, seed=3, **kwargs) as loader:
        return [rows(batch) for batch in loader]


@pytest.mark.parametrize("workers", [0, 2])
def test_loaders_read_what_local_files_give(s3: Remote, tmp_path: Path, workers: int) -> None:
    reference = _epoch(HDF5SessionDataset(s3.paths, key="x"), num_workers=workers)
    ds = HDF5SessionDataset(s3.urls, key="x", storage_options=s3.options, cache=_cache(tmp_path))
    s3.server.requests.clear()
    with DataLoader(ds, batch_size=16, shuffle=True, seed=3, num_workers=workers) as loader:
        got = [rows(batch) for batch in loader]
        text = loader.describe()
    assert got == reference
    assert all(s3.whole_gets(url) == 1 for url in s3.urls)  # each fetched once
    assert "\ncache " in text and "\nprefetch " in text and "cache now" in text
    assert [e.in_use for e in ds.cached_sessions.cache.ls()] == [False] * files.SESSIONS  # type: ignore[union-attr]


def test_a_spawned_worker_reads_from_the_cache(s3: Remote, warm: SessionCache) -> None:
    reference = _epoch(HDF5SessionDataset(s3.paths, key="x"))
    ds = HDF5SessionDataset(s3.urls, key="x", storage_options=s3.options, cache=warm)
    s3.server.requests.clear()
    got = _epoch(ds, num_workers=1, multiprocessing_context="spawn")
    assert got == reference
    assert all(s3.whole_gets(url) == 0 for url in s3.urls)


class Extra(HDF5SessionDataset):
    """A subclass: ``super().read()`` plus keys of its own."""

    def read(self, session: Any, row: int) -> Any:
        sample = super().read(session, row)
        label = self.h5dataset(session, "label")[row]
        return {"x": sample, "label": int(label), "where": str(self.files[session])[-5:]}


def test_a_subclass_reads_remote_files_as_local_ones(s3: Remote, warm: SessionCache) -> None:
    local = Extra(s3.paths, key="x")
    ds = Extra(s3.urls, key="x", storage_options=s3.options, cache=warm)
    for i in (0, 97, len(ds) - 1):
        got, want = ds[i], local[i]
        assert np.array_equal(got["x"], want["x"]) and got["label"] == want["label"]
        assert got["where"] == want["where"] == f"{i // files.ROWS:02d}.h5"
    assert ds.handles.read_path == local.handles.read_path


def test_local_paths_with_a_cache_are_copied(s3: Remote, tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    ds = HDF5SessionDataset(s3.paths[:2], key="x", cache=cache)
    assert all(isinstance(p, Path) for p in ds.files.values())
    local = HDF5SessionDataset(s3.paths[:2], key="x")
    assert np.array_equal(ds[100], local[100])
    listed = cache.ls()
    assert [entry.url for entry in listed] == [s3.paths[1]]
    assert listed[0].in_use  # the open file holds its lease
    ds.close()
    assert not cache.ls()[0].in_use
    assert ds.cached_sessions.stats().bytes_fetched == s3.sizes[1]  # type: ignore[union-attr]


def test_a_local_file_changed_under_a_cached_dataset(tmp_path: Path) -> None:
    path = tmp_path / "s.h5"
    files.write_session(path, 0)
    ds = HDF5SessionDataset([path], key="x", cache=_cache(tmp_path))
    files.write_session(path, 0, scale=2.0)
    os.utime(path, ns=(1, 1))
    with pytest.raises(HDF5FileError, match="changed after the dataset was built"):
        ds[0]


def _replace(s3: Remote, url: str, tmp_path: Path, session: int, scale: float) -> None:
    path = tmp_path / f"new{session}.h5"
    files.write_session(path, session, scale=scale)
    s3.put(url.rsplit("/", 1)[1], path)


def test_an_object_replaced_between_runs_is_fetched_again(s3: Remote, tmp_path: Path) -> None:
    s3.put("changing.h5", s3.paths[0])
    url = f"s3://{files.BUCKET}/changing.h5"
    cache = _cache(tmp_path)
    before = HDF5SessionDataset([url], key="x", storage_options=s3.options, cache=cache)
    old = float(before[5][1])
    assert old == HDF5SessionDataset(s3.paths[:1], key="x")[5][1]
    before.close()
    _replace(s3, url, tmp_path, 0, scale=2.0)
    s3.server.requests.clear()
    after = HDF5SessionDataset([url], key="x", storage_options=s3.options, cache=cache)
    assert s3.range_gets(url)  # its metadata read again: another version
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = after[5][1]
        after.close()
        after[6]
    changed = [w for w in caught if issubclass(w.category, LoaderkitWarning)]
    assert len(changed) == 1 and url in str(changed[0].message)
    assert float(value) == pytest.approx(2 * old)
    assert s3.whole_gets(url) == 1
    assert [entry.url for entry in cache.ls()] == [url]  # the old version was evicted


def test_an_object_replaced_during_a_pass(s3: Remote, tmp_path: Path) -> None:
    s3.put("replaced.h5", s3.paths[1])
    url = f"s3://{files.BUCKET}/replaced.h5"
    ds = HDF5SessionDataset([url], key="x", storage_options=s3.options, cache=_cache(tmp_path))
    _replace(s3, url, tmp_path, 1, scale=3.0)  # same size, other bytes
    with pytest.raises(HDF5FileError, match=rf"session 0: {url} changed after the dataset"):
        ds[0]


def test_missing_objects_buckets_and_refused_credentials_name_the_url(
    s3: Remote, tmp_path: Path
) -> None:
    cache = _cache(tmp_path)
    missing = f"s3://{files.BUCKET}/nope.h5"
    with pytest.raises(FileNotFoundError, match=missing):
        HDF5SessionDataset([missing], key="x", storage_options=s3.options, cache=cache)
    no_bucket = "s3://no-such-bucket-here/s.h5"
    with pytest.raises(FileNotFoundError, match="bucket 'no-such-bucket-here' does not exist"):
        HDF5SessionDataset([no_bucket], key="x", storage_options=s3.options, cache=cache)
    refused = dict(s3.options, key=REFUSED_KEY)
    with pytest.raises(StorageAccessError, match=rf"{s3.urls[0]}: the store refused") as info:
        HDF5SessionDataset(s3.urls[:1], key="x", storage_options=refused, cache=cache)
    assert isinstance(info.value, PermissionError) and "anon" in str(info.value)


def test_an_object_that_is_not_hdf5(s3: Remote, tmp_path: Path) -> None:
    url = s3.put("notes.h5", Path(__file__))
    with pytest.raises(HDF5FileError, match=rf"session 0: cannot open {url} as HDF5"):
        HDF5SessionDataset([url], key="x", storage_options=s3.options, cache=_cache(tmp_path))


def test_a_cache_too_small_for_a_session_is_refused(s3: Remote, tmp_path: Path) -> None:
    cache = _cache(tmp_path, max_bytes=s3.sizes[0] // 2, prefetch=0)
    with pytest.raises(ConfigError, match="smaller than the largest session"):
        HDF5SessionDataset(s3.urls, key="x", storage_options=s3.options, cache=cache)


def test_local_datasets_import_no_fsspec_and_urls_need_the_extra(tmp_path: Path) -> None:
    path = tmp_path / "s.h5"
    files.write_session(path, 0)
    code = (
        "import sys\n"
        "from loaderkit import HDF5SessionDataset\n"
        f"ds = HDF5SessionDataset([{str(path)!r}], key='x'); ds[0]\n"
        "print(sorted(m for m in ('fsspec', 's3fs', 'filelock') if m in sys.modules))\n"
        "sys.modules['fsspec'] = None\n"
        "try:\n"
        "    HDF5SessionDataset(['s3://bucket/s.h5'], key='x')\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, '|', exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout.splitlines()
    assert out[0] == "[]"
    assert out[1].startswith("ConfigError | s3://bucket/s.h5 needs fsspec")
    assert 'pip install "loaderkit[remote]"' in out[1]


def test_cli_fetch_then_cache_ls_du_clear(
    s3: Remote, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from loaderkit.cli import main

    directory = str(tmp_path / "node")
    options = json.dumps(s3.options)
    pattern = f"s3://{files.BUCKET}/betas_session0[0-1].h5"
    args = ["fetch", pattern, "--cache", directory, "--storage-options", options, "--no-progress"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "2 object(s)" in out and "2 fetched" in out
    assert main(args) == 0
    assert "0 fetched (0 B), 2 already cached" in capsys.readouterr().out
    assert main(["cache", "ls", directory]) == 0
    listed = capsys.readouterr().out
    assert s3.urls[0] in listed and s3.urls[1] in listed and "2 entries" in listed
    assert main(["cache", "du", directory]) == 0
    assert str(sum(s3.sizes[:2])) in capsys.readouterr().out
    assert main(["cache", "clear", directory]) == 0
    assert "removed 2 entries" in capsys.readouterr().out
    missing = ["fetch", f"s3://{files.BUCKET}/nope.h5", "--cache", directory]
    assert main([*missing, "--storage-options", options, "--no-progress"]) == 1
    assert "nope.h5" in capsys.readouterr().err


def test_doctor_reports_the_session_cache(warm: SessionCache) -> None:
    from loaderkit.cli.doctor import run_checks, session_cache_report
    from loaderkit.machine.platform import detect_platform

    report = session_cache_report({"LOADERKIT_CACHE": str(warm.dir)})
    assert report is not None
    check = run_checks(detect_platform(), cache=report)[-1]
    assert check.name == "session cache" and "misses" in check.finding and "free" in check.finding
    assert run_checks(detect_platform(), cache=None)[-1].status == "pass"
    full = dataclasses.replace(report, free=report.min_free - 1)  # a disk fuller than min_free
    warned = run_checks(detect_platform(), cache=full)[-1]
    assert warned.status == "warn" and "lowered to leave room for one session" in warned.advice


def test_a_rows_layout_cache_reads_the_same_samples_row_wise(s3: Remote, tmp_path: Path) -> None:
    cache = _cache(tmp_path, layout="rows")
    local = HDF5SessionDataset(s3.paths[:2], key="x")
    ds = HDF5SessionDataset(s3.urls[:2], key="x", storage_options=s3.options, cache=cache)
    order = np.random.default_rng(1).permutation(len(ds))[:40].tolist()
    for got, want in zip(ds.__getitems__(order), local.__getitems__(order), strict=True):
        assert np.array_equal(got, want)
    assert ds._reader.files.contiguous  # the copy is stored row by row: os.preadv of rows
    handle = ds._reader.files.file_pool.peek(0)
    assert handle is not None and handle.raws[0] is not None
    assert [entry.layout for entry in cache.ls()] == ["rows", "rows"]
    ds.close()


def test_the_ranks_on_the_node_share_the_cache_limits(
    s3: Remote, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """4 local ranks x (1 open + prefetch 1) sessions do not fit 5 sessions' max_bytes."""
    size = max(s3.sizes)
    cache = _cache(tmp_path, max_bytes=5 * size, prefetch=1)
    one = HDF5SessionDataset(s3.urls, key="x", storage_options=s3.options, cache=cache)
    assert one.max_open_files == 3  # 5 sessions - a window of 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun's, before init_process_group
    two = HDF5SessionDataset(s3.urls, key="x", storage_options=s3.options, cache=cache)
    assert two.max_open_files == 1  # (5 - 2 x 2) // 2 ranks
    assert (
        two.cached_sessions.open_files(2, ranks=1) == 1
        and two.cached_sessions.open_files(0, ranks=1) == 3
    )
    with DataLoader(two, batch_size=16, num_workers=0) as loader:
        assert "1 file + the prefetch window" in " ".join(loader.describe().split())
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    with pytest.raises(ConfigError, match=r"4 readers on this node") as info:
        HDF5SessionDataset(s3.urls, key="x", storage_options=s3.options, cache=cache)
    assert f"max_bytes={5 * size / 2**20:.1f} MiB" in str(info.value)
    assert f"at least {sum(s3.sizes)} bytes" in str(info.value)  # 8 > the 6 sessions there are


def _lz4_session(s3: Remote, tmp_path: Path) -> tuple[str, SessionCache]:
    """An LZ4-compressed session in the bucket, its metadata record kept in a fresh cache."""
    hdf5plugin = pytest.importorskip("hdf5plugin")
    import h5py

    path = tmp_path / "lz4.h5"
    with h5py.File(path, "w") as f:
        data = np.arange(96 * 64, dtype=np.float32).reshape(96, 64)
        f.create_dataset("x", data=data, chunks=(8, 64), **hdf5plugin.LZ4())
    url = s3.put("lz4.h5", path)
    cache = _cache(tmp_path)
    HDF5SessionDataset([url], key="x", storage_options=s3.options, cache=cache).close()
    assert list((cache.dir / "meta").glob("*.json"))  # kept: the next construction reads none
    s3.server.requests.clear()
    return url, cache


def _refused_lz4(text: str, url: str) -> bool:
    return (
        text.startswith(f"session 0: dataset 'x' in {url}")
        and "LZ4" in text
        and "32004" in text
        and "hdf5plugin" in text
    )


def test_a_missing_filter_is_refused_at_construction_from_kept_records(
    s3: Remote, tmp_path: Path
) -> None:
    """The second construction reads no file: the kept filter ids are checked instead."""
    from h5py import h5z

    url, cache = _lz4_session(s3, tmp_path)
    import hdf5plugin

    assert h5z.unregister_filter(32004)  # this process loses the plugin
    try:
        with pytest.raises(HDF5FileError) as info:
            HDF5SessionDataset([url], key="x", storage_options=s3.options, cache=cache)
    finally:
        hdf5plugin.register("lz4", force=True)
    assert _refused_lz4(str(info.value), url), info.value
    assert not s3.range_gets(url) and not s3.whole_gets(url)  # from the records alone


@pytest.mark.slow
def test_a_missing_filter_plugin_package_is_refused_from_kept_records(
    s3: Remote, tmp_path: Path
) -> None:
    """As above in a process without hdf5plugin at all (and an empty HDF5_PLUGIN_PATH)."""
    url, cache = _lz4_session(s3, tmp_path)
    plugins = tmp_path / "no-plugins"
    plugins.mkdir()
    code = (
        "import sys; sys.modules['hdf5plugin'] = None\n"
        "from loaderkit import HDF5SessionDataset, SessionCache\n"
        f"cache = SessionCache({str(cache.dir)!r})\n"
        "try:\n"
        f"    HDF5SessionDataset([{url!r}], key='x', storage_options={s3.options!r}, cache=cache)\n"
        "    print('built')\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, '|', exc)\n"
    )
    env = dict(os.environ, HDF5_PLUGIN_PATH=str(plugins))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    name, _, text = out.stdout.partition(" | ")
    assert name == "HDF5FileError" and _refused_lz4(text, url), out
    assert not s3.range_gets(url) and not s3.whole_gets(url)


def _construct(urls: list[str], options: dict[str, Any], cache_dir: str, barrier: Any) -> None:
    from loaderkit.storage import filesystems

    filesystems.reset()  # this process's own client, as a rank makes
    barrier.wait()
    HDF5SessionDataset(
        urls, key="x", storage_options=options, cache=SessionCache(cache_dir)
    ).close()


def test_ranks_constructing_at_once_read_each_objects_metadata_once(
    s3: Remote, tmp_path: Path
) -> None:
    """Two processes on one node build the index together: one reads, the other waits."""
    import multiprocessing as mp

    alone = _cache(tmp_path / "alone")
    s3.server.requests.clear()
    HDF5SessionDataset(s3.urls, key="x", storage_options=s3.options, cache=alone).close()
    once = {url: len(s3.range_gets(url)) for url in s3.urls}
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(2)
    s3.server.requests.clear()
    s3.server.throttle = 0.002  # slow replies: the two constructions overlap
    try:
        procs = [
            ctx.Process(
                target=_construct, args=(s3.urls, s3.options, str(tmp_path / "node"), barrier)
            )
            for _ in range(2)
        ]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(120)
    finally:
        s3.server.throttle = 0.0
    assert [proc.exitcode for proc in procs] == [0, 0]
    assert {url: len(s3.range_gets(url)) for url in s3.urls} == once
    assert len(list((tmp_path / "node" / "meta").glob("*.json"))) == files.SESSIONS


def test_session_positions_and_check_index() -> None:
    from loaderkit.hdf5.meta.index import check_index
    from loaderkit.hdf5.remote.cachedsessions import session_positions

    keys = np.array([0, 1, 1 << 36, (1 << 36) + 1], np.int64)
    assert session_positions(keys, np.array([0, 2, 3])).tolist() == [0, 1, 1]
    assert session_positions(keys, np.array([-1, 4])).tolist() == [1, -1]
    assert session_positions(keys, np.array([0.5])).tolist() == [-1]
    assert check_index(-4, 4) == 0
    with pytest.raises(IndexError, match="index 4 is out of range for a dataset of 4"):
        check_index(4, 4)
    with pytest.raises(TypeError, match="must be integers, got str"):
        check_index("1", 4)
