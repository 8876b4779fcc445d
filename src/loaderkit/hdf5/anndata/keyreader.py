"""``AnnDataReader``: an AnnData key's reader, a matrix part beside a row reader, labels served.

Three parts, composed (none is a ``SessionReader`` subclass):

* the **matrix** (``matrix``): a CSR group's rows (``csrmatrix.CSRMatrix``), a dense matrix
  whose files' genes differ mapped onto the served columns (``densejoin.DenseColumns``), or
  none (a dense matrix read as stored is a key like any other);
* the **row reader** (``rows``, a ``SessionReader`` over the same files) for every other key:
  ``obs`` columns, ``obsm`` embeddings, a dense matrix read as stored;
* the **labels** (``served``): per key of the files, how a per-cell anndata column's rows are
  served (``labels.LabelKey``: a categorical's codes shared across files, missing values).

``configure`` decides the served columns (``genemap.gene_map``: ``join=``, ``genes=``) and the
form (``sparse=``). It answers the reader contract (``loaderkit.hdf5.read.reader.Reader``)
and the dataset's AnnData questions (``genes``, ``n_out``, ``served``, ``missing_values``).

Example:
    >>> AnnDataReader.configure.__name__
    'configure'
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from loaderkit.batches.contract import BatchMemory, RowBatch
from loaderkit.errors import ConfigError
from loaderkit.hdf5.anndata.genemap import GeneMap, VarTable, gene_map
from loaderkit.hdf5.anndata.labels import LabelKey, served_parts, served_values
from loaderkit.hdf5.read.chunkio import ReadPath
from loaderkit.hdf5.read.handles import Handle
from loaderkit.hdf5.read.reader import ReadFacts, SessionReader, row_batch

__all__ = ["AnnDataReader", "MatrixPart", "matrix_arguments_refused"]


class MatrixPart(ReadFacts, Protocol):
    """What ``AnnDataReader`` asks of its matrix part (``CSRMatrix``, ``DenseColumns``).

    Example:
        >>> "serve" in MatrixPart.__dict__
        True
    """

    @property
    def keys(self) -> tuple[int, ...]:
        """The files' keys the part reads (the rest are the row reader's)."""
        ...

    @property
    def forms(self) -> tuple[str, ...]:
        """The forms a batch may be served in (``sparse=``)."""
        ...

    @property
    def genes(self) -> GeneMap:
        """The served columns, and where each file's go."""
        ...

    @property
    def n_out(self) -> int:
        """Columns of a sample."""
        ...

    @property
    def sparse_samples(self) -> bool:
        """Whether samples are sparse tensors."""
        ...

    def serve(self, form: str, genes: GeneMap) -> None:
        """Serve batches as ``form``, the columns ``genes`` maps."""
        ...

    def use_memory(self, memory: BatchMemory) -> None:
        """Write batches where ``memory`` says."""
        ...

    def read_batch(self, idx: np.ndarray, keys: np.ndarray) -> RowBatch:
        """The matrix's rows of packed ``keys`` as one batch."""
        ...

    def read_one(self, index: int, pos: int, row: int) -> Any:
        """The matrix's row ``row`` of session ``pos``."""
        ...

    @property
    def reading(self) -> list[None]:
        """One entry per thread inside a batch read of the matrix now."""
        ...

    def fit_memory(self, memory: int | None, source: str | None) -> None:
        """Fit what is read around a miss and ahead to ``memory``."""
        ...

    def read_ahead_watcher(self, index: np.ndarray) -> Any | None:
        """A watcher of the coming rows of packed ``index``, or ``None``."""
        ...

    def read_path(self, path: ReadPath) -> ReadPath:
        """How the matrix's keys are read: ``path`` (the files'), amended."""
        ...

    def session_rows(self) -> list[int]:
        """Samples per session."""
        ...

    def chunk_rows(self) -> list[int]:
        """Rows per storage chunk of each session."""
        ...

    def close(self) -> None:
        """Drop what this process holds for the matrix (the files stay open)."""
        ...


