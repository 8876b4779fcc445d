"""What a session dataset read through a ``SessionCache`` adds: fetch order, budgets, stats.

``CachedSessions`` is a base of ``HDF5SessionDataset`` (a no-op for datasets read in place):

- ``prefetch_watcher()``: the loader (``loaderkit.order.resume.PassIndices``, main process) draws
  indices a little ahead of torch and tells the returned ``OrderWatcher`` which sessions come
  next; it moves this process's prefetch window (``SessionSources.ahead``);
- ``cached_open_files(num_workers)``: the most files each process may keep open (each holds a
  lease on its cache entry, which cannot be evicted) so that every local rank's files and
  prefetch window still fit ``max_bytes``;
- ``cache_plan(num_workers)``: the plan's ``cache`` and ``prefetch`` rows; ``cache_stats()``.
"""

from __future__ import annotations

import numpy as np

from loaderkit.hdf5.meta.index import ROW_BITS
from loaderkit.hdf5.read.reader import SessionReader
from loaderkit.hdf5.remote.sources import OrderWatcher, SessionSources
from loaderkit.machine.distributed import local_world_size
from loaderkit.storage import CacheStats, SessionCache
from loaderkit.storage.limits import fit_to_readers, format_bytes, window_sessions

__all__ = ["CachedSessions"]


class CachedSessions:
    """Fetch order, budgets and statistics of sessions read through a cache (a base class)."""

    _sources: SessionSources | None
    _reader: SessionReader
    _key: np.ndarray
    max_open_files: int

    @property
    def session_cache(self) -> SessionCache | None:
        """The node cache sessions are read through (``None``: all read in place)."""
        return None if self._sources is None else self._sources.cache

    def cache_stats(self) -> CacheStats | None:
        """Cache counters of this process and its workers: hits, misses, bytes, waiting, evictions.

        Example:
            >>> ds.cache_stats().misses  # doctest: +SKIP
            4
        """
        return None if self._sources is None else self._sources.stats()

    def prefetch_watcher(self) -> OrderWatcher | None:
        """A watcher of the loader's coming indices that fetches their sessions ahead.

        Called by ``loaderkit.DataLoader`` at the start of every pass, in the process that
        draws the indices; ``None`` when nothing is fetched (local files, ``prefetch=0``).

        Example:
            >>> ds.prefetch_watcher() is None  # doctest: +SKIP
            False
        """
        sources = self._sources
        if sources is None or sources.cache.prefetch <= 0:
            return None
        rows = max((rec.layouts[0].rows for rec in self._reader.records if rec.layouts), default=1)
        horizon = (self.max_open_files + sources.cache.prefetch + 1) * max(rows, 1)
        return OrderWatcher(sources, self._session_positions, horizon)

    def _session_positions(self, indices: np.ndarray) -> np.ndarray:
        """The session position of each index; -1 for one that is not the dataset's."""
        keys = self._key
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

    def cached_open_files(self, num_workers: int, ranks: int | None = None) -> int | None:
        """Most files each reading process may keep open so the cache never blocks.

        Every open file leases its cache entry; every rank on the node shares the cache and has
        its own prefetch window (``1 + prefetch`` sessions; none when workers read and
        ``prefetch=0``), so ``ranks x (readers x max_open_files + window)`` sessions of the
        largest size must fit ``max_bytes``. A ``prefetch`` the caller left unset is lowered
        first until one open file per reader fits (``limits.fit_to_readers``; the plan's
        ``prefetch`` row says why). ``None`` when nothing is read through a cache.

        Args:
            num_workers: The loader's workers (0: the main process reads).
            ranks: Ranks on this node; default ``loaderkit.machine.distributed.local_world_size()``.
        """
        sources = self._sources
        if sources is None:
            return None
        largest = max(sources.sizes(), default=0)
        if largest <= 0:
            return None
        ranks = max(1, local_world_size() if ranks is None else ranks)
        cache = sources.cache
        capacity = cache.max_bytes // largest
        cache.limits = fit_to_readers(cache.session_limits, capacity, ranks, num_workers, largest)
        room = capacity - ranks * window_sessions(cache.prefetch, num_workers)
        return max(1, room // (ranks * max(1, num_workers)))

    def cache_plan(self, num_workers: int) -> list[tuple[str, bool, object, str]]:
        """The plan's ``cache`` and ``prefetch`` rows: ``(name, given, value, reason)`` each.

        ``given``: the caller chose the value (``cache=``, ``prefetch=``).

        Example:
            >>> [row[0] for row in ds.cache_plan(2)]  # doctest: +SKIP
            ['cache', 'prefetch']
        """
        sources = self._sources
        if sources is None:
            return []
        self.cached_open_files(num_workers)  # prefetch fitted to these readers
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
            f"there); at most {self.max_open_files} open per process"
            if num_workers > 0
            else "in this process, in the loader's order"
        )
        ahead = (
            f"{limits.prefetch.reason}: {cache.prefetch} session(s) ahead of the one read, "
            f"fetched {where}"
            if cache.prefetch > 0
            else f"{limits.prefetch.reason}: each session is fetched when first opened"
        )
        given = "prefetch" in limits.given
        return [
            ("cache", sources.given, str(cache.dir), reason),
            ("prefetch", given, cache.prefetch, ahead),
        ]
