"""Labels and covariates beside an ``.h5ad`` CSR matrix: ``key=("X", "obs/cell_type", ...)``.

Files are written by anndata itself (and anndata 0.7's categorical by hand); every value is
compared with anndata's own reading: categorical codes with ``adata.obs[col].cat.codes`` (and,
across files whose category lists differ, with pandas' ``union_categoricals``), numeric
columns with ``adata.obs[col]``, embeddings with ``adata.obsm[name]``.
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
    write_current,
    write_legacy,
    write_nullable_strings,
)

KEY = ("X", "obs/cell_type", "obs/n_counts", "obs/batch", "obsm/X_pca")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], dict[str, Any]]:
    """3 files x 200 cells: uncompressed, gzip, and one whose categories differ (some missing).

    The truth is anndata's reading of each file, joined as pandas joins categoricals.
    """
    root = tmp_path_factory.mktemp("labels")
    paths = [
        write_current(root / "s0.h5ad", matrix(0)),
        write_current(root / "s1.h5ad", matrix(1), compression="gzip"),
        write_current(root / "s2.h5ad", matrix(2), cell_types=("T", "Mono", None, "T")),
    ]
    adatas = [anndata.read_h5ad(p) for p in paths]
    joined = pd.api.types.union_categoricals([a.obs["cell_type"].array for a in adatas])
    truth = {
        "X": np.concatenate([a.X.toarray() for a in adatas]),
        "obs/cell_type": np.asarray(joined.codes, np.int64),
        "categories": list(joined.categories),
        "obs/n_counts": np.concatenate([a.obs["n_counts"].to_numpy() for a in adatas]),
        "obs/batch": np.concatenate([a.obs["batch"].to_numpy() for a in adatas]),
        "obsm/X_pca": np.concatenate([a.obsm["X_pca"] for a in adatas]),
        "own_codes": [np.asarray(a.obs["cell_type"].cat.codes, np.int64) for a in adatas],
        "names": np.concatenate([a.obs["cell_type"].astype(object).to_numpy() for a in adatas]),
    }
    return paths, truth


def _plain(batch: dict[str, Any]) -> dict[str, np.ndarray]:
    out = {}
    for name, value in batch.items():
        if isinstance(value, torch.Tensor) and value.layout != torch.strided:
            value = value.to_dense()
        out[name] = value.numpy()
    return out


def test_values_equal_anndata_row_for_row(corpus: tuple[list[Path], dict[str, Any]]) -> None:
    paths, truth = corpus
    with HDF5SessionDataset(paths, key=KEY) as ds:
        # the first files' lists open the shared list: their codes are anndata's own
        assert truth["categories"][:3] == ["B", "NK", "T"]
        assert (
            ds.handles.categories("obs/cell_type")
            == truth["categories"]
            == ["B", "NK", "T", "Mono"]
        )
        batch = next(iter(DataLoader(ds, batch_size=len(ds))))
        assert set(batch) == set(KEY)
        assert batch["obs/cell_type"].dtype == torch.int64
        assert batch["obs/n_counts"].dtype == torch.float32
        assert batch["obsm/X_pca"].shape == (600, 4)
        got = _plain(batch)
        for name in KEY:
            assert np.array_equal(got[name], truth[name]), name
        codes = got["obs/cell_type"]
        assert np.array_equal(codes[:200], truth["own_codes"][0])
        assert np.array_equal(codes[200:400], truth["own_codes"][1])
        assert (codes[400:] == -1).sum() == 50  # missing stays -1
        names = np.array(ds.handles.categories("obs/cell_type"), object)[codes]
        known = codes >= 0
        assert np.array_equal(names[known], truth["names"][known])
        for i in (0, 17, 233, 402, 599):  # samples: dicts of the same values
            sample = ds[i]
            assert np.array_equal(sample["X"].to_dense().numpy(), truth["X"][i])
            assert isinstance(sample["obs/cell_type"], np.int64)
            for name in KEY[1:]:
                assert np.array_equal(sample[name], truth[name][i]), (name, i)


def test_forms_mapping_names_and_lazy_samples(corpus: tuple[list[Path], dict[str, Any]]) -> None:
    paths, truth = corpus
    rows = [5, 400, 3, 250, 17, 402]
    # obs/_index: a string dataset, or with anndata >= 0.13 and pandas 3 values and a mask
    key = {"x": "X", "y": "obs/cell_type", "emb": "obsm/X_pca", "cell": "obs/_index"}
    with HDF5SessionDataset(paths, key=key, sparse="dense", genes=["gene7", "gene3"]) as ds:
        assert ds.handles.categories("y") == ds.handles.categories("obs/cell_type")
        batch = next(iter(DataLoader(ds, batch_size=6, sampler=rows)))
        assert np.array_equal(batch["x"].numpy(), truth["X"][rows][:, [7, 3]])
        assert np.array_equal(batch["y"].numpy(), truth["obs/cell_type"][rows])
        assert np.array_equal(batch["emb"].numpy(), truth["obsm/X_pca"][rows])
        assert batch["cell"] == [f"c{r % 200}" for r in rows]  # strings: str per cell
        samples = ds.__getitems__(rows)  # the batch's per-cell samples, built when looked at
        for j, r in enumerate(rows):
            assert samples[j]["cell"] == ds[r]["cell"] == f"c{r % 200}"
            assert samples[j]["y"] == truth["obs/cell_type"][r]
            assert np.array_equal(samples[j]["x"], truth["X"][r][[7, 3]])
    with HDF5SessionDataset(paths, key=("X",)) as ds:  # a tuple key: dicts, as for any key
        assert set(ds[3]) == {"X"}
        batch = next(iter(DataLoader(ds, batch_size=6, sampler=rows)))
        assert np.array_equal(batch["X"].to_dense().numpy(), truth["X"][rows])
    with HDF5SessionDataset(paths, key={"x": "X", "y": "obs/cell_type"}, sparse="tokens") as ds:
        batch = next(iter(DataLoader(ds, batch_size=6, sampler=rows)))
        assert set(batch) == {"x", "y"} and set(batch["x"]) == {"genes", "values"}
        assert np.array_equal(batch["y"].numpy(), truth["obs/cell_type"][rows])
        for j, r in enumerate(rows):
            n = int(batch["x"]["genes"].lengths[j])
            ids = batch["x"]["genes"].values[j, :n].numpy()
            assert np.array_equal(np.sort(ids), np.flatnonzero(truth["X"][r]))


def _epoch(ds: Any, **kwargs: Any) -> list[dict[str, np.ndarray]]:
    with create_dataloader(ds, batch_size=64, seed=3, shuffle=True, **kwargs) as loader:
        return [_plain(b) for b in loader]


def _same(a: list[dict[str, np.ndarray]], b: list[dict[str, np.ndarray]]) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
        for x, y in zip(a, b, strict=True)
    )


@pytest.mark.parametrize(
    "options",
    [
        {"num_workers": 2, "multiprocessing_context": "fork"},
        {"num_workers": 2, "worker_method": "thread"},
    ],
    ids=["fork", "threads"],
)
def test_batches_identical_with_workers(
    corpus: tuple[list[Path], dict[str, Any]], options: dict[str, Any]
) -> None:
    paths, truth = corpus
    with HDF5SessionDataset(paths, key=KEY) as ds:
        alone = _epoch(ds, num_workers=0)
        seen = np.concatenate([b["obsm/X_pca"] for b in alone])  # every cell once, shuffled
        assert np.array_equal(
            seen[np.lexsort(seen.T)], truth["obsm/X_pca"][np.lexsort(truth["obsm/X_pca"].T)]
        )
        assert _same(alone, _epoch(ds, **options))


def test_resume_mid_epoch_with_dict_batches(corpus: tuple[list[Path], dict[str, Any]]) -> None:
    paths, _ = corpus
    ds = HDF5SessionDataset(paths, key=KEY)
    full = _epoch(ds)
    with create_dataloader(ds, batch_size=64, seed=3, shuffle=True) as first:
        iterator = iter(first)
        seen = [_plain(next(iterator)) for _ in range(3)]
        state = first.state_dict()
    with create_dataloader(ds, batch_size=64, seed=3, shuffle=True) as second:
        second.load_state_dict(state)
        rest = [_plain(b) for b in second]
    assert _same(seen + rest, full)


def test_anndata_07_categoricals(tmp_path: Path) -> None:
    paths = [
        categorical_as_v07(
            write_current(tmp_path / "a.h5ad", matrix(0), cell_types=("T", None, "B"))
        ),
        categorical_as_v07(write_current(tmp_path / "b.h5ad", matrix(1), cell_types=("NK", "T"))),
    ]
    adatas = [anndata.read_h5ad(p) for p in paths]  # anndata's 0.7 reader
    joined = pd.api.types.union_categoricals([a.obs["cell_type"].array for a in adatas])
    with HDF5SessionDataset(paths, key=("X", "obs/cell_type")) as ds:
        assert ds.handles.categories("obs/cell_type") == list(joined.categories) == ["B", "T", "NK"]
        got = next(iter(DataLoader(ds, batch_size=400)))["obs/cell_type"].numpy()
        assert np.array_equal(got, np.asarray(joined.codes))
        assert np.array_equal(got[:200], adatas[0].obs["cell_type"].cat.codes)
    current = write_current(tmp_path / "c.h5ad", matrix(2))
    with pytest.raises(
        ConfigError, match=rf"'obs/cell_type' is categorical \(anndata 0.7\).*{current}"
    ):
        HDF5SessionDataset([paths[0], current], key=("X", "obs/cell_type"))


# ------------------------------------------------------------------ refused and damaged


def test_refused_by_name(tmp_path: Path) -> None:
    path = write_current(tmp_path / "a.h5ad", matrix(0))
    genes = tmp_path / "genes.h5ad"  # a per-gene column (50 rows) named beside the cells
    shutil.copy(path, genes)
    with h5py.File(genes, "r+") as f:
        f["var/n_cells"] = np.zeros(50, np.int64)
    with pytest.raises(
        ConfigError, match=rf"'var/n_cells' of session 0 \({genes}\) has 50 rows.*200 cells"
    ):
        HDF5SessionDataset([genes], key=("X", "var/n_cells"))
    with pytest.raises(ConfigError, match=r"sparse matrices.*one sparse matrix"):
        HDF5SessionDataset([path], key=("X", "raw/X"))
    with pytest.raises(ConfigError, match=r"'obsm'.*group \(dict\), not one value per cell"):
        HDF5SessionDataset([path], key=("X", "obsm"))
    with pytest.raises(KeyError, match="obs/missing"):
        HDF5SessionDataset([path], key=("X", "obs/missing"))
    with HDF5SessionDataset([path], key=("X", "obs/batch")) as ds:
        with pytest.raises(KeyError, match=r"'obs/batch' is not a categorical key.*\[\]"):
            ds.handles.categories("obs/batch")
    nullable = tmp_path / "nullable.h5ad"
    adata = anndata.read_h5ad(path)
    adata.obs["umis"] = pd.array([1, None] * 100, dtype="Int64")
    adata.write_h5ad(nullable)
    with pytest.raises(
        ConfigError,
        match=rf"'obs/umis' of session 0 \({nullable}\) is a nullable-integer.*'category'",
    ):
        HDF5SessionDataset([nullable], key=("X", "obs/umis"))
    legacy = write_legacy(tmp_path / "legacy.h5ad", matrix(0))  # obs: one compound table
    with pytest.raises(
        ConfigError, match=r"'obs/index'.*compound table 'obs'.*anndata < 0.7.*write_h5ad"
    ):
        HDF5SessionDataset([legacy], key=("X", "obs/index"))
    fewer = tmp_path / "fewer.h5ad"
    with h5py.File(path, "r") as src, h5py.File(fewer, "w") as f:
        for name in ("X", "var", "obs"):
            src.copy(src[name], f, name)
        del f["obs/n_counts"]
        f["obs/n_counts"] = np.zeros(150, np.float32)
    with pytest.raises(ConfigError, match=rf"'obs/n_counts' of session 1 \({fewer}\) has 150 rows"):
        HDF5SessionDataset([path, fewer], key=("X", "obs/n_counts"))


def test_codes_of_differing_widths_are_refused(tmp_path: Path) -> None:
    few = write_current(tmp_path / "few.h5ad", matrix(0))
    many = write_current(
        tmp_path / "many.h5ad", matrix(1), cell_types=[f"t{i}" for i in range(200)]
    )
    with h5py.File(few) as a, h5py.File(many) as b:
        assert (a["obs/cell_type/codes"].dtype, b["obs/cell_type/codes"].dtype) == (
            np.int8,
            np.int16,
        )
    with pytest.raises(
        ConfigError,
        match=rf"codes are int8 in session 0.*int16 in session 1 \({many}\).*set_categories",
    ):
        HDF5SessionDataset([few, many], key=("X", "obs/cell_type"))


def test_damaged_code_is_an_error_never_a_wrong_label(tmp_path: Path) -> None:
    path = write_current(tmp_path / "a.h5ad", matrix(0))
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


# ------------------------------------------------------------------ strings with missing values


def _donors(k: int, cells: int = 200) -> list[str | None]:
    """File ``k``'s donor column: some missing (cell 0 of file 0), none, mostly missing."""
    if k == 0:
        return [None if i % 7 == 0 else f"d{i % 5}" for i in range(cells)]
    if k == 1:
        return [f"dönor{i % 3}" for i in range(cells)]  # nothing missing
    return ["" if i % 10 == 1 else None if i % 4 else f"x{i}" for i in range(cells)]


