"""Small ``.h5ad`` files for the single-cell tests: written by anndata, and legacy by hand.

``write_current`` uses anndata itself (the test extra's file-writing tool, like PyTables);
``write_legacy`` writes what anndata < 0.7 wrote: ``h5sparse_format``/``h5sparse_shape``
attributes, the raw matrix as the top-level group ``raw.X`` and ``var``/``raw.var`` as
compound tables with an ``index`` field.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import scipy.sparse as sp

CELLS, GENES = 200, 50
GENE_NAMES = [f"gene{i}" for i in range(GENES)]


def matrix(seed: int, cells: int = CELLS, genes: int = GENES) -> sp.csr_matrix:
    """A float32 CSR matrix of small counts, ~10 % nonzero, some rows empty."""
    m = sp.random(cells, genes, density=0.1, format="csr", dtype=np.float32, random_state=seed)
    m.data = np.ceil(m.data * 10).astype(np.float32)
    keep = np.ones(cells, np.float32)
    keep[::17] = 0  # empty rows: spans of length 0
    m = sp.csr_matrix(sp.diags(keep) @ m)
    m.eliminate_zeros()
    return m


def uniform(seed: int, cells: int, genes: int, per: int) -> sp.csr_matrix:
    """A float32 CSR matrix with ``per`` values in every row, at random sorted columns."""
    rng = np.random.default_rng(seed)
    indices = np.sort(rng.random((cells, genes)).argsort(axis=1)[:, :per], axis=1)
    data = rng.integers(1, 9, (cells, per)).astype(np.float32)
    indptr = np.arange(cells + 1, dtype=np.int64) * per
    return sp.csr_matrix((data.ravel(), indices.ravel().astype(np.int32), indptr), (cells, genes))


def write_current(
    path: Path,
    m: sp.csr_matrix,
    *,
    cell_types: Sequence[str | None] = ("B", "T", "NK"),
    **kwargs: Any,
) -> Path:
    """``anndata.AnnData(X=m).write_h5ad(path, **kwargs)`` with var names and obs columns.

    obs: ``cell_type`` (categorical, ``cell_types`` in turn; ``None`` is missing),
    ``n_counts`` (float32 row sums), ``batch`` (int64); obsm: ``X_pca`` (float32, 4 columns).
    """
    import anndata
    import pandas as pd

    cells = np.arange(m.shape[0])
    obs = pd.DataFrame(
        {"cell_type": pd.Categorical(np.array(cell_types, object)[cells % len(cell_types)])},
        index=[f"c{i}" for i in range(m.shape[0])],
    )
    obs["n_counts"] = np.asarray(m.sum(axis=1), np.float32).ravel()
    obs["batch"] = (cells // 50).astype(np.int64)
    adata = anndata.AnnData(X=m, obs=obs, var=pd.DataFrame(index=GENE_NAMES[: m.shape[1]]))
    adata.obsm["X_pca"] = np.stack([cells * 0.5, -cells, cells % 7, m.getnnz(axis=1)], 1).astype(
        np.float32
    )
    adata.layers["counts"] = m
    adata.raw = adata
    adata.write_h5ad(path, **kwargs)
    return path


def write_legacy(path: Path, m: sp.csr_matrix, compression: str | None = "gzip") -> Path:
    """A pre-0.7 ``.h5ad``: ``X`` and ``raw.X`` as legacy ``h5sparse`` CSR groups."""
    n, g = m.shape
    with h5py.File(path, "w") as f:
        for name in ("X", "raw.X"):
            group = f.create_group(name)
            group.attrs["h5sparse_format"] = "csr"
            group.attrs["h5sparse_shape"] = np.array([n, g])
            for part in ("data", "indices", "indptr"):
                group.create_dataset(part, data=getattr(m, part), compression=compression)
        table = np.array([(name.encode(),) for name in GENE_NAMES[:g]], [("index", "S16")])
        f.create_dataset("var", data=table)
        f.create_dataset("raw.var", data=table)
        obs = np.array([(f"c{i}".encode(),) for i in range(n)], [("index", "S16")])
        f.create_dataset("obs", data=obs)
    return path


def categorical_as_v07(path: Path, column: str = "cell_type") -> Path:
    """Rewrite ``obs/<column>`` of a current file as anndata 0.7 stored categoricals.

    The codes become the dataset ``obs/<column>`` whose attribute ``categories`` is an object
    reference to ``obs/__categories/<column>``; ``obs`` is marked ``dataframe`` 0.1.0 so
    anndata reads it with its 0.7 reader.
    """
    with h5py.File(path, "r+") as f:
        obs = f["obs"]
        codes = obs[f"{column}/codes"][()]
        names = obs[f"{column}/categories"].asstr()[()]
        del obs[column]
        cats = obs.create_dataset(f"__categories/{column}", data=names.astype("S"))
        dset = obs.create_dataset(column, data=codes)
        dset.attrs["categories"] = cats.ref
        obs.attrs["encoding-version"] = "0.1.0"
    return path


def write_csr(
    path: Path,
    m: sp.csr_matrix,
    chunks: int | None = None,
    rows: tuple[np.ndarray, np.ndarray] | None = None,
    var: bool = False,
) -> Path:
    """``X`` as a CSR group written by h5py (anndata's attributes), nothing else by default.

    Args:
        chunks: Values a chunk of ``data`` and ``indices`` (``None``: contiguous).
        rows: ``(data, indices)`` to store instead of ``m``'s (same ``indptr``).
        var: Also a legacy ``var`` table of the gene names.
    """
    data, indices = rows if rows is not None else (m.data, m.indices)
    with h5py.File(path, "w") as f:
        x = f.create_group("X")
        x.attrs["encoding-type"], x.attrs["encoding-version"] = "csr_matrix", "0.1.0"
        x.attrs["shape"] = np.array(m.shape)
        for part, values in (("data", data), ("indices", indices)):
            x.create_dataset(part, data=values, chunks=(chunks,) if chunks else None)
        x.create_dataset("indptr", data=m.indptr.astype(np.int64))
        if var:
            names = [(name.encode(),) for name in GENE_NAMES[: m.shape[1]]]
            f.create_dataset("var", data=np.array(names, [("index", "S16")]))  # legacy table
    return path


def write_nullable_strings(
    group: h5py.Group, name: str, values: Sequence[str | None], **kwargs: Any
) -> h5py.Group:
    """``group[name]`` as anndata >= 0.13 with pandas 3 writes a string column (by hand).

    A group with ``encoding-type: nullable-string-array`` (``encoding-version`` 0.1.0,
    ``na-value`` "NA") holding
    ``values`` (variable-length UTF-8 strings, ``""`` where missing; anndata's
    ``string-array`` attributes) and ``mask`` (bool, True where missing; ``array``
    attributes). ``None`` in ``values`` is missing; ``kwargs`` go to both datasets
    (``compression="gzip"``...).
    """
    if name in group:
        del group[name]
    column = group.create_group(name)
    column.attrs["encoding-type"], column.attrs["encoding-version"] = (
        "nullable-string-array",
        "0.1.0",
    )
    column.attrs["na-value"] = "NA"  # anndata 0.13 (pandas 3's missing value); 0.12 has none
    texts = np.array(["" if v is None else v for v in values], dtype=object)
    stored = column.create_dataset("values", data=texts, dtype=h5py.string_dtype(), **kwargs)
    stored.attrs["encoding-type"], stored.attrs["encoding-version"] = "string-array", "0.2.0"
    mask = column.create_dataset("mask", data=np.array([v is None for v in values]), **kwargs)
    mask.attrs["encoding-type"], mask.attrs["encoding-version"] = "array", "0.2.0"
    return column


def as_pandas3(
    path: Path,
    columns: dict[str, Sequence[str | None]] | None = None,
    cells: Sequence[str] | None = None,
    **kwargs: Any,
) -> Path:
    """Rewrite a current file's string indexes as anndata >= 0.13 (pandas 3) stores them.

    ``obs/_index`` (cell names; ``cells`` instead where given) and ``var/_index`` (gene names)
    become ``nullable-string-array`` groups (``write_nullable_strings``); each ``columns``
    entry is added as an ``obs`` string column of that layout (``None``: missing).
    """
    with h5py.File(path, "r+") as f:
        for table in ("obs", "var"):
            index = f[f"{table}/_index"]  # a nullable-string-array group where anndata >= 0.13
            stored = index["values"] if isinstance(index, h5py.Group) else index
            names = stored.asstr()[()].tolist()
            if table == "obs" and cells is not None:
                names = list(cells)
            write_nullable_strings(f[table], "_index", names, **kwargs)
        order = list(f["obs"].attrs["column-order"])
        for name, values in (columns or {}).items():
            write_nullable_strings(f["obs"], name, values, **kwargs)
            order += [] if name in order else [name]
        f["obs"].attrs["column-order"] = np.array(order, dtype=object)
    return path