class AnnDataReader:
    """An AnnData key's reader: the matrix part, the row reader of the other keys, the labels.

    Args:
        rows: The row reader of the keys beside the matrix (``keys=``: every key the matrix
            part does not read), over the files every part shares.
        matrix: The matrix part, or ``None`` (no matrix whose columns are genes to map).
        served: Per key of the files, its ``LabelKey`` (``None``: served as read).
        table: The matrix's var indexes, one per file (``None``: no matrix).
        name: The matrix's name (a dict sample's key, messages).

    Example:
        >>> AnnDataReader.read_batch.__name__
        'read_batch'
    """

    def __init__(
        self,
        rows: SessionReader,
        *,
        matrix: MatrixPart | None,
        served: Sequence[LabelKey | None],
        table: VarTable | None = None,
        name: str | None = None,
    ) -> None:
        self.rows = rows
        self.files = rows.files
        self.matrix = matrix
        #: Per key of the files, how an anndata column's rows are served.
        self.served = tuple(served) or (None,) * len(self.files.specs)
        self.table = table
        self.name = name if name is not None else (self.files.key_names or [""])[0]
        #: How a matrix's rows are served (one of the matrix part's ``forms``).
        self.form = "csr"
        #: The dataset's packed index (``Reader.index``).
        self.index: np.ndarray = np.empty(0, np.int64)
        #: What decides a sample's content besides the index (the matrix's column map).
        self.content_parts: list[bytes] = []
        self._labels = [self.served[k] for k in rows.keys]  # the row reader's keys' labels

    # ------------------------------------------------------------------ the AnnData facts

    @property
    def single(self) -> bool:
        """A sample is one key's row, not a dict of keys."""
        return self.rows.single

    @property
    def genes(self) -> GeneMap | None:
        """The served columns, and where each file's go (``None``: no matrix)."""
        return None if self.matrix is None else self.matrix.genes

    @property
    def n_out(self) -> int | None:
        """Columns of a matrix's sample (``None``: no matrix)."""
        return None if self.matrix is None else self.matrix.n_out

    @property
    def missing_values(self) -> bool:
        """Whether a label's rows may be missing (a nullable column)."""
        return any(label is not None and label.masks is not None for label in self.served)

    @property
    def sparse_samples(self) -> bool:
        """Whether samples are sparse rows: a CSR matrix served as ``"csr"``."""
        return self.matrix is not None and self.matrix.sparse_samples

    def configure(self, form: str = "csr", genes: Any = None, join: str | None = None) -> None:
        """Serve the matrix's rows as ``form``, the columns ``join`` and ``genes`` give.

        Args:
            form: One of the matrix part's ``forms`` (``sparse=``): a sparse matrix's
                ``"csr"``, ``"dense"`` or ``"tokens"``; a dense matrix is served dense.
            genes: ``None`` (every column), var names (a name twice: two columns), integer
                positions or a boolean mask (``genemap.gene_map``).
            join: ``None`` (the files share one var index), ``"outer"`` or ``"inner"``.

        Raises:
            ConfigError: Any of them given where there is no matrix to map, a form this
                matrix has not, an unknown join, files whose var indexes differ without
                ``join=`` or ``genes=`` names, or a ``genes=`` that selects no column of the
                files (each named by ``gene_map``).
        """
        matrix = self.matrix
        if matrix is None or self.table is None:
            if form != "csr" or genes is not None or join is not None:
                raise matrix_arguments_refused(form, self.files.key_names)
            return
        if form not in matrix.forms:
            if len(matrix.forms) > 1:
                raise ConfigError(f"sparse={form!r}: expected one of {list(matrix.forms)}.")
            raise ConfigError(
                f"sparse={form!r} applies to a sparse (CSR) matrix; key {self.name!r} is a "
                "dense matrix, served as dense rows: leave sparse= unset."
            )
        self.form = form
        mapped = gene_map(self.table, join, genes, key=self.name, where=self.files.where())
        matrix.serve(form, mapped)
        self.content_parts = [b"columns", *mapped.digest_parts()]

    # ------------------------------------------------------------------ the reader contract

    @property
    def fills_chunk_buffer(self) -> bool:
        """Reads fill a chunk buffer per open file (the matrix's reads, or the rows')."""
        matrix = self.matrix
        return self.rows.fills_chunk_buffer if matrix is None else matrix.fills_chunk_buffer

    @property
    def maps_whole_files(self) -> bool:
        """Whether warm tables are copied out of whole-file maps (a CSR matrix's may be)."""
        return self.matrix is not None and self.matrix.maps_whole_files

    @property
    def matrix_nbytes(self) -> list[int] | None:
        """Per session, bytes of a sparse matrix's values and column ids (``None``: none)."""
        return None if self.matrix is None else self.matrix.matrix_nbytes

    def use_memory(self, memory: BatchMemory) -> None:
        """Write the batches this process reads where ``memory`` says (every part)."""
        self.rows.use_memory(memory)
        if self.matrix is not None:
            self.matrix.use_memory(memory)

    def fit_memory(self, memory: int | None, source: str | None = None) -> None:
        """Fit what a CSR matrix reads around a miss and ahead to ``memory`` (else nothing)."""
        if self.matrix is not None:
            self.matrix.fit_memory(memory, source)

    def read_ahead_watcher(self) -> Any | None:
        """A CSR matrix's watcher of the coming rows (``ahead``); ``None`` otherwise."""
        return None if self.matrix is None else self.matrix.read_ahead_watcher(self.index)

    def read_paths(self, handle: Handle) -> dict[str, ReadPath]:
        """Per key name, how its rows are read from ``handle``'s file (``ReadPath``)."""
        paths = self.files.read_paths(handle)
        if self.matrix is not None:
            for k in self.matrix.keys:
                name = self.files.specs[k].name
                if name in paths:
                    paths[name] = self.matrix.read_path(paths[name])
        return paths

    def session_rows(self) -> list[int]:
        """Samples per session: a CSR group's cells, else the rows of the files' first key."""
        return self.rows.session_rows() if self.matrix is None else self.matrix.session_rows()

    def chunk_rows(self) -> list[int]:
        """Rows per storage chunk of each session: where blocks are cut."""
        return self.rows.chunk_rows() if self.matrix is None else self.matrix.chunk_rows()

    def threads_reading(self) -> int:
        """How many threads are inside a batch read now (this one included)."""
        inside = 0 if self.matrix is None else len(self.matrix.reading)
        return max(inside, self.rows.threads_reading())

    def close(self) -> None:
        """Close the matrix part's process-local parts, then the files (the row reader's)."""
        matrix = self.__dict__.get("matrix")  # absent where construction failed
        if matrix is not None:
            matrix.close()
        rows = self.__dict__.get("rows")
        if rows is not None:
            rows.close()

    # ------------------------------------------------------------------ reads

    def read_one(self, index: int, pos: int, row: int) -> Any:
        """Sample ``index`` (session ``pos``, ``row``): the matrix's row and the labels'.

        Unless the key was one path (``single``), ``{name: row, label: value...}``: a
        categorical's value its shared code (``numpy.int64``), others as stored.

        Raises:
            ConfigError: The rows have no torch type (``SessionReader.type_error``).
        """
        if self.rows.type_error is not None:
            raise ConfigError(str(self.rows.type_error))
        sample: dict[str, Any] = {}
        if self.matrix is not None:
            row_of = self.matrix.read_one(index, pos, row)
            if self.single:
                return row_of
            sample[self.name] = row_of
        keys = self.rows.keys
        values = self.rows.read_keys(index, pos, row, keys)
        values = served_values(
            self.served, keys, values, (pos, row), self.files.ids, self.files.paths
        )
        if self.matrix is None and self.single:
            return values[0]
        sample.update(zip(self.rows.names, values, strict=True))
        return sample

    def read_batch(self, idx: np.ndarray, keys: np.ndarray) -> RowBatch:
        """The samples of packed ``keys`` (dataset indices ``idx``) as one finished batch.

        Unless ``single``, a dict batch ``{name: matrix batch, label: batch...}`` (a
        categorical's codes as shared int64 codes).
        """
        names: list[str] = []
        parts: list[tuple[Any, Any]] = []
        ragged: list[str | None] = []
        if self.matrix is not None:
            batch = self.matrix.read_batch(idx, keys)
            if self.single:
                return batch
            names, parts, ragged = [self.name], [(batch.copy, batch.tensor)], [None]
        if self.rows.keys:
            beside = self.rows.read_parts(idx, keys)
            files = self.files
            beside = served_parts(
                self._labels, beside, keys, files.ids, files.paths, self.rows.memory
            )
            names += self.rows.names
            parts += beside
            ragged += self.rows.ragged_names
        return row_batch(names, parts, ragged, self.single)


def matrix_arguments_refused(form: str, key_names: Sequence[str]) -> ConfigError:
    """The error for ``sparse=``, ``genes=`` or ``join=`` given where no matrix maps columns.

    Example:
        >>> str(matrix_arguments_refused("dense", ["betas"])).split(";")[-1]
        " key 'betas' is none: leave them unset (its rows are read as stored)."
    """
    names = key_names[0] if len(key_names) == 1 else list(key_names)
    return ConfigError(
        f"sparse={form!r}, genes= and join= apply to an anndata matrix (sparse= to "
        "a CSR one; genes= and join= to X, layers/<name> or raw/X, dense too, as "
        f"the first key); key {names!r} is none: leave them unset (its rows are read as stored)."
    )
