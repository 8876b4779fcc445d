"""Keys whose rows span many chunks that other rows share, read apart from the runs.

Functions over a reader's ``SessionFiles`` state (its handles, records and held sessions):
``fill_wide`` reads a batch's rows of such a key, ``read_wide`` one session's rows. NSD's
``(750, V)`` betas with chunks ``(750, 1)``: one row touches every chunk. A batch's rows of
one session are read in one pass over that session's chunks (``widerows``), and whole
sessions are held in memory within ``max_session_bytes`` (``heldsessions``), so that block
order reads each session once per pass. ``WideAhead`` is the loader's watcher for such a
reader: in block order it builds the next session's chunk index on a thread of its own, and
asks the kernel for the session's first bytes once the one before is held.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from loaderkit.hdf5.meta.index import ROW_BITS, ROW_MASK
from loaderkit.hdf5.read.handles import Handle
from loaderkit.hdf5.read.heldsessions import HeldSession
from loaderkit.hdf5.read.rawio import (
    ChunkMap,
    chunk_map,
    preadv_possible,
)
from loaderkit.hdf5.read.sessionfiles import SessionFiles
from loaderkit.hdf5.read.widerows import read_rows_hdf5, read_rows_raw

__all__ = ["ASK_BYTES", "WideAhead", "fill_wide", "read_wide"]

logger = logging.getLogger(__name__)

#: Bytes of the next session asked for ahead at most (``WideAhead``; a sixteenth of memory
#: where that is less): what the disk reads while the current session's batches are served.
ASK_BYTES = 256 << 20
#: Seconds ``WideAhead`` waits for the session before the next to be held.
HELD_WAIT = 120.0
#: Batches handed on in a process that holds no session before ``WideAhead`` goes quiet
#: (worker processes read the files).
QUIET_AFTER = 8


def _chunk_map(files: SessionFiles, handle: Handle, k: int) -> ChunkMap | None:
    """The raw chunk map of key ``k`` in an open file (built once per open), or ``None``."""
    maps = handle.chunk_maps
    found = maps[k] if maps is not None else False
    if found is False:
        with handle.guard:  # one thread builds it; the others wait for it
            maps = handle.chunk_maps
            if maps is None:
                maps = handle.chunk_maps = [False] * len(files.specs)
            found = maps[k]
            if found is False:
                found = None
                if preadv_possible(files.open_kwargs[handle.position]) and handle.fd is not None:
                    found = chunk_map(handle.file, handle.datasets[k])
                maps[k] = found
    return found if isinstance(found, ChunkMap) else None


def _wide_rows(
    files: SessionFiles, handle: Handle, k: int, rows: np.ndarray, out: np.ndarray
) -> int:
    """Rows (sorted) of key ``k`` from an open file into ``out``, every chunk read once."""
    cmap = _chunk_map(files, handle, k)
    if cmap is not None:
        return read_rows_raw(cmap, rows, out)
    return read_rows_hdf5(handle.datasets[k], rows, out)


def _held(files: SessionFiles, pos: int, index: int) -> HeldSession | None:
    """Session ``pos`` held in memory, read whole now if it fits ``max_session_bytes``.

    A held session is served only while its file is unchanged (one ``os.stat``). The
    session returned counts one more reader: ``files.held.release`` it after copying.
    One copy per process: the threads that want a session not held yet wait while one
    of them reads it (its ``building`` lock), then share it.
    """
    held = files.held.acquire(pos)
    if held is not None:
        _check_held(files, held, pos, index)
        return held
    nbytes = files.session_nbytes[pos]
    if not files.held.fits(nbytes):
        return None
    with files.held.building(pos):
        held = files.held.acquire(pos)
        if held is not None:  # another thread read it meanwhile
            _check_held(files, held, pos, index)
            return held
        handle = files.leased(pos, 0, index)
        try:
            held = _read_session(files, handle, pos, index, nbytes)
        finally:
            files.file_pool.release(handle)
        return held


def _check_held(files: SessionFiles, held: HeldSession, pos: int, index: int) -> None:
    """Raise ``HDF5FileError`` (and forget the session) when its file changed since."""
    if files.swmr or (files.sources is not None and files.sources.cached(pos)):
        return  # a cached copy is one version of the object: it cannot change
    try:
        st = os.stat(files.paths[pos])
        same = st.st_size == held.size and st.st_mtime_ns == held.mtime_ns
        now_text = (
            f"size {held.size} -> {st.st_size} bytes"
            if st.st_size != held.size
            else "same size, modified since"
        )
    except OSError as exc:
        same, now_text = False, f"it cannot be examined any more ({exc})"
    if same:
        return
    files.held.release(held)
    files.held.discard(pos)
    files.file_pool.discard(files.canonical[pos])
    lost = f"the row for dataset index {index}"
    raise files.changed(pos, "after its rows were read into memory", now_text, lost, index)


def _read_session(
    files: SessionFiles, handle: Handle, pos: int, index: int, nbytes: int
) -> HeldSession | None:
    """Read session ``pos``'s wide keys whole and hold them (one reader counted).

    ``None``: the sessions other threads are reading whole leave no room for it now.
    """
    if not files.held.reserve(nbytes):
        return None
    put = False
    try:
        arrays: list[np.ndarray | None] = []
        rows = files.records[pos].layouts
        for k, wide in enumerate(files.wide[pos]):
            if not wide:
                arrays.append(None)
                continue
            rt = files.types[k]
            out = files.held.buffer((rows[k].rows, *rt.row_shape), rt.mem_dtype)
            try:
                _wide_rows(files, handle, k, np.arange(rows[k].rows), out)
            except MemoryError:
                raise
            except Exception as exc:
                raise files.read_error(exc, pos, range(rows[k].rows), index, k) from exc
            arrays.append(out)
        files.verify(handle, pos, "rows", index)  # what was read is the file as it is
        ident = handle.identity
        held = HeldSession(
            arrays,
            size=ident.size if ident is not None else -1,
            mtime_ns=ident.mtime_ns if ident is not None else -1,
            readers=1,
        )
        if ident is not None:
            files.held.put(pos, held, reserved=nbytes)
            put = True
        return held
    finally:
        if not put:
            files.held.unreserve(nbytes)


def read_wide(
    files: SessionFiles, k: int, pos: int, rows: np.ndarray, out: np.ndarray, index: int
) -> None:
    """Rows (sorted) of key ``k`` in session ``pos`` into ``out``: held, or one pass.

    No lock is held while reading: the handle is leased, a held session counted.
    """
    held = _held(files, pos, index)
    if held is not None:
        try:
            source = held.arrays[k]
            assert source is not None
            np.take(source, rows, axis=0, out=out, mode="clip")  # rows checked at open
        finally:
            files.held.release(held)
        return
    handle = files.leased(pos, int(rows[0]), index)
    try:
        try:
            _wide_rows(files, handle, k, rows, out)
        except MemoryError:
            raise
        except Exception as exc:
            span = range(int(rows[0]), int(rows[-1]) + 1)
            raise files.read_error(exc, pos, span, index, k) from exc
        files.verify(handle, pos, "rows", index)
    finally:
        files.file_pool.release(handle)


def fill_wide(
    files: SessionFiles, k: int, idx: np.ndarray, keys: np.ndarray, out: np.ndarray
) -> None:
    """``SessionReader._fill`` for a key whose rows span many chunks in some session.

    The batch is sorted by (session, row); each wide session's rows are read in one pass
    over its chunks (or served from memory), other sessions' runs as usual.
    """
    n = keys.shape[0]
    order = np.argsort(keys, kind="stable")
    ordered = bool(np.all(order == np.arange(n)))
    buf = out if ordered else np.empty_like(out)
    skeys = keys if ordered else keys[order]
    positions = skeys >> ROW_BITS
    cuts = np.flatnonzero(np.diff(positions)) + 1
    bounds = [0, *cuts.tolist(), n]
    segments = list(itertools.pairwise(bounds))
    # sessions already held first: they are this batch's, and must not make room for
    # the sessions it reads anew (least recently used go first)
    segments.sort(key=lambda seg: files.held.get(int(positions[seg[0]]), touch=False) is None)
    pending = collections.deque(segments)
    passed = 0  # sessions put back in a row because another thread reads them whole
    while pending:
        s, e = pending[0]
        pos = int(positions[s])
        if passed < len(pending) and files.wide[pos][k] and files.held.reading(pos):
            # another thread reads this session whole: read the batch's others meanwhile
            pending.rotate(-1)
            passed += 1
            continue
        pending.popleft()
        passed = 0
        rows = skeys[s:e] & ROW_MASK
        index = int(idx[order[s]])
        if files.wide[pos][k]:
            read_wide(files, k, pos, rows, buf[s:e], index)
            continue
        handle = files.leased(pos, int(rows[0]), index)
        try:
            brk = np.flatnonzero(np.diff(rows) != 1) + 1
            starts = [0, *brk.tolist(), e - s]
            for a, b in itertools.pairwise(starts):
                first = int(rows[a])
                try:
                    files.fill_run(handle, k, pos, first, b - a, buf[s + a : s + b], index)
                except MemoryError:
                    raise
                except Exception as exc:
                    span = range(first, first + b - a)
                    raise files.read_error(exc, pos, span, index, k) from exc
            if handle.watch:
                files.verify(handle, pos, "rows", index)
        finally:
            files.file_pool.release(handle)
    if not ordered:
        out[order] = buf


class WideAhead:
    """The loader's watcher (``order.lookahead``) that readies the next session held whole.

    Block order over rows that span every chunk (NSD's betas) reads a session whole, then
    serves its batches from memory. While it does, the disk is idle, and the next session's
    read starts with its chunk index (0.1 s of B-tree for 300,000 chunks). This watcher sees
    the sessions coming in the sampler's order: for the next one, on a thread of its own, it
    opens the file and builds the chunk index (kept with the open file), waits until the
    session before is held, then asks the kernel (``posix_fadvise(WILLNEED)``) for the first
    ``ask_bytes`` of its chunks, which the disk reads while the batches are served. One
    session at a time; only advice (a failed call is ignored, the read reads as any).

    It begins once this process has read a session whole in the pass, and stays quiet for
    the pass where batches mix many sessions (not block order: nothing is held whole for
    long) or where this process has read none after ``QUIET_AFTER`` batches (worker
    processes read the files).

    Args:
        files: The reader's files.
        index: The dataset's packed index (dataset index -> row key).
        ask_bytes: Bytes of a session asked for ahead at most.

    Example:
        >>> WideAhead.drawn.__name__, WideAhead.reading.__name__
        ('drawn', 'reading')
    """

    def __init__(self, files: SessionFiles, index: np.ndarray, ask_bytes: int) -> None:
        self.files = files
        self._index = index
        self.ask_bytes = ask_bytes
        wide = [pos for pos, w in enumerate(files.wide) if any(w)]
        rows = [files.records[pos].layouts[0].rows for pos in wide] or [1]
        #: Samples drawn ahead: the next session is seen while the current one is read.
        self.horizon = 2 * max(rows)
        self._order: list[int] = []  # sessions in the order they come, each once
        self._seen: set[int] = set()
        self._next = 0  # ``_order[_next]`` is the next to ready
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._handed = 0
        self._loads = files.held.info().loads  # sessions read whole here before this pass
        self.quiet = False
        #: Sessions readied (chunk index built) and asked for ahead.
        self.readied: list[int] = []
        self.asked: list[int] = []

    def drawn(self, items: Sequence[Any]) -> None:
        """Note the sessions of the batches just drawn; ready the next one."""
        if self.quiet:
            return
        n = len(self._index)
        for item in items:
            idx = np.asarray(item, np.int64).reshape(-1)
            idx = idx[(idx >= -n) & (idx < n)]
            positions = np.asarray(self._index[idx], np.int64) >> ROW_BITS
            distinct = np.unique(positions)
            if distinct.size > 2:  # batches mix sessions: not block order
                self.close()
                return
            _, first = np.unique(positions, return_index=True)
            for pos in positions[np.sort(first)].tolist():
                if pos not in self._seen:
                    self._seen.add(pos)
                    self._order.append(pos)
        self._start()

    def reading(self) -> None:
        """The oldest batch drawn is handed on; go quiet where this process holds nothing."""
        self._handed += 1
        if not self.quiet and self._handed > QUIET_AFTER and not self._reads_here():
            self.close()
            return
        self._start()

    def _reads_here(self) -> bool:
        """Whether this process read a session whole in this pass (no worker processes)."""
        return self.files.held.info().loads > self._loads

    def close(self) -> None:
        """Stop readying sessions for this pass."""
        self.quiet = True
        self._stop.set()

    def _start(self) -> None:
        """Ready the next session not held, on the watcher's thread, one at a time."""
        if self.quiet or (self._thread is not None and self._thread.is_alive()):
            return
        if not self._reads_here():
            return  # the first session is not read yet, or worker processes read the files
        held = self.files.held
        while self._next < len(self._order):
            pos = self._order[self._next]
            before = self._order[self._next - 1] if self._next else None
            self._next += 1
            nbytes = self.files.session_nbytes[pos]
            if not any(self.files.wide[pos]) or not held.fits(nbytes):
                continue
            if before is None or held.get(pos, touch=False) is not None or held.reading(pos):
                continue  # the pass's first session is read at once: nothing to ready ahead
            self._thread = threading.Thread(
                target=self._ready, args=(pos, before), name="loaderkit-wide-ahead", daemon=True
            )
            self._thread.start()
            return

    def _ready(self, pos: int, before: int | None) -> None:
        try:
            self._ready_session(pos, before)
        except Exception:
            logger.debug("session %d not readied ahead", pos, exc_info=True)

    def _ready_session(self, pos: int, before: int | None) -> None:
        files, held = self.files, self.files.held
        handle = files.leased(pos, 0, -1)
        try:  # built once per open file, kept with it
            for k, wide in enumerate(files.wide[pos]):
                if wide:
                    _chunk_map(files, handle, k)
        finally:
            files.file_pool.release(handle)  # no lease held while waiting: leases may wait
        self.readied.append(pos)
        deadline = time.monotonic() + HELD_WAIT
        while before is not None and held.get(before, touch=False) is None:
            if held.get(pos, touch=False) is not None or held.reading(pos):
                return  # its own read began: nothing to ask ahead
            if self._stop.wait(0.01) or time.monotonic() > deadline:
                return
        leased = files.file_pool.lease_open([files.canonical[pos]])  # never opens or waits
        if leased is None:
            return  # closed meanwhile: its read opens it again
        try:
            left = self.ask_bytes
            for cmap in leased[0].chunk_maps or []:
                if isinstance(cmap, ChunkMap) and left > 0:
                    left -= _ask_first(cmap, left)
        finally:
            files.file_pool.release_all(leased)
        self.asked.append(pos)


def _ask_first(cmap: ChunkMap, nbytes: int) -> int:
    """Ask the kernel for the first ``nbytes`` of ``cmap``'s chunks in the file; bytes asked."""
    if not cmap.offsets.size:
        return 0
    order = np.argsort(cmap.offsets, kind="stable")
    starts = cmap.offsets[order]
    ends = starts + cmap.lengths[order] * cmap.chunk_bytes
    first = int(starts[0])
    upto = int(np.searchsorted(ends - first, nbytes, side="right"))
    last = int(ends[max(0, min(upto, ends.size) - 1)])
    with contextlib.suppress(OSError, AttributeError):  # only advice
        os.posix_fadvise(cmap.fd, first, last - first, os.POSIX_FADV_WILLNEED)
    return last - first