@pytest.fixture(scope="module")
def pandas3(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], dict[str, Any]]:
    """3 files x 200 cells whose string columns are ``nullable-string-array`` groups.

    As anndata >= 0.13 with pandas 3 writes them (by hand: this anndata writes strings as
    datasets): ``obs/_index`` (cell names unique across files), ``var/_index`` and a
    ``donor`` column, missing in some cells of two files; the second file gzip. The truth is
    anndata's reading (``pd.NA`` as ``None``).
    """
    root = tmp_path_factory.mktemp("pandas3")
    paths = []
    for k in range(3):
        path = write_current(root / f"p{k}.h5ad", matrix(k))
        gzip = {"compression": "gzip"} if k == 1 else {}
        cells = [f"s{k}c{i}" for i in range(200)]
        paths.append(as_pandas3(path, {"donor": _donors(k)}, cells, **gzip))
    adatas = [anndata.read_h5ad(p) for p in paths]
    donors = [None if pd.isna(v) else v for a in adatas for v in a.obs["donor"]]
    truth = {
        "donor": donors,
        "cell": [name for a in adatas for name in a.obs_names],
        "X": np.concatenate([a.X.toarray() for a in adatas]),
        "y": np.concatenate([np.asarray(a.obs["cell_type"].cat.codes, np.int64) for a in adatas]),
    }
    assert donors == [*_donors(0), *_donors(1), *_donors(2)]  # anndata reads the hand layout
    assert truth["cell"][:2] == ["s0c0", "s0c1"]
    return paths, truth


