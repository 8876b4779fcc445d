"""Session files read through a ``SessionCache``: remote objects, and local paths given ``cache=``.

Where each part runs:

- *main process, at construction*: ``session_names`` expands URL globs once (sorted);
  ``SessionSources.build`` lists the objects (one listing per prefix: size, ETag, mtime) and
  refuses cache limits that cannot hold them. Local paths without ``cache=`` never get here
  (``import loaderkit`` and local datasets import no fsspec).
- *every reading process* (the main one, DataLoader workers): ``lease(pos)`` when the handle
  cache opens session ``pos``: a local, verified copy that h5py opens; the lease is held as
  long as the handle is open (``loaderkit.hdf5.read.handles.Handle.lease``).
- *the process that draws the loader's indices* (each rank's main process): ``ahead`` moves
  a ``loaderkit.storage.Prefetcher``'s window over the sessions the pass reads next
  (``OrderWatcher``, fed by the loader's ``PassIndices``). The prefetcher is made at its first
  use in that process, so its threads and fsspec filesystems never cross a fork; the workers'
  leases then find the files there (or wait for the download in flight: once per node).
"""

from __future__ import annotations

import errno
import itertools
import os
from collections import deque
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from loaderkit.errors import CacheDamageError, ConfigError, HDF5FileError, StorageError
from loaderkit.hdf5.convert.rowcache import RowsTransform, rows_key
from loaderkit.hdf5.meta.keyspecs import KeySpec
from loaderkit.machine.distributed import local_world_size
from loaderkit.storage import (
    CachedFile,
    CacheStats,
    ObjectInfo,
    Prefetcher,
    SessionCache,
    Transform,
    expand,
    is_url,
    require_remote,
    stat_objects,
)
from loaderkit.storage.urls import has_glob

__all__ = ["OrderWatcher", "SessionSources", "session_names"]

#: Most sample indices the loader draws ahead of torch to see the sessions coming.
MAX_HORIZON = 1 << 18


def session_names(files: Any, storage_options: Mapping[str, Any] | None) -> Any:
    """``files`` with URL globs expanded (sorted, in place of the glob); unchanged otherwise.

    Raises:
        ConfigError: A URL without the ``remote`` extra, or a glob as a mapping's value.
        FileNotFoundError: A glob that matches nothing.

    Examples:
        >>> session_names(["/data/s1.h5"], None)
        ['/data/s1.h5']
    """
    if isinstance(files, str | bytes | os.PathLike):
        return files  # normalize_files names the mistake
    if isinstance(files, Mapping):
        for sid, name in files.items():
            if is_url(name):
                require_remote(os.fspath(name))
                if has_glob(os.fspath(name)):
                    raise ConfigError(
                        f"session {sid!r}: {name!r} is a glob; a mapping names one file per "
                        "session. Pass a list of URLs or globs (ids 0..n-1) instead."
                    )
        return files
    names = list(files)
    urls = [os.fspath(name) for name in names if is_url(name)]
    if not urls:
        return names
    require_remote(urls[0])
    if not any(has_glob(url) for url in urls):
        return names
    return expand(names, storage_options)


