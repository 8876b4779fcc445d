"""What an ``HDF5SessionDataset``'s files and handles say: open files, read paths, types.

``SessionHandles`` is the part the dataset shows as ``ds.handles``, over its reader: this
process's file pool (the open files and their counters), how each key's rows are read and
why (``io_paths``, the plan's ``hdf5_reads`` row, ``read_path``), and the sample's type and
size, and what defines the samples (``samples_key``: a digest resume compares). The reader
owns every fact it reports (session ids, the index, the open files).
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable
from typing import Any, Protocol

import numpy as np

from loaderkit.hdf5.dataset.readmode import ReadMode, describe_read_path
from loaderkit.hdf5.meta.index import unpack_index
from loaderkit.hdf5.meta.inventory import sample_type
from loaderkit.hdf5.meta.types import Kind, RowType
from loaderkit.hdf5.read.chunkio import ReadPath
from loaderkit.hdf5.read.handles import FilePoolInfo
from loaderkit.hdf5.read.reader import Reader

__all__ = ["AnnDataFacts", "SessionHandles"]


class AnnDataFacts(Protocol):
    """What ``SessionHandles`` asks of a dataset's AnnData part (``anndata.AnnDataReader``).

    Example:
        >>> sorted(name for name in vars(AnnDataFacts) if not name.startswith("_"))
        ['genes', 'n_out', 'served']
    """

    @property
    def genes(self) -> Any:
        """The served columns and where each file's go (``genemap.GeneMap``), or ``None``."""
        ...

    @property
    def n_out(self) -> int | None:
        """Columns of a matrix's sample (``None``: no matrix)."""
        ...

    @property
    def served(self) -> tuple[Any, ...]:
        """Per key, how a per-cell anndata column is served (``labels.LabelKey``) or ``None``."""
        ...