PANDAS3_KEY = {"x": "X", "donor": "obs/donor", "cell": "obs/_index", "y": "obs/cell_type"}


def test_the_hand_layout_is_the_one_anndata_writes(tmp_path: Path) -> None:
    """anndata writes this layout too where told to keep strings nullable (pandas 3's default)."""
    adata = anndata.AnnData(X=matrix(0, cells=8))
    adata.obs["donor"] = pd.array(["a", None, "b", "", "a", None, "c", "d"], dtype="string")
    adata.obs_names = pd.Index([f"c{i}" for i in range(8)], dtype="string")
    with anndata.settings.override(allow_write_nullable_strings=True):
        adata.write_h5ad(tmp_path / "own.h5ad", convert_strings_to_categoricals=False)
    with h5py.File(tmp_path / "hand.h5ad", "w") as f:
        write_nullable_strings(
            f,
            "donor",
            list(adata.obs["donor"].astype(object).where(adata.obs["donor"].notna(), None)),
        )
    with h5py.File(tmp_path / "own.h5ad") as own, h5py.File(tmp_path / "hand.h5ad") as hand:
        a, b = own["obs/donor"], hand["donor"]
        written = dict(b.attrs)
        if "na-value" not in a.attrs:  # anndata < 0.13 writes no na-value
            del written["na-value"]
        assert dict(a.attrs) == written
        for name in ("values", "mask"):
            assert dict(a[name].attrs) == dict(b[name].attrs), name
            assert a[name].dtype == b[name].dtype and a[name][()].tolist() == b[name][()].tolist()
        assert dict(own["obs/_index"].attrs) == dict(a.attrs)
    with HDF5SessionDataset([tmp_path / "own.h5ad"], key=("X", "obs/donor", "obs/_index")) as ds:
        batch = next(iter(DataLoader(ds, batch_size=8)))
        assert batch["obs/donor"] == ["a", None, "b", "", "a", None, "c", "d"]
        assert batch["obs/_index"] == [f"c{i}" for i in range(8)]
        assert ds[1]["obs/donor"] is None and ds[3]["obs/donor"] == ""


