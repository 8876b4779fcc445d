"""``SessionFiles``: a session reader's files, what they hold and the checks on them.

The part a ``loaderkit.hdf5.read.reader.SessionReader`` holds as ``files`` (the functions of
``loaderkit.hdf5.read.widekeys`` read over it too): what the files hold (keys, types,
records), the per-process file pool and how a file is (re)opened and compared with its
``SessionRecord``, the sessions held in memory, the error context every read failure gets,
and the read of one run of rows from an open file.

Never silently wrong: a file is compared with its ``SessionRecord`` when it is (re)opened, and
with its identity at open (one ``fstat``) after every read and before every copy out of a
memory map, so a file rewritten, shrunk or truncated under the dataset is an
``HDF5FileError`` naming what changed, never another dataset's bytes or zero rows.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Hashable, Sequence
from typing import Any

import h5py
import numpy as np

from loaderkit.errors import HDF5FileError, add_note
from loaderkit.hdf5.meta.diagnose import (
    Identity,
    changes,
    hdf5_message,
    identity_of,
    metadata_errors,
    missing_sources,
    open_diagnosis,
    repair_advice,
)
from loaderkit.hdf5.meta.filters import fletcher_damage
from loaderkit.hdf5.meta.keyspecs import KeySpec, SessionRecord, read_slab
from loaderkit.hdf5.meta.layout import SessionLayout, dataset_at, open_object
from loaderkit.hdf5.meta.types import Kind, RowType
from loaderkit.hdf5.read.chunkio import ChunkReader, ReadPath, choose_path
from loaderkit.hdf5.read.copies import SessionCopies
from loaderkit.hdf5.read.handles import FilePool, Handle
from loaderkit.hdf5.read.heldsessions import HeldSessions
from loaderkit.hdf5.read.rawio import (
    map_rows,
    pread,
    preadv_possible,
    raw_location,
    read_direct,
)

__all__ = ["SessionFiles", "where_sessions"]


logger = logging.getLogger(__name__)

#: Slabs at least this large are read straight into the batch buffer (``H5Dread`` into the
#: destination); smaller ones go through h5py's Cython fast path and one copy, which has less
#: per-call overhead. Measured with ``benchmarks/hdf5_read.py`` (see docs/hdf5.md).
_DIRECT_READ_BYTES = 256 * 1024


def where_sessions(ids: Sequence[Hashable], paths: Sequence[str]) -> list[str]:
    """Per session, how a message names it (``gene_map``'s ``where``): id and path.

    Example:
        >>> where_sessions(["s1", 2], ["a.h5ad", "b.h5ad"])
        ["session 's1' (a.h5ad)", 'session 2 (b.h5ad)']
    """
    return [f"session {sid!r} ({path})" for sid, path in zip(ids, paths, strict=True)]


class SessionFiles:
    """A session reader's files: keys, types, records, handles, checks and error context.

    Args:
        ids: Session ids, in position order.
        paths: Their file paths.
        canonical: Per position, the position whose handle it uses (the same file listed
            twice shares one handle).
        specs: The keys read (empty: the dataset's subclass reads on its own).
        types: Per key, the ``RowType`` (empty where the rows cannot be typed: the reader's
            ``type_error``).
        records: Per position, the ``SessionRecord``.
        open_kwargs: Per position, the ``h5py.File`` keyword arguments.
        max_open: Most files open at once in each process.
        memory_map: Read contiguous numbers out of memory maps.
        fast: Default reads are used (raw access allowed, types known).
        label: What to call the dataset in messages (its class name).
        uneven: Group keys whose per-sample datasets differ in shape (never stacked).
        max_session_bytes: Most bytes of whole sessions held in memory in each process
            (keys whose rows span many chunks; 0: none).

    Example:
        >>> SessionFiles.verify.__name__
        'verify'
    """

    #: The sessions read through a ``SessionCache`` (``None``: every file read in place).
    sources: SessionCopies | None = None

    def __init__(
        self,
        *,
        ids: Sequence[Hashable],
        paths: Sequence[str],
        canonical: Sequence[int],
        specs: Sequence[KeySpec],
        types: Sequence[RowType],
        records: Sequence[SessionRecord],
        open_kwargs: Sequence[dict[str, Any]],
        max_open: int,
        memory_map: bool,
        fast: bool,
        label: str,
        uneven: Sequence[int] = (),
        max_session_bytes: int = 0,
    ) -> None:
        self.ids = list(ids)
        self._position = {sid: i for i, sid in enumerate(self.ids)}
        self.paths = list(paths)
        self.canonical = list(canonical)
        self.specs = tuple(specs)
        self.types = tuple(types)
        self.records = list(records)
        self.open_kwargs = list(open_kwargs)
        self.memory_map = memory_map
        self.fast = fast
        self.label = label
        self.uneven = frozenset(uneven)
        self.swmr = any(bool(kw.get("swmr")) for kw in self.open_kwargs)
        self.locking = all(kw.get("locking", True) is not False for kw in self.open_kwargs)
        layouts = [lay for rec in self.records for lay in rec.layouts[:1]]
        self.chunked = any(lay.chunk_rows is not None for lay in layouts)
        #: The keys as the dataset was given them, for messages.
        self.key_names = [spec.name for spec in self.specs]
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
        self.file_pool = FilePool(
            self._open, max_open, self.paths.__getitem__, on_evict=self._evicted
        )
        #: Per key, how a message names its rows when they are ragged (``None``: not ragged).
        self.ragged_names = [self._ragged(k) for k in range(len(self.types))]
        #: Per session, per key: its rows span many chunks and are read apart (``widerows``).
        self.wide = [
            tuple(
                self._reads_wide(k, layout)
                for k, layout in enumerate(rec.layouts[: len(self.types)])
            )
            for rec in self.records
        ]
        self.any_wide: list[bool] = []
        self.some_wide = False  # one attribute test on the per-item path
        #: Per session: bytes of its wide keys' rows, as held in memory.
        self.session_nbytes: list[int] = []
        self._count_wide()
        self.held = HeldSessions(max_session_bytes)

    def _count_wide(self) -> None:
        """``any_wide``, ``some_wide`` and ``session_nbytes`` from ``wide``."""
        self.any_wide = [any(w[k] for w in self.wide) for k in range(len(self.types))]
        self.some_wide = any(self.any_wide)
        self.session_nbytes = [
            sum(rec.layouts[k].rows * self.row_bytes[k] for k, wide in enumerate(w) if wide)
            for rec, w in zip(self.records, self.wide, strict=True)
        ]

    def keep_in_runs(self, k: int) -> None:
        """Read key ``k`` in runs like any key, never apart nor held whole (``widekeys``).

        For a reader that reads key ``k`` its own way, file by file (``densejoin``).
        """
        self.wide = [(*w[:k], False, *w[k + 1 :]) for w in self.wide]
        self._count_wide()

    def where(self) -> list[str]:
        """Per session, how a message names it: ``session 's1' (path)`` (``where_sessions``)."""
        return where_sessions(self.ids, self.paths)

    def named(self, pos: int) -> str:
        """How a message names session ``pos``: ``session 's1' (path)``."""
        return where_sessions(self.ids[pos : pos + 1], self.paths[pos : pos + 1])[0]

    def close(self) -> None:
        """Close this process's open files and drop the sessions held in memory."""
        self.file_pool.close()
        self.held.clear()

    def position(self, session: Hashable) -> int:
        """The position of session id ``session`` (its place in ``ids``).

        Raises:
            KeyError: An unknown session (the message lists the first ids).
        """
        try:
            return self._position[session]
        except (KeyError, TypeError):
            raise KeyError(
                f"unknown session {session!r}; sessions: {self.ids[:20]}"
                + (" ..." if len(self.ids) > 20 else "")
            ) from None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["file_pool"] = self.file_pool.max_open  # handles never travel: only the bound
        state["held"] = self.held.max_bytes  # nor held rows
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.file_pool = FilePool(
            self._open, int(state["file_pool"]), self.paths.__getitem__, on_evict=self._evicted
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

    def read_paths(self, handle: Handle) -> dict[str, ReadPath]:
        """Per key name, how its rows are read from ``handle``'s file (``ReadPath``)."""
        return {spec.name: path for spec, path in zip(self.specs, handle.paths, strict=False)}

    def _ragged(self, k: int) -> str | None:
        inner = "" if k in self.uneven else self.types[k].ragged_field()
        if inner is None:
            return None
        name = self.specs[k].name
        where = f"{name!r}" + (f" (field {inner!r})" if inner else "")
        return f"{where} in {self.label}"

    def context(self, pos: int, row: int, index: int) -> str:
        """The note added to errors: dataset index, session, row, file, key and process."""
        keys = self.key_names[0] if len(self.key_names) == 1 else self.key_names
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
        chunks fail on their own (damaged bytes). Otherwise HDF5's own message stands, with
        what to do about a damaged file (HDF5 opened the file and the dataset, so the damage
        is in the rows' chunks or in the index that finds them: other rows may read).

        Args:
            exc: What the read raised.
            pos: The session position.
            rows: The rows that were being read.
            index: The dataset index of the first of them (for the message).
            key: Which key was being read.
        """
        if isinstance(exc, HDF5FileError):
            self.file_pool.discard(self.canonical[pos])
            return exc
        try:
            cause, changed = self._read_cause(pos, key, rows)
        except Exception:  # a check that fails on a damaged file explains nothing
            logger.debug("checking why a read failed failed", exc_info=True)
            cause, changed = "", False
        what = f"row {rows.start}" if len(rows) == 1 else f"rows {rows.start}..{rows[-1]}"
        self.file_pool.discard(self.canonical[pos])
        name = self.specs[key].name if self.specs else None
        path = self.paths[pos]
        advice = (
            ""
            if changed
            else " If the file did not change, the bytes holding these rows (or the index "
            f"that finds them) are damaged; other rows may still read. {repair_advice(path)}."
        )
        return HDF5FileError(
            f"reading {what} of {name!r} from session {self.ids[pos]!r} ({path}) "
            f"for dataset index {index} failed in process {os.getpid()}: "
            f"{cause or hdf5_message(exc)}"
            f"{' (HDF5: ' + hdf5_message(exc) + ')' if cause else ''}. The handle was closed."
            f"{advice}"
        )

    def _read_cause(self, pos: int, key: int, rows: range) -> tuple[str, bool]:
        """Why a read failed, as far as checks establish it, and whether the file changed."""
        entry = self.file_pool.peek(self.canonical[pos])
        if entry is not None and entry.identity is not None:
            try:
                now = identity_of(self.paths[pos] if entry.lease is None else entry.file.filename)
            except OSError as exc:
                return f"the file is gone or unreadable now ({exc})", True
            changed = changes(entry.identity, now)
            if changed:
                return f"the file changed while it was open: {', '.join(changed)}", True
        if entry is None or key >= len(entry.datasets):
            return "", False
        return fletcher_damage(entry.datasets[key], self.specs[key].axis, rows), False

    def _open(self, pos: int) -> Handle:
        """Open session ``pos``'s file and check it against its record (the file pool's opener).

        A session read through a ``SessionCache`` (``sources``) is leased first: h5py opens
        the local copy, and the handle holds the lease until it is closed.
        """
        sources = self.sources
        if sources is None or not sources.cached(pos):
            return self._open_path(pos, self.paths[pos])
        lease = sources.lease(pos)
        try:
            try:
                handle = self._open_path(pos, str(lease.path))
            except FileNotFoundError:  # discarded as damaged by another process meanwhile
                lease.close()
                lease = sources.lease(pos)
                handle = self._open_path(pos, str(lease.path))
            except HDF5FileError as exc:
                fresh = sources.repair(pos, lease, exc)  # a damaged copy: fetched again
                if fresh is lease:
                    raise self._object_fails(pos, exc) from exc
                lease = fresh
                try:
                    handle = self._open_path(pos, str(lease.path))
                except HDF5FileError as again:
                    raise self._object_fails(pos, again) from again
        except BaseException:
            lease.close()
            raise
        handle.lease = lease
        return handle

    def _object_fails(self, pos: int, exc: HDF5FileError) -> HDF5FileError:
        """The cache's copy holds the store's own bytes and fails: the object is at fault."""
        url = self.sources.infos[pos].url if self.sources is not None else self.paths[pos]
        return HDF5FileError(
            *((exc.errno,) if exc.errno else ()),
            f"{exc} The cache's copy holds exactly the bytes of {url} (checked against its "
            "record): the object itself cannot be opened. Check it in the store",
        )

    def _open_path(self, pos: int, path: str) -> Handle:
        """Open ``path`` as session ``pos``'s file (its own, or the cache's copy)."""
        sid = self.ids[pos]
        try:
            f = h5py.File(path, "r", **self.open_kwargs[pos])
        except MemoryError:
            raise
        except Exception as exc:
            hint, os_error, advice = open_diagnosis(path, locking=self.locking)
            if isinstance(os_error, FileNotFoundError):
                raise FileNotFoundError(
                    os_error.errno,
                    f"session {sid!r}: file {path} no longer exists (opened in process "
                    f"{os.getpid()})",
                ) from exc
            error = HDF5FileError(
                *((os_error.errno,) if os_error is not None and os_error.errno else ()),
                f"session {sid!r}: cannot open {path} in process {os.getpid()}: "
                f"{hint or 'HDF5 refused it'} (HDF5: {exc}).{' ' + advice if advice else ''}",
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
        keys = ", ".join(repr(spec.path) for spec in self.specs) or "the file"
        with metadata_errors(self.ids[pos], self.paths[pos], keys, process=True):
            # each looked up once per open; a key HDF5 cannot open is damage, not "missing"
            objects = [open_object(f, spec.path) for spec in self.specs]
            self._check_record(objects, pos, identity)
            raws: list[tuple[int, int] | None] = [
                raw_location(f, obj)
                if not spec.members
                and self.fast
                and spec.axis == 0
                and self.types[k].raw_ok
                and fd is not None
                else None
                for k, (spec, obj) in enumerate(zip(self.specs, objects, strict=True))
            ]
        datasets: list[Any] = list(objects)
        mapped: list[tuple[Any, np.ndarray] | None] = [
            map_rows(raw, obj.shape, obj.dtype) if raw is not None and self.memory_map else None
            for raw, obj in zip(raws, objects, strict=True)
        ]
        handle = Handle(f, datasets, raws, mapped, fd=fd, identity=identity)
        handle.position = pos
        for k, obj in enumerate(objects):
            reader, path = self._read_path(f, obj, k, pos, raws[k], mapped[k] is not None)
            handle.chunked[k] = reader
            handle.paths.append(path)
        handle.watch = any(  # HDF5 reads chunks past a new end of file as zeros
            raw is None and (spec.members or layout.chunk_rows is not None)
            for spec, layout, raw in zip(self.specs, self.records[pos].layouts, raws, strict=True)
        )
        return handle

    def _read_path(
        self, f: h5py.File, obj: Any, k: int, pos: int, raw: Any, mapped: bool
    ) -> tuple[ChunkReader | None, ReadPath]:
        """How key ``k`` of session ``pos``'s open file is read, and the chunk reader if any."""
        spec, rt = self.specs[k], self.types[k] if k < len(self.types) else None
        return choose_path(
            f,
            obj,
            raw=raw,
            mapped=mapped,
            members=spec.members,
            hooks=not self.fast or rt is None,
            axis=spec.axis,
            kind=None if rt is None else rt.kind.value,
            swmr=self.swmr,
            options=self.open_kwargs[pos],
            wide=k < len(self.wide[pos]) and self.wide[pos][k],
        )

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
            return self.file_pool.get(self.canonical[pos])
        except Exception as exc:
            self.note(exc, pos, row, index)
            raise

    def leased(self, pos: int, row: int, index: int) -> Handle:
        """Session ``pos``'s handle with a lease (``file_pool.release`` it); errors get the context.

        No lock is held while reading through it: the lease keeps the file open.
        """
        try:
            return self.file_pool.lease(self.canonical[pos])
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
        self.file_pool.discard(self.canonical[pos])
        lost = f"{what} for dataset index {index} may hold other data or zeros and"
        raise self.changed(pos, "while it was being read", now_text, lost, index)

    def done(self, handle: Handle, pos: int, index: int) -> None:
        """Release a handle read through; first check the file when HDF5 read chunks of it.

        The rows read are real rows, not zeros past a new end of the file.
        """
        try:
            if handle.watch:
                self.verify(handle, pos, "rows", index)
        finally:
            self.file_pool.release(handle)

    def changed(self, pos: int, when: str, now_text: str, lost: str, index: int) -> HDF5FileError:
        """The ``HDF5FileError`` to raise: session ``pos``'s file changed ``when``.

        ``now_text`` says how, ``lost`` what "was not returned"; noted with ``index`` if >= 0.
        """
        error = HDF5FileError(
            f"session {self.ids[pos]!r}: {self.paths[pos]} changed {when} ({now_text}); "
            f"{lost} was not returned. Never rewrite or truncate session files while a dataset "
            "over them is in use; create the dataset again afterwards."
        )
        if index >= 0:
            self.note(error, pos, -1, index)
        return error

    def _evicted(self, handle: Handle) -> None:
        """Check a handle read in this batch before the file pool closes it (``on_evict``)."""
        if handle.dirty:
            pos = handle.position
            self.verify(handle, pos, "rows", -1)

    def other_dataset(self, handle: Handle, pos: int, path: str) -> h5py.Dataset:
        """Dataset ``path`` of session ``pos``'s open file, looked up once per handle.

        Raises:
            MissingKeyError: The file has no dataset ``path`` (the message lists those it has).
            HDF5FileError: HDF5 cannot open it (damaged metadata).
        """
        dset = handle.others.get(path)
        if dset is None:
            dset = dataset_at(
                handle.file,
                path,
                self.ids[pos],
                self.paths[pos],
                fix="Pass the path of one of them to h5dataset(session, path).",
            )
            handle.others[path] = dset
        return dset

    def member(self, handle: Handle, k: int, pos: int, row: int) -> Any:
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

    def index_chunks(self, handle: Handle, k: int) -> None:
        """Build key ``k``'s chunk index in ``handle`` (once; one thread, under h5py's lock)."""
        chunked = handle.chunked[k]
        if chunked is not None and chunked.offsets is None:
            with handle.guard:
                chunked.index(handle.datasets[k])

    def fill_run(
        self,
        handle: Handle,
        k: int,
        pos: int,
        a: int,
        length: int,
        target: np.ndarray,
        index: int,
    ) -> None:
        """Read ``length`` rows of key ``k`` from ``a`` on, out of an open file, into ``target``."""
        rt, spec = self.types[k], self.specs[k]
        if spec.members:
            for j in range(length):
                target[j] = self.member(handle, k, pos, a + j)
            return
        mapped, raw = handle.maps[k], handle.raws[k]
        if mapped is not None:  # checked by _fill before the first copy from this file
            target[:] = mapped[a : a + length]  # converts byte order while copying
            return
        if raw is not None:
            pread(raw, a * self.row_bytes[k], target, length * self.row_bytes[k])
            return
        dset = handle.datasets[k]
        chunked = handle.chunked[k]
        if chunked is not None and target.dtype == chunked.dtype and target.flags.c_contiguous:
            self.index_chunks(handle, k)
            chunked.read(a, length, target)  # no lock: os.pread and codecs
            return
        if spec.axis:
            slab = read_slab(dset, spec.axis, a, length, target.dtype)
            target[:] = np.moveaxis(slab, spec.axis, 0)
        elif rt.kind is Kind.STRUCT or (
            rt.kind is Kind.NUMBER and length * self.row_bytes[k] >= _DIRECT_READ_BYTES
        ):
            read_direct(dset, a, length, target)  # HDF5 converts into the native buffer
        elif length == 1:
            target[0] = dset[a]
        else:
            target[:] = dset[a : a + length]
