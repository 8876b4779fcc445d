"""Loaders over remote sessions: once per node, a bounded cache in block order, resume.

Ranks are real torch.distributed (gloo) processes (``tests.dist_utils``); the S3 server runs in
this process and counts every request, so "fetched once" is the server's count of whole-object
GETs.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from loaderkit import DataLoader, HDF5SessionDataset, SessionCache
from tests.dist_utils import run_distributed
from tests.hdf5 import remotefiles as files
from tests.hdf5.remotefiles import Remote, rows

GLOBAL = 16  # samples per global batch
STOP = 7  # batches of epoch 0 before the checkpoint
SEED = 11
SESSIONS = 8  # a quarter of the data is two sessions: the reader's and the next


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Remote]:
    yield from files.start(tmp_path_factory.mktemp("remote"), SESSIONS)


def _loader(names: list[str], world: int, options: Any, cache: Any, workers: int = 0) -> DataLoader:
    dataset = HDF5SessionDataset(names, key="x", storage_options=options, cache=cache)
    return DataLoader(
        dataset,
        batch_size=GLOBAL // world,
        shuffle="block",
        seed=SEED,
        training=True,
        num_workers=workers,
    )


def _rank(
    rank: int, world: int, urls: list[str], options: dict[str, Any], caches: list[str]
) -> dict[str, Any]:
    """One rank: an epoch with 2 workers, then the state after STOP batches of a fresh pass."""
    cache = SessionCache(caches[rank % len(caches)], room_timeout=30)
    with _loader(urls, world, options, cache, workers=2) as loader:
        epoch = [rows(batch) for batch in loader]
    with _loader(urls, world, options, cache) as loader:
        iterator = iter(loader)
        for _ in range(STOP):
            next(iterator)
        state = loader.state_dict()
        del iterator
    return {"epoch": epoch, "state": state}


def _rank_spawned_workers(
    rank: int, world: int, urls: list[str], options: dict[str, Any], caches: list[str]
) -> list[Any]:
    """One rank: an epoch with 2 spawned workers (each leases from the shared directory)."""
    cache = SessionCache(caches[0], room_timeout=30)
    dataset = HDF5SessionDataset(urls, key="x", storage_options=options, cache=cache)
    with DataLoader(
        dataset, batch_size=GLOBAL // world, shuffle="block", seed=SEED, training=True,
        num_workers=2, multiprocessing_context="spawn",
    ) as loader:  # fmt: skip
        return [rows(batch) for batch in loader]


def _merge(per_rank: list[list[Any]]) -> list[Any]:
    return [[s for batches in per_rank for s in batches[k]] for k in range(len(per_rank[0]))]


@pytest.fixture(scope="module")
def local_epochs(s3: Remote) -> list[list[Any]]:
    """Two epochs over the local files on one process: the reference."""
    with _loader(s3.paths, 1, None, None) as loader:
        return [[rows(batch) for batch in loader] for _ in range(2)]


@pytest.fixture(scope="module")
def two_ranks(
    s3: Remote, tmp_path_factory: pytest.TempPathFactory
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """2 ranks x 2 workers (fork) on one node sharing one cache directory; GETs per object."""
    node = tmp_path_factory.mktemp("node")
    s3.server.requests.clear()
    results = run_distributed(_rank, 2, node, s3.urls, s3.options, [str(node / "cache")])
    return results, {url: s3.whole_gets(url) for url in s3.urls}


def test_two_ranks_two_workers_fetch_each_object_once_per_node(
    two_ranks: Any, local_epochs: list[list[Any]]
) -> None:
    results, gets = two_ranks
    assert gets == {url: 1 for url in gets}
    assert _merge([r["epoch"] for r in results]) == local_epochs[0]  # elastic: same batches


def test_an_elastic_resume_from_two_ranks_on_one(
    s3: Remote, two_ranks: Any, local_epochs: list[list[Any]], tmp_path: Path
) -> None:
    results, _ = two_ranks
    state = results[0]["state"]
    assert (state["epoch"], state["batches_yielded"]) == (0, STOP)
    cache = SessionCache(tmp_path / "cache", room_timeout=30)
    with _loader(s3.urls, 1, s3.options, cache, workers=1) as loader:
        loader.load_state_dict(state)
        resumed = [[rows(batch) for batch in loader] for _ in range(2)]
    assert resumed == [local_epochs[0][STOP:], local_epochs[1]]


def test_a_mid_epoch_resume_reads_what_local_files_give(
    s3: Remote, local_epochs: list[list[Any]], tmp_path: Path
) -> None:
    cache = SessionCache(tmp_path / "cache", room_timeout=30)
    with _loader(s3.urls, 1, s3.options, cache) as loader:
        iterator = iter(loader)
        first = [rows(next(iterator)) for _ in range(3)]
        state = loader.state_dict()
        del iterator
    with _loader(s3.paths, 1, None, None) as local:  # the state does not depend on where
        iterator = iter(local)
        for _ in range(3):
            next(iterator)
        assert local.state_dict() == state
        del iterator
    with _loader(s3.urls, 1, s3.options, cache) as loader:
        loader.load_state_dict(state)
        rest = [rows(batch) for batch in loader]
    assert first + rest == local_epochs[0]


@pytest.mark.slow  # 2 ranks x 2 spawned workers: four fresh interpreters besides the ranks
def test_two_ranks_two_spawned_workers_fetch_each_object_once_per_node(
    s3: Remote, local_epochs: list[list[Any]], tmp_path: Path
) -> None:
    """As the forked test above, with workers that unpickle the dataset in fresh interpreters."""
    s3.server.requests.clear()
    caches = [str(tmp_path / "cache")]
    epochs = run_distributed(_rank_spawned_workers, 2, tmp_path, s3.urls, s3.options, caches)
    assert {url: s3.whole_gets(url) for url in s3.urls} == {url: 1 for url in s3.urls}
    assert _merge(epochs) == local_epochs[0]


@pytest.mark.slow
def test_two_nodes_fetch_independently(s3: Remote, tmp_path: Path) -> None:
    """Two cache directories (one per rank): each fetches what its rank reads, once."""
    caches = [str(tmp_path / "node0"), str(tmp_path / "node1")]
    s3.server.requests.clear()
    run_distributed(_rank, 2, tmp_path, s3.urls, s3.options, caches)
    for url in s3.urls:
        holders = sum(any(entry.url == url for entry in SessionCache(c).ls()) for c in caches)
        assert s3.whole_gets(url) == holders >= 1


def test_a_cache_of_a_quarter_of_the_data_completes_block_order_epochs(
    s3: Remote, tmp_path: Path
) -> None:
    """max_bytes = 1/4 of the data: each session fetched once per epoch, the directory bounded."""
    size = max(s3.sizes)
    cache = SessionCache(
        tmp_path / "cache", max_bytes=sum(s3.sizes) // 4, prefetch=1, room_timeout=30
    )
    peak = [0]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], cache.du())
            stop.wait(0.002)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        for epoch in range(2):
            s3.server.requests.clear()
            with _loader(s3.urls, 1, s3.options, cache) as loader:
                loader.set_epoch(epoch)
                assert loader.dataset.max_open_files == 1  # type: ignore[attr-defined]
                count = sum(len(rows(batch)) for batch in loader)
            assert count == SESSIONS * files.ROWS
            gets = [s3.whole_gets(url) for url in s3.urls]
            assert max(gets) == 1, gets  # never fetched twice in an epoch
            if epoch == 0:
                assert gets == [1] * SESSIONS
    finally:
        stop.set()
        watcher.join()
    assert peak[0] <= cache.max_bytes + size
    assert cache.du() <= cache.max_bytes
    assert cache.stats().evictions >= SESSIONS - 2


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_describe_counts_what_the_workers_fetched(s3: Remote, tmp_path: Path, method: str) -> None:
    """prefetch=0: each session is fetched by the worker that opens it, not the main process."""
    cache = SessionCache(tmp_path / "cache", prefetch=0, room_timeout=30)
    dataset = HDF5SessionDataset(s3.urls, key="x", storage_options=s3.options, cache=cache)
    with DataLoader(
        dataset, batch_size=GLOBAL, shuffle="block", seed=SEED, num_workers=2,
        multiprocessing_context=method,
    ) as loader:  # fmt: skip
        assert len([rows(batch) for batch in loader]) == len(dataset) // GLOBAL
        text = loader.describe()
    stats = dataset.cached_sessions.stats()
    assert stats is not None
    assert stats.misses == SESSIONS and stats.bytes_fetched == sum(s3.sizes)
    assert cache.stats(this_process=True).misses == 0  # the main process fetched nothing
    assert f"{SESSIONS} misses, {sum(s3.sizes)} bytes fetched" in text
    dataset.close()


def _window(epoch: list[list[tuple[int, int]]], size: int) -> set[int]:
    """The first ``size`` distinct sessions of batches, in order."""
    window: list[int] = []
    for batch in epoch:
        for session, _ in batch:
            if session not in window:
                window.append(session)
    return set(window[:size])


def test_a_resumed_pass_fetches_from_the_restored_position(
    s3: Remote, local_epochs: list[list[Any]], tmp_path: Path
) -> None:
    """The first downloads after load_state_dict are the sessions the restored pass reads next."""
    stop = 20
    with _loader(s3.paths, 1, None, None) as local:
        iterator = iter(local)
        done = [rows(next(iterator)) for _ in range(stop)]
        state = local.state_dict()
        del iterator
    expected = _window(local_epochs[0][stop:], 2)  # prefetch=1: the session read and the next
    assert expected != _window(local_epochs[0], 2)  # not what a pass from its start fetches
    s3.server.requests.clear()
    cache = SessionCache(tmp_path / "fresh", prefetch=1, room_timeout=30)
    with _loader(s3.urls, 1, s3.options, cache) as loader:
        loader.load_state_dict(state)
        rest = [rows(batch) for batch in loader]
    assert done + rest == local_epochs[0]
    paths = [f"/{files.BUCKET}{urlparse(url).path}" for url in s3.urls]
    gets = [
        r.path for r in s3.server.log() if r.method == "GET" and r.range is None and r.path in paths
    ]
    first = {paths.index(path) for path in gets[:2]}
    assert first == expected, (first, expected)