def test_nullable_strings_are_str_per_cell_and_none_where_missing(
    pandas3: tuple[list[Path], dict[str, Any]],
) -> None:
    paths, truth = pandas3
    with HDF5SessionDataset(paths, key=PANDAS3_KEY) as ds:
        batch = next(iter(DataLoader(ds, batch_size=len(ds))))
        assert batch["donor"] == truth["donor"] and batch["cell"] == truth["cell"]
        assert np.array_equal(batch["y"].numpy(), truth["y"])
        assert np.array_equal(batch["x"].to_dense().numpy(), truth["X"])
        assert {type(v) for v in batch["donor"]} == {str, type(None)}
        rows = [0, 401, 7, 205, 599, 3, 402, 400]  # missing first, "" kept, across files
        got = next(iter(DataLoader(ds, batch_size=len(rows), sampler=rows)))
        assert got["donor"] == [truth["donor"][r] for r in rows]
        assert got["donor"][:3] == [None, "", None]
        assert got["cell"] == [truth["cell"][r] for r in rows]
        samples = ds.__getitems__(rows)  # built from the batch when looked at
        for j, r in enumerate(rows):
            sample = ds[r]
            assert sample["donor"] == samples[j]["donor"] == truth["donor"][r], r
            assert sample["cell"] == samples[j]["cell"] == truth["cell"][r]
            assert sample["y"] == truth["y"][r]
        assert ds[0]["donor"] is None and ds[401]["donor"] == "" and ds[200]["donor"] == "dönor0"


