"""The cache's counters summed over the processes that use one SessionCache: workers count."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import pickle
from pathlib import Path

import pytest

from loaderkit.storage.records import Totals

pytest.importorskip("filelock")
pytest.importorskip("fsspec")


def _add(cache: object, n: int) -> None:
    from loaderkit.storage.cache import SessionCache

    assert isinstance(cache, SessionCache)
    for _ in range(n):
        cache._state().add("hits")
    cache._state().add("misses", 2, waiting=0.25)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_processes_using_one_cache_add_to_its_totals(tmp_path: Path, method: str) -> None:
    from loaderkit import SessionCache

    cache = SessionCache(tmp_path / "cache")
    _add(cache, 3)
    ctx = mp.get_context(method)
    procs = [ctx.Process(target=_add, args=(cache, 50)) for _ in range(3)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
    assert [proc.exitcode for proc in procs] == [0, 0, 0]
    total = cache.stats()
    assert (total.hits, total.misses) == (3 + 3 * 50, 4 * 2)  # no update lost
    assert total.seconds_waiting == pytest.approx(4 * 0.25)
    mine = cache.stats(this_process=True)
    assert (mine.hits, mine.misses) == (3, 2)


def test_the_totals_file_goes_with_its_cache_and_a_copy_owns_none(tmp_path: Path) -> None:
    from loaderkit import SessionCache

    cache = SessionCache(tmp_path / "cache")
    _add(cache, 1)
    path = cache._totals.path
    assert path.exists() and path.parent == tmp_path / "cache" / "stats"
    copy = pickle.loads(pickle.dumps(cache))  # as a spawned worker gets it
    assert copy._totals.path == path
    del copy
    gc.collect()
    assert path.exists()  # a copy's end removes nothing
    del cache
    gc.collect()
    assert not path.exists()


def test_a_dead_jobs_totals_are_removed_after_a_week(tmp_path: Path) -> None:
    stats = tmp_path / "stats"
    stats.mkdir()
    old, recent = stats / "1-dead.bin", stats / "2-alive.bin"
    for path in (old, recent):
        path.write_bytes(b"")
    os.utime(old, (0, 0))
    Totals.create(stats)
    assert not old.exists() and recent.exists()


def test_an_unwritable_totals_file_counts_nothing_and_raises_nothing(tmp_path: Path) -> None:
    totals = Totals(tmp_path / "missing-dir" / "t.bin")
    totals.add("hits")
    assert totals.read() == ({"hits": 0, "misses": 0, "bytes_fetched": 0, "evictions": 0}, 0.0)
