"""The cache view of a session dataset read through a ``SessionCache``: fetch order, budgets, stats.

``CachedSessions`` is the part ``HDF5SessionDataset`` shows as ``ds.cached_sessions`` (it
answers ``None`` or nothing for datasets read in place):

- ``cache``: the node's ``SessionCache``; ``stats()``: its counters;
- ``prefetch_watcher()``: the loader (``loaderkit.order.resume.PassIndices``, main process)
  draws indices a little ahead of torch and tells the returned ``OrderWatcher`` which sessions
  come next; it moves this process's prefetch window (``SessionSources.ahead``);
- ``open_files(num_workers)``: the most files each process may keep open (each holds a lease
  on its cache entry, which cannot be evicted) so that every local rank's files and prefetch
  window still fit ``max_bytes``;
- ``plan_rows(...)``: the plan's ``cache`` and ``prefetch`` rows; ``shuffle_hint()``: why a
  uniform shuffle through a cache smaller than the data refetches.
"""

from __future__ import annotations

import functools

import numpy as np

from loaderkit.hdf5.meta.index import ROW_BITS
from loaderkit.hdf5.read.reader import Reader
from loaderkit.hdf5.remote.sources import OrderWatcher, SessionSources
from loaderkit.machine.distributed import local_world_size
from loaderkit.plan import counted
from loaderkit.storage import CacheStats, SessionCache
from loaderkit.storage.limits import (
    fit_to_readers,
    fit_to_workers,
    format_bytes,
    window_sessions,
)

__all__ = ["CachedSessions", "session_positions"]


