"""Dense anndata matrices over files whose genes differ: ``join=`` and ``genes=`` for dense keys.

anndata writes a dense ``X`` (and dense ``layers/<name>``, ``raw/X``) as a plain ``(n_obs,
n_vars)`` dataset; its columns are the genes of ``var`` (``raw/var`` for ``raw/X``). Files
collected from many studies hold other genes, in other orders, so their widths differ.
``DenseColumns`` is the matrix part of such a key's reader when the dataset is given ``join=``
or ``genes=``: the served columns are ``genemap.gene_map``'s, exactly as for a CSR key (the same
meaning, order and refusals). A batch's rows of each file are read at that file's own width
(contiguous rows: one table of reads, a read a run; else memory maps, raw chunks or HDF5, as
any key), then their served columns taken with that file's lookup array (one ``np.take`` and one row
scatter into the ``(batch, n_out)`` batch per file and batch, no per-cell Python). A gene a
file lacks reads 0; a gene served twice is given twice. Keys beside the matrix (``obs``
columns, ``obsm`` embeddings) are read by the row reader the AnnData reader holds. Without
``join=``/``genes=`` a dense key is read as stored.

Example:
    >>> is_dense_matrix("layers/counts"), is_dense_matrix("obsm/X_pca")
    (True, False)
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from loaderkit.batches.contract import PLAIN, BatchMemory, RowBatch
from loaderkit.errors import ConfigError
from loaderkit.hdf5.anndata.genemap import GeneMap, VarTable
from loaderkit.hdf5.meta.index import ROW_BITS, ROW_MASK
from loaderkit.hdf5.meta.keyspecs import KeySpec, SessionRecord
from loaderkit.hdf5.meta.layout import check_same_rows
from loaderkit.hdf5.read.chunkio import ReadPath
from loaderkit.hdf5.read.reader import SessionReader

__all__ = ["DenseColumns", "check_matrix", "is_dense_matrix"]


def is_dense_matrix(path: str) -> bool:
    """Whether key ``path`` names an anndata matrix whose columns are a var index's genes.

    ``X``, ``layers/<name>`` (genes of ``var``) and ``raw/X`` (of ``raw/var``; legacy
    ``raw.X``). ``obsm``/``obs`` keys are per-cell values, not genes.

    Example:
        >>> [is_dense_matrix(p) for p in ("X", "/X", "raw/X", "obs/n_counts")]
        [True, True, True, False]
    """
    path = path.strip("/")
    return path in ("X", "raw/X", "raw.X") or (path.startswith("layers/") and "/" not in path[7:])


def check_matrix(
    records: Sequence[SessionRecord],
    specs: Sequence[KeySpec],
    files: Sequence[tuple[Hashable, str]],
    *,
    columns: bool,
) -> None:
    """Check the rows of a dense matrix key (key 0) and of the keys beside it.

    The matrix's rows are 1-D (``(n_obs, n_vars)``) of one dtype in every file; their widths
    may differ only where ``columns`` (``join=`` or ``genes=`` given): the files are then
    aligned by their var indexes. Every other key has one row shape and dtype everywhere.

    Raises:
        ConfigError: Widths that differ without ``join=``/``genes=`` (naming both files and
            what to pass), matrix rows that are not 1-D or differ in dtype, or other keys
            whose rows differ (``layout.check_same_rows``).

    Example:
        >>> check_matrix([], [], [], columns=True)
    """
    ids = [sid for sid, _ in files]
    paths = [path for _, path in files]
    for k, spec in enumerate(specs[1:], start=1):
        if not spec.members:
            check_same_rows([rec.layouts[k] for rec in records], spec.path, ids, paths)
    if not specs:
        return
    key = specs[0].path
    full = [(pos, rec.layouts[0]) for pos, rec in enumerate(records) if rec.layouts[0].rows]
    if not full:
        return
    first, ref = full[0]
    for pos, layout in full[1:]:
        if layout.row_shape == ref.row_shape and layout.dtype == ref.dtype:
            continue
        if len(layout.row_shape) == 1 == len(ref.row_shape) and layout.dtype == ref.dtype:
            if columns:
                continue
            raise ConfigError(
                f"key {key!r} of session {ids[pos]!r} ({paths[pos]}) has {layout.row_shape[0]} "
                f"columns (genes) where session {ids[first]!r} ({paths[first]}) has "
                f"{ref.row_shape[0]}: the files' var indexes differ. Pass join='outer' (every "
                "gene of any file; absent ones read 0) or join='inner' (the genes every file "
                "has), as anndata.concat does, or genes=[names] to choose the genes."
            )
        check_same_rows([ref, layout], key, [ids[first], ids[pos]], [paths[first], paths[pos]])


class DenseColumns:
    """The served columns of a dense anndata matrix (the files' key 0): a column-mapping step.

    The matrix part of ``reader.AnnDataReader`` where a dense key is given ``join=`` or
    ``genes=``: each file's rows are read at that file's own width by the row reader
    (``SessionReader.stored_rows``), then mapped onto the served columns (``serve``).

    Args:
        rows: The row reader over the same files (it reads the keys beside the matrix).
        table: Each session's var index and width.

    Example:
        >>> DenseColumns.keys, DenseColumns.forms
        ((0,), ('csr',))
    """

    #: The files' key this step serves: the matrix.
    keys = (0,)
    #: A dense key is served dense: only the default form (``sparse=``) is accepted.
    forms = ("csr",)
    #: Samples are dense rows.
    sparse_samples = False

    def __init__(self, rows: SessionReader, table: VarTable) -> None:
        self.rows = rows
        self.files = files = rows.files
        self.table = table
        #: The matrix's rows as the first file stores them (its width, its dtype).
        self.stored = files.types[0]
        self.genes = GeneMap.plain(table)
        self.n_out = self.genes.n_out
        #: Where batches are written in this process (``AnnDataReader.use_memory``).
        self.memory: BatchMemory = PLAIN
        self._lookups: list[tuple[np.ndarray, np.ndarray] | None] = []
        files.keep_in_runs(0)  # read here, file by file at its own width: never held

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["memory"] = PLAIN  # a worker's slot is its own
        return state

    def serve(self, form: str, genes: GeneMap) -> None:
        """A sample is the served columns: key 0's row type and size, each file's lookup."""
        self.genes, self.n_out = genes, genes.n_out
        types = list(self.files.types)
        types[0] = dataclasses.replace(self.stored, row_shape=(genes.n_out,))
        self.files.types = tuple(types)
        self.files.row_bytes[0] = genes.n_out * self.stored.read_dtype.itemsize
        self._lookups = _lookups(genes)

    def use_memory(self, memory: BatchMemory) -> None:
        """Write the batches this process reads where ``memory`` says."""
        self.memory = memory

    # ------------------------------------------------------------------ as the rows are read

    maps_whole_files = False
    matrix_nbytes = None

    @property
    def fills_chunk_buffer(self) -> bool:
        """As the row reader's reads: the matrix is read through it."""
        return self.rows.fills_chunk_buffer

    @property
    def reading(self) -> list[None]:
        """The row reader's threads reading now (the matrix is read through it)."""
        return self.rows.reading

    def fit_memory(self, memory: int | None, source: str | None) -> None:
        """Nothing to fit: rows are read as asked."""

    def read_ahead_watcher(self, index: np.ndarray) -> None:
        """``None``: rows are read when their batch comes."""
        return None

    def read_path(self, path: ReadPath) -> ReadPath:
        """How the matrix's rows are read: as the files say, file by file at its own width."""
        return path

    def session_rows(self) -> list[int]:
        """Rows per session: the row reader's count (the matrix's rows)."""
        return self.rows.session_rows()

    def chunk_rows(self) -> list[int]:
        """Rows per storage chunk of each session: the row reader's count."""
        return self.rows.chunk_rows()

    def close(self) -> None:
        """Nothing held apart from the files (the row reader closes them)."""

    # ------------------------------------------------------------------ reads

    def read_batch(self, idx: np.ndarray, keys: np.ndarray) -> RowBatch:
        """The served columns of packed ``keys``'s rows (dataset indices ``idx``), one batch."""
        tensor, out = self.memory.buffer(idx.size, (self.n_out,), self.stored.mem_dtype)
        files = self.files
        sessions = keys >> ROW_BITS
        by = np.argsort(sessions, kind="stable")
        cuts = np.flatnonzero(sessions[by][1:] != sessions[by][:-1]) + 1
        for slots in np.split(by, cuts) if by.size else ():
            pos, index = int(sessions[slots[0]]), int(idx[slots[0]])
            rows, inverse = np.unique(keys[slots] & ROW_MASK, return_inverse=True)
            try:
                handle = files.file_pool.lease(files.canonical[pos])
            except Exception as exc:
                files.note(exc, pos, int(rows[0]), index)
                raise
            try:
                buf = self.rows.stored_rows(handle, 0, pos, rows, index, wrap=True)
            except BaseException:
                files.file_pool.release(handle)
                raise
            files.done(handle, pos, index)
            if rows.size == slots.size:  # no row twice: row i of ``buf`` is one sample's
                slots[inverse.reshape(-1)] = slots.copy()
                self._scatter(out, slots, buf, pos)
            else:
                self._scatter(out, slots, buf[inverse.reshape(-1)], pos)
        return RowBatch(tensor, functools.partial(list, out))

    def read_one(self, index: int, pos: int, row: int) -> np.ndarray:
        """The served columns of row ``row`` of session ``pos`` (dataset index ``index``).

        The handle is leased for the read, unless this thread holds the hook lock (a
        subclass's ``read`` calling ``super().read()``): no handle is closed under it.
        """
        files = self.files
        locked = files.file_pool.lock.held()
        handle = files.handle(pos, row, index) if locked else files.leased(pos, row, index)
        try:
            buf = self.rows.stored_rows(handle, 0, pos, np.array([row], np.int64), index, wrap=True)
        finally:
            if not locked:
                files.file_pool.release(handle)
        out = np.empty((1, self.n_out), self.stored.mem_dtype)
        self._scatter(out, np.zeros(1, np.intp), buf, pos)
        return out[0]

    def _scatter(self, out: np.ndarray, slots: np.ndarray, buf: np.ndarray, pos: int) -> None:
        """``out[slots]`` = the served columns of ``buf``'s rows (session ``pos``'s).

        One ``np.take`` along the columns (a gene served twice is taken twice), the columns
        the file lacks set to 0, one row scatter; straight into ``out`` where the rows are
        the whole batch in order.
        """
        lookup = self._lookups[pos] if self._lookups else None
        if lookup is None:  # the files' own columns, as stored
            out[slots] = buf
            return
        sources, missing = lookup
        if not buf.shape[1]:  # a file without columns: every served one reads 0
            out[slots] = 0
            return
        whole = slots.size == out.shape[0] and bool((slots == np.arange(slots.size)).all())
        if whole and out.dtype == buf.dtype:
            np.take(buf, sources, axis=1, out=out)
            out[:, missing] = 0
            return
        rows = np.take(buf, sources, axis=1)
        rows[:, missing] = 0
        out[slots] = rows


def _lookups(genes: GeneMap) -> list[tuple[np.ndarray, np.ndarray] | None]:
    """Per file, ``(sources, missing)``: each served column's source column, and those it lacks.

    A column the file lacks has the placeholder source 0 and reads 0. Files that share a var
    index share the arrays (sized by the served columns). ``None`` per file served as stored
    (every column, in order).
    """
    if genes.lut is None:
        return [None] * len(genes.n_vars)
    done: dict[int, tuple[np.ndarray, np.ndarray] | None] = {}
    found: list[tuple[np.ndarray, np.ndarray] | None] = []
    for start, width in zip(genes.offsets.tolist(), genes.n_vars.tolist(), strict=True):
        if start not in done:
            lut = genes.lut[start : start + width]
            if genes.copies is None:
                columns = np.flatnonzero(lut >= 0)
                targets = lut[columns].astype(np.intp)
            else:  # a gene served k times: its column fills k served columns
                first, count, order = genes.copies
                times = count[start : start + width].astype(np.int64)
                columns = np.repeat(np.arange(width), times)
                within = np.arange(columns.size) - np.repeat(np.cumsum(times) - times, times)
                targets = order[first[start : start + width][columns] + within].astype(np.intp)
            sources = np.full(genes.n_out, -1, np.intp)
            sources[targets] = columns
            missing = np.flatnonzero(sources < 0)
            sources[missing] = 0
            plain = width == sources.size and not missing.size and _ordered(sources)
            done[start] = None if plain else (sources, missing)
        found.append(done[start])
    return found


def _ordered(sources: np.ndarray) -> bool:
    return bool((sources == np.arange(sources.size)).all())
