"""``SessionReader``, rows of keys of session files read as stored; ``Reader``, the contract.

The reader holds its files as a part (``sessionfiles.SessionFiles``: how each key is stored
and typed, what every file held when the index was built, the per-process file pool, the
checks that make a changed file an ``HDF5FileError`` naming what changed, the error context).
``HDF5SessionDataset`` keeps its hooks, accessors and pickling, and hands its default reads here:

* ``read_one`` — one sample (per-item reads);
* ``read_batch`` — a batch grouped into runs of consecutive rows (``runs.plan_runs``),
  every key read into one buffer: a table of reads (``readtable.read_table``) or a memory map
  for contiguous numbers (other byte orders into a reused scratch buffer, converted while
  copied), HDF5 otherwise (which converts byte order, enums and compounds itself), then split
  into samples and the collated batch (``loaderkit.batches.RowBatch``, ``row_batch``), written
  where the loader's ``BatchMemory`` says (``use_memory``: a worker's batch slot).

Keys whose rows span many chunks that other rows share are read apart (``widekeys``). What
the dataset, its budgets and the loader ask of any reader is ``Reader``, a ``Protocol`` with
nothing AnnData in it. The AnnData package's reader holds a ``SessionReader`` for the keys
beside its matrix (``keys=``, the same ``files``) and reads the matrix itself; none subclasses it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from loaderkit.batches.contract import PLAIN, BatchMemory, RowBatch
from loaderkit.errors import ConfigError
from loaderkit.hdf5.meta.index import ROW_BITS, ROW_MASK, decode_index, encode_index
from loaderkit.hdf5.meta.keyspecs import KeySpec, SessionRecord, axis_selection, read_slab
from loaderkit.hdf5.meta.types import Kind, Samples, dict_rows
from loaderkit.hdf5.read.chunkio import ReadPath
from loaderkit.hdf5.read.handles import Handle
from loaderkit.hdf5.read.mappedrows import take_mapped
from loaderkit.hdf5.read.rawio import pread
from loaderkit.hdf5.read.readtable import RING_MIN_READS, ShortRead, Table, read_table
from loaderkit.hdf5.read.runs import plan_runs
from loaderkit.hdf5.read.scratch import ScratchRows
from loaderkit.hdf5.read.sessionfiles import SessionFiles
from loaderkit.hdf5.read.widekeys import ASK_BYTES, WideAhead, fill_wide, read_wide

__all__ = ["KeySpec", "ReadFacts", "Reader", "SessionReader", "SessionRecord", "row_batch"]


class ReadFacts(Protocol):
    """How a reader's reads use memory and descriptors: what the budgets ask of any reader.

    Example:
        >>> "matrix_nbytes" in ReadFacts.__dict__
        True
    """

    @property
    def fills_chunk_buffer(self) -> bool:
        """Reads fill a chunk buffer per open file (HDF5's, or decoded chunks)."""
        ...

    @property
    def maps_whole_files(self) -> bool:
        """Warm tables of reads may be copied out of whole-file maps (a second descriptor)."""
        ...

    @property
    def matrix_nbytes(self) -> list[int] | None:
        """Per session, bytes a chunk buffer holds of the reads (``None``: the layouts say)."""
        ...


class Reader(ReadFacts, Protocol):
    """What the dataset, its budgets and the loader ask of any reader: the declared contract.

    ``SessionReader`` answers it for keys read as stored; the AnnData package's reader
    (``loaderkit.hdf5.anndata.keyreader.AnnDataReader``) answers it by composing a matrix part
    with a ``SessionReader`` for the keys beside the matrix. Nothing in it is AnnData's: a
    matrix's genes, forms and labels are that package's own part.

    Example:
        >>> isinstance(SessionReader, type) and "read_batch" in Reader.__dict__
        True
    """

    #: The files part: specs, types, records, the per-process file pool, checks, errors.
    files: SessionFiles
    #: The dataset's packed index (``meta.index``), set by the dataset after construction.
    index: np.ndarray
    #: What decides a sample's content besides the index, as bytes a resumed state shares.
    content_parts: list[bytes]

    @property
    def sparse_samples(self) -> bool:
        """Whether samples are sparse tensors (not dense rows)."""
        ...

    def read_one(self, index: int, pos: int, row: int) -> Any:
        """Sample ``index`` (session ``pos``, ``row``)."""
        ...

    def read_batch(self, idx: np.ndarray, keys: np.ndarray) -> RowBatch:
        """The samples of packed ``keys`` (dataset indices ``idx``) as one finished batch."""
        ...

    def use_memory(self, memory: BatchMemory) -> None:
        """Write the batches read in this process where ``memory`` says."""
        ...

    def fit_memory(self, memory: int | None, source: str | None = None) -> None:
        """Fit what is read around a miss and ahead to the memory the process may use."""
        ...

    def read_ahead_watcher(self) -> Any | None:
        """A watcher of the loader's coming indices that asks for their reads ahead."""
        ...

    def read_paths(self, handle: Handle) -> dict[str, ReadPath]:
        """Per key name, how its rows are read from ``handle``'s file."""
        ...

    def session_rows(self) -> list[int]:
        """Samples per session the default ``build_index`` counts."""
        ...

    def chunk_rows(self) -> list[int]:
        """Rows per storage chunk of each session: where blocks are cut."""
        ...

    def threads_reading(self) -> int:
        """How many threads are inside a batch read now."""
        ...

    def close(self) -> None:
        """Close this process's open files and drop what is held in memory."""
        ...


class SessionReader:
    """Rows of the keys of session files read as stored: the default reads of the dataset.

    Its files, their handles and checks are a part it holds (``files``); the keys it reads
    are ``keys`` (all of the files' keys, or those another reader leaves to it).

    Args:
        single: A sample is one key's row, not a dict of keys.
        type_error: Why the keys' rows cannot be typed (a type no torch dtype holds, rows that
            differ between sessions), kept for a subclass that overrides ``read``: ``read_one``
            raises it when called, an override that converts the rows itself works.
        files: The files part to read through (shared with a reader that holds this one);
            ``None``: made here from ``kwargs``.
        keys: The positions of the files' keys this reader reads (``None``: every key).
        **kwargs: The arguments of ``sessionfiles.SessionFiles`` (the files part).

    Example:
        >>> SessionReader.read_one.__name__, SessionReader.maps_whole_files
        ('read_one', False)
    """

    #: Tables of reads are never copied out of whole-file maps here.
    maps_whole_files = False

    def __init__(
        self,
        *,
        single: bool,
        type_error: Exception | None = None,
        files: SessionFiles | None = None,
        keys: Sequence[int] | None = None,
        **kwargs: Any,
    ) -> None:
        self.files = files = SessionFiles(**kwargs) if files is None else files
        #: The files' keys this reader reads, in sample order.
        self.keys = tuple(range(len(files.specs))) if keys is None else tuple(keys)
        #: The dataset's packed index: sample ``i`` is ``(index[i] >> ROW_BITS, index[i] &
        #: ROW_MASK)``, (session position, row); read-only once the dataset set it.
        self.index: np.ndarray = np.empty(0, np.int64)
        self.single = single
        self.type_error = type_error
        #: Reads fill a chunk buffer per open file (HDF5's, or decoded chunks).
        self.fills_chunk_buffer = files.chunked
        #: What decides a sample's content besides the index (nothing: rows as stored).
        self.content_parts: list[bytes] = []
        #: Per thread: the reused buffer of rows that need converting.
        self.scratch = ScratchRows()
        #: One entry per thread inside a batch read now (``list.append``/``pop`` are atomic).
        self.reading: list[None] = []
        #: Rows as stored: the layouts say what a chunk buffer holds.
        self.matrix_nbytes: list[int] | None = None
        #: Memory the process may use (``fit_memory``; ``None``: unknown): bounds read-ahead.
        self.memory_bytes: int | None = None
        #: Where batches are written in this process (``use_memory``; plain memory until
        #: the loader hands over a worker's batch slot). Never pickled.
        self.memory: BatchMemory = PLAIN

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["index"] = encode_index(self.index)  # a million samples in a few kilobytes
        state["reading"] = None
        state["memory"] = PLAIN  # a worker's slot is its own: a copy elsewhere writes plainly
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.index = decode_index(state["index"])
        self.reading = []

    @property
    def sparse_samples(self) -> bool:
        """Rows as stored are dense: ``False``."""
        return False

    @functools.cached_property
    def names(self) -> list[str]:
        """The names of this reader's keys (a dict sample's keys), in ``keys`` order."""
        return [self.files.specs[k].name for k in self.keys]

    @functools.cached_property
    def ragged_names(self) -> list[str | None]:
        """Per key of ``keys``, its name where its rows may differ in shape (else ``None``)."""
        return [self.files.ragged_names[k] for k in self.keys]

    def use_memory(self, memory: BatchMemory) -> None:
        """Write the batches this process reads from now on where ``memory`` says.

        Args:
            memory: A ``loaderkit.batches.BatchMemory`` (a worker's batch slot, or ``PLAIN``).
        """
        self.memory = memory

    def fit_memory(self, memory: int | None, source: str | None = None) -> None:
        """Fit what is read around a miss and ahead to the memory the process may use.

        Kept: it bounds what is read ahead (``read_ahead_watcher``); rows are read as asked (a
        CSR matrix reads around and ahead).

        Args:
            memory: ``PlatformInfo.memory_bytes`` (``None``: unknown).
            source: Where that figure came from, for the plan.
        """
        self.memory_bytes = memory

    def read_ahead_watcher(self) -> Any | None:
        """A watcher of the loader's coming indices that asks for their reads ahead.

        Where sessions are held whole (rows that span every chunk, ``max_session_bytes``
        holding one), ``widekeys.WideAhead`` readies the next session; else ``None``: rows
        are read when their batch comes (a CSR matrix reads ahead).
        """
        files = self.files
        if not any(files.any_wide) or files.held.max_bytes <= 0 or not self.index.size:
            return None
        memory = self.memory_bytes
        ask = ASK_BYTES if memory is None else min(ASK_BYTES, memory // 16)
        return WideAhead(files, self.index, ask)

    def read_paths(self, handle: Handle) -> dict[str, ReadPath]:
        """Per key name, how its rows are read from ``handle``'s file (``ReadPath``)."""
        return self.files.read_paths(handle)

    def close(self) -> None:
        """Close this process's open files and drop the sessions held in memory."""
        files = self.__dict__.get("files")  # absent where construction failed
        if files is not None:
            files.close()

    def session_rows(self) -> list[int]:
        """Samples per session the default ``build_index`` counts: rows of the first key."""
        return [rec.layouts[0].rows if rec.layouts else 0 for rec in self.files.records]

    def chunk_rows(self) -> list[int]:
        """Rows per storage chunk of each session (1: contiguous): where blocks are cut."""
        return [
            (rec.layouts[0].chunk_rows or 1) if rec.layouts else 1 for rec in self.files.records
        ]

    def threads_reading(self) -> int:
        """How many threads are inside a batch read of this reader now (this one included)."""
        return len(self.reading)

    def read_one(self, index: int, pos: int, row: int) -> Any:
        """Sample ``index`` (session ``pos``, ``row``) as the default ``read`` returns it.

        Raises:
            ConfigError: The rows have no torch type (``type_error``), raised at this call.
        """
        if self.type_error is not None:
            raise ConfigError(str(self.type_error))
        values = self.read_keys(index, pos, row, self.keys)
        if self.single:
            return values[0]
        return dict(zip(self.names, values, strict=True))

    def read_keys(self, index: int, pos: int, row: int, keys: Sequence[int]) -> list[Any]:
        """Row ``row`` of session ``pos`` of each of the files' keys ``keys``; errors name the row.

        The handle is leased for the read, unless this thread holds the hook lock (a subclass's
        ``read`` calling ``super().read()``): no handle is closed under it.
        """
        locked = self.files.file_pool.lock.held()
        handle = (
            self.files.handle(pos, row, index) if locked else self.files.leased(pos, row, index)
        )
        try:
            values = [self._one(handle, k, pos, row, index) for k in keys]
            if handle.watch:
                self.files.verify(handle, pos, f"row {row}", index)
        except MemoryError:
            raise
        except Exception as exc:
            raise self.files.read_error(exc, pos, range(row, row + 1), index) from exc
        finally:
            if not locked:
                self.files.file_pool.release(handle)
        return values

    def _one(self, handle: Handle, k: int, pos: int, row: int, index: int) -> Any:
        rt = self.files.types[k]
        if (
            self.files.some_wide and self.files.wide[pos][k]
        ):  # a row touches every chunk: held, or a pass
            sample = np.empty((1, *rt.row_shape), rt.mem_dtype)
            read_wide(self.files, k, pos, np.array([row], np.int64), sample, index)
            return sample[0] if rt.row_shape else sample[0][()]
        raw, mapped = handle.raws[k], handle.maps[k]
        if raw is not None:
            sample = np.empty(rt.row_shape, rt.read_dtype)
            if mapped is not None:
                self.files.verify(
                    handle, pos, f"row {row}", index
                )  # never fault on a truncated map
                sample[...] = mapped[row]  # a copy, never a view of the map
            else:
                pread(raw, row * self.files.row_bytes[k], sample, self.files.row_bytes[k])
            if rt.kind is Kind.STRUCT:
                return rt.sample(sample[()] if not rt.row_shape else sample)
            if rt.swap:
                sample = sample.astype(rt.mem_dtype)
            return sample if rt.row_shape else sample[()]
        if handle.chunked[k] is not None and rt.kind is Kind.NUMBER:  # raw chunks, no lock
            rows = np.empty((1, *rt.row_shape), rt.read_dtype)
            self.files.fill_run(handle, k, pos, row, 1, rows, index)
            if rt.swap:
                rows = rows.astype(rt.mem_dtype)
            return rows[0] if rt.row_shape else rows[0][()]
        spec = self.files.specs[k]
        if spec.members:
            return rt.sample(self.files.member(handle, k, pos, row))
        dset = handle.datasets[k]
        if rt.kind is Kind.NUMBER:
            value = dset[axis_selection(spec.axis, row, None)] if spec.axis else dset[row]
            if isinstance(value, np.ndarray):
                return value.astype(rt.mem_dtype, copy=False)
            return np.asarray(value).astype(rt.mem_dtype)[()]
        if rt.kind is Kind.STRUCT:
            slab = read_slab(dset, spec.axis, row, 1, rt.read_dtype)
            return rt.sample(np.moveaxis(slab, spec.axis, 0)[0])
        value = dset[axis_selection(spec.axis, row, None)] if spec.axis else dset[row]
        return rt.sample(value)

    def read_batch(self, idx: np.ndarray, keys: np.ndarray) -> RowBatch:
        """Read the samples of ``keys`` (dataset indices ``idx``), every key into one buffer.

        Returns:
            A ``RowBatch``: the samples in request order, and the collated batch.
        """
        return row_batch(self.names, self.read_parts(idx, keys), self.ragged_names, self.single)

    def read_parts(self, idx: np.ndarray, keys: np.ndarray) -> list[tuple[Samples, Any]]:
        """Per key of ``keys`` (this reader's), its samples and batch of packed ``keys``.

        Each part is ``(samples, batch)``: a function that makes the per-row samples, and the
        key's collated batch (``None`` where its rows differ in shape). ``row_batch`` makes
        the finished batch of parts.
        """
        order, starts = plan_runs(keys, sort=self.files.chunked, always=self.files.contiguous)
        if starts is None:
            starts = np.arange(idx.size)
        reading = self.reading
        reading.append(None)  # threads reading now: ``_fill`` chooses its system calls by it
        try:
            return [self._read_key(k, idx, keys, order, starts) for k in self.keys]
        finally:
            reading.pop()

    def stored_rows(
        self, handle: Handle, k: int, pos: int, rows: np.ndarray, index: int, *, wrap: bool
    ) -> np.ndarray:
        """Rows ``rows`` (sorted, unique) of key ``k`` of session ``pos``, at its own shape.

        The file's own row shape (``records``), not the one every session shares: a dense
        matrix's files may differ in width (the AnnData package maps their columns). Contiguous
        rows are one table of reads (a read a run); else memory maps, raw chunks or HDF5.

        Args:
            handle: Session ``pos``'s open file, leased by the caller.
            k: The key.
            pos: The session.
            rows: The rows to read.
            index: The dataset index of the first, for errors.
            wrap: Name the file and rows in an ``HDF5FileError`` (``False``: raise as read).
        """
        shape = self.files.records[pos].layouts[k].row_shape
        dtype = self.files.types[k].read_dtype
        buf = np.empty((rows.size, *shape), dtype)
        row_bytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        cuts = (np.flatnonzero(rows[1:] != rows[:-1] + 1) + 1).tolist()
        mapped, raw = handle.maps[k], handle.raws[k]
        if mapped is not None:
            self.files.verify(handle, pos, "rows", index)  # never fault on a truncated map
        runs = list(zip([0, *cuts], [*cuts, rows.size], strict=True))
        firsts = rows[[k0 for k0, _ in runs]].tolist()
        if raw is not None and mapped is None:  # contiguous: the runs are one table of reads
            fd, base = raw
            table = [
                (fd, base + a * row_bytes, k0 * row_bytes, (k1 - k0) * row_bytes)
                for a, (k0, k1) in zip(firsts, runs, strict=True)
            ]
            try:
                read_table(buf, table, what="the row data")
            except ShortRead as exc:
                if not wrap:
                    raise
                a, (k0, k1) = firsts[exc.row], runs[exc.row]
                raise self.files.read_error(exc, pos, range(a, a + k1 - k0), index, k) from exc
            return buf
        for a, (k0, k1) in zip(firsts, runs, strict=True):
            try:
                if mapped is not None:
                    buf[k0:k1] = mapped[a : a + k1 - k0]
                else:  # raw chunks or HDF5: the dataset's own shape
                    self.files.fill_run(handle, k, pos, a, k1 - k0, buf[k0:k1], index)
            except MemoryError:
                raise
            except Exception as exc:
                if not wrap:
                    raise
                raise self.files.read_error(exc, pos, range(a, a + k1 - k0), index, k) from exc
        return buf

    def _read_key(
        self,
        k: int,
        idx: np.ndarray,
        keys: np.ndarray,
        order: np.ndarray | None,
        starts: np.ndarray,
    ) -> tuple[Samples, Any]:
        files = self.files
        rt, n = files.types[k], idx.size
        if rt.kind is Kind.NUMBER and not files.specs[k].members:
            tensor, out = self.memory.buffer(n, rt.row_shape, rt.mem_dtype)
            stored = self.scratch.rows(n, rt.read_dtype, rt.row_shape) if rt.swap else out
            mapped = files.memory_map and files.contiguous
            if not (mapped and take_mapped(files, k, idx, keys, stored, self.scratch)):
                self._fill(k, idx, keys, order, starts, stored)
            if stored is not out:
                np.copyto(out, stored)  # to native byte order while copying
            return functools.partial(list, out), tensor
        if k in files.uneven:
            out = np.empty(n, object)
        elif rt.record is not None:  # split into fresh per-field batches: the records are scratch
            out = self.scratch.rows(n, rt.read_dtype, rt.row_shape)
        else:
            out = np.empty((n, *rt.row_shape), rt.read_dtype)
        self._fill(k, idx, keys, order, starts, out)
        if k in files.uneven:  # per-sample datasets of differing shapes: never stacked
            return functools.partial(list, [rt.sample(v) for v in out]), None
        return rt.batch(out, self.memory.buffer)

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
        if self.files.any_wide[k]:
            fill_wide(self.files, k, idx, keys, out)
            return
        n = idx.size
        buf = out if order is None else np.empty_like(out)
        # reads take the rows as bytes: exporting a record dtype's buffer is slow
        plain = buf.dtype.names is None or buf.dtype.hasobject  # objects: never read raw
        rows = buf if plain else buf.view(np.uint8).reshape(n, -1)
        # Contiguous data: the runs are a table of reads (``read_table``). With other threads
        # reading at once, every system call releases the GIL, a hand-over to another thread:
        # the table then goes to a ring or takes turns (``shared``).
        shared = self.threads_reading() > 1
        if (
            self.files.contiguous
            and order is None
            and self._fill_at_once(k, idx, keys, starts, rows, shared)
        ):
            return
        run_keys = (keys[starts] if order is None else keys[order[starts]]).tolist()
        bounds = starts.tolist()
        bounds.append(n)
        runs: Sequence[int] = range(len(run_keys))
        if order is None and len(run_keys) > 1:
            # runs in request order, each into its own slice of ``buf``: read session by
            # session (one lease per session, not per run); sorted() is stable
            runs = sorted(runs, key=lambda r: run_keys[r] >> ROW_BITS)

        def index_at(slot: int) -> int:  # the dataset index read into ``buf[slot]``
            return int(idx[slot] if order is None else idx[order[slot]])

        mapped_checked: set[int] = set()
        get, canonical = self.files.file_pool.lease, self.files.canonical
        last = -1
        handle: Handle | None = None
        raw: tuple[int, int] | None = None
        row_bytes = self.files.row_bytes[k]
        # contiguous runs of the session being read: (first row, first slot, end slot)
        pending: list[tuple[int, int, int]] = []

        def read_pending() -> None:
            """Read ``pending`` from ``raw``: one table; a read that fails names its rows."""
            assert raw is not None
            fd, base = raw
            table = [
                (fd, base + a * row_bytes, k0 * row_bytes, (k1 - k0) * row_bytes)
                for a, k0, k1 in pending
            ]
            try:
                read_table(rows, table, shared=shared, what="the row data")
            except ShortRead as exc:
                a, k0, k1 = pending[exc.row]
                raise self.files.read_error(
                    exc, last, range(a, a + k1 - k0), index_at(k0), k
                ) from exc
            pending.clear()

        try:
            for r in runs:
                key = run_keys[r]
                pos, a = key >> ROW_BITS, key & ROW_MASK
                k0, k1 = bounds[r], bounds[r + 1]
                if pos != last:
                    if pending:
                        read_pending()
                    if handle is not None:
                        self.files.done(handle, last, index_at(k0))
                        handle = None
                    try:
                        handle = get(canonical[pos])
                    except Exception as exc:
                        self.files.note(exc, pos, a, index_at(k0))
                        raise
                    if handle.maps[k] is None:
                        raw = handle.raws[k]
                    else:
                        raw = None
                        if pos not in mapped_checked:  # never fault on a truncated map
                            self.files.verify(handle, pos, "rows", index_at(k0))
                            mapped_checked.add(pos)
                    last = pos
                assert handle is not None
                length = k1 - k0
                if raw is not None:  # contiguous rows: read with the session's other runs
                    pending.append((a, k0, k1))
                    continue
                try:
                    self.files.fill_run(handle, k, pos, a, length, buf[k0:k1], index_at(k0))
                except MemoryError:
                    raise
                except Exception as exc:
                    raise self.files.read_error(
                        exc, pos, range(a, a + length), index_at(k0), k
                    ) from exc
            if pending:
                read_pending()
            if handle is not None:
                self.files.done(handle, last, index_at(0))
                handle = None
        finally:
            if handle is not None:
                self.files.file_pool.release(handle)
        if order is not None:
            out[order] = buf

    def _fill_at_once(
        self,
        k: int,
        idx: np.ndarray,
        keys: np.ndarray,
        starts: np.ndarray,
        rows: np.ndarray,
        shared: bool,
    ) -> bool:
        """Read every run of a batch (request order) as one table, every file leased at once.

        Every session's file is leased with one hold of the file pool's mutex. Returns
        ``False``, having read nothing, where a session's file is not open (``lease_open``) or
        is not read raw (mapped, or HDF5 reads it): ``_fill`` then reads the batch session by
        session. Nothing here releases the GIL but the reads' system calls: each release is
        a hand-over to another thread (numpy's sorts and 2-D fancy indexing release it).
        """
        run_keys = keys[starts]
        slots: dict[int, int] = {}  # session: its place in order of first appearance
        places = [slots.setdefault(p, len(slots)) for p in (run_keys >> ROW_BITS).tolist()]
        sessions = list(slots)
        canonical = self.files.canonical
        leased = self.files.file_pool.lease_open([canonical[pos] for pos in sessions])
        if leased is None:
            return False
        try:
            raws = [handle.raws[k] if handle.maps[k] is None else None for handle in leased]
            if None in raws:
                return False
            row_bytes = self.files.row_bytes[k]
            ring = shared and starts.size >= RING_MIN_READS  # the table may go to a ring
            table = _run_table(run_keys, starts, idx.size, row_bytes, raws, places, ring)
            try:
                read_table(rows, table, shared=shared, what="the row data")
            except ShortRead as exc:
                r = exc.row
                key, k0 = int(run_keys[r]), int(starts[r])
                a = key & ROW_MASK
                run = range(a, a + int(table[r][3]) // row_bytes)
                raise self.files.read_error(exc, key >> ROW_BITS, run, int(idx[k0]), k) from exc
            for s, handle in enumerate(leased):
                if handle.watch:  # HDF5 read chunks of it: the rows are real rows
                    self.files.verify(
                        handle, sessions[s], "rows", int(idx[starts[places.index(s)]])
                    )
            return True
        finally:
            self.files.file_pool.release_all(leased)


def row_batch(
    names: Sequence[str],
    parts: Sequence[tuple[Samples, Any]],
    ragged: Sequence[str | None],
    single: bool,
) -> RowBatch:
    """The finished batch of keys' parts (``read_parts``): one key's, or a dict of keys.

    Args:
        names: Per part, its key's name (a dict batch's keys).
        parts: Per key, ``(samples, batch)``; a batch ``None`` where the key's rows differ in
            shape (the batch is then the samples, collated by the loader's ``collate_fn``).
        ragged: Per part, the name to give where its rows differ in shape.
        single: A sample is the first part's row, not a dict.

    Example:
        >>> import functools, torch
        >>> batch = row_batch(["x"], [(functools.partial(list, [1]), torch.ones(1))], [None], True)
        >>> batch.tensor
        tensor([1.])
    """
    if single:  # the rows (views of the batch, or dicts) only when something asks
        return RowBatch(parts[0][1], parts[0][0], ragged=ragged[0])
    batch = {name: part[1] for name, part in zip(names, parts, strict=True)}
    odd = next((name for name, part in zip(ragged, parts, strict=True) if part[1] is None), None)
    rows = functools.partial(dict_rows, list(names), [part[0] for part in parts])
    return RowBatch(None if odd else batch, rows, ragged=odd)


def _run_table(
    run_keys: np.ndarray,
    starts: np.ndarray,
    n: int,
    row_bytes: int,
    raws: list[tuple[int, int] | None],
    places: list[int],
    vectorised: bool,
) -> Table:
    """The table of a batch's runs: run ``r`` from its session's file into rows ``starts[r]..``.

    Built in numpy where the table goes to a ring (``vectorised``: a few microseconds whatever
    the number of runs), else as a list of tuples (no fixed numpy cost; a list is what the
    reads walk anyway).
    """
    if vectorised:
        fds, bases = np.array(raws, dtype=np.int64).T  # one row per session
        which = np.array(places)
        lengths = np.empty(starts.size, np.int64)  # rows per run (np.diff costs more)
        np.subtract(starts[1:], starts[:-1], out=lengths[:-1])
        lengths[-1] = n - starts[-1]
        table = np.empty((starts.size, 4), np.int64)
        table[:, 0] = fds[which]
        table[:, 1] = bases[which] + (run_keys & ROW_MASK) * row_bytes
        table[:, 2] = starts * row_bytes
        table[:, 3] = lengths * row_bytes
        return table
    bounds = starts.tolist()
    bounds.append(n)
    rows: list[tuple[int, int, int, int]] = []
    for r, key in enumerate(run_keys.tolist()):
        raw = raws[places[r]]
        assert raw is not None
        k0 = bounds[r]
        rows.append(
            (
                raw[0],
                raw[1] + (key & ROW_MASK) * row_bytes,
                k0 * row_bytes,
                (bounds[r + 1] - k0) * row_bytes,
            )
        )
    return rows
