"""A pass over sessions already in the cache does no per-batch cache work (no timing).

Local paths given ``cache=`` take the same path as remote objects once cached (lease, local
copy, prefetch window) and need no server. The loader draws ahead and moves the prefetch
window; when every entry is already complete, the window is leased in the loader's thread
(one lease per session per pass, no download thread woken) and moved once per session change,
never once per batch.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from loaderkit import DataLoader, HDF5SessionDataset, SessionCache
from loaderkit.hdf5.remote import sources as sources_module
from loaderkit.storage import Prefetcher, stat_objects
from loaderkit.storage import cache as cache_module
from tests.hdf5.remotefiles import ROWS, write_session

SESSIONS = 4
BATCH = 8  # ROWS / BATCH = 12 batches per session


@pytest.fixture
def paths(tmp_path: Path) -> list[str]:
    made = []
    for s in range(SESSIONS):
        path = tmp_path / f"s{s}.h5"
        write_session(path, s)
        made.append(str(path))
    return made


def _counting(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, calls: Counter[str]) -> None:
    original = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[f"{name}:{threading.current_thread().name}"] += 1
        calls[name] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)


def test_a_warm_pass_leases_each_session_once_in_the_loader_thread(
    paths: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = SessionCache(tmp_path / "cache", prefetch=1)
    ds = HDF5SessionDataset(paths, key="x", cache=cache, max_open_files=SESSIONS)
    loader = DataLoader(ds, batch_size=BATCH, shuffle="block", seed=0, training=True)
    first = sorted(int(v) for batch in loader for v in batch[:, 0])
    assert first == sorted(1000 * s + r for s in range(SESSIONS) for r in range(ROWS))
    opens = ds.handles.file_pool_info().opens
    calls: Counter[str] = Counter()
    _counting(monkeypatch, cache_module.SessionCache, "lease", calls)
    _counting(monkeypatch, cache_module.SessionCache, "lease_cached", calls)
    _counting(monkeypatch, sources_module.SessionSources, "ahead", calls)
    _counting(monkeypatch, sources_module.OrderWatcher, "_window", calls)
    for epoch in range(2):
        calls.clear()
        order = [int(v) // 1000 for batch in loader for v in batch[:, 0]]
        batches = len(order) // BATCH
        assert batches == SESSIONS * ROWS // BATCH
        runs = 1 + sum(a != b for a, b in itertools.pairwise(order))
        assert runs < batches / 2  # block order: the session changes a few times a pass
        # no download thread woken, nothing leased the slow way (it would wait on downloads)
        assert calls["lease"] == 0, (epoch, calls)
        # the window moves along the pass: a session is leased when it enters it
        assert calls["lease_cached"] <= runs, (epoch, runs, calls)
        assert all(k.endswith("MainThread") for k in calls if ":" in k), calls
        # the window is computed when the session changes, not once per batch
        assert calls["_window"] <= runs + 1, (epoch, runs, calls)
        assert calls["ahead"] <= runs + 1, (epoch, runs, calls)
    assert ds.handles.file_pool_info().opens == opens  # the open files (and their leases) were kept
    assert ds.cached_sessions.stats().misses == SESSIONS  # type: ignore[union-attr]
    loader.close()
    ds.close()


def test_prefetcher_holds_a_warm_window_when_ahead_returns(
    paths: list[str], tmp_path: Path
) -> None:
    cache = SessionCache(tmp_path / "cache")
    listed = stat_objects(paths, None)
    urls = [listed[path].url for path in paths]
    for url in urls:
        cache.lease(listed[url if url in listed else paths[urls.index(url)]]).close()
    fetcher = Prefetcher(cache, {info.url: info for info in listed.values()}, window=2)
    try:
        fetcher.ahead(urls[1:])
        assert fetcher.held() == urls[1:3]  # leased in this thread: no waiting
        assert not fetcher._threads  # and no download thread started
        assert sorted(cache.clear().in_use) == sorted(urls[1:3])  # leased: never evicted
    finally:
        fetcher.close()
