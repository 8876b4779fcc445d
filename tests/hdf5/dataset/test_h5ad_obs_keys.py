"""Per-cell ``obs``/``obsm`` keys beside any matrix key of an ``.h5ad``, or alone.

``key=("X", "obs/cell_type")`` on a file whose ``X`` is dense, ``("obsm/X_pca",
"obs/cell_type")`` (the embedding -> cell type classifier), ``layers/<name>``, ``raw/X``, and
``key="obs/cell_type"`` alone serve what the CSR path serves: a categorical's codes on one
category list shared by every file, numbers and strings as stored, ``None`` where a
``nullable-string-array`` says missing. Files are written by anndata itself; every value is
compared with anndata's own reading (across files, with pandas' ``union_categoricals``).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch

from loaderkit import DataLoader, SessionCache, create_dataloader
from loaderkit.errors import ConfigError, HDF5FileError
from loaderkit.hdf5 import HDF5SessionDataset

anndata = pytest.importorskip("anndata")
pd = pytest.importorskip("pandas")

from tests.hdf5.h5adfiles import (  # noqa: E402
    as_pandas3,
    categorical_as_v07,
    matrix,
    write_legacy,
)

CELLS = 120
LABELS = ("obs/cell_type", "obs/n_counts", "obs/batch", "obs/_index", "obs/donor")
TYPES = (("B", "T", "NK"), ("T", "Mono", None, "T"), ("NK", "DC"))


def write_dense(path: Path, k: int, *, sparse: bool = False, **kwargs: Any) -> Path:
    """File ``k`` as anndata writes it: dense ``X`` (CSR where ``sparse``), labels, layers, raw.

    obs: ``cell_type`` (categorical, ``TYPES[k]`` in turn, ``None`` missing), ``n_counts``
    (float32), ``batch`` (int64), ``donor`` (strings kept as strings); obsm ``X_pca``;
    ``layers/counts`` and ``raw/X`` (dense or CSR alike).
    """
    m = matrix(k, cells=CELLS, genes=12)
    cells = np.arange(CELLS)
    obs = pd.DataFrame(
        {"cell_type": pd.Categorical(np.array(TYPES[k], object)[cells % len(TYPES[k])])},
        index=[f"f{k}c{i}" for i in cells],
    )
    obs["n_counts"] = np.asarray(m.sum(axis=1), np.float32).ravel()
    obs["batch"] = (cells // 40 + 10 * k).astype(np.int64)
    obs["donor"] = [f"d{k}{i % 4}" for i in cells]
    x = m if sparse else m.toarray()
    adata = anndata.AnnData(X=x, obs=obs, var=pd.DataFrame(index=[f"g{j}" for j in range(12)]))
    adata.obsm["X_pca"] = np.stack([cells * 0.5 + k, -cells, cells % 7], 1).astype(np.float32)
    adata.layers["counts"] = x * 2
    adata.raw = adata
    adata.write_h5ad(path, convert_strings_to_categoricals=False, **kwargs)
    return path


def _truth(paths: list[Path]) -> dict[str, Any]:
    adatas = [anndata.read_h5ad(p) for p in paths]
    joined = pd.api.types.union_categoricals([a.obs["cell_type"].array for a in adatas])

    def dense(x: Any) -> np.ndarray:
        return np.asarray(x.toarray() if hasattr(x, "toarray") else x)

    return {
        "X": np.concatenate([dense(a.X) for a in adatas]),
        "layers/counts": np.concatenate([dense(a.layers["counts"]) for a in adatas]),
        "raw/X": np.concatenate([dense(a.raw.X) for a in adatas]),
        "obsm/X_pca": np.concatenate([a.obsm["X_pca"] for a in adatas]),
        "obs/cell_type": np.asarray(joined.codes, np.int64),
        "categories": list(joined.categories),
        "obs/n_counts": np.concatenate([a.obs["n_counts"].to_numpy() for a in adatas]),
        "obs/batch": np.concatenate([a.obs["batch"].to_numpy() for a in adatas]),
        "obs/_index": [name for a in adatas for name in a.obs_names],
        "obs/donor": [None if pd.isna(v) else v for a in adatas for v in a.obs["donor"]],
    }


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], dict[str, Any]]:
    """3 files x 120 cells, dense ``X``: uncompressed, gzip, uncompressed; categories differ."""
    root = tmp_path_factory.mktemp("obskeys")
    paths = [
        write_dense(root / "d0.h5ad", 0),
        write_dense(root / "d1.h5ad", 1, compression="gzip"),
        write_dense(root / "d2.h5ad", 2),
    ]
    with h5py.File(paths[0]) as f:  # what this test is about: dense matrices, encoded columns
        assert isinstance(f["X"], h5py.Dataset) and isinstance(f["raw/X"], h5py.Dataset)
        assert f["obs/cell_type"].attrs["encoding-type"] == "categorical"
        # anndata >= 0.13 with pandas 3 writes strings as nullable-string-array groups
        assert f["obs/donor"].attrs["encoding-type"] in ("string-array", "nullable-string-array")
    return paths, _truth(paths)


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (value.to_dense() if value.layout != torch.strided else value).numpy()
    return value


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, list) or isinstance(b, list):
        return list(a) == list(b)
    return np.array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("matrix_key", ["X", "obsm/X_pca", "layers/counts", "raw/X"])
def test_labels_beside_every_dense_matrix_key(
    dense: tuple[list[Path], dict[str, Any]], matrix_key: str
) -> None:
    paths, truth = dense
    assert truth["categories"] == ["B", "NK", "T", "Mono", "DC"]
    key = (matrix_key, *LABELS)
    with HDF5SessionDataset(paths, key=key) as ds:
        assert ds.handles.categories("obs/cell_type") == truth["categories"]
        batch = next(iter(DataLoader(ds, batch_size=len(ds))))
        assert batch["obs/cell_type"].dtype == torch.int64
        for name in key:
            assert _equal(_plain(batch[name]), truth[name]), name
        assert (batch["obs/cell_type"][CELLS : 2 * CELLS] == -1).sum() == CELLS // 4
        rows = [5, 250, 119, 121, 3, 359]  # across files, out of order
        got = ds.__getitems__(rows)
        for j, r in enumerate(rows):
            sample = ds[r]
            assert isinstance(sample["obs/cell_type"], np.int64)
            assert isinstance(sample["obs/_index"], str)
            for name in key:
                assert _equal(sample[name], truth[name][r]), (name, r)
                assert _equal(got[j][name], truth[name][r]), (name, r)


def test_a_label_alone_and_labels_alone(dense: tuple[list[Path], dict[str, Any]]) -> None:
    paths, truth = dense
    with HDF5SessionDataset(paths, key="obs/cell_type") as ds:
        assert len(ds) == 3 * CELLS
        assert ds.handles.categories("obs/cell_type") == truth["categories"]
        batch = next(iter(DataLoader(ds, batch_size=len(ds))))
        assert batch.dtype == torch.int64
        assert np.array_equal(batch.numpy(), truth["obs/cell_type"])
        assert ds[130] == truth["obs/cell_type"][130] and isinstance(ds[130], np.int64)
    with HDF5SessionDataset(paths, key=("obs/cell_type", "obs/n_counts")) as ds:
        batch = next(iter(DataLoader(ds, batch_size=7, sampler=[300, 2, 150, 151, 0, 359, 9])))
        rows = [300, 2, 150, 151, 0, 359, 9]
        assert np.array_equal(batch["obs/cell_type"].numpy(), truth["obs/cell_type"][rows])
        assert np.array_equal(batch["obs/n_counts"].numpy(), truth["obs/n_counts"][rows])
    with HDF5SessionDataset(paths, key="obs/_index") as ds:
        assert next(iter(DataLoader(ds, batch_size=len(ds)))) == truth["obs/_index"]


def test_the_values_the_csr_path_gives(tmp_path: Path) -> None:
    """The same cells with ``X`` dense and ``X`` CSR: the same labels, batch for batch."""
    dense = [write_dense(tmp_path / f"d{k}.h5ad", k) for k in range(3)]
    sparse = [write_dense(tmp_path / f"s{k}.h5ad", k, sparse=True) for k in range(3)]
    key = ("X", *LABELS)
    with HDF5SessionDataset(dense, key=key) as a, HDF5SessionDataset(sparse, key=key) as b:
        assert a.handles.categories("obs/cell_type") == b.handles.categories("obs/cell_type")
        rows = [359, 0, 121, 240, 17, 200]
        for x, y in zip(a.__getitems__(rows), b.__getitems__(rows), strict=True):
            for name in LABELS:
                assert _equal(x[name], y[name]), name
        x, y = (next(iter(DataLoader(ds, batch_size=len(ds)))) for ds in (a, b))
        for name in key:
            assert _equal(_plain(x[name]), _plain(y[name])), name


def _epoch(ds: Any, **options: Any) -> list[dict[str, Any]]:
    with create_dataloader(ds, batch_size=32, seed=7, shuffle=True, **options) as loader:
        return [{name: _plain(value) for name, value in b.items()} for b in loader]


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"num_workers": 2, "multiprocessing_context": "fork"}, id="fork"),
        pytest.param(
            {"num_workers": 2, "multiprocessing_context": "spawn"},
            id="spawn",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            {"num_workers": 2, "multiprocessing_context": "forkserver"},
            id="forkserver",
            marks=pytest.mark.slow,
        ),
        pytest.param({"num_workers": 2, "worker_method": "thread"}, id="threads"),
    ],
)
def test_the_same_batches_with_workers(
    dense: tuple[list[Path], dict[str, Any]], options: dict[str, Any]
) -> None:
    paths, truth = dense
    key = ("obsm/X_pca", "obs/cell_type", "obs/_index", "obs/batch")
    with HDF5SessionDataset(paths, key=key) as ds:
        alone = _epoch(ds, num_workers=0)
        cells = [c for b in alone for c in b["obs/_index"]]
        assert sorted(cells) == sorted(truth["obs/_index"]) and cells != truth["obs/_index"]
        where = {c: i for i, c in enumerate(truth["obs/_index"])}
        for b in alone:  # each cell's label follows the cell
            at = [where[c] for c in b["obs/_index"]]
            assert np.array_equal(b["obs/cell_type"], truth["obs/cell_type"][at])
            assert np.array_equal(b["obsm/X_pca"], truth["obsm/X_pca"][at])
        other = _epoch(ds, **options)
    assert len(other) == len(alone)
    for x, y in zip(alone, other, strict=True):
        assert x.keys() == y.keys() and all(_equal(x[n], y[n]) for n in x)


def test_anndata_07_categoricals_and_pandas3_strings_beside_a_dense_x(tmp_path: Path) -> None:
    v07 = [categorical_as_v07(write_dense(tmp_path / f"v{k}.h5ad", k)) for k in range(2)]
    adatas = [anndata.read_h5ad(p) for p in v07]  # anndata's 0.7 reader
    joined = pd.api.types.union_categoricals([a.obs["cell_type"].array for a in adatas])
    with HDF5SessionDataset(v07, key=("X", "obs/cell_type")) as ds:
        assert ds.handles.categories("obs/cell_type") == list(joined.categories)
        got = next(iter(DataLoader(ds, batch_size=len(ds))))["obs/cell_type"].numpy()
        assert np.array_equal(got, np.asarray(joined.codes))
        assert ds[CELLS + 2]["obs/cell_type"] == joined.codes[CELLS + 2]
    donors = [None if i % 5 == 0 else f"x{i}" for i in range(CELLS)]
    p3 = [
        as_pandas3(write_dense(tmp_path / f"p{k}.h5ad", k), {"donor": donors})
        if k
        else write_dense(tmp_path / f"p{k}.h5ad", k)
        for k in range(2)
    ]
    with h5py.File(p3[0]) as f:  # anndata < 0.13 wrote a dataset: two encodings, refused
        mixed = isinstance(f["obs/donor"], h5py.Dataset)
    if mixed:
        with pytest.raises(ConfigError, match=r"'obs/donor' is a dataset of values in session 0"):
            HDF5SessionDataset(p3, key=("X", "obs/donor"))
    p3 = p3[1:]
    with h5py.File(p3[0]) as f:
        assert f["obs/_index"].attrs["encoding-type"] == "nullable-string-array"
    adata = anndata.read_h5ad(p3[0])
    want = [None if pd.isna(v) else v for v in adata.obs["donor"]]
    with HDF5SessionDataset(p3, key=("obsm/X_pca", "obs/donor", "obs/_index")) as ds:
        batch = next(iter(DataLoader(ds, batch_size=len(ds))))
        assert batch["obs/donor"] == want == donors
        assert batch["obs/_index"] == list(adata.obs_names)
        assert ds[0]["obs/donor"] is None and ds[1]["obs/donor"] == "x1"
    with HDF5SessionDataset(p3, key="obs/donor") as ds:
        assert ds[5] is None and ds[6] == "x6"
        assert ds.__getitems__([5, 6, 10]) == [None, "x6", None]


class _Reads(HDF5SessionDataset):
    """A ``read`` subclass: batches are collated from its samples (the base's, as served)."""

    def read(self, session: Any, row: int) -> Any:
        return super().read(session, row)


def test_samples_of_a_read_subclass_beside_a_dense_x(tmp_path: Path) -> None:
    donors = [None if i % 3 == 0 else f"x{i}" for i in range(CELLS)]
    paths = [as_pandas3(write_dense(tmp_path / f"r{k}.h5ad", k), {"donor": donors}) for k in (0, 1)]
    truth = _truth(paths)
    rows = [0, 1, 2, 125, 124, 3]  # the first cell's donor missing, across files
    key = ("X", "obs/cell_type", "obs/donor", "obs/_index")
    with _Reads(paths, key=key) as ds:
        samples = ds.__getitems__(rows)  # the subclass's samples, read one by one
        assert [sample["obs/donor"] for sample in samples][:2] == [None, "x1"]
        for j, r in enumerate(rows):
            for name in key:
                assert _equal(samples[j][name], truth[name][r]), (name, r)
        # samples that may hold None: loaderkit's collate fills the unset collate_fn, since
        # torch's default_collate refuses None (a batch whose first donor is missing too)
        loader = DataLoader(ds, batch_size=len(rows), sampler=rows)
        assert "None" in loader.plan["collate_fn"].reason
        batch = next(iter(loader))
    assert batch["obs/donor"] == [truth["obs/donor"][r] for r in rows]
    assert batch["obs/donor"][0] is None
    assert batch["obs/_index"] == [truth["obs/_index"][r] for r in rows]
    assert np.array_equal(batch["obs/cell_type"].numpy(), truth["obs/cell_type"][rows])
    assert np.array_equal(batch["X"].numpy(), truth["X"][rows])
    with _Reads(paths, key=("X", "obs/cell_type")) as ds:  # no missing value: not for None
        plan = DataLoader(ds, batch_size=4).plan  # (torch < 2.5 fills it for numpy bools)
        assert "collate_fn" not in plan or "None" not in plan["collate_fn"].reason


# ------------------------------------------------------------------ refused and damaged


def test_refused_by_name(tmp_path: Path) -> None:
    a = write_dense(tmp_path / "a.h5ad", 0)
    plain = tmp_path / "plain.h5ad"  # cell_type stored as numbers, not a categorical
    shutil.copy(a, plain)
    with h5py.File(plain, "r+") as f:
        del f["obs/cell_type"]
        f["obs/cell_type"] = np.zeros(CELLS, np.int64)
    with pytest.raises(
        ConfigError,
        match=rf"'obs/cell_type' is categorical in session 0 .* but a dataset of values in "
        rf"session 1 \({plain}\)",
    ):
        HDF5SessionDataset([a, plain], key=("X", "obs/cell_type"))
    many = tmp_path / "many.h5ad"  # 200 categories: int16 codes beside int8
    adata = anndata.read_h5ad(a)
    adata.obs["cell_type"] = pd.Categorical([f"t{i}" for i in range(CELLS)])
    adata.obs["cell_type"] = adata.obs["cell_type"].cat.add_categories([f"u{i}" for i in range(90)])
    adata.write_h5ad(many)
    with pytest.raises(
        ConfigError, match=rf"codes are int8 in session 0.*int16 in session 1 \({many}\)"
    ):
        HDF5SessionDataset([a, many], key="obs/cell_type")
    nullable = tmp_path / "nullable.h5ad"
    adata = anndata.read_h5ad(a)
    adata.obs["umis"] = pd.array([1, None] * (CELLS // 2), dtype="Int64")
    adata.write_h5ad(nullable)
    with pytest.raises(ConfigError, match=rf"'obs/umis' of session 0 \({nullable}\) is a nullable"):
        HDF5SessionDataset([nullable], key=("obsm/X_pca", "obs/umis"))
    legacy = write_legacy(tmp_path / "legacy.h5ad", matrix(0))  # obs: one compound table
    with h5py.File(legacy, "r+") as f:  # a dense X, as scanpy's pbmc68k_reduced stores it
        del f["X"]
        f["X"] = matrix(0).toarray()
    for key in ("obs/index", ("X", "obs/index")):
        with pytest.raises(
            ConfigError, match=r"'obs/index'.*compound table 'obs'.*anndata < 0.7.*write_h5ad"
        ):
            HDF5SessionDataset([legacy], key=key)
    cache = SessionCache(tmp_path / "cache", room_timeout=20)
    with pytest.raises(
        ConfigError, match=r"keys \['obs/cell_type'\] of session 0 .* node cache.*local files"
    ):
        HDF5SessionDataset([a], key=("X", "obs/cell_type"), cache=cache)
    with HDF5SessionDataset([a], key=("X", "obs/batch"), cache=cache) as ds:  # numbers: served
        assert ds[41]["obs/batch"] == 1


def test_a_damaged_code_is_an_error_never_a_wrong_label(tmp_path: Path) -> None:
    path = write_dense(tmp_path / "a.h5ad", 0)
    before = np.asarray(anndata.read_h5ad(path).obs["cell_type"].cat.codes)
    with h5py.File(path, "r+") as f:
        f["obs/cell_type/codes"][30] = 3  # 3 categories: codes -1..2
    with HDF5SessionDataset([path], key=("X", "obs/cell_type")) as ds:
        assert ds[29]["obs/cell_type"] == before[29]
        with pytest.raises(
            HDF5FileError,
            match=rf"\({path}\), key 'obs/cell_type': row 30 holds category code 3, outside -1..2",
        ):
            ds.__getitems__([10, 30, 31])
        with pytest.raises(HDF5FileError, match="row 30"):
            ds[30]
