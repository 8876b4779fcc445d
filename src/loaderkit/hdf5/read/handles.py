"""The file pool: a per-process pool of open HDF5 files, safe across fork and threads.

One ``FilePool`` belongs to one dataset object in one process. It keeps at most
``max_open`` files open, closes the least recently used one *before* opening another (so the
bound is never exceeded, not even for a moment), and keeps the ``h5py.Dataset`` object next to
its ``h5py.File`` (looking a dataset up by name costs several row reads).

Fork safety does not rely on a pid check on the hot path. A module-level
``os.register_at_fork(after_in_child=...)`` hook, registered once, walks a ``WeakSet`` of live
pools in every forked child and closes the inherited handles there before anything can reopen
them: HDF5 recognises a file that is already open in the process and would silently share the
parent's open file (its file descriptor, file locks and chunk-buffer settings) with the child.
Closing the child's copies leaves the parent's handles usable.

Locks (what each guards; none is held across a read):

* ``FilePool._mutex`` (a ``threading.Lock``) guards the pool's dict of open handles, the
  handles waiting to be closed, every handle's reader count and the statistics. It is held
  for dictionary work only, never while a file is opened, read or closed.
* ``FilePool.lock`` (a re-entrant ``HookLock``) serialises the reads that run user code or
  h5py objects handed out (``read``/``read_rows``/``__getitem__`` overrides, ``file()``,
  ``h5dataset()``): while any thread holds it, no handle is closed except by that thread's
  own eviction, so an ``h5py.File`` handed out stays open. The default reads never take it.
* Leases: the default reads ``lease`` a handle (its reader count goes up) and ``release`` it
  when done; a handle evicted (least recently used), discarded or closed (``close()``)
  while it has readers is retired from the dict at once and closed by its last reader.
  Retired handles still count against ``max_open``: a miss that finds every open handle
  leased waits until one is released, so the bound is never exceeded, not even for a moment.
  A thread that holds a lease asks for another only with ``lease_open``, which never waits,
  so waiting cannot deadlock.
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
from loaderkit.hdf5.read.hooklock import HookLock

__all__ = ["FilePool", "FilePoolInfo", "Handle", "HookLock", "foreign_file_ids"]

logger = logging.getLogger(__name__)

_LIVE_POOLS: weakref.WeakSet[FilePool] = weakref.WeakSet()
_FORKED = False


class FilePoolInfo(NamedTuple):
    """Statistics of one process's file pool (reset in every new process).

    Attributes:
        hits: Accesses served by an already open file.
        misses: Accesses that had to open a file.
        evictions: Files closed to stay within ``max_open_files``.
        opens: Files opened (misses that succeeded).
        open_files: Files open now.
        max_open_files: The bound.

    Example:
        >>> FilePoolInfo(3, misses=1, evictions=0, opens=1, open_files=1, max_open_files=8).hits
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
        lease: The node cache's lease on the local copy of a remote (or cached) session, held as
            long as the file is open and released when it is closed (``None``: read in place).
        chunked: Per key, the ``ChunkReader`` that reads its chunks raw (``None``: none).
        paths: Per key, the ``ReadPath`` its rows are read by (how, and why).
        readers: Threads reading through it now (leases of ``FilePool.lease``); guarded by
            the pool's mutex.
        retired: Out of the pool (evicted, discarded or closed): closed by its last reader.
        guard: A lock for the state built lazily on first use (``chunk_maps``, ``others``,
            ``members``), held while building it, never while reading.

    Example:
        >>> Handle.__slots__[:4]
        ('_mapped', 'chunk_maps', 'chunked', 'datasets')
    """

    __slots__ = (
        "_mapped",
        "chunk_maps",
        "chunked",
        "datasets",
        "dirty",
        "fd",
        "file",
        "guard",
        "identity",
        "lease",
        "maps",
        "members",
        "others",
        "paths",
        "position",
        "raws",
        "readers",
        "retired",
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
        self.chunked: list[Any] = [None] * len(self.datasets)
        self.paths: list[Any] = []
        self.readers = 0
        self.retired = False
        self.guard = threading.Lock()

    def close(self) -> None:
        """Close the maps and the file (and every object opened through it); never raises."""
        self.datasets = []
        self.raws = []
        self.maps = []
        self.members = {}
        self.others = {}
        self.chunk_maps = None
        self.chunked = []
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
                logger.debug("releasing a node cache lease failed", exc_info=True)


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


class _Opening:
    """A slot taken in the pool while one thread opens the file (others wait on ``done``)."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = threading.Event()


#: How long a miss that found every open handle leased waits before it looks again.
_WAIT_S = 0.05