class _Reads(HDF5SessionDataset):
    """A ``read`` subclass: batches are collated from its samples."""

    def read(self, session: Any, row: int) -> Any:
        return super().read(session, row)


def test_samples_of_a_read_subclass_batch_alike(
    pandas3: tuple[list[Path], dict[str, Any]],
) -> None:
    paths, truth = pandas3
    rows = [0, 1, 2, 7, 401]  # the first cell missing: torch alone refuses such a batch
    with _Reads(paths, key=PANDAS3_KEY) as ds:
        for sampler in (rows, rows[1:]):
            batch = next(iter(DataLoader(ds, batch_size=len(sampler), sampler=sampler)))
            assert batch["donor"] == [truth["donor"][r] for r in sampler]
            assert batch["cell"] == [truth["cell"][r] for r in sampler]
    from loaderkit.workers.collate import collate

    with pytest.raises(TypeError, match=r"found <class 'NoneType'> beside <class 'torch\.Tensor'>"):
        collate([{"a": None}, {"a": torch.zeros(2).to_sparse()}])  # no list of tensors and None


@pytest.mark.parametrize(
    "options",
    [
        {"num_workers": 0},
        {"num_workers": 2, "multiprocessing_context": "fork"},
        {"num_workers": 2, "worker_method": "thread"},
    ],
    ids=["main", "fork", "threads"],
)
def test_nullable_strings_with_workers(
    pandas3: tuple[list[Path], dict[str, Any]], options: dict[str, Any]
) -> None:
    paths, truth = pandas3
    pairs = dict(zip(truth["cell"], truth["donor"], strict=True))
    with HDF5SessionDataset(paths, key=PANDAS3_KEY) as ds:
        with create_dataloader(ds, batch_size=64, seed=5, shuffle=True, **options) as loader:
            batches = list(loader)
    cells = [c for b in batches for c in b["cell"]]
    assert sorted(cells) == sorted(truth["cell"])  # every cell once, shuffled
    assert cells != truth["cell"]
    for b in batches:  # each cell's donor, None where missing: the mask follows the cell
        assert b["donor"] == [pairs[c] for c in b["cell"]]