class SessionSources:
    """The sessions a dataset reads through a cache, and the fetcher of this process.

    Args:
        ids: Session ids by position.
        infos: Position -> the object (or local file) as listed at construction.
        cache: The node's cache.
        storage_options: For fsspec.
        transform: Writes the cache's stored form (``layout="rows"``), or ``None``.

    Examples:
        >>> sources = SessionSources.build([0], ["/data/s1.h5"], None, None)
        >>> sources is None
        True
    """

    def __init__(
        self,
        ids: Sequence[Hashable],
        infos: Mapping[int, ObjectInfo],
        cache: SessionCache,
        storage_options: Mapping[str, Any] | None,
        transform: Transform | None = None,
        *,
        given: bool = True,
    ) -> None:
        self.ids = list(ids)
        #: Whether the caller passed the cache (``False``: the default ``SessionCache()``).
        self.given = given
        self.infos = dict(infos)
        self.cache = cache
        self.storage_options = dict(storage_options or {})
        self.transform = transform
        self._fetcher: Prefetcher | None = None
        self._pid = os.getpid()

    @classmethod
    def build(
        cls,
        ids: Sequence[Hashable],
        names: Sequence[str],
        storage_options: Mapping[str, Any] | None,
        cache: SessionCache | None,
    ) -> SessionSources | None:
        """The cached sessions of a dataset (``None``: every file is read in place).

        URLs always go through a cache (``cache``, else ``SessionCache()``: ``$LOADERKIT_CACHE``
        or ``~/.cache/loaderkit``); local paths only when ``cache`` is given.

        Raises:
            FileNotFoundError: An object, its bucket or a local file is missing (named).
            StorageAccessError: The store refused the credentials.
            ConfigError: The cache cannot hold the largest session, or every local rank's
                open session and prefetch window (``LOCAL_WORLD_SIZE`` ranks share the node's
                cache directory).
        """
        if cache is not None and not isinstance(cache, SessionCache):
            raise ConfigError(
                f"cache must be a loaderkit.SessionCache or None, got {type(cache).__name__}"
            )
        remote = [pos for pos, name in enumerate(names) if is_url(name)]
        if cache is None and not remote:
            return None
        cached = range(len(names)) if cache is not None else remote
        given = cache is not None
        if cache is None:
            cache = SessionCache()
        listed = stat_objects([names[pos] for pos in cached], storage_options)
        infos = {pos: listed[names[pos]] for pos in cached}
        cache.check_limits([info.size for info in infos.values()], readers=local_world_size())
        return cls(ids, infos, cache, storage_options, given=given)

    def use_keys(self, specs: Sequence[KeySpec]) -> None:
        """The keys read: with ``layout="rows"`` the cache stores the first one row by row."""
        spec = rows_key(specs)
        if self.cache.layout == "rows" and spec is not None:
            self.transform = RowsTransform(spec.path)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_fetcher"] = None  # threads and leases belong to their process
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pid = os.getpid()

    def cached(self, pos: int) -> bool:
        """Whether session ``pos`` is read through the cache."""
        return pos in self.infos

    @property
    def remote(self) -> dict[int, ObjectInfo]:
        """The sessions that are URLs (their metadata is read with range requests)."""
        return {pos: info for pos, info in self.infos.items() if is_url(info.url)}

    def sizes(self) -> list[int]:
        """The stored size of every cached session."""
        return [info.size for info in self.infos.values()]

    def lease(self, pos: int) -> CachedFile:
        """A leased local copy of session ``pos`` (fetched now if the node has none).

        Raises:
            HDF5FileError: The object (or local file) changed since the dataset was built.
            FileNotFoundError: It is gone (the message names session and URL).
            StorageAccessError: The store refused the credentials.
            StorageError: The cache's disk is full or no room came free.
        """
        info = self.infos[pos]
        if not is_url(info.url):
            self._check_local(pos, info)
        try:
            return self.cache.lease(info, self.storage_options, transform=self.transform)
        except FileNotFoundError as exc:
            raise FileNotFoundError(
                errno.ENOENT,
                f"session {self.ids[pos]!r}: {info.url} is gone since the dataset was built "
                f"({exc}; process {os.getpid()})",
            ) from exc
        except StorageError as exc:
            if exc.errno != errno.EIO or isinstance(exc, CacheDamageError):
                raise
            raise self._changed(pos, str(exc)) from exc

    def repair(self, pos: int, cached: CachedFile, error: BaseException) -> CachedFile:
        """After session ``pos``'s cached copy failed to open: check it, fetch it again if damaged.

        Returns the same lease when the copy is the store's bytes, else a lease on a fresh copy
        (``SessionCache.repair``).

        Raises:
            CacheDamageError: The copy was damaged again after a re-fetch in this process.
        """
        try:
            return self.cache.repair(
                cached, str(error), self.storage_options, transform=self.transform
            )
        except FileNotFoundError as exc:
            raise FileNotFoundError(
                errno.ENOENT,
                f"session {self.ids[pos]!r}: {cached.info.url} is gone since the dataset was "
                f"built ({exc}; process {os.getpid()})",
            ) from exc

    def _check_local(self, pos: int, info: ObjectInfo) -> None:
        path = info.url[len("file://") :] if info.url.lower().startswith("file://") else info.url
        try:
            st = os.stat(path)
        except FileNotFoundError as exc:
            raise FileNotFoundError(
                errno.ENOENT,
                f"session {self.ids[pos]!r}: file {path} no longer exists (process {os.getpid()})",
            ) from exc
        if st.st_size != info.size or st.st_mtime_ns / 1e9 != info.mtime:
            raise self._changed(pos, f"size {info.size} -> {st.st_size} bytes, mtime changed")

    def _changed(self, pos: int, what: str) -> HDF5FileError:
        return HDF5FileError(
            f"session {self.ids[pos]!r}: {self.infos[pos].url} changed after the dataset was "
            f"built ({what}), so its index no longer matches the file. Create the dataset "
            "again after replacing objects (never replace session files while a dataset over "
            "them is in use)."
        )

    def ahead(self, positions: Iterable[int]) -> None:
        """The sessions this process's loader reads next, in order, the current one first."""
        if self.cache.prefetch <= 0:
            return
        if self._fetcher is None or self._pid != os.getpid():
            self._pid = os.getpid()
            self._fetcher = Prefetcher(
                self.cache,
                {info.url: info for info in self.infos.values()},
                self.storage_options,
                window=self.cache.prefetch + 1,
                transform=self.transform,
            )
        self._fetcher.ahead(self.infos[pos].url for pos in positions if pos in self.infos)

    def held(self) -> list[str]:
        """The URLs this process's prefetcher holds now."""
        fetcher = self._fetcher
        return [] if fetcher is None or self._pid != os.getpid() else fetcher.held()

    def stats(self) -> CacheStats:
        """This process's cache counters (hits, misses, bytes, waiting, evictions, free disk)."""
        return self.cache.stats()

    def close(self) -> None:
        """Stop this process's prefetcher and release its leases (idempotent)."""
        fetcher, self._fetcher = self._fetcher, None
        if fetcher is not None and self._pid == os.getpid():
            fetcher.close()