class CachedSessions:
    """Fetch order, budgets and statistics of a dataset's sessions read through a cache.

    Args:
        sources: The dataset's sessions and the cache they are read through (``None``: every
            session read in place).
        reader: The dataset's reader (its records: rows per session; its open-file bound).

    Example:
        >>> CachedSessions.plan_rows.__name__
        'plan_rows'
    """

    def __init__(self, sources: SessionSources | None, reader: Reader) -> None:
        self.sources = sources
        self.reader = reader

    @property
    def cache(self) -> SessionCache | None:
        """The node cache sessions are read through (``None``: all read in place)."""
        return None if self.sources is None else self.sources.cache

    def stats(self) -> CacheStats | None:
        """Counters of ``cache`` for this process and its workers (``None``: no cache).

        Hits, misses, bytes fetched, seconds waiting, evictions and free bytes.

        Example:
            >>> ds.cached_sessions.stats().misses  # doctest: +SKIP
            4
        """
        return None if self.sources is None else self.sources.stats()

    def prefetch_watcher(self) -> OrderWatcher | None:
        """A watcher of the loader's coming indices that fetches their sessions ahead.

        Called by ``loaderkit.DataLoader`` at the start of every pass, in the process that
        draws the indices; ``None`` when nothing is fetched (local files, ``prefetch=0``).

        Example:
            >>> ds.cached_sessions.prefetch_watcher() is None  # doctest: +SKIP
            False
        """
        sources = self.sources
        if sources is None or sources.cache.prefetch <= 0:
            return None
        rows = max(
            (rec.layouts[0].rows for rec in self.reader.files.records if rec.layouts), default=1
        )
        horizon = (self.reader.files.file_pool.max_open + sources.cache.prefetch + 1) * max(rows, 1)
        return OrderWatcher(
            sources, functools.partial(session_positions, self.reader.index), horizon
        )

    def open_files(
        self, num_workers: int, ranks: int | None = None, threads: int = 0
    ) -> int | None:
        """Most files each reading process may keep open so the cache never blocks.

        Every open file leases its cache entry; every rank on the node shares the cache and has
        its own prefetch window (``1 + prefetch`` sessions; none when workers read and
        ``prefetch=0``), so ``ranks x (readers x max_open_files + window)`` sessions of the
        largest size must fit ``max_bytes``. A ``prefetch`` the caller left unset is lowered
        first until one open file per reader fits (``limits.fit_to_readers``; the plan's
        ``prefetch`` row says why), after an unset ``max_bytes`` below one open session per
        reading process is raised to that (``limits.fit_to_workers``; set, or without room on
        the disk: ``ConfigError``). Thread workers count as one process there (they share its
        files, taking turns when it holds one) but as readers for the prefetch window: each
        holds the session it reads while the window moves on.
        ``None`` when nothing is read through a cache.

        Args:
            num_workers: The loader's worker processes (0: the main process reads).
            ranks: Ranks on this node; default ``loaderkit.machine.distributed.local_world_size()``.
            threads: The loader's worker threads (``worker_method="thread"``, with
                ``num_workers=0``): the files returned are for all of them together.
        """
        sources = self.sources
        if sources is None:
            return None
        largest = max(sources.sizes(), default=0)
        if largest <= 0:
            return None
        ranks = max(1, local_world_size() if ranks is None else ranks)
        cache = sources.cache
        readers = threads if threads > 0 else num_workers
        limits = fit_to_workers(cache.session_limits, cache.disk(), ranks, num_workers, largest)
        capacity = limits.max_bytes.value // largest
        cache.limits = fit_to_readers(limits, capacity, ranks, readers, largest)
        room = capacity - ranks * window_sessions(cache.prefetch, readers)
        if threads > 0:  # one file pool: its files are shared by the threads
            return max(1, room // ranks)
        return max(1, room // (ranks * max(1, num_workers)))

    def shuffle_hint(self) -> str | None:
        """Why a uniform shuffle through this cache refetches, or ``None`` when all fits.

        A uniformly shuffled order draws every batch from all sessions; a cache that holds
        fewer than all of them evicts a session long before its rows are all read, so it is
        fetched again and again. ``shuffle="block"`` reads one session's rows together.

        Example:
            >>> ds.cached_sessions.shuffle_hint()  # doctest: +SKIP
            'shuffle=True reads the rows of 8 sessions in random order through a ...'
        """
        sources = self.sources
        if sources is None:
            return None
        sizes = sources.sizes()
        cache = sources.cache
        total = sum(sizes)
        if not sizes or total <= cache.max_bytes:
            return None
        return (
            f"shuffle=True reads the rows of {counted(len(sizes), 'session')} in random order "
            "through a "
            f"SessionCache that holds {cache.max_bytes // max(sizes)} or more of them (max_bytes "
            f"{format_bytes(cache.max_bytes)} of {format_bytes(total)}): nearly every batch "
            "evicts a session whose rows are not all read yet, and it is fetched again, many "
            "times per epoch. shuffle='block' fetches each session once per epoch; or raise "
            "max_bytes to hold every session"
        )

    def plan_rows(self, num_workers: int, threads: int = 0) -> list[tuple[str, bool, object, str]]:
        """The plan's ``cache`` and ``prefetch`` rows: ``(name, given, value, reason)`` each.

        ``given``: the caller chose the value (``cache=``, ``prefetch=``).

        Args:
            num_workers: The loader's worker processes (0: the main process reads).
            threads: The loader's worker threads (``open_files``).

        Example:
            >>> [row[0] for row in ds.cached_sessions.plan_rows(2)]  # doctest: +SKIP
            ['cache', 'prefetch']
        """
        sources = self.sources
        if sources is None:
            return []
        self.open_files(num_workers, threads=threads)  # prefetch fitted to these readers
        cache = sources.cache
        limits = cache.limits
        stats = cache.stats()
        remote = len(sources.remote)
        local = len(sources.infos) - remote
        what = ", ".join(
            part
            for part in (
                f"{remote} remote session(s)" if remote else "",
                f"{local} local session(s) copied" if local else "",
            )
            if part
        )
        reason = (
            f"{what}, {format_bytes(sum(sources.sizes()))} in all; layout {cache.layout!r}; "
            f"max_bytes {format_bytes(cache.max_bytes)} ({limits.max_bytes.reason}); min_free "
            f"{format_bytes(cache.min_free)} ({limits.min_free.reason}); "
            f"{format_bytes(stats.free_bytes)} free; {stats.hits} hits, {stats.misses} misses, "
            f"{format_bytes(stats.bytes_fetched)} fetched, {stats.seconds_waiting:.1f} s "
            f"waiting, {stats.evictions} evictions (this process and its workers)"
        )
        where = (
            "in the main process, in the loader's order (each worker's reads find the files "
            f"there); at most {self.reader.files.file_pool.max_open} open per process"
            if num_workers > 0
            else "in this process, in the loader's order"
        )
        ahead = (
            f"{limits.prefetch.reason}: {counted(cache.prefetch, 'session')} ahead of the one "
            "read, "
            f"fetched {where}"
            if cache.prefetch > 0
            else f"{limits.prefetch.reason}: each session is fetched when first opened"
        )
        given = "prefetch" in limits.given
        return [
            ("cache", sources.given, str(cache.dir), reason),
            ("prefetch", given, cache.prefetch, ahead),
        ]


def session_positions(keys: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """The session position of each of ``indices`` in the packed index ``keys``.

    -1 for an index that is not the dataset's (it fails in the reader, named).

    Example:
        >>> session_positions(np.array([0, 1 << 36], np.int64), np.array([1, 5])).tolist()
        [1, -1]
    """
    idx = np.asarray(indices).reshape(-1)
    if idx.dtype.kind not in "iu":
        return np.full(idx.size, -1, np.int64)
    n = len(keys)
    if not idx.size or (idx.min() >= -n and idx.max() < n):
        return np.asarray(keys[idx]) >> ROW_BITS
    good = (idx >= -n) & (idx < n)  # bad ones fail in the reader, named
    out = np.full(idx.size, -1, np.int64)
    out[good] = np.asarray(keys[idx[good]]) >> ROW_BITS
    return out
