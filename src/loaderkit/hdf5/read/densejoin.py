"""Dense anndata matrices over files whose genes differ: ``join=`` and ``genes=`` for dense keys.

anndata writes a dense ``X`` (and dense ``layers/<name>``, ``raw/X``) as a plain ``(n_obs,
n_vars)`` dataset; its columns are the genes of ``var`` (``raw/var`` for ``raw/X``). Files
collected from many studies hold other genes, in other orders, so their widths differ.
``DenseJoinReader`` is the ``SessionReader`` of such a key when the dataset is given ``join=``
or ``genes=``: the served columns are ``genemap.gene_map``'s, exactly as for a CSR key (the same
meaning, order and refusals). A batch's rows of each file are read at that file's own width
(contiguous rows: one table of reads, a read a run; else memory maps, raw chunks or HDF5, as
any key), then their served columns taken with that file's lookup array (one ``np.take`` and one row
scatter into the ``(batch, n_out)`` batch per file and batch, no per-cell Python). A gene a
file lacks reads 0; a gene served twice is given twice. Keys beside the matrix (``obs``
columns, ``obsm`` embeddings) are read by the base reads. Without ``join=``/``genes=`` dense
keys keep the plain ``SessionReader``.

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

from loaderkit.errors import ConfigError
from loaderkit.hdf5.meta.index import ROW_BITS, ROW_MASK
from loaderkit.hdf5.meta.keyspecs import KeySpec, SessionRecord
from loaderkit.hdf5.meta.layout import check_same_rows
from loaderkit.hdf5.meta.types import Samples
from loaderkit.hdf5.read.genemap import GeneMap, VarTable
from loaderkit.hdf5.read.handles import Handle
from loaderkit.hdf5.read.reader import SessionReader
from loaderkit.hdf5.read.readtable import ShortRead, read_table

__all__ = ["DenseJoinReader", "check_matrix", "is_dense_matrix"]


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


class DenseJoinReader(SessionReader):
    """Reads a dense anndata matrix (key 0) whose served columns ``configure`` decides.

    Built with the arguments of ``SessionReader``, ``table`` (each session's var index and
    width) and ``name`` (the matrix's) among them. ``configure`` (the base's) accepts only the
    form ``"csr"``, its default: a dense key is served dense.

    Example:
        >>> DenseJoinReader.forms
        ('csr',)
    """

    table: VarTable  # a matrix: its columns always mapped (``configure``), samples sized
    genes: GeneMap
    n_out: int

    def __init__(self, *, table: VarTable, name: str, **kwargs: Any) -> None:
        super().__init__(table=table, name=name, **kwargs)
        #: The matrix's rows as the first file stores them (its width, its dtype).
        self.stored = self.files.types[0]
        self._lookups: list[tuple[np.ndarray, np.ndarray] | None] = []
        self.files.keep_in_runs(0)  # read here, file by file at its own width: never held

    def _serve_columns(self, genes: GeneMap) -> None:
        """A sample is the served columns: key 0's row type and size, each file's lookup."""
        types = list(self.files.types)
        types[0] = dataclasses.replace(self.stored, row_shape=(genes.n_out,))
        self.files.types = tuple(types)
        self.files.row_bytes[0] = genes.n_out * self.stored.read_dtype.itemsize
        self._lookups = _lookups(genes)

    # ------------------------------------------------------------------ reads

    def _read_key(
        self,
        k: int,
        idx: np.ndarray,
        keys: np.ndarray,
        order: np.ndarray | None,
        starts: np.ndarray,
    ) -> tuple[Samples, Any]:
        if k:
            return super()._read_key(k, idx, keys, order, starts)
        tensor, out = self.memory.buffer(idx.size, (self.n_out,), self.stored.mem_dtype)
        sessions = keys >> ROW_BITS
        by = np.argsort(sessions, kind="stable")
        cuts = np.flatnonzero(sessions[by][1:] != sessions[by][:-1]) + 1
        for slots in np.split(by, cuts) if by.size else ():
            pos, index = int(sessions[slots[0]]), int(idx[slots[0]])
            rows, inverse = np.unique(keys[slots] & ROW_MASK, return_inverse=True)
            try:
                handle = self.files.file_pool.lease(self.files.canonical[pos])
            except Exception as exc:
                self.files.note(exc, pos, int(rows[0]), index)
                raise
            try:
                buf = self._rows(handle, pos, rows, index, wrap=True)
            except BaseException:
                self.files.file_pool.release(handle)
                raise
            self.files.done(handle, pos, index)
            if rows.size == slots.size:  # no row twice: row i of ``buf`` is one sample's
                slots[inverse.reshape(-1)] = slots.copy()
                self._scatter(out, slots, buf, pos)
            else:
                self._scatter(out, slots, buf[inverse.reshape(-1)], pos)
        return functools.partial(list, out), tensor

    def _one(self, handle: Handle, k: int, pos: int, row: int, index: int) -> Any:
        if k:
            return super()._one(handle, k, pos, row, index)
        buf = self._rows(handle, pos, np.array([row], np.int64), index, wrap=False)
        out = np.empty((1, self.n_out), self.stored.mem_dtype)
        self._scatter(out, np.zeros(1, np.intp), buf, pos)
        return out[0]

    def _rows(
        self, handle: Handle, pos: int, rows: np.ndarray, index: int, *, wrap: bool
    ) -> np.ndarray:
        """Rows ``rows`` (sorted, unique) of session ``pos``'s matrix, at its own width."""
        width = self.table.n_vars[pos]
        dtype = self.stored.read_dtype
        buf = np.empty((rows.size, width), dtype)
        row_bytes = width * dtype.itemsize
        cuts = (np.flatnonzero(rows[1:] != rows[:-1] + 1) + 1).tolist()
        mapped, raw = handle.maps[0], handle.raws[0]
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
                raise self.files.read_error(exc, pos, range(a, a + k1 - k0), index, 0) from exc
            return buf
        for a, (k0, k1) in zip(firsts, runs, strict=True):
            try:
                if mapped is not None:
                    buf[k0:k1] = mapped[a : a + k1 - k0]
                else:  # raw chunks or HDF5: the dataset's own shape
                    self.files.fill_run(handle, 0, pos, a, k1 - k0, buf[k0:k1], index)
            except MemoryError:
                raise
            except Exception as exc:
                if not wrap:
                    raise
                raise self.files.read_error(exc, pos, range(a, a + k1 - k0), index, 0) from exc
        return buf

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