def _flatten(items: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Every index of ``items`` in one array, and how many each item holds.

    Batches of Python ints (what torch's ``BatchSampler`` yields, a short last one included)
    go through one ``np.fromiter``; anything else (single indices, tensors, arrays, keys that
    are not integers) item by item.
    """
    try:
        sizes = [len(item) for item in items]
        flat = np.fromiter(itertools.chain.from_iterable(items), np.int64, count=sum(sizes))
    except (TypeError, ValueError, OverflowError):
        arrays = [np.asarray(item).reshape(-1) for item in items]
        if not arrays:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        kinds = {a.dtype.kind for a in arrays}
        if kinds <= {"i", "u"}:
            return np.concatenate(arrays), np.array([a.size for a in arrays])
        # not integer indices: NaNs, which no session position matches (-1 for each)
        return np.full(sum(a.size for a in arrays), np.nan), np.array([a.size for a in arrays])
    return flat, np.asarray(sizes)


class OrderWatcher:
    """Sees the loader's indices ahead of torch and moves the prefetch window (main process).

    The loader draws up to ``horizon`` samples ahead (``drawn``) and says which batch it hands
    to torch now (``reading``); the watcher turns indices into sessions and tells
    ``SessionSources.ahead`` the sessions from that batch on, when they changed.

    Args:
        sources: The dataset's cached sessions.
        positions: ``positions(indices)`` -> the session position of each index (-1 for one
            that is not the dataset's).
        horizon: Samples to see ahead.

    Examples:
        >>> watcher = OrderWatcher(None, lambda idx: np.asarray(idx) // 10, 30)
        >>> watcher.drawn([[0, 1], [12]]); watcher.drawn([25])
        >>> list(watcher.upcoming())
        [0, 1, 2]
    """

    def __init__(self, sources: Any, positions: Any, horizon: int) -> None:
        self.sources = sources
        self._positions = positions
        self.horizon = max(1, min(int(horizon), MAX_HORIZON))
        self._runs: deque[tuple[int, int]] = deque()  # (item number, session position)
        self._drawn = 0
        self._read = 0
        self._sent: list[int] | None = None
        self._changed = True  # the runs changed since the window was last computed

    def drawn(self, items: Sequence[Any]) -> None:
        """Items drawn from the sampler (batches of indices, or single indices), in order.

        One vectorised pass over all of them: a pass's first call holds the whole horizon.
        """
        if not items:
            return
        first = self._drawn
        self._drawn += len(items)
        flat, sizes = _flatten(items)
        positions = np.asarray(self._positions(flat)).reshape(-1)
        numbers = np.repeat(np.arange(first, first + len(items)), sizes)
        known = positions >= 0  # -1: not an index of the dataset (the reader will say so)
        if not known.all():
            positions, numbers = positions[known], numbers[known]
        if not positions.size:
            return
        last = self._runs[-1][1] if self._runs else None
        starts = np.flatnonzero(positions[1:] != positions[:-1]) + 1
        if last is None or int(positions[0]) != last:
            starts = np.concatenate(([0], starts))
        if starts.size:
            self._runs.extend(
                zip(numbers[starts].tolist(), positions[starts].tolist(), strict=True)
            )
            self._changed = True

    def reading(self) -> None:
        """The next drawn item goes to the reader now: move the window if it changed."""
        number = self._read
        self._read += 1
        runs = self._runs
        # drop the runs behind this item; the one it lies in stays (it may have begun earlier)
        while len(runs) > 1 and runs[0][0] < number and runs[1][0] <= number:
            runs.popleft()
            self._changed = True
        if self.sources is None or not self._changed:
            return  # same runs ahead, same window: once per session change, not per batch
        self._changed = False
        window = self._window(self.sources.cache.prefetch + 1)
        if window != self._sent:
            self._sent = window
            self.sources.ahead(window)

    def upcoming(self) -> Iterator[int]:
        """Session positions from the item being read on (consecutive repeats dropped)."""
        return (pos for _, pos in self._runs)

    def _window(self, size: int) -> list[int]:
        window: list[int] = []
        for pos in self.upcoming():
            if pos not in window and self.sources.cached(pos):
                window.append(pos)
                if len(window) >= size:
                    break
        return window
