"""``H5ADDataset``: an ``HDF5SessionDataset`` over AnnData ``.h5ad`` files, with their options.

``HDF5SessionDataset(files, key="X")`` already serves a CSR matrix's rows (a batch is one
``torch.sparse_csr_tensor``); this subclass adds what only single-cell matrices have: the form
a batch takes (``sparse=``), a gene subset read out of the rows (``genes=``), and the var index
(``var_names``). Reads stay those of ``loaderkit.hdf5.read.csrrows.CSRReader``.
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from loaderkit.errors import ConfigError
from loaderkit.hdf5.dataset.dataset import HDF5SessionDataset
from loaderkit.hdf5.read.csrrows import FORMS, CSRReader

__all__ = ["H5ADDataset"]


class H5ADDataset(HDF5SessionDataset):
    """Rows of an AnnData matrix (``X``, ``raw/X``, legacy ``raw.X``, ``layers/<name>``) per sample.

    Every file is a session; their ``var`` indexes must agree (names and order). See
    docs/single-cell.md.

    Args:
        files: As ``HDF5SessionDataset``'s: paths of ``.h5ad`` files (or a mapping id -> path).
        key: The matrix: ``"X"`` (default), ``"raw/X"``, ``"raw.X"`` (legacy files),
            ``"layers/<name>"``; a dense matrix (or ``obsm/<name>``) reads as
            ``HDF5SessionDataset`` reads it (then ``sparse`` and ``genes`` must stay unset).
        sparse: What a CSR batch becomes: ``"csr"`` (default) one ``torch.sparse_csr_tensor``
            ``(batch, n_vars)`` of the file's value dtype (``.to_dense()`` it on the GPU), a
            sample a 1-D ``torch.sparse_coo_tensor``; ``"dense"`` a dense ``(batch, n_vars)``
            tensor filled from the sparse values (a sample a numpy row); ``"tokens"``
            ``{"genes": Padded, "values": Padded}`` (a sample ``{"genes": int64 ids,
            "values": values}``), padded with 0 as ``pad_collate`` pads.
        genes: Only these columns, renumbered ``0..len-1``: var names (in the order given) or
            a boolean mask over the var index. Applied in the read.
        **options: Any other ``HDF5SessionDataset`` argument (``max_open_files``,
            ``memory_map``, ``h5py_options``...).

    Raises:
        ConfigError: ``sparse``/``genes`` for a key that is not a CSR matrix, an unknown
            ``sparse``, unknown genes; and whatever ``HDF5SessionDataset`` raises (CSC
            matrices, var indexes that differ between files).
        HDF5FileError: A damaged CSR group (file, row and what is wrong).

    Example:
        >>> import anndata, numpy as np, scipy.sparse, tempfile, os  # doctest: +SKIP
        >>> path = os.path.join(tempfile.mkdtemp(), "a.h5ad")  # doctest: +SKIP
        >>> anndata.AnnData(scipy.sparse.random(10, 4, 0.5, "csr", np.float32)).write_h5ad(path)
        ... # doctest: +SKIP
        >>> H5ADDataset([path], sparse="dense")[0].shape  # doctest: +SKIP
        (4,)
    """

    def __init__(
        self,
        files: Mapping[Hashable, str | os.PathLike[str]] | Sequence[str | os.PathLike[str]],
        *,
        key: str = "X",
        sparse: str = "csr",
        genes: Sequence[str] | np.ndarray | None = None,
        **options: Any,
    ) -> None:
        if sparse not in FORMS:
            raise ConfigError(f"sparse={sparse!r}: expected one of {list(FORMS)}.")
        super().__init__(files, key=key, **options)
        self.sparse = sparse
        self.genes = genes
        reader = self._reader
        if isinstance(reader, CSRReader):
            reader.configure(sparse, genes)
        elif sparse != "csr" or genes is not None:
            raise ConfigError(
                f"sparse={sparse!r}, genes=... apply to CSR matrices; key {key!r} is dense. "
                "Leave them unset (dense rows are read as they are)."
            )

    @property
    def var_names(self) -> list[str] | None:
        """The var index the files share (gene names, column order), before ``genes``.

        ``None`` for a dense key or files without one.
        """
        reader = self._reader
        return list(reader.var) if isinstance(reader, CSRReader) and reader.var else None

    @property
    def n_vars(self) -> int:
        """Columns of a sample (after ``genes``)."""
        reader = self._reader
        if isinstance(reader, CSRReader):
            return reader.n_out
        shape = reader.types[0].row_shape if reader.types else ()
        return int(np.prod(shape)) if shape else 1
