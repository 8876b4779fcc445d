"""Rows of CSR matrices (AnnData ``.h5ad``): a batch's spans of ``data``/``indices`` read raw.

``CSRMatrix`` is the matrix part of the reader of a key that names a CSR group
(``encoding.CSRGroup``). Its two keys are the group's ``data`` and ``indices``; row ``r`` is
the span ``[indptr[r], indptr[r+1])`` of both. ``indptr`` is read once per session and
process and held, with where the two datasets' chunks lie, in a ``csrplan.SpanCatalog``.

A batch is read by one plan (``_read``), whatever the number of sessions it draws from: the
catalog learns the batch's sessions first (``_know``); rows back to back in both the file and
the batch are one run (``csrplan.batch_runs``), each run's part in a chunk one read of a table
(``csrplan.piece_table``, the read-ahead's table too; ``readtable.read_table``: page cache
first, the misses asked for together), straight into one values buffer and one column-id
buffer in request order. Its cases: the batch's files leased at once, or each session's in
turn where they cannot all be open; runs of compressed chunks, of a chunk never written or of
a table that came back short decoded one by one in file order through the files' chunk index
and codecs (in the reading thread, outside every lock), every error naming its file and rows.
Column ids are checked per batch (one vectorised pass): a damaged file is an
``HDF5FileError`` naming the row, never a wrong row.

The keys beside the matrix are not this part's: ``reader.AnnDataReader`` reads them with the
row reader it holds. What the matrix's batch becomes (``form``: sparse CSR tensor, dense rows,
tokens) is ``forms``'. A gene subset (``serve``) keeps some columns, renumbered.

Example:
    >>> CSRMatrix.read_batch.__name__, FORMS
    ('read_batch', ('csr', 'dense', 'tokens'))
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from loaderkit.batches.contract import PLAIN, BatchMemory, RowBatch
from loaderkit.errors import HDF5FileError
from loaderkit.hdf5.anndata.ahead import CSRAhead
from loaderkit.hdf5.anndata.csrplan import (
    CONTIGUOUS,
    SpanCatalog,
    batch_runs,
    batch_sessions,
    piece_table,
    raw_chunks,
    read_around,
)
from loaderkit.hdf5.anndata.encoding import CSRGroup, check_csr
from loaderkit.hdf5.anndata.forms import FORMS, matrix_batch, part_buffer, row_samples, sorted_rows
from loaderkit.hdf5.anndata.genemap import GeneMap, VarTable
from loaderkit.hdf5.meta.index import ROW_BITS, ROW_MASK
from loaderkit.hdf5.read.chunkio import ReadPath
from loaderkit.hdf5.read.handles import Handle
from loaderkit.hdf5.read.mapped import FileMaps
from loaderkit.hdf5.read.readahead import AheadPlan, SamplerReadAhead, ahead_plan
from loaderkit.hdf5.read.readtable import ShortRead, read_table
from loaderkit.hdf5.read.sessionfiles import SessionFiles

__all__ = ["FORMS", "CSRMatrix"]

#: Where a batch's column ids start in its buffer, after its values: a cache line's multiple.
_ALIGN = 64


class CSRMatrix:
    """Rows of a CSR group: the files' keys ``keys`` (0 and 1) are its ``data`` and ``indices``.

    The matrix part of ``reader.AnnDataReader``: it reads through the files part it is given
    (the one the row reader of the keys beside the matrix shares) and serves the columns
    ``serve`` decides, in one of ``FORMS``.

    Args:
        files: The files part (``specs``: the group's ``data`` then ``indices``, then the keys
            beside the matrix, which this part never reads).
        groups: Per session, its ``CSRGroup`` (rows, columns, path).
        table: Each session's var index (``genemap.VarTable``).
        file_bytes: Bytes of the session files (what reads around a miss are fitted against).
        file_maps: Warm tables of pieces are copied out of whole-file maps
            (``mapped.FileMaps``); ``False``: every piece is read with ``os.preadv``.

    Example:
        >>> CSRMatrix.keys, CSRMatrix.forms
        ((0, 1), ('csr', 'dense', 'tokens'))
    """

    #: The files' keys this part reads: the group's ``data`` and ``indices``.
    keys = (0, 1)
    #: The forms a batch is served in (``sparse=``).
    forms = FORMS

    def __init__(
        self,
        *,
        files: SessionFiles,
        groups: Sequence[CSRGroup],
        table: VarTable,
        file_bytes: int = 0,
        file_maps: bool = True,
    ) -> None:
        self.files = files
        #: Bytes of the session files (what reads around a miss are fitted against).
        self.file_bytes = file_bytes
        #: Bytes read around a row the page cache misses, and why (``csrplan.read_around``;
        #: ``fit_memory`` decides it).
        self.around: tuple[int, str] = (0, "memory not known yet: a missed row's bytes alone")
        self.groups = list(groups)
        self.table = table
        #: How a batch is served (one of ``forms``; ``serve``).
        self.form = "csr"
        #: The served columns, and where each file's go (``serve``).
        self.genes = GeneMap.plain(table)
        #: Columns of a sample.
        self.n_out = self.genes.n_out
        #: One entry per thread inside a batch read now (``list.append``/``pop`` are atomic).
        self.reading: list[None] = []
        #: Where batches are written in this process (``AnnDataReader.use_memory``).
        self.memory: BatchMemory = PLAIN
        self._canon = np.asarray(self.files.canonical, np.int64)
        widths = [group.n_vars for group in self.groups] or [0]
        self._n_vars_min, self._n_vars_max = min(widths), max(widths)
        self.catalog = SpanCatalog(self.session_rows())
        #: Per session, whether its chunk tables cannot be held (compressed chunks): its
        #: batches are read session by session, not tried again every batch.
        self._unplanned = np.zeros(self._canon.size, bool)
        self._any_unplanned = False
        self._indptr_lock = threading.Lock()
        # uncompressed values and column ids are read raw (the first read of a session aside)
        self.fills_chunk_buffer = any(
            lay.compression for r in self.files.records for lay in r.layouts[:2]
        )
        #: Per session, bytes of its values and column ids decoded (what a chunk buffer holds).
        self.matrix_nbytes = [
            sum(lay.rows * lay.dtype.itemsize for lay in r.layouts[:2]) for r in self.files.records
        ]
        #: How far ahead the sampler's coming rows are asked for (``read_ahead_watcher``;
        #: ``fit_memory`` fits it).
        self.ahead_plan = self._ahead_plan(None)
        self._ahead: CSRAhead | None = None
        #: Whether whole-file maps may be used at all (``memory_map=False``: never).
        self._maps_allowed = file_maps
        #: Whether warm tables are copied out of whole-file maps (``_file_maps``): where
        #: allowed and the files fit memory as ``read_around`` judges it (``fit_memory``).
        self.maps_whole_files = file_maps
        self._maps: FileMaps | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["reading"] = None
        state["memory"] = PLAIN  # a worker's slot is its own
        state["catalog"] = None  # read again where needed: never pickled (8 bytes a cell)
        state["_indptr_lock"] = None
        state["_ahead"] = None
        state["_maps"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.reading = []
        self.catalog = SpanCatalog(self.session_rows())
        self._indptr_lock = threading.Lock()

    def close(self) -> None:
        """Stop reading ahead and drop this process's whole-file maps (the files stay open)."""
        ahead, self._ahead = self.__dict__.get("_ahead"), None
        if ahead is not None:
            ahead.close()
        maps, self._maps = self.__dict__.get("_maps"), None
        if maps is not None:
            maps.close()

    # ------------------------------------------------------------------ configuration

    def serve(self, form: str, genes: GeneMap) -> None:
        """Serve batches as ``form`` (one of ``forms``), the columns ``genes`` maps."""
        self.form, self.genes, self.n_out = form, genes, genes.n_out

    def use_memory(self, memory: BatchMemory) -> None:
        """Write the batches this process reads where ``memory`` says."""
        self.memory = memory

    def _ahead_plan(self, memory: int | None) -> AheadPlan:
        rows = max(sum(self.session_rows()), 1)
        total = sum(self.matrix_nbytes)
        return ahead_plan(total, self.around[0], total / rows, memory)

    def fit_memory(self, memory: int | None, source: str | None = None) -> None:
        """Fit the bytes read around a missed row and the read-ahead to ``memory``.

        ``csrplan.read_around`` (the neighbours of a miss are read where the files fit a
        quarter of memory) and ``readahead.ahead_plan`` (what is asked ahead at once) from the
        memory this process may use; a read-ahead already started in this process is stopped,
        to start again with the new plan.

        Args:
            memory: ``PlatformInfo.memory_bytes`` (``None``: unknown, nothing read around).
            source: Where that figure came from (a cgroup limit, physical memory).
        """
        self.around = read_around(self.file_bytes, memory, source)
        self.ahead_plan = self._ahead_plan(memory)
        ahead, self._ahead = self.__dict__.get("_ahead"), None
        if ahead is not None:
            ahead.close()
        # Out of core (the files over a quarter of memory: nothing read around a miss) a copy
        # out of a map that meets a page the page cache lost waits for the disk one page at a
        # time, the batch's other misses behind it: every table is read page cache first,
        # its misses asked for together.
        self.maps_whole_files = self._maps_allowed and (memory is None or self.around[0] > 0)
        maps = self.__dict__.get("_maps")
        if maps is not None and not self.maps_whole_files:
            self._maps = None
            maps.close()

    def read_path(self, path: ReadPath) -> ReadPath:
        """How the matrix's rows are read: ``path``, with what is read around a miss and ahead."""
        ahead = f"read ahead in the sampler's order (no worker processes): {self.ahead_plan.reason}"
        if self.maps_whole_files:
            maps = "warm batches copied out of whole-file maps (memory_map=False: never)"
        elif self._maps_allowed:
            maps = (
                "every piece read with os.preadv, page cache first: the files do not fit "
                "(a copy out of a map would wait for the disk a page at a time)"
            )
        else:
            maps = "every piece read with os.preadv (memory_map=False)"
        return path._replace(reason=f"{path.reason}; {self.around[1]}; {ahead}; {maps}")

    def session_rows(self) -> list[int]:
        """Rows (cells) per session: the groups' ``shape[0]``."""
        return [group.n_obs for group in self.groups]

    def chunk_rows(self) -> list[int]:
        """1 for every session: a row is a span of ``data``, not rows of a chunked array.

        A chunk of ``data`` holds a number of values, not of rows (anndata: 15,625 values, a
        few dozen cells); blocks of rows are cut by the block sampler's size alone.
        """
        return [1] * len(self.groups)

    @property
    def sparse_samples(self) -> bool:
        """Whether samples are sparse rows: the ``"csr"`` form (``serve``)."""
        return self.form == "csr"

    # ------------------------------------------------------------------ indptr

    def indptr(self, handle: Handle, pos: int) -> np.ndarray:
        """Session ``pos``'s ``indptr`` (int64), read once per process and held; checked."""
        key = self.files.canonical[pos]
        held = self.catalog.indptr(key)
        if held is not None:
            return held
        group = self.groups[pos]
        with self._indptr_lock:
            held = self.catalog.indptr(key)
            if held is None:
                indptr = np.asarray(handle.file[group.indptr][()], dtype=np.int64)
                nnz = [int(d.shape[0]) for d in handle.datasets[:2]]
                check_csr(group, indptr, nnz[0], nnz[1], self.files.ids[pos], self.files.paths[pos])
                held = self.catalog.hold_indptr(key, indptr)
        return held

    # ------------------------------------------------------------------ reads

    def read_one(self, index: int, pos: int, row: int) -> Any:
        """Row ``row`` of session ``pos`` (dataset index ``index``) in this part's form."""
        lengths, values, cols = self.gather(
            np.array([index], np.int64), np.array([(pos << ROW_BITS) | row], np.int64)
        )
        return self._samples(lengths, values, cols)[0]

    def read_batch(self, idx: np.ndarray, keys: np.ndarray) -> RowBatch:
        """The rows of ``keys`` (dataset indices ``idx``) as one batch in this part's form.

        Returns:
            A ``RowBatch`` whose ``tensor`` is the batch (``collate`` returns it) and whose
            samples are built only when something asks for them.
        """
        return self._matrix_batch(idx, keys)

    def _matrix_batch(self, idx: np.ndarray, keys: np.ndarray) -> RowBatch:
        """The matrix's rows of ``keys`` as one batch in this reader's form."""
        return matrix_batch(self.form, self.n_out, *self.gather(idx, keys), self.memory)

    def _samples(self, lengths: np.ndarray, values: np.ndarray, cols: np.ndarray) -> list[Any]:
        """Per-row samples in this reader's form."""
        return row_samples(self.form, self.n_out, lengths, values, cols)

    def gather(
        self, idx: np.ndarray, keys: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Read rows ``keys``: ``(lengths, values, column ids)`` in request order.

        Column ids are renumbered to the served columns (``configure``: ``join=``, ``genes=``),
        increasing within a row but for the ``"dense"`` form (which scatters them), and are
        ``int32`` or ``int64`` (as the file stores them, int64 for other integer types).
        """
        lengths, values, cols = self._read(idx, keys)
        total = values.size
        if self.files.types[0].swap:
            values = values.astype(self.files.types[0].mem_dtype)
        if cols.dtype not in (np.dtype(np.int32), np.dtype(np.int64)) or total >= 2**31:
            cols = cols.astype(np.int64)
        lengths, values, cols = self.genes.apply(keys >> ROW_BITS, lengths, values, cols)
        if self.form != "dense":  # sparse tensors and tokens: column ids increasing in a row
            values, cols = sorted_rows(lengths, values, cols)
        return lengths, values, cols

    def _buffers(
        self, lengths: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[np.ndarray, int]]:
        """Each row's first element, and the empty values and column ids, in one buffer.

        One buffer (a worker's slot) for both, so that a batch's reads are one table.

        Returns:
            ``(offsets, values, column ids, (the buffer, the ids' first byte in it))``.
        """
        offsets = np.zeros(lengths.size + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        total = int(offsets[-1])
        kinds = self.files.types[0].read_dtype, self.files.types[1].read_dtype
        ids_at = -(-total * kinds[0].itemsize // _ALIGN) * _ALIGN
        block = part_buffer(ids_at + total * kinds[1].itemsize, np.dtype(np.uint8), self.memory)
        values = block[: total * kinds[0].itemsize].view(kinds[0])
        return offsets, values, block[ids_at:].view(kinds[1]), (block, ids_at)

    def _read(self, idx: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Read rows ``keys`` (dataset indices ``idx``) in request order: one plan a batch.

        The plan: every row's span from the catalog (``_know`` teaches it the batch's sessions
        first), runs of spans back to back in both the file and the batch
        (``csrplan.batch_runs``), each run's pieces in each key's chunks
        (``csrplan.piece_table``, what the read-ahead asks for too) read as one table into one
        buffer for values and column ids (``read_table``: page cache first, the misses asked
        for together). The batch's files are leased at once; where they cannot be (more
        sessions than files open at once, other threads' files in the way), each session's
        runs are read in turn, the same way. ``_runs`` reads a lease's runs.

        Returns:
            ``(lengths, values, column ids)`` as stored, in request order.
        """
        n = idx.size
        pos, rows = keys >> ROW_BITS, keys & ROW_MASK
        cpos = self._canon[pos]  # where each row's file is held: its canonical session
        self._know(idx, pos, rows, cpos)
        begin, end = self.catalog.spans(cpos, rows)
        lengths = end - begin
        first, stop, length = batch_runs(cpos, begin, end)
        sessions, slot = batch_sessions(cpos, self._canon.size)
        self.reading.append(None)  # threads reading now: ``_read_table`` chooses its calls by it
        try:
            leased = self.files.file_pool.lease_batch(sessions.tolist())
            if leased is not None:
                try:
                    buffers = self._buffers(lengths)  # after the lease: a worker's slot waits
                    runs = _Runs(first, stop, length, slot[first], begin[first], cpos[first])
                    self._runs(leased, runs, idx, pos, rows, buffers)
                finally:
                    self.files.file_pool.release_all(leased)
            else:  # session by session, each file leased (and opened) in turn
                buffers = self._buffers(lengths)
                for s in range(sessions.size):
                    mine = slot[first] == s
                    if not mine.any():
                        continue
                    at = int(first[mine][0])
                    p, index = int(pos[at]), int(idx[at])
                    handle = self.files.leased(p, int(rows[at]), index)
                    try:
                        runs = _Runs(
                            first[mine],
                            stop[mine],
                            length[mine],
                            np.zeros(int(mine.sum()), np.int64),
                            begin[first[mine]],
                            cpos[first[mine]],
                        )
                        self._runs([handle], runs, idx, pos, rows, buffers)
                    except BaseException:
                        self.files.file_pool.release(handle)
                        raise
                    self.files.done(handle, p, index)
        finally:
            self.reading.pop()
        offsets, values, cols, _ = buffers
        self._check_columns(cols, offsets, 0, n, pos, rows, idx, np.arange(n))
        return lengths, values, cols

    def _runs(
        self,
        leased: Sequence[Handle],
        runs: _Runs,
        idx: np.ndarray,
        pos: np.ndarray,
        rows: np.ndarray,
        buffers: tuple[np.ndarray, np.ndarray, np.ndarray, tuple[np.ndarray, int]],
    ) -> None:
        """Read ``runs`` from the files ``leased`` (run ``i``'s is ``leased[runs.slot[i]]``).

        Runs in sessions whose chunk tables are held are one table of pieces (both keys);
        the rest — compressed chunks, a chunk never written, a table that came back short —
        are read run by run through the files' chunk index and codecs (``_span``), in file
        order, and every error names its file and rows.
        """
        offsets, values, cols, (block, ids_at) = buffers
        catalog = self.catalog
        cpos = runs.cpos
        if self._any_unplanned or not catalog.known(cpos):  # some runs decoded
            planned = (catalog.table_base[:, cpos] >= 0).all(axis=0) & ~self._unplanned[cpos]
            take: Any = planned if not planned.all() else slice(None)
        else:  # every run's session is read raw: the whole batch is one table
            planned, take = np.ones(cpos.size, bool), slice(None)
        if planned.any():
            fds = np.array([[_fd_of(h, k) for h in leased] for k in self.keys], np.int64)
            slot, cp, start, length = (
                runs.slot[take],
                cpos[take],
                runs.start[take],
                runs.length[take],
            )
            at = offsets[runs.first[take]]
            tables = []
            for k in self.keys:
                item = self.files.types[k].read_dtype.itemsize
                table, _ = piece_table(catalog, k, fds[k], slot, cp, start, length, at, item)
                tables.append(table)
            tables[1][:, 2] += ids_at  # both keys' reads: one table into one buffer
            table = np.concatenate(tables)
            readable = not table.size or (
                int(table[:, 1].min()) >= 0  # no chunk never written
                and (int(fds.min()) >= 0 or int(table[:, 0].min()) >= 0)  # every file read raw
            )
            if not (readable and self._read_table(block, table)):
                planned[:] = False  # read again run by run: what fails is named
        left = np.flatnonzero(~planned)
        if not left.size:
            return
        left = left[np.lexsort((runs.start[left], cpos[left]))]  # file order: chunks decoded once
        verified: set[int] = set()
        for r in left.tolist():
            handle = leased[int(runs.slot[r])]
            r0, r1 = int(runs.first[r]), int(runs.stop[r])
            p, index = int(pos[r0]), int(idx[r0])
            if p not in verified and any(m is not None for m in handle.maps):
                self.files.verify(handle, p, "rows", index)  # never fault on a truncated map
                verified.add(p)
            a, length, o0 = int(runs.start[r]), int(runs.length[r]), int(offsets[r0])
            for k, out in zip(self.keys, (values, cols), strict=True):
                try:
                    self._span(handle, k, p, a, length, out[o0 : o0 + length], index)
                except MemoryError:
                    raise
                except Exception as exc:
                    named = range(int(rows[r0]), int(rows[r1 - 1]) + 1)
                    raise self.files.read_error(exc, p, named, index, k) from exc
        for c in np.unique(cpos[left]).tolist():  # the spans read built the chunk index
            if not self._unplanned[c] and (catalog.table_base[:, c] < 0).any():
                r = int(left[cpos[left] == c][0])
                self._hold_tables(leased[int(runs.slot[r])], int(pos[runs.first[r]]))

    def _know(self, idx: np.ndarray, pos: np.ndarray, rows: np.ndarray, cpos: np.ndarray) -> None:
        """Teach the catalog the batch's sessions: each one's ``indptr`` and chunk tables.

        A session whose chunks are not read raw (compressed) is marked: its runs are always
        decoded. A process's first batches are then one table too, their misses asked for together,
        not a session at a time. A damaged index is left to the reads, which name it.
        """
        catalog = self.catalog
        if catalog.known(cpos):
            return
        tables = (catalog.table_base[:, cpos] >= 0).all(axis=0) | self._unplanned[cpos]
        need = (catalog.ptr_base[cpos] < 0) | ~tables
        rows_needed = np.flatnonzero(need)
        for first in np.unique(cpos[need], return_index=True)[1].tolist():
            i = int(rows_needed[first])
            p, row, index, c = int(pos[i]), int(rows[i]), int(idx[i]), int(cpos[i])
            handle = self.files.leased(p, row, index)
            try:
                try:
                    self.indptr(handle, p)
                except Exception as exc:
                    self.files.note(exc, p, row, index)
                    raise
                if (catalog.table_base[:, c] < 0).any() and not self._unplanned[c]:
                    self._hold_tables(handle, p)
                    if (catalog.table_base[:, c] < 0).any():
                        self._unplanned[c] = self._any_unplanned = True
            finally:
                self.files.file_pool.release(handle)

    def _file_maps(self) -> FileMaps | None:
        """This process's whole-file maps (made at the first read), or ``None`` (not used)."""
        maps = self._maps
        if maps is None and self.maps_whole_files:
            maps = self._maps = FileMaps(2 * self.files.file_pool.max_open)
        return maps

    # ------------------------------------------------------------------ read ahead

    @property
    def canonical_positions(self) -> np.ndarray:
        """Per session, the position whose file holds it (its canonical session), as int64."""
        return self._canon

    @staticmethod
    def raw_fd(handle: Handle, k: int) -> int:
        """The descriptor key ``k`` is read from raw in ``handle`` (-1: not read raw)."""
        return _fd_of(handle, k)

    def reads_warm(self) -> bool:
        """Whether this process's reads come from the page cache alone lately (maps serve)."""
        maps = self._maps
        return maps is not None and maps.warm

    def read_ahead_watcher(self, index: np.ndarray) -> SamplerReadAhead | None:
        """A watcher that asks for the coming batches' reads (``ahead``), for a pass.

        Args:
            index: The dataset's packed index (what the loader's indices name).
        """
        if self._ahead is None:
            self._ahead = CSRAhead(self, self.ahead_plan, self.around[0])
        return self._ahead.watcher(index)

    def _read_table(self, out: np.ndarray, table: np.ndarray) -> bool:
        """Read ``table`` into ``out``; ``False`` where a read failed or came back short."""
        try:  # another thread reading too: a ring call, or copies that take turns
            read_table(
                out,
                table,
                shared=len(self.reading) > 1,
                around=self.around[0],
                what="a piece",
                maps=self._file_maps(),
            )
        except ShortRead:
            return False  # ``_runs`` reads the runs again one by one and names what fails
        return True

    def _hold_tables(self, handle: Handle, pos: int) -> None:
        """Keep where session ``pos``'s ``data`` and ``indices`` lie, if read raw uncompressed.

        Their chunks are indexed first: a session's first rows are then read as one table too
        (its misses asked for at once), not a read at a time.
        """
        parts: list[tuple[int, np.ndarray]] = []
        for k in (0, 1):
            raw, chunked = handle.raws[k], handle.chunked[k]
            if chunked is not None and not chunked.filters:
                try:
                    self.files.index_chunks(handle, k)
                except MemoryError:
                    raise
                except Exception:  # a damaged chunk index: the reads (``fill_run``) name it
                    return
            if raw is not None:
                parts.append((CONTIGUOUS, np.array([raw[1]], np.int64)))
            elif raw_chunks(chunked, self.files.types[k].read_dtype):
                parts.append((chunked.chunks[0], chunked.offsets))
            else:
                return
        self.catalog.hold_tables(self.files.canonical[pos], parts)

    def _span(
        self, handle: Handle, k: int, pos: int, a: int, length: int, out: np.ndarray, index: int
    ) -> None:
        """Elements ``a..a+length-1`` of key ``k`` into ``out``.

        Uncompressed chunks (anndata's default) are read as one table, a read per chunk the span
        touches, straight from the chunk index; everything else through ``fill_run``.
        """
        chunked = handle.chunked[k]
        if not raw_chunks(chunked, out.dtype):
            self.files.fill_run(handle, k, pos, a, length, out, index)
            return
        size, item = chunked.chunks[0], chunked.dtype.itemsize
        offsets = chunked.offsets
        reads: list[tuple[int, int, int, int]] = []  # the span's part in each chunk
        done = 0
        while done < length:
            at = a + done
            band = at // size
            take = min(length - done, (band + 1) * size - at)
            where = int(offsets[band])
            if where < 0:  # never written: the fill value
                out[done : done + take] = chunked.fill
            else:
                reads.append(
                    (chunked.fd, where + (at - band * size) * item, done * item, take * item)
                )
            done += take
        if reads:
            read_table(out, reads, what="a chunk")

    def _check_columns(
        self,
        cols: np.ndarray,
        offsets: np.ndarray,
        s0: int,
        s1: int,
        spos: np.ndarray,
        srows: np.ndarray,
        idx: np.ndarray,
        order: np.ndarray,
    ) -> None:
        """``HDF5FileError`` naming the first row of ``s0:s1`` with a column id out of range."""
        part = cols[int(offsets[s0]) : int(offsets[s1])]
        limit: Any = self._n_vars_max
        if not part.size:
            return
        if part.dtype.kind == "i":  # one pass: a negative id is a huge one unsigned
            if int(part.view(part.dtype.str.replace("i", "u")).max()) < self._n_vars_min:
                return
        elif int(part.min()) >= 0 and int(part.max()) < self._n_vars_min:
            return
        if self._n_vars_min != self._n_vars_max:  # each file's own width
            limit = np.repeat(self.genes.n_vars[spos[s0:s1]], np.diff(offsets[s0 : s1 + 1]))
        outside = (part < 0) | (part >= limit)
        if not outside.any():
            return
        bad = int(np.flatnonzero(outside)[0]) + int(offsets[s0])
        at = int(np.searchsorted(offsets, bad, side="right")) - 1
        pos = int(spos[at])
        n_vars = self.groups[pos].n_vars
        self.files.file_pool.discard(self.files.canonical[pos])
        error = HDF5FileError(
            f"{self.files.named(pos)}, key {self.groups[pos].path!r}: row "
            f"{int(srows[at])} holds column id {int(cols[bad])}, outside 0..{n_vars - 1} "
            f"(shape {(self.groups[pos].n_obs, n_vars)}); the CSR group's 'indices' are "
            "damaged, so the row was not returned. Write the file again (anndata's "
            "write_h5ad) or leave the session out."
        )
        self.files.note(error, pos, int(srows[at]), int(idx[order[at]]))
        raise error


def _fd_of(handle: Handle, k: int) -> int:
    """The descriptor key ``k`` is read from raw (-1: not read raw)."""
    raw, chunked = handle.raws[k], handle.chunked[k]
    if raw is not None:
        return raw[0]
    return chunked.fd if chunked is not None else -1


class _Runs(NamedTuple):
    """A batch's runs (``csrplan.batch_runs``), each with where it is read from."""

    first: np.ndarray  # its first row (request order)
    stop: np.ndarray  # the row after its last
    length: np.ndarray  # its elements
    slot: np.ndarray  # its file among the leased ones
    start: np.ndarray  # its first element in the session's datasets
    cpos: np.ndarray  # its canonical session