class FilePool:
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
        >>> pool = FilePool(lambda k: Handle(h5py.File(path, "r")), max_open=1,
        ...                 path_of=lambda k: path)
        >>> handle = pool.lease(0)
        >>> handle.file.mode, handle.readers
        ('r', 1)
        >>> pool.release(handle)
        >>> pool.close()
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
        self._mutex = threading.Lock()
        self._released = threading.Condition(self._mutex)
        self._waiting = 0  # threads in ``_released.wait``: releases notify only where some wait
        self.lock = HookLock(self._sweep)
        self._entries: OrderedDict[Hashable, Handle | _Opening] = OrderedDict()
        self._closing: list[Handle] = []
        self._reserved = 0  # files being opened, room reserved for them
        self._shutting = 0  # files being closed now (out of ``_closing``, still open)
        self._checked: set[Hashable] = set()
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.opens = 0
        _LIVE_POOLS.add(self)

    def get(self, key: Hashable) -> Handle:
        """Return the open handle for ``key``, opening it (and evicting the LRU one) if needed.

        No lease is taken: the handle stays open while the caller holds ``lock`` (or until
        the calling thread itself evicts it). The default reads use ``lease``.

        Args:
            key: The session position.

        Returns:
            The ``Handle``.
        """
        return self._acquire(key, 0)

    def lease(self, key: Hashable) -> Handle:
        """The open handle for ``key`` with one more reader: it stays open until ``release``.

        Args:
            key: The session position.

        Returns:
            The ``Handle``; pass it to ``release`` when done (also on errors).
        """
        return self._acquire(key, 1)

    def lease_open(self, keys: Sequence[Hashable]) -> list[Handle] | None:
        """``lease`` every key whose file is open now, or none: never opens, never waits.

        One hold of the pool's mutex for a whole batch. A thread that holds leases asks
        with this for more; where it gets ``None``, it releases what it holds before it
        calls ``lease`` (which may wait).

        Args:
            keys: Session positions.

        Returns:
            The leased handles in the order of ``keys`` (pass them to ``release_all``), or
            ``None`` (nothing leased) where one of the files is not open.
        """
        handles: list[Handle] = []
        with self._mutex:
            entries = self._entries
            for key in keys:
                entry = entries.get(key)
                if not isinstance(entry, Handle):
                    return None
                handles.append(entry)
            for key, handle in zip(keys, handles, strict=True):
                entries.move_to_end(key)
                handle.readers += 1
            self.hits += len(handles)
            return handles

    def lease_batch(self, keys: Sequence[Hashable]) -> list[Handle] | None:
        """``lease_open``, after opening the closed files of ``keys`` where all fit at once.

        For a thread that holds no lease (it may wait). The batch's open files go last in
        line for eviction; each closed one is leased and released in turn, then the whole
        batch is leased with ``lease_open``: ``None`` where ``keys`` outnumber ``max_open``
        or other threads' files took the room meanwhile.
        """
        leased = self.lease_open(keys)
        if leased is not None or len(keys) > self.max_open:
            return leased
        with self._mutex:
            entries = self._entries
            closed = [key for key in keys if not isinstance(entries.get(key), Handle)]
            for key in keys:
                if key in entries:
                    entries.move_to_end(key)
        for key in closed:
            self.release(self.lease(key))
        return self.lease_open(keys)

    def release(self, handle: Handle) -> None:
        """Give back a lease; the last reader of a retired handle closes it."""
        self.release_all((handle,))

    def release_all(self, handles: Sequence[Handle]) -> None:
        """``release`` each of ``handles`` (one hold of the mutex)."""
        with self._mutex:
            ready = False
            for handle in handles:
                handle.readers -= 1
                ready = ready or (handle.readers == 0 and handle.retired)
            if self._waiting:
                self._released.notify_all()
        if ready:
            self._close_ready()

    def _acquire(self, key: Hashable, readers: int) -> Handle:
        while True:
            with self._mutex:
                entry = self._entries.get(key)
                if isinstance(entry, Handle):
                    self._entries.move_to_end(key)
                    self.hits += 1
                    entry.readers += readers
                    return entry
                if entry is None:
                    self.misses += 1
                    slot = _Opening()
                    self._entries[key] = slot
                    break
            entry.done.wait()  # another thread opens this file
        try:
            self._make_room()
        except BaseException:
            with self._mutex:
                if self._entries.get(key) is slot:
                    del self._entries[key]
            slot.done.set()
            raise
        try:
            if _FORKED and key not in self._checked:
                self._checked.add(key)
                self._warn_inherited(key)
            handle = self._opener(key)
        except BaseException:
            with self._mutex:
                self._reserved -= 1
                if self._entries.get(key) is slot:
                    del self._entries[key]
                self._released.notify_all()
            slot.done.set()
            raise
        with self._mutex:
            self._reserved -= 1
            handle.readers += readers
            if self._entries.get(key) is slot:
                self._entries[key] = handle
                self.opens += 1
            else:  # closed (``close()``) while it was opened: the caller's alone
                handle.retired = True
                self._closing.append(handle)
        slot.done.set()
        if handle.retired and not readers:
            self._close_ready()
        return handle

    def _handles(self) -> int:
        """Files open: in the dict, retired but not closed yet (caller holds the mutex)."""
        handles = sum(isinstance(e, Handle) for e in self._entries.values())
        return handles + len(self._closing) + self._shutting

    def _make_room(self) -> None:
        """Reserve room for one more file within ``max_open``, closing the least recently used.

        Only handles without readers are evicted; while every open file is being read, this
        waits for a reader to finish (it holds no lease and no room meanwhile, so the readers
        and the threads with room always progress).
        """
        while True:
            with self._mutex:
                if self._handles() + self._reserved >= self.max_open:
                    old_key = next(
                        (
                            k
                            for k, e in self._entries.items()
                            if isinstance(e, Handle) and not e.readers
                        ),
                        None,
                    )
                    if old_key is not None:
                        old = self._entries.pop(old_key)
                        assert isinstance(old, Handle)
                        old.retired = True
                        self._closing.append(old)
                        self.evictions += 1
            self._close_ready(evicted=True)
            with self._mutex:
                if self._handles() + self._reserved < self.max_open:
                    self._reserved += 1
                    return
                self._waiting += 1
                try:
                    self._released.wait(_WAIT_S)
                finally:
                    self._waiting -= 1

    def _close_ready(self, evicted: bool = False) -> None:
        """Close retired handles without readers, unless another thread holds ``lock``."""
        if not self.lock.acquire(blocking=False):
            return  # its holder closes them when it lets go (``_sweep``)
        try:
            with self._mutex:
                ready = [h for h in self._closing if not h.readers]
                self._closing = [h for h in self._closing if h.readers]
                self._shutting += len(ready)  # still open: counted until closed
            error: BaseException | None = None
            for old in ready:
                try:
                    if evicted and self._on_evict is not None and error is None:
                        self._on_evict(old)
                except BaseException as exc:
                    error = exc
                finally:
                    old.close()
                    with self._mutex:
                        self._shutting -= 1
                        self._released.notify_all()
            if error is not None:
                raise error
        finally:
            self.lock.release(notify=False)

    def _sweep(self) -> None:
        """Close what waited for ``lock`` (its outermost holder let go)."""
        if self._closing and any(not h.readers for h in self._closing):
            self._close_ready()

    def _warn_inherited(self, key: Hashable) -> None:
        path = self._path_of(key)
        with self._mutex:
            handles = [e for e in self._entries.values() if isinstance(e, Handle)]
        own = {entry.file.id.id for entry in handles if entry.file.id}
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
        with self._mutex:
            entry = self._entries.get(key)
        return entry if isinstance(entry, Handle) else None

    def discard(self, key: Hashable) -> None:
        """Retire the handle for ``key`` (after an error): closed now, or by its last reader."""
        with self._mutex:
            entry = self._entries.get(key)
            if not isinstance(entry, Handle):
                return
            del self._entries[key]
            entry.retired = True
            self._closing.append(entry)
        self._close_ready()

    def close(self) -> None:
        """Close every open handle of this process; the pool stays usable.

        Handles being read now are closed by their readers when they finish (their reads
        complete); files being opened now stay with the threads that open them.
        """
        with self.lock:
            with self._mutex:
                for key in [k for k, e in self._entries.items() if isinstance(e, Handle)]:
                    entry = self._entries.pop(key)
                    assert isinstance(entry, Handle)
                    entry.retired = True
                    self._closing.append(entry)
                for key in [k for k, e in self._entries.items() if isinstance(e, _Opening)]:
                    del self._entries[key]  # its opener retires the file when it is open
            self._close_ready()

    def __len__(self) -> int:
        with self._mutex:
            return self._handles()

    def __repr__(self) -> str:
        keys = [k for k, e in list(self._entries.items()) if isinstance(e, Handle)]
        open_keys = ", ".join(repr(k) for k in keys[:8])
        more = ", ..." if len(keys) > 8 else ""
        return (
            f"<FilePool {len(self)}/{self.max_open} open [{open_keys}{more}], "
            f"hits={self.hits} misses={self.misses} evictions={self.evictions} pid={os.getpid()}>"
        )

    def info(self) -> FilePoolInfo:
        """Return the statistics of this process as a ``FilePoolInfo``."""
        open_files = len(self)
        with self._mutex:
            return FilePoolInfo(
                self.hits, self.misses, self.evictions, self.opens, open_files, self.max_open
            )

    def _after_fork(self) -> None:
        # The child may have inherited locks held by threads that do not exist here.
        self._mutex = threading.Lock()
        self._released = threading.Condition(self._mutex)
        self._waiting = 0
        self.lock = HookLock(self._sweep)
        entries = [e for e in self._entries.values() if isinstance(e, Handle)] + self._closing
        self._entries = OrderedDict()
        self._closing = []
        self._reserved = 0
        self._shutting = 0
        for entry in entries:
            entry.guard = threading.Lock()
            entry.close()
        self._checked = set()
        self.hits = self.misses = self.evictions = self.opens = 0

    def __del__(self) -> None:
        entries: Any = self.__dict__.get("_entries")
        closing: Any = self.__dict__.get("_closing") or []
        for entry in [*(entries or {}).values(), *closing]:
            if isinstance(entry, Handle):
                entry.close()
        if entries:
            entries.clear()


def _after_fork_in_child() -> None:
    global _FORKED
    _FORKED = True
    for pool in list(_LIVE_POOLS):
        pool._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
