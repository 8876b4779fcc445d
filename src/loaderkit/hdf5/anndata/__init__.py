"""AnnData's own room: ``.h5ad`` matrices, their genes, the per-cell columns beside them.

Imports go down only: to ``loaderkit.hdf5.read`` (the files part, the row reader, the one
read primitive) and ``loaderkit.hdf5.meta``; ``convert``, ``remote`` and ``dataset`` import
this package through the names below, never ``read`` (the row reader knows nothing of it).

- ``encoding``: how anndata stores things in HDF5 (``CSRGroup``, categoricals, nullable
  columns, var names), read as facts;
- ``obs``: ``ObsTable``, a file's ``obs`` columns read as numpy arrays (``cells=``);
- ``cells``: ``choose_cells``, the cells ``cells=fn`` chose in every file (``CellChoice``);
- ``weights``: ``balanced_weights``, draws balanced over a categorical ``obs`` column;
- ``genemap``: which column of each file a batch column is (``join=``, ``genes=``): one lookup
  array per distinct var index, applied per batch;
- ``labels``: ``LabelKey``, per-cell anndata columns as served (a categorical's codes on one
  shared list, ``None`` where a value is missing), and ``LabelColumns``, which finds them;
- ``sessions``: ``csr_sessions``, what every file holds of a CSR key (shape, ``indptr``,
  ``var``) and of the per-cell keys beside it, inspected once where the dataset is built;
- ``csrplan``: where a batch of CSR rows lies (``SpanCatalog``: indptr and chunk tables);
- ``forms``: what a batch of CSR rows becomes (sparse CSR tensor, dense rows, tokens);
- ``ahead``: ``CSRAhead``, a CSR matrix's coming rows planned and asked for ahead;
- ``csrmatrix``: ``CSRMatrix``, the rows of a CSR group read as runs of their spans;
- ``densejoin``: ``DenseColumns``, a dense matrix (``X``, ``layers/<name>``, ``raw/X``) under
  ``join=``/``genes=``: each file's rows at its own width mapped onto the served columns;
- ``keyreader``: ``AnnDataReader``, the matrix part beside a row reader for the other keys,
  labels served: the reader of every AnnData key.

Example:
    >>> from loaderkit.hdf5.anndata import AnnDataReader, CSRMatrix
    >>> CSRMatrix.keys
    (0, 1)
"""

from __future__ import annotations

from loaderkit.hdf5.anndata.cells import CellChoice, choose_cells
from loaderkit.hdf5.anndata.csrmatrix import FORMS, CSRMatrix
from loaderkit.hdf5.anndata.densejoin import DenseColumns, check_matrix, is_dense_matrix
from loaderkit.hdf5.anndata.encoding import (
    CSRGroup,
    check_csr,
    obs_column,
    shared_categories,
    sparse_group,
    var_names,
    var_path,
)
from loaderkit.hdf5.anndata.genemap import VarTableBuilder, gene_map
from loaderkit.hdf5.anndata.keyreader import AnnDataReader, matrix_arguments_refused
from loaderkit.hdf5.anndata.labels import LabelColumns, LabelKey
from loaderkit.hdf5.anndata.sessions import CSRSessions, csr_sessions
from loaderkit.hdf5.anndata.weights import balanced_weights

__all__ = [
    "FORMS",
    "AnnDataReader",
    "CSRGroup",
    "CSRMatrix",
    "CSRSessions",
    "CellChoice",
    "DenseColumns",
    "LabelColumns",
    "LabelKey",
    "VarTableBuilder",
    "balanced_weights",
    "check_csr",
    "check_matrix",
    "choose_cells",
    "csr_sessions",
    "gene_map",
    "is_dense_matrix",
    "matrix_arguments_refused",
    "obs_column",
    "shared_categories",
    "sparse_group",
    "var_names",
    "var_path",
]
