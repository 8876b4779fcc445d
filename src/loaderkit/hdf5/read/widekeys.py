"""Keys whose rows span many chunks that other rows share, read apart from the runs.

Functions over a reader's ``SessionFiles`` state (its handles, records and held sessions):
``fill_wide`` reads a batch's rows of such a key, ``read_wide`` one session's rows. NSD's
``(750, V)`` betas with chunks ``(750, 1)``: one row touches every chunk. A batch's rows of
one session are read in one pass over that session's chunks (``widerows``), and whole
sessions are held in memory within ``max_session_bytes`` (``heldsessions``), so that block
order reads each session once per pass.
"""

from __future__ import annotations

import collections
import itertools
import os

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

__all__ = ["fill_wide", "read_wide"]


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
