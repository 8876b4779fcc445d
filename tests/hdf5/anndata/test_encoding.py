"""AnnData's encodings: what a group is, CSC and unknown encodings refused, damaged indptr."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from loaderkit.errors import ConfigError, HDF5FileError
from loaderkit.hdf5.anndata.encoding import (
    CSRGroup,
    categories,
    check_csr,
    is_categorical,
    sparse_group,
    var_difference,
    var_names,
)

anndata = pytest.importorskip("anndata")
sp = pytest.importorskip("scipy.sparse")


def test_current_and_legacy_csr_groups_are_recognised(tmp_path: Path) -> None:
    from tests.hdf5.h5adfiles import matrix, write_current, write_legacy

    m = matrix(0)
    current = write_current(tmp_path / "c.h5ad", m)
    legacy = write_legacy(tmp_path / "l.h5ad", m)
    with h5py.File(current, "r") as f:
        for key in ("X", "raw/X", "layers/counts"):
            assert sparse_group(f[key], key, 0, str(current)) == CSRGroup(key, *m.shape)
        assert sparse_group(f["obsm"], "obsm", 0, str(current)) is None  # a plain group
        assert is_categorical(f["obs/cell_type"])
        assert categories(f["obs/cell_type"]) == ["B", "NK", "T"]
        names = var_names(f, "var")
    with h5py.File(legacy, "r") as f:
        assert sparse_group(f["raw.X"], "raw.X", 0, str(legacy)) == CSRGroup(
            "raw.X", *m.shape, legacy=True
        )
        assert var_names(f, "raw.var") == names


def test_csc_is_refused_with_how_to_convert(tmp_path: Path) -> None:
    path = tmp_path / "csc.h5ad"
    anndata.AnnData(X=sp.random(20, 5, 0.3, "csc", np.float32)).write_h5ad(path)
    with h5py.File(path, "r") as f, pytest.raises(ConfigError, match=r"CSC.*tocsr\(\)"):
        sparse_group(f["X"], "X", "s0", str(path))


def test_unknown_encodings_are_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "odd.h5ad"
    with h5py.File(path, "w") as f:
        f.create_group("X").attrs["encoding-type"] = "awkward-array"
        f.create_group("Y").attrs["h5sparse_format"] = "coo"
        with pytest.raises(ConfigError, match="'awkward-array'"):
            sparse_group(f["X"], "X", 0, str(path))
        with pytest.raises(ConfigError, match="'coo \\(h5sparse\\)'"):
            sparse_group(f["Y"], "Y", 0, str(path))


@pytest.mark.parametrize(
    ("indptr", "nnz", "nnz_indices", "what"),
    [
        ([0, 2, 1, 3], 3, 3, "row 1 ends before it starts"),
        ([0, 1, 2, 9], 3, 3, "row 2 ends at 9, past the 3 stored values"),
        ([0, 1, 2, 3], 3, 2, "'data' holds 3 values but 'indices' 2"),
        ([0, 1, 3], 3, 3, "'indptr' holds 3 entries, expected 4"),
        ([1, 1, 2, 3], 3, 3, "row 0 starts at 1"),
    ],
)
def test_damaged_indptr_names_file_and_row(
    indptr: list[int], nnz: int, nnz_indices: int, what: str
) -> None:
    with pytest.raises(HDF5FileError, match=r"session 's1' \(f.h5ad\)") as caught:
        check_csr(CSRGroup("X", 3, 4), np.array(indptr), nnz, nnz_indices, "s1", "f.h5ad")
    assert what in str(caught.value)


def test_var_difference_says_how() -> None:
    assert var_difference(["a", "b"], ["a", "b"]) is None
    assert var_difference(["a", "b"], ["a"]) == "it has 1 genes where the first file has 2"
    assert "position 1 holds 'c'" in str(var_difference(["a", "b"], ["a", "c"]))


def test_a_var_index_written_with_pandas_3_is_read(tmp_path: Path) -> None:
    """anndata with pandas 3 stores string columns as ``nullable-string-array`` groups."""
    from loaderkit import HDF5SessionDataset
    from loaderkit.hdf5.anndata.encoding import categories, var_names
    from tests.hdf5.h5adfiles import matrix

    path = tmp_path / "p3.h5ad"
    m = matrix(4)
    genes = [f"gene{i}" for i in range(m.shape[1])]
    with h5py.File(path, "w") as f:
        x = f.create_group("X")
        x.attrs["encoding-type"], x.attrs["encoding-version"] = "csr_matrix", "0.1.0"
        x.attrs["shape"] = np.array(m.shape)
        for part in ("data", "indices", "indptr"):
            x.create_dataset(part, data=getattr(m, part))
        var = f.create_group("var")
        var.attrs["_index"], var.attrs["encoding-type"] = "_index", "dataframe"
        index = var.create_group("_index")
        index.attrs["encoding-type"], index.attrs["na-value"] = "nullable-string-array", "NaN"
        index.create_dataset(
            "values", data=np.array(genes, dtype=object), dtype=h5py.string_dtype()
        )
        index.create_dataset("mask", data=np.zeros(len(genes), bool))
        ct = f.create_group("obs").create_group("ct")
        ct.attrs["encoding-type"] = "categorical"
        ct.create_dataset("codes", data=np.zeros(m.shape[0], np.int8))
        cats = ct.create_group("categories")
        cats.attrs["encoding-type"] = "nullable-string-array"
        cats.create_dataset(
            "values", data=np.array(["B", "T"], dtype=object), dtype=h5py.string_dtype()
        )
        cats.create_dataset("mask", data=np.array([False, True]))
    with h5py.File(path, "r") as f:
        assert var_names(f, "var") == genes
        assert categories(f["obs/ct"]) == ["B", "nan"]
    with HDF5SessionDataset([path], key="X", sparse="dense", genes=["gene3", "gene1"]) as ds:
        assert ds.handles.var_names == genes
        np.testing.assert_array_equal(np.asarray(ds[5]), m.toarray()[5, [3, 1]])


def test_obs_columns_of_strings_with_missing_values(tmp_path: Path) -> None:
    """A ``nullable-string-array`` is its ``values`` and ``mask``; nullable numbers refused."""
    from loaderkit.hdf5.anndata.encoding import ObsColumn, obs_column
    from tests.hdf5.h5adfiles import write_nullable_strings

    path = tmp_path / "o.h5ad"
    with h5py.File(path, "w") as f:
        obs = f.create_group("obs")
        write_nullable_strings(obs, "donor", ["a", None, "b"])
        write_nullable_strings(obs, "_index", ["c0", "c1", "c2"])
        ints = obs.create_group("umis")
        ints.attrs["encoding-type"] = "nullable-integer"
        ints["values"], ints["mask"] = np.arange(3), np.zeros(3, bool)
        assert obs_column(f, "obs/donor", "s", str(path)) == ObsColumn(
            "obs/donor/values", None, "nullable-string-array", "obs/donor/mask"
        )
        index = obs_column(f, "obs/_index", "s", str(path))  # the cell names: alike
        assert index is not None and index.mask == "obs/_index/mask"
        with pytest.raises(ConfigError, match=r"'obs/umis' of session 's'.*nullable-integer"):
            obs_column(f, "obs/umis", "s", str(path))
        del obs["donor/mask"]
        with pytest.raises(HDF5FileError, match=rf"'obs/donor' of session 's' \({path}\).*'mask'"):
            obs_column(f, "obs/donor", "s", str(path))
