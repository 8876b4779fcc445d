"""Per-process LRU cache of open HDF5 files, safe across fork and threads.

One ``HandleCache`` belongs to one dataset object in one process. It keeps at most
``max_open`` files open, closes the least recently used one *before* opening another (so the
bound is never exceeded, not even for a moment), and keeps the ``h5py.Dataset`` object next to
its ``h5py.File`` (looking a dataset up by name costs several row reads).

Fork safety does not rely on a pid check on the hot path. A module-level
``os.register_at_fork(after_in_child=...)`` hook, registered once, walks a ``WeakSet`` of live
caches in every forked child and closes the inherited handles there before anything can reopen
them: HDF5 recognises a file that is already open in the process and would silently share the
parent's open file (its file descriptor, file locks and chunk-cache settings) with the child.
Closing the child's copies leaves the parent's handles usable.

Thread safety: every cache operation takes a re-entrant lock, and the dataset holds the same
lock for the whole of a read, so a handle can never be closed by an eviction in one thread while
another thread reads through it. h5py serialises all HDF5 calls behind one global lock anyway,
so this costs no parallelism.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any, NamedTuple

import h5py
import numpy as np
from h5py import h5f

from loaderkit.errors import warn

__all__ = ["CacheInfo", "Handle", "HandleCache", "foreign_file_ids"]

logger = logging.getLogger(__name__)

_LIVE_CACHES: weakref.WeakSet[HandleCache] = weakref.WeakSet()
_FORKED = False


class CacheInfo(NamedTuple):
    """Statistics of one process's handle cache (reset in every new process).

    Attributes:
        hits: Accesses served by an already open file.
        misses: Accesses that had to open a file.
        evictions: Files closed to stay within ``max_open_files``.
        opens: Files opened (misses that succeeded).
        open_files: Files open now.
        max_open_files: The bound.

    Example:
        >>> CacheInfo(hits=3, misses=1, evictions=0, opens=1, open_files=1, max_open_files=8).hits
        3
    """

    hits: int
    misses: int
    evictions: int
    opens: int
    open_files: int
    max_open_files: int


class Handle:
    """An open file and, per key, its ``h5py.Dataset`` and fast-read state.

    Attributes:
        file: The open ``h5py.File`` (read-only).
        datasets: ``file[key]`` of every key, looked up once (empty without a key).
        raws: Per key, ``(fd, offset)`` of the dataset's bytes when it is stored contiguously
            and unfiltered in a plain (sec2) file, so rows can be read with ``os.preadv`` into
            the destination (and swapped to native order); ``None`` otherwise.
        maps: Per key, a read-only memory map of those bytes as an array of the dataset's
            shape and file dtype (copy out of it; never hand out views), or ``None``.
        fd: HDF5's file descriptor (sec2 driver), or ``None``.
        identity: The file's ``Identity`` when it was opened (``None``: not known).
        members: Per key that names a group of per-sample datasets, those looked up so far.
        others: Other datasets of the file by path, looked up so far (``h5dataset(session,
            path)`` for a path that is not a key); dropped when the handle is closed.
        position: The session position it was opened for.
        watch: Reads through it must be followed by a check of the file (chunked data: HDF5
            reads chunks past a new end of the file as zeros).
        dirty: Read since it was last checked.
        chunk_maps: Per key, where its column chunks lie (``rawio.chunk_map``), built at
            the first read that needs it (``None``: not yet).
        lease: The cache's lease on the local copy of a remote (or cached) session, held as
            long as the file is open and released when it is closed (``None``: read in place).

    Example:
        >>> Handle.__slots__[:4]
        ('_mapped', 'chunk_maps', 'datasets', 'dirty')
    """

    __slots__ = (
        "_mapped",
        "chunk_maps",
        "datasets",
        "dirty",
        "fd",
        "file",
        "identity",
        "lease",
        "maps",
        "members",
        "others",
        "position",
        "raws",
        "watch",
    )

    def __init__(
        self,
        file: h5py.File,
        datasets: Sequence[Any] = (),
        raws: Sequence[tuple[int, int] | None] = (),
        mapped: Sequence[tuple[mmap.mmap, np.ndarray] | None] = (),
        *,
        fd: int | None = None,
        identity: Any = None,
    ) -> None:
        self.file = file
        self.datasets: list[Any] = list(datasets)
        self.raws: list[tuple[int, int] | None] = list(raws) or [None] * len(self.datasets)
        self._mapped: list[mmap.mmap] = [m[0] for m in mapped if m is not None]
        self.maps: list[np.ndarray | None] = [None if m is None else m[1] for m in mapped] or [
            None
        ] * len(self.datasets)
        self.fd = fd
        self.identity = identity
        self.members: dict[tuple[int, str], h5py.Dataset] = {}
        self.others: dict[str, h5py.Dataset] = {}
        self.position = -1
        self.watch = False
        self.dirty = False
        self.chunk_maps: list[Any] | None = None
        self.lease: Any = None

    def close(self) -> None:
        """Close the maps and the file (and every object opened through it); never raises."""
        self.datasets = []
        self.raws = []
        self.maps = []
        self.members = {}
        self.others = {}
        self.chunk_maps = None
        for mapped in self._mapped:
            try:
                mapped.close()
            except BufferError:  # a view still refers to it: unmapped when that view goes
                logger.debug("a memory map is still referenced; left to garbage collection")
        self._mapped = []
        try:
            self.file.close()
        except Exception:  # closing must not fail (interpreter shutdown, broken file)
            logger.debug("closing an HDF5 handle failed", exc_info=True)
        lease, self.lease = self.lease, None
        if lease is not None:
            try:
                lease.close()  # after the file: the entry may be evicted from now on
            except Exception:
                logger.debug("releasing a cache lease failed", exc_info=True)


def foreign_file_ids(path: str | os.PathLike[str]) -> list[h5f.FileID]:
    """HDF5 file identifiers open in this process for ``path``.

    Args:
        path: The file to look for (compared by device and inode, so links match too).

    Returns:
        The open ``FileID`` objects that refer to ``path``; empty when none.

    Example:
        >>> foreign_file_ids("/nonexistent.h5")
        []
    """
    try:
        target = os.stat(path)
    except OSError:
        return []
    found = []
    for fid in h5f.get_obj_ids(h5f.OBJ_ALL, h5f.OBJ_FILE):
        try:
            name = os.fsdecode(fid.name)
            st = os.stat(name)
        except (OSError, ValueError):
            continue
        if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
            found.append(fid)
    return found


class HandleCache:
    """A bounded, thread-safe, fork-aware LRU of open HDF5 files for one process.

    Args:
        opener: Called as ``opener(key)`` on a miss; returns a ``Handle``. It must release
            everything it opened when it raises.
        max_open: Most files open at once (>= 1).
        path_of: Maps a key to its path, used to detect handles inherited from a parent process.
        on_evict: Called with a handle about to be closed to make room (it may raise; the
            handle is closed either way).

    Example:
        >>> import h5py, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "a.h5")
        >>> with h5py.File(path, "w") as f:
        ...     _ = f.create_dataset("x", data=[1, 2, 3])
        >>> cache = HandleCache(lambda k: Handle(h5py.File(path, "r")), max_open=1,
        ...                     path_of=lambda k: path)
        >>> cache.get(0).file.mode
        'r'
        >>> cache.close()
    """

    def __init__(
        self,
        opener: Callable[[Any], Handle],
        max_open: int,
        path_of: Callable[[Any], str | os.PathLike[str]],
        on_evict: Callable[[Handle], None] | None = None,
    ) -> None:
        self._opener = opener
        self._on_evict = on_evict
        self._path_of = path_of
        self.max_open = max_open
        self.lock = threading.RLock()
        self._entries: OrderedDict[Hashable, Handle] = OrderedDict()
        self._checked: set[Hashable] = set()
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.opens = 0
        _LIVE_CACHES.add(self)

    def get(self, key: Hashable) -> Handle:
        """Return the open handle for ``key``, opening it (and evicting the LRU one) if needed.

        Args:
            key: The session position.

        Returns:
            The ``Handle``; valid while the caller holds ``lock``.
        """
        with self.lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return entry
            self.misses += 1
            while len(self._entries) >= self.max_open:
                _, old = self._entries.popitem(last=False)
                self.evictions += 1
                try:
                    if self._on_evict is not None:
                        self._on_evict(old)
                finally:
                    old.close()
            if _FORKED and key not in self._checked:
                self._checked.add(key)
                self._warn_inherited(key)
            entry = self._opener(key)
            self._entries[key] = entry
            self.opens += 1
            return entry

    def _warn_inherited(self, key: Hashable) -> None:
        path = self._path_of(key)
        own = {entry.file.id.id for entry in self._entries.values() if entry.file.id}
        if [fid for fid in foreign_file_ids(path) if fid.id not in own]:
            warn(
                f"{os.fspath(path)!s} was already open in the parent process when this worker "
                "was forked (opened outside this dataset, e.g. by your own h5py.File or another "
                "dataset object). HDF5 will share that inherited handle with this worker "
                "instead of opening the file afresh. Close your HDF5 files before creating "
                "multi-worker loaders, or use multiprocessing_context='spawn'/'forkserver'."
            )

    def peek(self, key: Hashable) -> Handle | None:
        """The open handle for ``key`` without opening or reordering anything (``None``)."""
        with self.lock:
            return self._entries.get(key)

    def discard(self, key: Hashable) -> None:
        """Close and forget the handle for ``key`` (after an error); no-op if not open."""
        with self.lock:
            entry = self._entries.pop(key, None)
            if entry is not None:
                entry.close()

    def close(self) -> None:
        """Close every open handle of this process; the cache stays usable."""
        with self.lock:
            while self._entries:
                _, entry = self._entries.popitem(last=False)
                entry.close()

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        open_keys = ", ".join(repr(k) for k in list(self._entries)[:8])
        more = ", ..." if len(self._entries) > 8 else ""
        return (
            f"<HandleCache {len(self._entries)}/{self.max_open} open [{open_keys}{more}], "
            f"hits={self.hits} misses={self.misses} evictions={self.evictions} pid={os.getpid()}>"
        )

    def info(self) -> CacheInfo:
        """Return the statistics of this process as a ``CacheInfo``."""
        with self.lock:
            return CacheInfo(
                self.hits,
                self.misses,
                self.evictions,
                self.opens,
                len(self._entries),
                self.max_open,
            )

    def _after_fork(self) -> None:
        # The child may have inherited a lock held by a thread that does not exist here.
        self.lock = threading.RLock()
        entries = list(self._entries.values())
        self._entries = OrderedDict()
        for entry in entries:
            entry.close()
        self._checked = set()
        self.hits = self.misses = self.evictions = self.opens = 0

    def __del__(self) -> None:
        entries: Any = self.__dict__.get("_entries")
        if not entries:
            return
        for entry in list(entries.values()):
            entry.close()
        entries.clear()


def _after_fork_in_child() -> None:
    global _FORKED
    _FORKED = True
    for cache in list(_LIVE_CACHES):
        cache._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
