"""The node cache as a cluster user meets it (moto's S3 on 127.0.0.1, real processes, real damage).

A cache with room for 2 of 8 sessions and ``prefetch`` unset fits its prefetch and reads every
sample; a truncated or overwritten cached copy is fetched again once (main process, forked and
spawned workers, two processes sharing the directory, ``layout="rows"``); the metadata records
are JSON data and a planted pickle is never loaded; ``loaderkit cache verify`` removes damage.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import pickle
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loaderkit import DataLoader, HDF5SessionDataset, SessionCache
from loaderkit.errors import CacheRepairWarning, ConfigError, LoaderkitWarning, PerformanceHint
from tests.hdf5 import remotefiles as files
from tests.hdf5.remotefiles import Remote, rows

SESSIONS = 8


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Remote]:
    yield from files.start(tmp_path_factory.mktemp("remote"), sessions=SESSIONS)


@pytest.fixture(scope="module")
def reference(s3: Remote) -> list[list[tuple[int, int]]]:
    return _epoch(HDF5SessionDataset(s3.paths, key="x"))


def _epoch(ds: HDF5SessionDataset, **kwargs: Any) -> list[list[tuple[int, int]]]:
    with DataLoader(ds, batch_size=16, shuffle=True, seed=5, **kwargs) as loader:
        return [rows(batch) for batch in loader]


def _dataset(s3: Remote, cache: SessionCache, count: int = SESSIONS) -> HDF5SessionDataset:
    return HDF5SessionDataset(s3.urls[:count], key="x", storage_options=s3.options, cache=cache)


def _warm(s3: Remote, directory: Path, **kwargs: Any) -> SessionCache:
    cache = SessionCache(directory, room_timeout=30, **kwargs)
    with _dataset(s3, cache) as ds:
        ds.__getitems__(list(range(len(ds))))
    return cache


def _data(cache: SessionCache, url: str) -> Path:
    (entry,) = [entry for entry in cache.ls() if entry.url == url]
    return entry.path


def _damage(path: Path, how: str) -> None:
    time.sleep(0.02)  # past the filesystem's timestamp granularity
    if how == "truncate":
        os.truncate(path, path.stat().st_size // 3)
        return
    before = path.stat()
    with open(path, "r+b") as f:
        if how == "middle":
            f.seek(before.st_size // 2)
            f.write(os.urandom(4096))
        else:  # the object header of ``x``, then the file's times put back: only bytes differ
            import h5py

            with h5py.File(path, "r") as h5:
                header = h5py.h5o.get_info(h5["x"].id).addr
            f.seek(header)
            f.write(b"\xa5" * 64)
    if how == "header":
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def test_a_cache_for_two_of_eight_sessions_fits_prefetch_and_reads_right(
    s3: Remote, tmp_path: Path
) -> None:
    size = max(s3.sizes)
    s3.server.requests.clear()
    cache = SessionCache(tmp_path / "c", max_bytes=2 * size, room_timeout=30)
    ds = _dataset(s3, cache)
    assert cache.prefetch == 1  # fitted to the sessions; the loader fits it to its workers
    with DataLoader(ds, batch_size=16, num_workers=2) as loader:  # in order: no thrashing
        got = [row for batch in loader for row in rows(batch)]
        plan = " ".join(loader.describe().split())  # reasons wrap
    assert got == [(s, r) for s in range(SESSIONS) for r in range(files.ROWS)]
    assert all(s3.whole_gets(url) == 1 for url in s3.urls)
    assert "prefetch" in plan and "2 workers each holding a session open" in plan, plan
    with pytest.raises(ConfigError, match=r"max_bytes=1\.5 MiB\) is smaller than the prefetch"):
        _dataset(s3, SessionCache(tmp_path / "d", max_bytes=2 * size, prefetch=2))
    with pytest.raises(ConfigError, match=r"smaller than the largest session"):
        _dataset(s3, SessionCache(tmp_path / "e", max_bytes=size // 2))


def test_a_cache_holds_one_open_session_per_worker_process_or_is_refused_at_once(
    s3: Remote, tmp_path: Path
) -> None:
    size = max(s3.sizes)
    ds = _dataset(s3, SessionCache(tmp_path / "c", max_bytes=size, room_timeout=5))
    # each worker process holds the session it reads: 2 need 2 sessions (before, the loader
    # started and a shuffled pass failed after room_timeout)
    want = r"max_bytes=774\.7 KiB\) holds 1 session .* \(2: 1 rank on this node x 2 "
    with pytest.raises(ConfigError, match=want + rf"worker .* {2 * size} bytes or use fewer"):
        DataLoader(ds, batch_size=16, num_workers=2, shuffle=True)
    with DataLoader(ds, batch_size=16, num_workers=2, worker_method="thread") as loader:
        got = [row for batch in loader for row in rows(batch)]  # threads: one process's files
    assert got == [(s, r) for s in range(SESSIONS) for r in range(files.ROWS)]


def test_a_uniform_shuffle_through_a_cache_smaller_than_the_data_is_named(
    s3: Remote, tmp_path: Path
) -> None:
    size = max(s3.sizes)
    small = _dataset(s3, SessionCache(tmp_path / "c", max_bytes=2 * size))
    want = r"shuffle=True reads the rows of 8 sessions .* holds 2 or more of them .*shuffle='block'"
    with pytest.warns(PerformanceHint, match=want):
        DataLoader(small, batch_size=16, shuffle=True).close()
    with warnings.catch_warnings():
        warnings.simplefilter("error", PerformanceHint)
        DataLoader(small, batch_size=16, shuffle="block").close()  # one session at a time
        DataLoader(small, batch_size=16, shuffle=False).close()
        whole = _dataset(s3, SessionCache(tmp_path / "d", max_bytes=8 * size))
        DataLoader(whole, batch_size=16, shuffle=True).close()  # it holds every session


def test_thread_workers_hold_their_sessions_beside_the_prefetch_window(
    s3: Remote, tmp_path: Path
) -> None:
    size = max(s3.sizes)
    ds = _dataset(s3, SessionCache(tmp_path / "c", max_bytes=3 * size, room_timeout=5))
    assert ds.cached_sessions.cache.prefetch == 2  # 3 sessions: the one read and 2 ahead
    # 2 threads each hold the session they read while the window moves on: prefetch 2 (or 1)
    # left no room for them, and the pass failed after room_timeout
    with DataLoader(ds, batch_size=16, num_workers=2, worker_method="thread") as loader:
        got = [row for batch in loader for row in rows(batch)]
        plan = " ".join(loader.describe().split())  # reasons wrap
    assert got == [(s, r) for s in range(SESSIONS) for r in range(files.ROWS)]
    assert "2 workers each holding a session open" in plan, plan
    assert "2 threads sharing 3 files" in plan, plan


@pytest.mark.parametrize("how", ["truncate", "middle", "header"])
def test_a_damaged_cached_copy_is_fetched_again_once(
    s3: Remote, tmp_path: Path, reference: list[list[tuple[int, int]]], how: str
) -> None:
    cache = _warm(s3, tmp_path / "c")
    _damage(_data(cache, s3.urls[3]), how)
    s3.server.requests.clear()
    with pytest.warns(CacheRepairWarning, match=rf"{s3.urls[3]}: the cache's copy .* damaged"):
        got = _epoch(_dataset(s3, cache))
    assert got == reference
    assert [s3.whole_gets(url) for url in s3.urls] == [0, 0, 0, 1, 0, 0, 0, 0]


@pytest.mark.parametrize(
    ("method", "workers"), [("fork", 2), pytest.param("spawn", 1, marks=pytest.mark.slow)]
)
def test_workers_fetch_a_damaged_copy_again_once(
    s3: Remote,
    tmp_path: Path,
    reference: list[list[tuple[int, int]]],
    method: str,
    workers: int,
) -> None:
    cache = _warm(s3, tmp_path / "c")
    for url in s3.urls[1:3]:
        _damage(_data(cache, url), "middle")
    s3.server.requests.clear()
    with warnings.catch_warnings(record=True) as caught:  # forked workers inherit the filter
        warnings.simplefilter("always", CacheRepairWarning)
        got = _epoch(_dataset(s3, cache), num_workers=workers, multiprocessing_context=method)
    assert got == reference
    assert [s3.whole_gets(url) for url in s3.urls] == [0, 1, 1, 0, 0, 0, 0, 0]
    # Python 3.12+ adds a DeprecationWarning for each fork while the S3 server's threads run
    ours = [w for w in caught if issubclass(w.category, LoaderkitWarning)]
    assert all(issubclass(w.category, CacheRepairWarning) for w in ours), ours


def _rank(urls: list[str], options: dict[str, Any], directory: str, barrier: Any, out: str) -> None:
    import traceback

    from loaderkit.storage import filesystems

    filesystems.reset()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", CacheRepairWarning)
            cache = SessionCache(directory, room_timeout=30)
            ds = HDF5SessionDataset(urls, key="x", storage_options=options, cache=cache)
            barrier.wait()
            got = _epoch(ds)
        repaired = sum(issubclass(w.category, CacheRepairWarning) for w in caught)
        Path(out).write_text(json.dumps({"rows": got, "repaired": repaired}))
    except BaseException:
        Path(out).write_text(json.dumps({"error": traceback.format_exc()}))
        raise


def test_two_processes_sharing_the_directory_fetch_a_damaged_copy_once(
    s3: Remote, tmp_path: Path, reference: list[list[tuple[int, int]]]
) -> None:
    cache = _warm(s3, tmp_path / "node")
    _damage(_data(cache, s3.urls[5]), "truncate")
    s3.server.requests.clear()
    ctx = mp.get_context("fork")  # each builds its own dataset, cache object and s3fs client
    barrier = ctx.Barrier(2)
    outs = [tmp_path / f"rank{r}.json" for r in range(2)]
    args = (s3.urls, s3.options, str(cache.dir), barrier)
    procs = [ctx.Process(target=_rank, args=(*args, str(out))) for out in outs]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
    results = [json.loads(out.read_text()) for out in outs]
    assert [proc.exitcode for proc in procs] == [0, 0], [r.get("error") for r in results]
    assert all([[tuple(r) for r in b] for b in res["rows"]] == reference for res in results)
    assert sum(res["repaired"] for res in results) == 1
    assert [s3.whole_gets(url) for url in s3.urls] == [0, 0, 0, 0, 0, 1, 0, 0]


def test_a_damaged_rows_copy_is_transformed_again(
    s3: Remote, tmp_path: Path, reference: list[list[tuple[int, int]]]
) -> None:
    cache = _warm(s3, tmp_path / "c", layout="rows")
    _damage(_data(cache, s3.urls[0]), "header")  # found at the failed open: its MD5
    s3.server.requests.clear()
    with pytest.warns(CacheRepairWarning, match=r"failed to open|MD5"):
        got = _epoch(_dataset(s3, cache))
    assert got == reference
    assert [s3.whole_gets(url) for url in s3.urls] == [1, 0, 0, 0, 0, 0, 0, 0]


class Planted:
    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.mkdir, (str(Path(os.environ["PLANTED"]) / "ran"),))


def test_records_are_data_and_a_planted_pickle_is_never_loaded(
    s3: Remote, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = SessionCache(tmp_path / "c", room_timeout=30)
    _dataset(s3, cache, 2).close()
    meta = cache.dir / "meta"
    records = sorted(meta.glob("*.json"))
    assert len(records) == 2 and not list(meta.glob("*.pkl"))
    assert all(json.loads(r.read_text())["format"] == "loaderkit-remote-meta" for r in records)
    monkeypatch.setenv("PLANTED", str(tmp_path))
    evil = pickle.dumps(Planted())
    for record in records:  # a pickle where a record was, and beside it under the old name
        record.write_bytes(evil)
        record.with_suffix(".pkl").write_bytes(evil)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("pickle.loads called while building from the cache")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    s3.server.requests.clear()
    ds = _dataset(s3, cache, 2)
    monkeypatch.undo()
    assert not (tmp_path / "ran").exists()
    assert all(s3.range_gets(url) for url in s3.urls[:2])  # rebuilt from the store
    assert all(json.loads(r.read_text())["version"] == 3 for r in records)
    assert ds[0] is not None
    ds.close()


def test_cli_verify_ls_du_clear_cover_every_file(
    s3: Remote, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from loaderkit.cli import main

    cache = _warm(s3, tmp_path / "c")
    _damage(_data(cache, s3.urls[2]), "middle")
    (cache.dir / "meta" / "old.pkl").write_bytes(pickle.dumps({"x": 1}))
    directory = str(cache.dir)
    assert main(["cache", "du", directory]) == 0
    du = capsys.readouterr().out
    assert "  meta: " in du and "  stats: " in du and "  entries: " in du, du
    verify = subprocess.run(  # as a user runs it: the exit status is the process's
        [sys.executable, "-m", "loaderkit", "cache", "verify", directory],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert verify.returncode == 3, verify
    assert f"removed {s3.urls[2]}" in verify.stdout, verify.stdout
    assert "modified after it was fetched" in verify.stdout and "old.pkl" in verify.stdout
    assert main(["cache", "verify", directory]) == 0
    assert f"{SESSIONS - 1} entries match their records" in capsys.readouterr().out
    assert main(["cache", "ls", directory]) == 0
    assert "metadata records" in capsys.readouterr().out
    assert main(["cache", "clear", directory]) == 0
    cleared = capsys.readouterr().out
    assert f"removed {SESSIONS - 1} entries" in cleared and "metadata record" in cleared
    assert not list((cache.dir / "meta").iterdir()) and not cache.ls()