class SessionHandles:
    """A session dataset's open files and how its rows are read (``ds.handles``).

    Args:
        reader: The dataset's reader (its file pool, records, keys and types).
        anndata: The dataset's AnnData part (genes, served columns, labels), or ``None``.
        item_fast: The dataset reads samples with the default ``read`` (not overridden).
        mode: How the dataset's class reads batches (``hooks.read_mode``).
        transforms: The class overrides ``transform``.
        label: The dataset's class name, for messages and plan rows.

    Example:
        >>> SessionHandles.file_pool_info.__name__
        'file_pool_info'
    """

    def __init__(
        self,
        reader: Reader,
        *,
        anndata: AnnDataFacts | None = None,
        item_fast: bool,
        mode: ReadMode,
        transforms: bool,
        label: str,
    ) -> None:
        self.reader = reader
        self.anndata = anndata
        self.item_fast = item_fast
        self.mode = mode
        self.transforms = transforms
        self.label = label
        #: How many cells each file gave to ``cells=`` (an ``anndata.cells.CellChoice``:
        #: ``chosen``, ``cells``, ``summary()``); ``None``: every cell, no ``cells=``.
        self.cells: Any = None
        self._samples_key: str | None = None

    def sample_parts(self) -> list[bytes | memoryview]:
        """What defines the dataset's samples, as byte blobs: the packed index first.

        The index says which row (cell) of which session every sample is (``cells=`` and
        ``build_index`` choose it); then what decides a sample's content (a sparse key's
        served columns: ``join=``, ``genes=``). ``samples_key`` digests the parts in this
        order: a part added here changes the digest.

        Example:
            >>> ds.handles.sample_parts()[0]  # doctest: +SKIP
            b'index'
        """
        index = np.ascontiguousarray(self.reader.index, np.int64)
        return [b"index", memoryview(index.data).cast("B"), *self.reader.content_parts]

    def samples_key(self) -> str:
        """A short hex digest of ``sample_parts``, computed once (``LoaderSupport.samples_key``).

        A loader's state records it and resumes only a dataset with the same one.

        Example:
            >>> len(ds.handles.samples_key())  # doctest: +SKIP
            32
        """
        key = self._samples_key
        if key is None:
            digest = hashlib.blake2b(digest_size=16)
            for part in self.sample_parts():
                digest.update(len(part).to_bytes(8, "little"))
                digest.update(part)
            key = self._samples_key = digest.hexdigest()
        return key

    def io_paths(self, session: Hashable | None = None) -> dict[str, ReadPath]:
        """How each key's rows are read from ``session``'s file, and why (``ReadPath``).

        ``"memory map"``, ``"preadv"``, ``"raw chunks"``, ``"decoded chunks"`` and
        ``"column chunks"`` read outside every lock (threads read in parallel); ``"h5py"``
        is the fallback (serial under h5py's global lock), its reason naming what made the
        faster paths decline. Decided per file when it is opened: this opens ``session``'s
        file if it is not open (and closes it again).

        Args:
            session: Session id (default: the first session).

        Returns:
            ``{key name: ReadPath}``.

        Example:
            >>> ds.handles.io_paths()["betas"].kind  # doctest: +SKIP
            'decoded chunks'
        """
        pos = 0 if session is None else self.reader.files.position(session)
        reader = self.reader
        key = reader.files.canonical[pos]
        was_open = reader.files.file_pool.peek(key) is not None
        handle = reader.files.leased(pos, 0, -1)
        try:
            return reader.read_paths(handle)
        finally:
            reader.files.file_pool.release(handle)
            if not was_open:
                reader.files.file_pool.discard(key)

    def io_plan(self) -> list[tuple[str, bool, Any, str]]:
        """The plan row saying how rows are read (``hdf5_reads``), from the first session.

        Returns:
            ``[(name, given, value, reason)]`` (empty for a dataset without keys).
        """
        reader = self.reader
        if not reader.files.specs or not reader.files.ids:
            return []
        if not self.item_fast:
            return [
                (
                    "hdf5_reads",
                    False,
                    "h5py (hooks)",
                    f"{self.label} overrides read: its hooks read under the dataset's "
                    "lock, serially",
                )
            ]
        sources = reader.files.sources
        if sources is not None and sources.cached(0):
            return [
                (
                    "hdf5_reads",
                    False,
                    "per file",
                    "decided when each cached copy is opened (io_paths(session))",
                )
            ]
        paths = self.io_paths()
        if len(paths) == 1:
            value = next(iter(paths.values())).kind
        else:
            value = ", ".join(f"{name}: {path.kind}" for name, path in paths.items())
        reasons = "; ".join(
            f"{name!r}: {path.reason}" + ("" if path.parallel else " (serial under h5py's lock)")
            for name, path in paths.items()
        )
        return [("hdf5_reads", False, value, f"session {reader.files.ids[0]!r}: {reasons}")]

    @property
    def open_files(self) -> int:
        """Number of files this dataset holds open in the current process."""
        return len(self.reader.files.file_pool)

    def file_pool_info(self) -> FilePoolInfo:
        """Statistics of this process's file pool (this dataset's open files).

        Returns:
            ``FilePoolInfo(hits, misses, evictions, opens, open_files, max_open_files)``;
            counters start at zero in every new process (fork or spawn).

        Example:
            >>> ds.handles.file_pool_info().opens  # doctest: +SKIP
            8
        """
        return self.reader.files.file_pool.info()

    @property
    def sample_type(self) -> RowType | None:
        """How a sample is typed (``None`` when ``read`` is overridden); see docs/hdf5.md.

        Example:
            >>> ds.handles.sample_type.kind  # doctest: +SKIP
            <Kind.NUMBER: 'number'>
        """
        reader = self.reader
        if not self.item_fast or not reader.files.types:
            return None
        return sample_type(reader.files.types, reader.files.specs)

    @property
    def sample_nbytes(self) -> int | None:
        """Bytes of one sample as the default ``read`` returns it (``None`` when overridden).

        Counts fixed-size data (numbers, compound rows); ``None`` for variable-length rows.

        Example:
            >>> ds.handles.sample_nbytes  # doctest: +SKIP
            16384
        """
        reader = self.reader
        if (
            not self.item_fast
            or not reader.files.types
            or any(
                rt.kind in (Kind.TEXT, Kind.RAGGED)
                or rt.ragged_field() is not None
                or rt.mem_dtype.hasobject
                for rt in reader.files.types
            )
        ):
            return None
        return sum(reader.files.row_bytes)

    @property
    def var_names(self) -> list[str] | None:
        """A matrix key's var index, before ``genes=``: the files' shared one, or the joined one.

        Under ``join=`` the joined genes (``"outer"``: every gene of any file; ``"inner"``:
        those every file has). ``None`` for a dense key read without ``join=``/``genes=``,
        files without a var index, or files whose indexes differ read with ``genes=`` names
        alone (``columns`` names the served ones).

        Example:
            >>> ds.handles.var_names[:2]  # doctest: +SKIP
            ['MIR1302-2HG', 'FAM138A']
        """
        genes = None if self.anndata is None else self.anndata.genes
        names = None if genes is None else genes.var_names
        return list(names) if names else None

    @property
    def columns(self) -> list[str] | None:
        """The names of a matrix key's served columns, after ``genes=`` and ``join=``.

        Column ``j`` of every batch (``sparse="csr"``/``"dense"``) and gene id ``j`` of
        ``sparse="tokens"`` is ``columns[j]``: ``genes=["B", "A", "B"]`` gives ``["B", "A",
        "B"]``. ``None`` for a dense key read without ``join=``/``genes=``, or files without a
        var index.

        Example:
            >>> ds.handles.columns[:2]  # doctest: +SKIP
            ['CD3E', 'MS4A1']
        """
        genes = None if self.anndata is None else self.anndata.genes
        names = None if genes is None else genes.columns
        return list(names) if names is not None else None

    def categories(self, key: str) -> list[str]:
        """The category names a categorical key's codes index (``codes[i]`` names row i's).

        For a categorical ``obs`` column, beside any matrix or alone (``key=("X",
        "obs/cell_type")``, ``key="obs/cell_type"``): the shared list of every file (the union
        of the files' lists, first seen first; each file's codes are mapped onto it). ``key``
        is the key's path or its name in the sample dict.

        Raises:
            KeyError: ``key`` is not a categorical key of this dataset (the message lists
                those that are).

        Example:
            >>> ds.handles.categories("obs/cell_type")  # doctest: +SKIP
            ['B', 'T', 'NK']
        """
        served = () if self.anndata is None else self.anndata.served
        found = [label for label in served if label is not None and label.categories is not None]
        for label in found:
            if key in (label.name, label.path):
                return list(label.categories or ())
        raise KeyError(
            f"{key!r} is not a categorical key of {self.label}; categorical keys: "
            f"{[label.path for label in found]} (categorical obs columns: key=('X', "
            "'obs/<column>') beside a matrix, or key='obs/<column>' alone)."
        )

    @property
    def n_vars(self) -> int:
        """Columns of a sample: of a matrix key after ``genes``/``join``, else a row's elements."""
        out = None if self.anndata is None else self.anndata.n_out
        if out is not None:
            return out
        shape = self.reader.files.types[0].row_shape if self.reader.files.types else ()
        return int(np.prod(shape)) if shape else 1

    def index_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Read-only ``(session_positions, rows)`` arrays of the whole index.

        ``session_positions[i]`` is the position of sample ``i``'s session in the dataset's
        ``session_ids``; the reader holds the index, packed.

        Example:
            >>> positions, rows = ds.handles.index_arrays()  # doctest: +SKIP
        """
        return unpack_index(self.reader.index)

    @property
    def read_path(self) -> tuple[str, str]:
        """How batches are read (``"batch-native"``, ``"runs"`` or ``"per-sample"``) and why.

        Example:
            >>> ds.handles.read_path[0]  # doctest: +SKIP
            'batch-native'
        """
        kind = self.sample_type
        numbers = kind is None or kind.kind is Kind.NUMBER
        return describe_read_path(self.mode, self.label, self.transforms, numbers)
