"""``SessionReader``: reads rows of one or several keys from session files, and checks them.

The reader owns what reading needs: the per-process handle cache, how each key is stored
(``KeySpec``) and typed (``RowType``), what every session file held when the index was built
(``SessionRecord``), and the error context. ``HDF5SessionDataset`` keeps its hooks, accessors
and pickling, and hands its default reads here:

* ``read_one`` — one sample (per-item reads);
* ``read_batch`` — a batch grouped into runs of consecutive rows (``reading.plan_runs``),
  every key read into one buffer: ``os.preadv`` or a memory map for contiguous numbers (other
  byte orders into a reused scratch buffer, converted while copied), HDF5 otherwise (which
  converts byte order, enums and compounds itself), then split into samples and the collated
  batch (``loaderkit.collate.RowBatch``).

Keys whose rows span many chunks that other rows share (``SessionLayout.shares_chunks``:
NSD's ``(750, V)`` betas with chunks ``(750, 1)``) are read apart (``loaderkit.hdf5.wide``):
a batch's rows of one session in one pass over that session's chunks, and whole sessions held
in memory within ``max_session_bytes`` (``loaderkit.hdf5.held``), so that block order reads
each session once.

Never silently wrong: a file is compared with its ``SessionRecord`` when it is (re)opened, and
with its identity at open (one ``fstat``) after every read and before every copy out of a
memory map, so a file rewritten, shrunk or truncated under the dataset is an
``HDF5FileError`` naming what changed, never another dataset's bytes or zero rows.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import os
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import h5py
import numpy as np
from h5py import h5s

from loaderkit.collate import RowBatch, batch_buffer
from loaderkit.errors import ConfigError, HDF5FileError
from loaderkit.hdf5.diagnose import (
    Identity,
    changes,
    identity_of,
    missing_sources,
    open_failure,
)
from loaderkit.hdf5.filters import pipeline
from loaderkit.hdf5.handles import Handle, HandleCache
from loaderkit.hdf5.held import HeldSession, HeldSessions
from loaderkit.hdf5.index import _ROW_BITS, _ROW_MASK
from loaderkit.hdf5.layout import SessionLayout, add_note, dataset_at
from loaderkit.hdf5.rawio import (
    ChunkMap,
    chunk_map,
    map_rows,
    pread,
    preadv_possible,
    raw_location,
    read_direct,
)
from loaderkit.hdf5.reading import plan_runs
from loaderkit.hdf5.types import Kind, RowType, Samples, _dicts
from loaderkit.hdf5.wide import read_rows_hdf5, read_rows_raw

__all__ = ["KeySpec", "SessionReader", "SessionRecord"]

logger = logging.getLogger(__name__)

#: Slabs at least this large are read straight into the batch buffer (``H5Dread`` into the
#: destination); smaller ones go through h5py's Cython fast path and one copy, which has less
#: per-call overhead. Measured with ``benchmarks/hdf5_read.py`` (see docs/hdf5.md).
_DIRECT_READ_BYTES = 256 * 1024


@dataclass(frozen=True)
class KeySpec:
    """One dataset a sample is read from.

    Attributes:
        name: The name in a sample's dict (several keys), or the key itself.
        path: The dataset's path in the file (links are followed), or the group's path when
            ``members`` is set.
        axis: The axis samples lie along (``sample_axis``, non-negative).
        members: The path names a group whose datasets are the samples, one each.

    Example:
        >>> KeySpec("x", "data/x").axis
        0
    """

    name: str
    path: str
    axis: int = 0
    members: bool = False


class SessionRecord(NamedTuple):
    """What a session file held when the index was built: checked at every (re)open.

    Attributes:
        identity: The file's ``Identity`` then.
        layouts: Per key: rows, row shape and dtype (``SessionLayout``).
        members: Per key: the names of a group's per-sample datasets (``None``: not a group).

    Example:
        >>> SessionRecord(None, (), ()).layouts
        ()
    """

    identity: Identity | None
    layouts: tuple[SessionLayout, ...]
    members: tuple[tuple[str, ...] | None, ...]


def _axis_selection(axis: int, start: int, stop: int | None) -> tuple[Any, ...]:
    """The selection of rows ``start..stop-1`` (or row ``start`` when ``stop`` is ``None``)."""
    row: Any = start if stop is None else slice(start, stop)
    return (slice(None),) * axis + (row,)


def _read_slab(dset: h5py.Dataset, axis: int, start: int, length: int, dtype: np.dtype) -> Any:
    """Rows ``start..start+length-1`` along ``axis`` read into ``dtype`` (HDF5 converts).

    Returns the slab in the file's axis order (``moveaxis`` brings the sample axis first).
    """
    shape = dset.shape
    count = tuple(length if k == axis else n for k, n in enumerate(shape))
    offset = tuple(start if k == axis else 0 for k in range(len(shape)))
    out = np.empty(count, dtype)
    fspace = dset.id.get_space()
    fspace.select_hyperslab(offset, count)
    dset.id.read(h5s.create_simple(count), fspace, out, dxpl=dset._dxpl)
    return out


class SessionReader:
    """Default reads of ``HDF5SessionDataset``: keys, types, records, handles and checks.

    Args:
        ids: Session ids, in position order.
        paths: Their file paths.
        canonical: Per position, the position whose handle it uses (the same file listed
            twice shares one handle).
        specs: The keys read (empty: the subclass reads on its own).
        types: Per key, the ``RowType`` (empty when ``type_error`` is set).
        type_error: Why the keys' rows cannot be typed (a type no torch dtype holds, rows that
            differ between sessions), kept for a subclass that overrides ``read``: the base
            ``read`` raises it when called, an override that converts the rows itself works.
        records: Per position, the ``SessionRecord``.
        open_kwargs: Per position, the ``h5py.File`` keyword arguments.
        max_open: Most files open at once in each process.
        memory_map: Read contiguous numbers out of memory maps.
        fast: Default reads are used (raw access allowed, types known).
        single: A sample is one key's row, not a dict of keys.
        label: What to call the dataset in messages (its class name).
        uneven: Group keys whose per-sample datasets differ in shape (never stacked).
        max_session_bytes: Most bytes of whole sessions held in memory in each process
            (keys whose rows span many chunks; 0: none).

    Example:
        >>> SessionReader.read_one.__name__
        'read_one'
    """

    def __init__(
        self,
        *,
        ids: Sequence[Hashable],
        paths: Sequence[str],
        canonical: Sequence[int],
        specs: Sequence[KeySpec],
        types: Sequence[RowType],
        type_error: Exception | None = None,
        records: Sequence[SessionRecord],
        open_kwargs: Sequence[dict[str, Any]],
        max_open: int,
        memory_map: bool,
        fast: bool,
        single: bool,
        label: str,
        uneven: Sequence[int] = (),
        max_session_bytes: int = 0,
    ) -> None:
        self.ids = list(ids)
        self.paths = list(paths)
        self.canonical = list(canonical)
        self.specs = tuple(specs)
        self.types = tuple(types)
        self.type_error = type_error
        self.records = list(records)
        self.open_kwargs = list(open_kwargs)
        self.memory_map = memory_map
        self.fast = fast
        self.single = single
        self.label = label
        self.uneven = frozenset(uneven)
        self.swmr = any(bool(kw.get("swmr")) for kw in self.open_kwargs)
        self.locking = all(kw.get("locking", True) is not False for kw in self.open_kwargs)
        layouts = [lay for rec in self.records for lay in rec.layouts[:1]]
        self.chunked = any(lay.chunk_rows is not None for lay in layouts)
        number = bool(self.types) and all(rt.kind is Kind.NUMBER for rt in self.types)
        self.contiguous = (  # read with preadv (or maps): decided per file at open
            fast
            and number
            and all(preadv_possible(kw) for kw in self.open_kwargs)
            and all(spec.axis == 0 and not spec.members for spec in self.specs)
            and all(
                lay.chunk_rows is None for rec in self.records for lay in rec.layouts if lay.rows
            )
        )
        self.row_bytes = [
            int(np.prod(rt.row_shape, dtype=np.int64)) * rt.read_dtype.itemsize for rt in self.types
        ]
        self.cache = HandleCache(
            self._open, max_open, self.paths.__getitem__, on_evict=self._evicted
        )
        self._spare: np.ndarray | None = None
        self._scratches: dict[tuple[int, np.dtype, tuple[int, ...]], np.ndarray] = {}
        self._ragged_names = [self._ragged(k) for k in range(len(self.types))]
        #: Per session, per key: its rows span many chunks and are read apart (``wide``).
        self.wide = [
            tuple(
                self._reads_wide(k, layout)
                for k, layout in enumerate(rec.layouts[: len(self.types)])
            )
            for rec in self.records
        ]
        self.any_wide = [any(w[k] for w in self.wide) for k in range(len(self.types))]
        self._some_wide = any(self.any_wide)  # one attribute test on the per-item path
        #: Per session: bytes of its wide keys' rows, as held in memory.
        self.session_nbytes = [
            sum(rec.layouts[k].rows * self.row_bytes[k] for k, wide in enumerate(w) if wide)
            for rec, w in zip(self.records, self.wide, strict=True)
        ]
        self.held = HeldSessions(max_session_bytes)

    # ------------------------------------------------------------------ pickling

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["cache"] = self.cache.max_open  # handles never travel: only the bound
        state["held"] = self.held.max_bytes  # nor held rows
        state["_spare"] = None
        state["_scratches"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.cache = HandleCache(
            self._open, int(state["cache"]), self.paths.__getitem__, on_evict=self._evicted
        )
        self.held = HeldSessions(int(state["held"]))

    def _reads_wide(self, k: int, layout: SessionLayout) -> bool:
        """Whether key ``k`` of a session with ``layout`` is read apart (rows span many chunks).

        Numbers along axis 0 only; compound, string and ragged rows keep the run reads.
        """
        spec, rt = self.specs[k], self.types[k]
        return (
            layout.shares_chunks
            and rt.kind is Kind.NUMBER
            and spec.axis == 0
            and not spec.members
            and k not in self.uneven
        )

    # ------------------------------------------------------------------ messages

    def context(self, pos: int, row: int, index: int) -> str:
        """The note added to errors: dataset index, session, row, file, key and process."""
        keys = self.specs[0].name if len(self.specs) == 1 else [s.name for s in self.specs]
        return (
            f"loaderkit: dataset index {index} -> session {self.ids[pos]!r}, row {row}, "
            f"file {self.paths[pos]} (key {keys!r}, process {os.getpid()})"
        )

    def note(self, exc: BaseException, pos: int, row: int, index: int) -> None:
        """Add ``context`` to ``exc`` (Python >= 3.11), once."""
        add_note(exc, self.context(pos, row, index))

    def read_error(
        self, exc: Exception, pos: int, rows: range, index: int, key: int = 0
    ) -> Exception:
        """An ``HDF5FileError`` for a failed read, with the cause when a check establishes it.

        The handle is closed. Checks, in order: did the file change since it was opened
        (``fstat``); does the dataset carry a Fletcher-32 checksum and which of the rows'
        chunks fail on their own (damaged bytes). Otherwise HDF5's own message stands alone.

        Args:
            exc: What the read raised.
            pos: The session position.
            rows: The rows that were being read.
            index: The dataset index of the first of them (for the message).
            key: Which key was being read.
        """
        if isinstance(exc, HDF5FileError):
            self.cache.discard(self.canonical[pos])
            return exc
        cause = self._read_cause(pos, key, rows)
        what = f"row {rows.start}" if len(rows) == 1 else f"rows {rows.start}..{rows[-1]}"
        self.cache.discard(self.canonical[pos])
        name = self.specs[key].name if self.specs else None
        return HDF5FileError(
            f"reading {what} of {name!r} from session {self.ids[pos]!r} ({self.paths[pos]}) "
            f"for dataset index {index} failed in process {os.getpid()}: {cause or exc}"
            f"{' (HDF5: ' + str(exc) + ')' if cause else ''}. The handle was closed."
        )

    def _read_cause(self, pos: int, key: int, rows: range) -> str:
        entry = self.cache.peek(self.canonical[pos])
        if entry is not None and entry.identity is not None:
            try:
                now = identity_of(self.paths[pos])
            except OSError as exc:
                return f"the file is gone or unreadable now ({exc})"
            changed = changes(entry.identity, now)
            if changed:
                return f"the file changed while it was open: {', '.join(changed)}"
        if entry is None or key >= len(entry.datasets):
            return ""
        dset = entry.datasets[key]
        try:
            if not any(flt.id == 3 for flt in pipeline(dset)):
                return ""
        except Exception:
            return ""
        damaged = self._damaged_chunks(dset, self.specs[key].axis, rows)
        if not damaged:
            return ""
        spans = ", ".join(f"rows {a}..{b - 1}" for a, b in damaged)
        return (
            f"Fletcher-32 checksum mismatch: the chunk(s) holding {spans} are damaged "
            "(the file's bytes differ from what was written). Restore the file from a good "
            "copy; the other rows read correctly"
        )

    @staticmethod
    def _damaged_chunks(dset: h5py.Dataset, axis: int, rows: range) -> list[tuple[int, int]]:
        """Row spans of the chunks that fail to read on their own, among ``rows``."""
        first, last = rows.start, rows[-1]
        chunk = dset.chunks[axis] if dset.chunks else 1
        bad = []
        start = first // chunk * chunk
        while start <= last:
            stop = min(start + chunk, dset.shape[axis])
            try:
                dset[_axis_selection(axis, start, stop)]
            except OSError:
                bad.append((start, stop))
            start = stop
        return bad

    # ------------------------------------------------------------------ files

    def _open(self, pos: int) -> Handle:
        """Open session ``pos``'s file and check it against its record (the cache's opener)."""
        sid, path = self.ids[pos], self.paths[pos]
        try:
            f = h5py.File(path, "r", **self.open_kwargs[pos])
        except MemoryError:
            raise
        except Exception as exc:
            hint, os_error = open_failure(path, locking=self.locking)
            if isinstance(os_error, FileNotFoundError):
                raise FileNotFoundError(
                    os_error.errno,
                    f"session {sid!r}: file {path} no longer exists (opened in process "
                    f"{os.getpid()})",
                ) from exc
            error = HDF5FileError(
                *((os_error.errno,) if os_error is not None and os_error.errno else ()),
                f"session {sid!r}: cannot open {path} in process {os.getpid()}: "
                f"{hint or 'HDF5 refused it'} (HDF5: {exc}).",
            )
            raise error from (os_error or exc)
        try:
            return self._handle(f, pos)
        except BaseException:
            try:
                f.close()
            except Exception:
                logger.debug("closing %s after a failed open failed", path, exc_info=True)
            raise

    def _handle(self, f: h5py.File, pos: int) -> Handle:
        fd = f.id.get_vfd_handle() if f.driver == "sec2" else None
        fd = fd if isinstance(fd, int) and fd >= 0 else None
        identity = identity_of(fd if fd is not None else self.paths[pos])
        objects = [f.get(spec.path) for spec in self.specs]  # each looked up once per open
        self._check_record(objects, pos, identity)
        datasets: list[Any] = []
        raws: list[tuple[int, int] | None] = []
        mapped: list[tuple[Any, np.ndarray] | None] = []
        for k, (spec, obj) in enumerate(zip(self.specs, objects, strict=True)):
            if spec.members:
                datasets.append(obj)
                raws.append(None)
                mapped.append(None)
                continue
            raw = None
            if self.fast and spec.axis == 0 and self.types[k].raw_ok and fd is not None:
                raw = raw_location(f, obj)
            datasets.append(obj)
            raws.append(raw)
            mapped.append(
                map_rows(raw, obj.shape, obj.dtype) if raw is not None and self.memory_map else None
            )
        handle = Handle(f, datasets, raws, mapped, fd=fd, identity=identity)
        handle.position = pos
        handle.watch = any(  # HDF5 reads chunks past a new end of file as zeros
            raw is None and (spec.members or layout.chunk_rows is not None)
            for spec, layout, raw in zip(self.specs, self.records[pos].layouts, raws, strict=True)
        )
        return handle

    def _check_record(self, objects: Sequence[Any], pos: int, identity: Identity) -> None:
        """Raise ``HDF5FileError`` when the file is not what the index was built from.

        Args:
            objects: Per key, what the file holds at the key's path now (``None``: nothing).
            pos: The session position.
            identity: The file's identity now.
        """
        record = self.records[pos]
        if record.identity is None:
            return
        changed = [] if self.swmr else changes(record.identity, identity)
        found = []
        for spec, layout, members, obj in zip(
            self.specs, record.layouts, record.members, objects, strict=True
        ):
            if obj is None:
                found.append(f"{spec.path!r} is missing")
                continue
            if spec.members:
                now = tuple(obj.keys()) if isinstance(obj, h5py.Group) else ()
                if now != members:
                    found.append(
                        f"{spec.path!r} holds {len(now)} datasets, was {len(members or ())}"
                    )
                continue
            if not isinstance(obj, h5py.Dataset) or obj.ndim <= spec.axis:
                found.append(f"{spec.path!r} is no longer a dataset of {spec.axis + 1}+ axes")
                continue
            gone = missing_sources(obj, self.paths[pos])
            if gone:
                found.append(f"source files {gone} of the virtual dataset {spec.path!r} are gone")
            shape = obj.shape
            rows = int(shape[spec.axis])
            row_shape = tuple(int(n) for k, n in enumerate(shape) if k != spec.axis)
            if rows < layout.rows or (rows != layout.rows and not self.swmr):
                found.append(f"rows of {spec.path!r} {layout.rows} -> {rows}")
            if row_shape != layout.row_shape:
                found.append(f"row shape of {spec.path!r} {layout.row_shape} -> {row_shape}")
            try:
                dtype = obj.dtype
            except (TypeError, ValueError):
                dtype = np.dtype(object)
            if dtype != layout.dtype:
                found.append(f"dtype of {spec.path!r} {layout.dtype} -> {dtype}")
        if found or changed:
            raise HDF5FileError(
                f"session {self.ids[pos]!r}: {self.paths[pos]} changed after the dataset was "
                f"built ({'; '.join(found + changed)}), so its index no longer matches the file. "
                "Create the dataset again after rewriting files (never rewrite session files "
                "while a dataset over them is in use)."
            )

    def handle(self, pos: int, row: int, index: int) -> Handle:
        """The open handle of session ``pos`` (caller holds the lock); errors get the context."""
        try:
            return self.cache.get(self.canonical[pos])
        except Exception as exc:
            self.note(exc, pos, row, index)
            raise

    def verify(self, handle: Handle, pos: int, what: str, index: int) -> None:
        """Raise ``HDF5FileError`` if the open file changed since it was opened (one ``fstat``).

        A chunked file truncated while open reads back zero rows without an error from HDF5,
        and a memory-mapped one ends the process with ``SIGBUS``: both show in the file's
        size (and a rewrite in its modification time). Contiguous rows read with ``preadv`` or
        HDF5 need no check: a read past the end of the file is an error of its own.
        """
        handle.dirty = False
        ident = handle.identity
        if ident is None or self.swmr:
            return
        try:
            st = os.fstat(handle.fd) if handle.fd is not None else os.stat(self.paths[pos])
        except OSError as exc:
            now_text = f"it cannot be examined any more ({exc})"
        else:
            if st.st_size == ident.size and st.st_mtime_ns == ident.mtime_ns:
                return
            now = Identity(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            now_text = ", ".join(changes(ident, now))
        self.cache.discard(self.canonical[pos])
        error = HDF5FileError(
            f"session {self.ids[pos]!r}: {self.paths[pos]} changed while it was being read "
            f"({now_text}); {what} for dataset index {index} may hold other data or zeros and "
            "was not returned. Never rewrite or truncate session files while a dataset over "
            "them is in use; create the dataset again afterwards."
        )
        if index >= 0:
            self.note(error, pos, -1, index)
        raise error

    def _evicted(self, handle: Handle) -> None:
        """Check a handle read in this batch before the cache closes it (``on_evict``)."""
        if handle.dirty:
            pos = handle.position
            self.verify(handle, pos, "rows", -1)

    # ------------------------------------------------------------------ rows spanning chunks

    def _chunk_map(self, handle: Handle, k: int) -> ChunkMap | None:
        """The raw chunk map of key ``k`` in an open file (built once per open), or ``None``."""
        maps = handle.chunk_maps
        if maps is None:
            maps = handle.chunk_maps = [False] * len(self.specs)
        found = maps[k]
        if found is False:
            found = maps[k] = None
            if preadv_possible(self.open_kwargs[handle.position]) and handle.fd is not None:
                found = maps[k] = chunk_map(handle.file, handle.datasets[k])
        return found if isinstance(found, ChunkMap) else None

    def _wide_rows(self, handle: Handle, k: int, rows: np.ndarray, out: np.ndarray) -> int:
        """Rows (sorted) of key ``k`` from an open file into ``out``, every chunk read once."""
        cmap = self._chunk_map(handle, k)
        if cmap is not None:
            return read_rows_raw(cmap, rows, out)
        return read_rows_hdf5(handle.datasets[k], rows, out)

    def _held(self, pos: int, index: int) -> HeldSession | None:
        """Session ``pos`` held in memory, read whole now if it fits ``max_session_bytes``.

        A held session is served only while its file is unchanged (one ``os.stat``).
        """
        held = self.held.get(pos)
        if held is not None:
            if self.swmr:
                return held
            try:
                st = os.stat(self.paths[pos])
                same = st.st_size == held.size and st.st_mtime_ns == held.mtime_ns
                now_text = (
                    f"size {held.size} -> {st.st_size} bytes"
                    if st.st_size != held.size
                    else "same size, modified since"
                )
            except OSError as exc:
                same, now_text = False, f"it cannot be examined any more ({exc})"
            if same:
                return held
            self.held.discard(pos)
            self.cache.discard(self.canonical[pos])
            error = HDF5FileError(
                f"session {self.ids[pos]!r}: {self.paths[pos]} changed after its rows were read "
                f"into memory ({now_text}); rows for dataset index {index} were not returned. "
                "Never rewrite session files while a dataset over them is in use; create the "
                "dataset again afterwards."
            )
            if index >= 0:
                self.note(error, pos, -1, index)
            raise error
        nbytes = self.session_nbytes[pos]
        if not self.held.fits(nbytes):
            return None
        handle = self.handle(pos, 0, index)
        self.held.make_room(nbytes)
        arrays: list[np.ndarray | None] = []
        rows = self.records[pos].layouts
        for k, wide in enumerate(self.wide[pos]):
            if not wide:
                arrays.append(None)
                continue
            rt = self.types[k]
            out = self.held.buffer((rows[k].rows, *rt.row_shape), rt.mem_dtype)
            try:
                self._wide_rows(handle, k, np.arange(rows[k].rows), out)
            except MemoryError:
                raise
            except Exception as exc:
                raise self.read_error(exc, pos, range(rows[k].rows), index, k) from exc
            arrays.append(out)
        self.verify(handle, pos, "rows", index)  # what was read is the file as it is
        ident = handle.identity
        held = HeldSession(
            arrays,
            size=ident.size if ident is not None else -1,
            mtime_ns=ident.mtime_ns if ident is not None else -1,
        )
        if ident is not None:
            self.held.put(pos, held)
        return held

    def _read_wide(self, k: int, pos: int, rows: np.ndarray, out: np.ndarray, index: int) -> None:
        """Rows (sorted) of key ``k`` in session ``pos`` into ``out``: held, or one pass.

        The caller holds the lock.
        """
        held = self._held(pos, index)
        if held is not None:
            source = held.arrays[k]
            assert source is not None
            np.take(source, rows, axis=0, out=out, mode="clip")  # rows checked at open
            return
        handle = self.handle(pos, int(rows[0]), index)
        try:
            self._wide_rows(handle, k, rows, out)
        except MemoryError:
            raise
        except Exception as exc:
            span = range(int(rows[0]), int(rows[-1]) + 1)
            raise self.read_error(exc, pos, span, index, k) from exc
        self.verify(handle, pos, "rows", index)

    def _fill_wide(self, k: int, idx: np.ndarray, keys: np.ndarray, out: np.ndarray) -> None:
        """``_fill`` for a key whose rows span many chunks in some session.

        The batch is sorted by (session, row); each wide session's rows are read in one pass
        over its chunks (or served from memory), other sessions' runs as usual.
        """
        n = keys.shape[0]
        order = np.argsort(keys, kind="stable")
        ordered = bool(np.all(order == np.arange(n)))
        buf = out if ordered else np.empty_like(out)
        skeys = keys if ordered else keys[order]
        positions = skeys >> _ROW_BITS
        cuts = np.flatnonzero(np.diff(positions)) + 1
        bounds = [0, *cuts.tolist(), n]
        segments = list(itertools.pairwise(bounds))
        # sessions already held first: they are this batch's, and must not make room for
        # the sessions it reads anew (least recently used go first)
        segments.sort(key=lambda seg: self.held.get(int(positions[seg[0]]), touch=False) is None)
        for s, e in segments:
            pos = int(positions[s])
            rows = skeys[s:e] & _ROW_MASK
            index = int(idx[order[s]])
            if self.wide[pos][k]:
                self._read_wide(k, pos, rows, buf[s:e], index)
                continue
            handle = self.handle(pos, int(rows[0]), index)
            brk = np.flatnonzero(np.diff(rows) != 1) + 1
            starts = [0, *brk.tolist(), e - s]
            for a, b in itertools.pairwise(starts):
                first = int(rows[a])
                try:
                    self._fill_run(handle, k, pos, first, b - a, buf[s + a : s + b], index)
                except MemoryError:
                    raise
                except Exception as exc:
                    raise self.read_error(exc, pos, range(first, first + b - a), index, k) from exc
            if handle.watch:
                self.verify(handle, pos, "rows", index)
        if not ordered:
            out[order] = buf

    # ------------------------------------------------------------------ one sample

    def read_one(self, index: int, pos: int, row: int) -> Any:
        """Sample ``index`` (session ``pos``, ``row``) as the default ``read`` returns it.

        The caller holds the lock.

        Raises:
            ConfigError: The rows have no torch type (``type_error``), raised at this call.
        """
        if self.type_error is not None:
            raise ConfigError(str(self.type_error))
        try:
            handle = self.cache.get(self.canonical[pos])
        except Exception as exc:
            self.note(exc, pos, row, index)
            raise
        try:
            if self.single:
                value = self._one(handle, 0, pos, row, index)
            else:
                value = {
                    spec.name: self._one(handle, k, pos, row, index)
                    for k, spec in enumerate(self.specs)
                }
            if handle.watch:
                self.verify(handle, pos, f"row {row}", index)
        except MemoryError:
            raise
        except Exception as exc:
            raise self.read_error(exc, pos, range(row, row + 1), index) from exc
        return value

    def _one(self, handle: Handle, k: int, pos: int, row: int, index: int) -> Any:
        rt = self.types[k]
        if self._some_wide and self.wide[pos][k]:  # a row touches every chunk: held, or a pass
            sample = np.empty((1, *rt.row_shape), rt.mem_dtype)
            self._read_wide(k, pos, np.array([row], np.int64), sample, index)
            return sample[0] if rt.row_shape else sample[0][()]
        raw, mapped = handle.raws[k], handle.maps[k]
        if raw is not None:
            sample = np.empty(rt.row_shape, rt.read_dtype)
            if mapped is not None:
                self.verify(handle, pos, f"row {row}", index)  # never fault on a truncated map
                sample[...] = mapped[row]  # a copy, never a view of the map
            else:
                pread(raw, row * self.row_bytes[k], sample, self.row_bytes[k])
            if rt.kind is Kind.STRUCT:
                return rt.sample(sample[()] if not rt.row_shape else sample)
            if rt.swap:
                sample = sample.astype(rt.mem_dtype)
            return sample if rt.row_shape else sample[()]
        spec = self.specs[k]
        if spec.members:
            return rt.sample(self._member(handle, k, pos, row))
        dset = handle.datasets[k]
        if rt.kind is Kind.NUMBER:
            value = dset[_axis_selection(spec.axis, row, None)] if spec.axis else dset[row]
            if isinstance(value, np.ndarray):
                return value.astype(rt.mem_dtype, copy=False)
            return np.asarray(value).astype(rt.mem_dtype)[()]
        if rt.kind is Kind.STRUCT:
            slab = _read_slab(dset, spec.axis, row, 1, rt.read_dtype)
            return rt.sample(np.moveaxis(slab, spec.axis, 0)[0])
        value = dset[_axis_selection(spec.axis, row, None)] if spec.axis else dset[row]
        return rt.sample(value)

    def _member(self, handle: Handle, k: int, pos: int, row: int) -> Any:
        """The whole dataset that is sample ``row`` of a group key, read into its mem dtype."""
        names = self.records[pos].members[k]
        assert names is not None
        name = names[row]
        dset = handle.members.get((k, name))
        if dset is None:
            dset = dataset_at(handle.datasets[k], name, self.ids[pos], self.paths[pos])
            handle.members[(k, name)] = dset
        rt = self.types[k]
        if rt.kind in (Kind.NUMBER, Kind.STRUCT):
            out = np.empty(dset.shape, rt.read_dtype)
            if out.size:
                dset.read_direct(out)
            return out if out.ndim or rt.kind is Kind.STRUCT else out[()]
        return dset[()]

    # ------------------------------------------------------------------ batches

    def read_batch(self, idx: np.ndarray, keys: np.ndarray) -> RowBatch:
        """Read the samples of ``keys`` (dataset indices ``idx``), every key into one buffer.

        Returns:
            A ``RowBatch``: the samples in request order, and the collated batch.
        """
        n = idx.size
        with self.cache.lock:
            order, starts = plan_runs(keys, sort=self.chunked, always=self.contiguous)
            if starts is None:
                starts = np.arange(n)
            if self.single:
                samples, collated = self._read_key(0, idx, keys, order, starts)
                # numbers: the row views now; dicts: built only when something asks for them
                rows = samples() if self.types[0].kind is Kind.NUMBER else samples
                return RowBatch(collated, rows, ragged=self._ragged_names[0])
            parts = [self._read_key(k, idx, keys, order, starts) for k in range(len(self.specs))]
        names = [spec.name for spec in self.specs]
        batch = {name: part[1] for name, part in zip(names, parts, strict=True)}
        ragged = next((self._ragged_names[k] for k, p in enumerate(parts) if p[1] is None), None)
        rows = functools.partial(_dicts, names, [part[0] for part in parts])
        return RowBatch(None if ragged else batch, rows, ragged=ragged)

    def _scratch(self, n: int, rt: RowType) -> np.ndarray:
        """A reused buffer of ``n`` rows as stored (``read_dtype``); never handed out.

        Rows that need converting (another byte order, records split into fields) are read
        here and copied out, so the batch costs no fresh allocation and page faults twice.
        """
        view = self._scratches.get((n, rt.read_dtype, rt.row_shape))
        if view is not None:
            return view
        shape = (n, *rt.row_shape)
        nbytes = math.prod(shape) * rt.read_dtype.itemsize
        if self._spare is None or self._spare.nbytes < nbytes:
            self._spare = np.empty(max(nbytes, 1 << 16), np.uint8)
            self._scratches.clear()  # views of the buffer replaced
        if len(self._scratches) >= 16:  # batches of many sizes: keep the views bounded
            self._scratches.clear()
        view = self._spare[:nbytes].view(rt.read_dtype).reshape(shape)
        self._scratches[n, rt.read_dtype, rt.row_shape] = view
        return view

    def _ragged(self, k: int) -> str | None:
        inner = "" if k in self.uneven else self.types[k].ragged_field()
        if inner is None:
            return None
        name = self.specs[k].name
        where = f"{name!r}" + (f" (field {inner!r})" if inner else "")
        return f"{where} in {self.label}"

    def _read_key(
        self,
        k: int,
        idx: np.ndarray,
        keys: np.ndarray,
        order: np.ndarray | None,
        starts: np.ndarray,
    ) -> tuple[Samples, Any]:
        rt = self.types[k]
        n = idx.size
        if rt.kind is Kind.NUMBER and not self.specs[k].members:
            tensor, out = batch_buffer(n, rt.row_shape, rt.mem_dtype)
            stored = self._scratch(n, rt) if rt.swap else out
            if not (self.memory_map and self.contiguous and self._mapped(k, idx, keys, stored)):
                self._fill(k, idx, keys, order, starts, stored)
            if stored is not out:
                np.copyto(out, stored)  # to native byte order while copying
            return functools.partial(list, out), tensor
        if k in self.uneven:
            out = np.empty(n, object)
        elif rt.record is not None:  # split into fresh per-field batches: the records are scratch
            out = self._scratch(n, rt)
        else:
            out = np.empty((n, *rt.row_shape), rt.read_dtype)
        self._fill(k, idx, keys, order, starts, out)
        if k in self.uneven:  # per-sample datasets of differing shapes: never stacked
            return functools.partial(list, [rt.sample(v) for v in out]), None
        return rt.batch(out, batch_buffer)

    def _mapped(self, k: int, idx: np.ndarray, keys: np.ndarray, out: np.ndarray) -> bool:
        """Gather a batch from memory maps with one ``np.take`` per session segment.

        A segment is a stretch of the batch (request order) whose rows come from one session:
        block-shuffled batches have a few, so the batch is copied at memory speed with a
        handful of C calls. Returns ``False`` (nothing read) for batches of many segments
        (uniform shuffling: ``_fill`` copies run by run) or a session that is not mapped.
        The file is checked (``verify``) before every copy: a truncated file is an error,
        not ``SIGBUS``. Caller holds the lock.
        """
        n = keys.shape[0]
        pos = keys >> _ROW_BITS
        cuts = np.flatnonzero(pos[1:] != pos[:-1]) + 1
        if (cuts.size + 1) * 4 > n:
            return False
        rows = keys & _ROW_MASK
        starts = np.concatenate(([0], cuts))
        bounds = [*starts.tolist(), n]
        checked: set[int] = set()
        for s, p in enumerate(pos[starts].tolist()):
            k0, k1 = bounds[s], bounds[s + 1]
            handle = self.handle(p, int(rows[k0]), int(idx[k0]))
            mapped = handle.maps[k]
            if mapped is None:
                return False  # not mapped (any more): _fill reads the whole batch again
            if p not in checked:  # never fault on a truncated map: once per file and batch
                self.verify(handle, p, "rows", int(idx[k0]))
                checked.add(p)
            segment = out[k0:k1]
            # rows were checked against the file when it was opened (its record); mode="clip"
            # because numpy buffers ``out`` for mode="raise"
            np.take(mapped, rows[k0:k1], axis=0, out=segment, mode="clip")
        return True

    def _fill(
        self,
        k: int,
        idx: np.ndarray,
        keys: np.ndarray,
        order: np.ndarray | None,
        starts: np.ndarray,
        out: np.ndarray,
    ) -> None:
        """Read the runs of ``keys`` for key ``k`` into ``out`` (request order)."""
        if self.any_wide[k]:
            self._fill_wide(k, idx, keys, out)
            return
        n = idx.size
        buf = out if order is None else np.empty_like(out)
        # os.preadv takes the rows as bytes: exporting a record dtype's buffer is slow
        plain = buf.dtype.names is None or buf.dtype.hasobject  # objects: never read raw
        rows = buf if plain else buf.view(np.uint8).reshape(n, -1)
        run_keys = (keys[starts] if order is None else keys[order[starts]]).tolist()
        bounds = starts.tolist()
        bounds.append(n)

        def index_at(slot: int) -> int:  # the dataset index read into ``buf[slot]``
            return int(idx[slot] if order is None else idx[order[slot]])

        watched: list[tuple[int, Handle]] = []
        mapped_checked: set[int] = set()
        get, canonical = self.cache.get, self.canonical
        last = -1
        handle: Handle | None = None
        raw: tuple[int, int] | None = None
        row_bytes = self.row_bytes[k]
        for r, key in enumerate(run_keys):
            pos, a = key >> _ROW_BITS, key & _ROW_MASK
            k0, k1 = bounds[r], bounds[r + 1]
            if pos != last:
                try:
                    handle = get(canonical[pos])
                except Exception as exc:
                    self.note(exc, pos, a, index_at(k0))
                    raise
                if handle.maps[k] is None:
                    raw = handle.raws[k]
                else:
                    raw = None
                    if pos not in mapped_checked:  # never fault on a truncated map
                        self.verify(handle, pos, "rows", index_at(k0))
                        mapped_checked.add(pos)
                if handle.watch and not handle.dirty:
                    handle.dirty = True
                    watched.append((pos, handle))
                last = pos
            assert handle is not None
            length = k1 - k0
            try:
                if raw is not None:  # contiguous rows: one preadv, no HDF5 call
                    pread(raw, a * row_bytes, rows[k0:k1], length * row_bytes)
                else:
                    self._fill_run(handle, k, pos, a, length, buf[k0:k1], index_at(k0))
            except MemoryError:
                raise
            except Exception as exc:
                raise self.read_error(exc, pos, range(a, a + length), index_at(k0), k) from exc
        for pos, touched in watched:  # the rows read are real rows, not zeros past a new end
            if touched.dirty:
                self.verify(touched, pos, "rows", index_at(0))
        if order is not None:
            out[order] = buf

    def _fill_run(
        self,
        handle: Handle,
        k: int,
        pos: int,
        a: int,
        length: int,
        target: np.ndarray,
        index: int,
    ) -> None:
        rt, spec = self.types[k], self.specs[k]
        if spec.members:
            for j in range(length):
                target[j] = self._member(handle, k, pos, a + j)
            return
        mapped, raw = handle.maps[k], handle.raws[k]
        if mapped is not None:  # checked by _fill before the first copy from this file
            target[:] = mapped[a : a + length]  # converts byte order while copying
            return
        if raw is not None:
            pread(raw, a * self.row_bytes[k], target, length * self.row_bytes[k])
            return
        dset = handle.datasets[k]
        if spec.axis:
            slab = _read_slab(dset, spec.axis, a, length, target.dtype)
            target[:] = np.moveaxis(slab, spec.axis, 0)
        elif rt.kind is Kind.STRUCT or (
            rt.kind is Kind.NUMBER and length * self.row_bytes[k] >= _DIRECT_READ_BYTES
        ):
            read_direct(dset, a, length, target)  # HDF5 converts into the native buffer
        elif length == 1:
            target[0] = dset[a]
        else:
            target[:] = dset[a : a + length]
