"""``SessionReader``: reads rows of one or several keys from session files; every reader's base.

The reader holds its files as a part (``sessionfiles.SessionFiles``: how each key is stored
and typed, what every file held when the index was built, the per-process file pool, the
checks that make a changed file an ``HDF5FileError`` naming what changed, the error context).
``HDF5SessionDataset`` keeps its hooks, accessors and pickling, and hands its default reads here:

* ``read_one`` — one sample (per-item reads);
* ``read_batch`` — a batch grouped into runs of consecutive rows (``runs.plan_runs``),
  every key read into one buffer: a table of reads (``readtable.read_table``) or a memory map
  for contiguous numbers (other byte orders into a reused scratch buffer, converted while
  copied), HDF5 otherwise (which converts byte order, enums and compounds itself), then split
  into samples and the collated batch (``loaderkit.batches.RowBatch``), written where the
  loader's ``BatchMemory`` says (``use_memory``: a worker's batch slot).

Keys whose rows span many chunks that other rows share are read apart (``widekeys``). What
the dataset asks of any reader (``configure``, ``genes``, ``n_out``, ``matrix_nbytes``,
``sparse_samples``...) is declared here, answered as for rows served as stored;
``csrrows.CSRReader`` and ``densejoin.DenseJoinReader`` are its direct subclasses.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from loaderkit.batches.contract import PLAIN, BatchMemory, RowBatch
from loaderkit.errors import ConfigError
from loaderkit.hdf5.meta.index import ROW_BITS, ROW_MASK, decode_index, encode_index
from loaderkit.hdf5.meta.keyspecs import KeySpec, SessionRecord, axis_selection, read_slab
from loaderkit.hdf5.meta.types import Kind, Samples, dict_rows
from loaderkit.hdf5.read.chunkio import ReadPath
from loaderkit.hdf5.read.genemap import GeneMap, VarTable, gene_map
from loaderkit.hdf5.read.handles import Handle
from loaderkit.hdf5.read.labelkeys import LabelKey, served_parts, served_values
from loaderkit.hdf5.read.mappedrows import take_mapped
from loaderkit.hdf5.read.rawio import pread
from loaderkit.hdf5.read.readtable import RING_MIN_READS, ShortRead, Table, read_table
from loaderkit.hdf5.read.runs import plan_runs
from loaderkit.hdf5.read.scratch import ScratchRows
from loaderkit.hdf5.read.sessionfiles import SessionFiles
from loaderkit.hdf5.read.widekeys import fill_wide, read_wide

__all__ = ["KeySpec", "SessionReader", "SessionRecord"]


class SessionReader:
    """Default reads of ``HDF5SessionDataset``, and the contract every reader answers.

    Its files, their handles and checks are a part it holds (``files``).

    Args:
        served: Per key, the ``labelkeys.LabelKey`` of a per-cell anndata column (a
            categorical's codes shared across files, ``None`` where a value is missing);
            ``None`` (or empty: every key) where rows are served as stored.
        single: A sample is one key's row, not a dict of keys.
        type_error: Why the keys' rows cannot be typed (a type no torch dtype holds, rows that
            differ between sessions), kept for a subclass that overrides ``read``: the base
            ``read`` raises it when called, an override that converts the rows itself works.
        table: A matrix key's var indexes, one per file (``genemap.VarTable``): its columns
            are genes, served as ``configure`` decides; ``None``: rows served as stored.
        name: The matrix's name (messages, dict samples); ``None``: the first key's.
        **kwargs: The arguments of ``sessionfiles.SessionFiles`` (the files part).

    Example:
        >>> SessionReader.read_one.__name__, SessionReader.forms
        ('read_one', ('csr',))
    """

    #: The forms a matrix's rows are served in (``configure``'s ``form``; ``sparse=``).
    forms: tuple[str, ...] = ("csr",)
    #: Whether tables of reads may be copied out of whole-file maps (each mapped file then
    #: holds a second descriptor where ``mapped.DUPLICATES_FD``); ``CSRReader`` may.
    maps_whole_files = False

    def __init__(
        self,
        *,
        served: Sequence[LabelKey | None] = (),
        single: bool,
        type_error: Exception | None = None,
        table: VarTable | None = None,
        name: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.files = files = SessionFiles(**kwargs)
        #: The dataset's packed index: sample ``i`` is ``(index[i] >> ROW_BITS, index[i] &
        #: ROW_MASK)``, (session position, row); read-only once the dataset set it.
        self.index: np.ndarray = np.empty(0, np.int64)
        #: Per key, how an anndata column's rows are served (``LabelKey``; ``None``: as stored).
        self.served = tuple(served) or (None,) * len(files.specs)
        self.single = single
        self.type_error = type_error
        #: Reads fill a chunk buffer per open file (HDF5's, or decoded chunks).
        self.fills_chunk_buffer = files.chunked
        #: What decides a sample's content besides the index, as bytes a resumed state must
        #: share (a matrix's column map: ``configure``).
        self.content_parts: list[bytes] = []
        #: Per thread: the reused buffer of rows that need converting.
        self.scratch = ScratchRows()
        #: One entry per thread inside a batch read now (``list.append``/``pop`` are atomic).
        self.reading: list[None] = []
        self.table = table
        self.name = name if name is not None else (files.key_names or [""])[0]
        #: How a matrix's rows are served (one of ``forms``).
        self.form = "csr"
        #: A matrix's served columns, and where each file's go (``configure``); ``None``:
        #: rows served as stored.
        self.genes: GeneMap | None = None if table is None else GeneMap.plain(table)
        #: Columns of a matrix's sample (``None``: rows served as stored, ``files.types``).
        self.n_out: int | None = None if self.genes is None else self.genes.n_out
        #: Per session, bytes of a sparse matrix's values and column ids decoded (what a
        #: chunk buffer holds of it); ``None``: no sparse matrix.
        self.matrix_nbytes: list[int] | None = None
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
        """Whether samples are rows of a sparse matrix (CSR tensors, not dense rows)."""
        return False

    def configure(self, form: str = "csr", genes: Any = None, join: str | None = None) -> None:
        """Serve a matrix's rows as ``form``, the columns ``join`` and ``genes`` give.

        Args:
            form: One of ``forms`` (``sparse=``): a sparse matrix's ``"csr"``, ``"dense"`` or
                ``"tokens"``; a dense matrix is served dense (only the default, ``"csr"``).
            genes: ``None`` (every column), var names (a name twice: two columns), integer
                positions or a boolean mask (``genemap.gene_map``).
            join: ``None`` (the files share one var index), ``"outer"`` or ``"inner"``.

        Raises:
            ConfigError: Any of them given where rows are served as stored (no matrix), a
                form this matrix has not, an unknown join, files whose var indexes differ
                without ``join=`` or ``genes=`` names, or a ``genes=`` that selects no column
                of the files (each named by ``gene_map``).
        """
        if self.table is None:
            if form != "csr" or genes is not None or join is not None:
                names = self.files.key_names
                raise ConfigError(
                    f"sparse={form!r}, genes= and join= apply to an anndata matrix (sparse= to "
                    "a CSR one; genes= and join= to X, layers/<name> or raw/X, dense too, as "
                    f"the first key); key {names[0] if len(names) == 1 else names!r} is none: "
                    "leave them unset (its rows are read as stored)."
                )
            return
        if form not in self.forms:
            if len(self.forms) > 1:
                raise ConfigError(f"sparse={form!r}: expected one of {list(self.forms)}.")
            raise ConfigError(
                f"sparse={form!r} applies to a sparse (CSR) matrix; key {self.name!r} is a "
                "dense matrix, served as dense rows: leave sparse= unset."
            )
        self.form = form
        self.genes = gene_map(self.table, join, genes, key=self.name, where=self.files.where())
        self.n_out = self.genes.n_out
        self.content_parts = [b"columns", *self.genes.digest_parts()]
        self._serve_columns(self.genes)

    def _serve_columns(self, genes: GeneMap) -> None:
        """After ``configure``: what a reader needs to serve ``genes`` (nothing here)."""

    def use_memory(self, memory: BatchMemory) -> None:
        """Write the batches this process reads from now on where ``memory`` says.

        Args:
            memory: A ``loaderkit.batches.BatchMemory`` (a worker's batch slot, or ``PLAIN``).
        """
        self.memory = memory

    def fit_memory(self, memory: int | None, source: str | None = None) -> None:
        """Fit what is read around a miss and ahead to the memory the process may use.

        Nothing here: rows are read as asked (``CSRReader`` reads around and ahead).

        Args:
            memory: ``PlatformInfo.memory_bytes`` (``None``: unknown).
            source: Where that figure came from, for the plan.
        """

    def read_ahead_watcher(self) -> Any | None:
        """A watcher of the loader's coming indices that asks for their reads ahead.

        ``None`` here: rows are read when their batch comes (``CSRReader`` reads ahead).
        """
        return None

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
        values = self.read_keys(index, pos, row, range(len(self.files.specs)))
        if self.single:
            return values[0]
        return {spec.name: value for spec, value in zip(self.files.specs, values, strict=True)}

    def read_keys(self, index: int, pos: int, row: int, keys: Sequence[int]) -> list[Any]:
        """Row ``row`` of session ``pos`` of each key in ``keys`` as served; errors name the row.

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
        return served_values(
            self.served, keys, values, (pos, row), self.files.ids, self.files.paths
        )

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
        n, files = idx.size, self.files
        order, starts = plan_runs(keys, sort=files.chunked, always=files.contiguous)
        if starts is None:
            starts = np.arange(n)
        reading = self.reading
        reading.append(None)  # threads reading now: ``_fill`` chooses its system calls by it
        try:
            parts = [self._read_key(k, idx, keys, order, starts) for k in range(len(files.specs))]
        finally:
            reading.pop()
        # anndata columns
        parts = served_parts(self.served, parts, keys, files.ids, files.paths, self.memory)
        if self.single:  # the rows (views of the batch, or dicts) only when something asks
            return RowBatch(parts[0][1], parts[0][0], ragged=files.ragged_names[0])
        names = [spec.name for spec in files.specs]
        batch = {name: part[1] for name, part in zip(names, parts, strict=True)}
        ragged = next((files.ragged_names[k] for k, p in enumerate(parts) if p[1] is None), None)
        rows = functools.partial(dict_rows, names, [part[0] for part in parts])
        return RowBatch(None if ragged else batch, rows, ragged=ragged)

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
