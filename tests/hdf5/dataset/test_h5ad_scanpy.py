"""scanpy's bundled ``10x_pbmc68k_reduced.h5ad``, row for row as anndata reads it.

A file written by an anndata before 0.7 (legacy ``h5sparse`` encoding): ``raw.X`` is a CSR
group (700 x 765, float32, gzip chunks of 2,725 values), ``X`` a dense gzip-chunked dataset,
``var``/``raw.var`` compound tables. It is not vendored (1.77 MB, the tests' data stays small):
the test reads it from

* ``$LOADERKIT_PBMC68K_REDUCED``: the ``.h5ad`` itself or a scanpy wheel holding it
  (``pip download scanpy --no-deps -d DIR``; scanpy is BSD-3-Clause), else
* an installed scanpy's ``scanpy/datasets/`` (found without importing scanpy),

and is skipped when neither is there.
"""

from __future__ import annotations

import importlib.util
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from loaderkit import DataLoader
from loaderkit.errors import PerformanceHint
from loaderkit.hdf5 import HDF5SessionDataset

anndata = pytest.importorskip("anndata")

NAME = "10x_pbmc68k_reduced.h5ad"
MEMBER = f"scanpy/datasets/{NAME}"


def _find(tmp: Path) -> Path | None:
    given = os.environ.get("LOADERKIT_PBMC68K_REDUCED")
    if given:
        path = Path(given)
        if path.suffix == ".h5ad":
            return path
        with zipfile.ZipFile(path) as wheel:  # a scanpy wheel
            return Path(wheel.extract(MEMBER, tmp))
    spec = importlib.util.find_spec("scanpy")
    if spec is not None and spec.origin is not None:
        path = Path(spec.origin).parent / "datasets" / NAME
        if path.exists():
            return path
    return None


@pytest.fixture(scope="module")
def pbmc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = _find(tmp_path_factory.mktemp("scanpy"))
    if path is None:
        pytest.skip(
            f"scanpy's {NAME} not found: set LOADERKIT_PBMC68K_REDUCED to it or to a scanpy "
            "wheel (pip download scanpy --no-deps -d DIR)"
        )
    return path


@pytest.fixture(scope="module")
def adata(pbmc: Path) -> object:
    with pytest.warns(Warning):  # anndata's OldFormatWarning for the pre-0.7 encoding
        return anndata.read_h5ad(pbmc)


def test_legacy_raw_x_rows_equal_anndata(pbmc: Path, adata: object) -> None:
    raw = adata.raw  # type: ignore[attr-defined]
    truth = raw.X.toarray()
    assert truth.shape == (700, 765)
    with HDF5SessionDataset([pbmc], key="raw.X") as ds:
        assert len(ds) == 700 and ds.handles.n_vars == 765
        assert ds.handles.var_names == list(raw.var_names)
        for i in range(len(ds)):  # every row: column ids (stored descending) served increasing
            row, want = ds[i], raw.X[i]
            order = np.argsort(want.indices)
            assert np.array_equal(row._indices().numpy()[0], want.indices[order])
            assert np.array_equal(row._values().numpy(), want.data[order])
        batch = next(iter(DataLoader(ds, batch_size=700)))
        assert batch.layout == torch.sparse_csr
        parts = (batch.crow_indices(), batch.col_indices(), batch.values())
        torch.sparse_csr_tensor(*parts, batch.shape, check_invariants=True)  # sorted, in range
        assert np.array_equal(batch.to_dense().numpy(), truth)
    with HDF5SessionDataset([pbmc], key="raw.X", sparse="dense") as ds:
        with DataLoader(ds, batch_size=64, num_workers=2) as loader:  # 2 worker processes
            assert np.array_equal(np.concatenate([b.numpy() for b in loader]), truth)
        with DataLoader(ds, batch_size=64, shuffle=True, seed=0, num_workers=2) as loader:
            got = np.concatenate([b.numpy() for b in loader])
        assert np.array_equal(np.sort(got, axis=0), np.sort(truth, axis=0))


def test_dense_x_rows_equal_anndata(pbmc: Path, adata: object) -> None:
    x = np.asarray(adata.X)  # type: ignore[attr-defined]
    with pytest.warns(PerformanceHint, match="one row spans 8 chunks"):  # chunks of 44 x 96
        ds = HDF5SessionDataset([pbmc], key="X")
    with ds:
        assert len(ds) == x.shape[0] == 700
        assert all(np.array_equal(ds[i], x[i]) for i in range(len(ds)))