def _damage(path: Path, how: str) -> None:
    with h5py.File(path, "r+") as f:
        group = f["obs/donor"]
        if how == "no values":
            del group["values"]
        elif how == "no mask":
            del group["mask"]
        elif how == "short mask":
            del group["mask"]
            group["mask"] = np.zeros(199, bool)
        elif how == "numbers":
            del group["values"]
            group["values"] = np.zeros(200, np.int64)
        elif how == "2-D mask":
            del group["mask"]
            group["mask"] = np.zeros((200, 1), bool)
        else:  # "fewer cells": values and mask one per cell of another file
            write_nullable_strings(f["obs"], "donor", ["a", None] * 75)


@pytest.mark.parametrize(
    ("how", "error", "says"),
    [
        pytest.param(
            "no values", HDF5FileError, r"has no 'values' dataset.*Write it again", id="no values"
        ),
        pytest.param(
            "no mask", HDF5FileError, r"has no 'mask' dataset.*Write it again", id="no mask"
        ),
        pytest.param(
            "short mask",
            HDF5FileError,
            r"has 199 mask entries for 200 values.*Write it again",
            id="short mask",
        ),
        pytest.param(
            "numbers",
            HDF5FileError,
            r"'values' of shape \(200,\) \(int64\), not 1-D strings",
            id="numbers",
        ),
        pytest.param(
            "2-D mask",
            HDF5FileError,
            r"'mask' of shape \(200, 1\) \(bool\), not 1-D booleans",
            id="2-D mask",
        ),
        pytest.param(
            "fewer cells",
            ConfigError,
            r"has 150 rows, but the matrix 'X' has 200 cells",
            id="fewer cells",
        ),
    ],
)
def test_a_damaged_nullable_string_column_is_named(
    tmp_path: Path, how: str, error: type[Exception], says: str
) -> None:
    good = as_pandas3(write_current(tmp_path / "good.h5ad", matrix(0)), {"donor": _donors(0)})
    bad = tmp_path / "bad.h5ad"
    shutil.copy(good, bad)
    _damage(bad, how)
    with pytest.raises(error, match=rf"'obs/donor' of session 1 \({bad}\).*{says}"):
        HDF5SessionDataset([good, bad], key=("X", "obs/donor"))
    with HDF5SessionDataset([good, bad], key=("X", "obs/_index")) as ds:  # other keys still read
        assert ds[201]["obs/_index"] == "c1"


def test_nullable_strings_refused_where_not_served(tmp_path: Path) -> None:
    """Stored as a dataset in one file and a group in another; through the node cache."""
    plain = write_current(tmp_path / "plain.h5ad", matrix(0))
    with h5py.File(plain, "r+") as f:
        f["obs/donor"] = np.array(["a"] * 200, dtype=object).astype(h5py.string_dtype())
    nullable = as_pandas3(write_current(tmp_path / "n.h5ad", matrix(1)), {"donor": _donors(0)})
    with pytest.raises(
        ConfigError,
        match=rf"'obs/donor' is a dataset of values in session 0.*but nullable-string-array in "
        rf"session 1 \({nullable}\).*one anndata version",
    ):
        HDF5SessionDataset([plain, nullable], key=("X", "obs/donor"))
    cache = SessionCache(tmp_path / "cache", room_timeout=20)
    with pytest.raises(ConfigError, match=r"with other keys \(\['obs/donor'\]\).*local files"):
        HDF5SessionDataset([nullable], key=("X", "obs/donor"), cache=cache)
    booleans = tmp_path / "booleans.h5ad"
    adata = anndata.read_h5ad(plain)
    adata.obs["qc"] = pd.array([True, None] * 100, dtype="boolean")
    adata.write_h5ad(booleans)
    with pytest.raises(ConfigError, match=r"'obs/qc' of session 0 .* is a nullable-boolean"):
        HDF5SessionDataset([booleans], key=("X", "obs/qc"))
