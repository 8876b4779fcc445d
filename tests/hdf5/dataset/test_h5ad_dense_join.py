"""``join=`` and ``genes=`` on DENSE anndata matrices: exactly what they give for a CSR key.

anndata writes a dense ``X`` (``layers/<name>``, ``raw/X``) as a plain ``(n_obs, n_vars)``
dataset, so files from studies with other genes have other widths. Files written by anndata
itself are read back and compared with ``anndata.concat(join=..., fill_value=0)`` and with
``adata[:, genes]``: a gene a file lacks reads 0, a name twice gives both copies, integers are
positions and a mask is over the (joined) var index. The same batches come out with no
workers, fork, spawn and threads; keys beside the matrix keep working; refusals are named.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from loaderkit import SessionCache, create_dataloader
from loaderkit.errors import ConfigError
from loaderkit.hdf5 import HDF5SessionDataset

anndata = pytest.importorskip("anndata")
pd = pytest.importorskip("pandas")

#: Three studies: other genes, other orders (the third narrower: 8 genes).
STUDIES = [
    [f"g{i}" for i in range(10)],
    [f"g{i}" for i in (9, 7, 12, 3, 1, 0, 5, 2, 11, 8)],
    [f"g{i}" for i in (4, 13, 2, 6, 9, 0, 3, 8)],
]
CELLS = 30


def _write(path: Path, names: list[str], seed: int, **kwargs: Any) -> Path:
    """Dense float32 counts over genes ``names`` and a categorical ``obs/cell_type``."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 9, (CELLS, len(names))).astype(np.float32)
    x[::7] = 0  # cells without counts
    obs = pd.DataFrame(
        {"cell_type": pd.Categorical(rng.choice(["B", "T", "NK"], CELLS))},
        index=[f"f{seed}c{i}" for i in range(CELLS)],
    )
    adata = anndata.AnnData(X=x, obs=obs, var=pd.DataFrame(index=names))
    adata.layers["counts"] = x * 2
    adata.write_h5ad(path, **kwargs)
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("dense-corpus")
    # the last file compressed: its rows are read through chunks, not preadv
    extra = [{}, {}, {"compression": "gzip"}]
    return [
        _write(root / f"study{k}.h5ad", names, 20 + k, **extra[k])
        for k, names in enumerate(STUDIES)
    ]


def _concat(paths: list[Path], join: str) -> Any:
    return anndata.concat([anndata.read_h5ad(p) for p in paths], join=join, fill_value=0)


def _read_all(ds: HDF5SessionDataset, batch_size: int = 7) -> np.ndarray:
    with create_dataloader(ds, batch_size=batch_size) as loader:
        return np.concatenate([np.asarray(b) for b in loader])


@pytest.mark.parametrize("memory_map", [False, True], ids=["preadv", "mapped"])
@pytest.mark.parametrize("join", ["outer", "inner"])
def test_join_gives_anndata_concat(corpus: list[Path], join: str, memory_map: bool) -> None:
    want = _concat(corpus, join)
    with HDF5SessionDataset(corpus, key="X", join=join, memory_map=memory_map) as ds:
        assert ds.handles.var_names == list(want.var_names)
        assert ds.handles.columns == list(want.var_names)
        assert ds.handles.n_vars == want.n_vars
        assert len(ds) == want.n_obs
        np.testing.assert_array_equal(_read_all(ds), want.X)
        for i in (0, 45, 89):  # per sample too, from every file
            np.testing.assert_array_equal(np.asarray(ds[i]), want.X[i])


def test_a_layer_joins_as_x_does(corpus: list[Path]) -> None:
    want = _concat(corpus, "outer")
    with HDF5SessionDataset(corpus, key="layers/counts", join="outer") as ds:
        assert ds.handles.var_names == list(want.var_names)
        np.testing.assert_array_equal(_read_all(ds), want.layers["counts"])


@pytest.mark.parametrize(
    "genes",
    [["g7", "g2", "g9", "g2"], [5, 0, -1, 5], np.arange(10) % 3 == 0],
    ids=["name-twice", "positions", "mask"],
)
def test_genes_is_exactly_anndatas_selection(corpus: list[Path], genes: Any) -> None:
    adata = anndata.read_h5ad(corpus[0])
    want = adata[:, genes]
    with HDF5SessionDataset([corpus[0]], key="X", genes=genes) as ds:
        assert ds.handles.columns == list(want.var_names)
        assert ds.handles.var_names == STUDIES[0]
        np.testing.assert_array_equal(_read_all(ds), want.X)
        np.testing.assert_array_equal(np.asarray(ds[3]), want.X[3])


@pytest.mark.parametrize("join", ["outer", "inner", None])
def test_genes_after_a_join_or_alone_across_differing_files(
    corpus: list[Path], join: str | None
) -> None:
    genes = ["g12", "g0", "g13", "g0", "g4"] if join != "inner" else ["g8", "g0", "g8"]
    want = _concat(corpus, join or "outer")[:, genes]
    with HDF5SessionDataset(corpus, key="X", join=join, genes=genes) as ds:
        assert ds.handles.columns == genes
        assert ds.handles.n_vars == len(genes)
        np.testing.assert_array_equal(_read_all(ds), want.X)
        np.testing.assert_array_equal(np.asarray(ds[70]), want.X[70])
    with pytest.raises(ConfigError, match=r"no file's var index holds.*'g99'"):
        HDF5SessionDataset(corpus, key="X", join=join, genes=["g0", "g99"])


def test_positions_and_masks_apply_to_the_joined_index(corpus: list[Path]) -> None:
    want = _concat(corpus, "outer")
    mask = np.arange(want.n_vars) % 2 == 1
    for genes in ([3, 0, 3], mask):
        with HDF5SessionDataset(corpus, key="X", join="outer", genes=genes) as ds:
            np.testing.assert_array_equal(_read_all(ds), want[:, genes].X)


def test_a_label_key_beside_the_joined_matrix(corpus: list[Path]) -> None:
    want = _concat(corpus, "outer")
    key = ("X", "obs/cell_type")
    with HDF5SessionDataset(corpus, key=key, join="outer") as ds:
        with create_dataloader(ds, batch_size=90) as loader:
            (batch,) = list(loader)
        np.testing.assert_array_equal(batch["X"].numpy(), want.X)
        names = ds.handles.categories("obs/cell_type")
        got = [names[c] for c in batch["obs/cell_type"].tolist()]
        assert got == list(want.obs["cell_type"])
        assert int(ds[40]["obs/cell_type"]) == names.index(want.obs["cell_type"].iloc[40])
        np.testing.assert_array_equal(np.asarray(ds[40]["X"]), want.X[40])


def _batches(paths: list[Path], **kwargs: Any) -> list[np.ndarray]:
    ds = HDF5SessionDataset(paths, key="X", join="outer", genes=["g0", "g13", "g0", "g7"])
    with create_dataloader(ds, batch_size=8, shuffle=True, seed=3, **kwargs) as loader:
        return [np.asarray(b) for b in loader]


@pytest.mark.parametrize(
    "how",
    [
        {"num_workers": 2, "multiprocessing_context": "fork"},
        {"num_workers": 2, "multiprocessing_context": "spawn"},
        {"num_workers": 2, "worker_method": "thread"},
    ],
    ids=["fork", "spawn", "threads"],
)
def test_the_same_batches_on_every_worker_method(corpus: list[Path], how: dict[str, Any]) -> None:
    want = _batches(corpus)
    assert sum(len(b) for b in want) == 3 * CELLS
    got = _batches(corpus, **how)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_samples_key_holds_the_column_map(corpus: list[Path]) -> None:
    keys = []
    for kwargs in ({"join": "outer"}, {"join": "inner"}, {"join": "outer", "genes": ["g1"]}):
        with HDF5SessionDataset(corpus, key="X", **kwargs) as ds:
            assert ds.handles.sample_parts()[2] == b"columns"
            keys.append(ds.handles.samples_key())
    assert len(set(keys)) == 3


def test_files_whose_widths_differ_are_refused_without_join(corpus: list[Path]) -> None:
    with pytest.raises(ConfigError, match=rf"{corpus[1]}.*differs from.*{corpus[0]}.*join='inner'"):
        HDF5SessionDataset(corpus, key="X")
    with pytest.raises(ConfigError, match=rf"{corpus[2]}.*8 genes where the first file has 10"):
        HDF5SessionDataset([corpus[0], corpus[2]], key="X")
    with pytest.raises(ConfigError, match=rf"{corpus[1]}.*differs.*join='outer'"):
        HDF5SessionDataset(corpus[:2], key="X", genes=[0, 1])  # positions over which index?
    with pytest.raises(ConfigError, match=r"sparse='dense' applies to a sparse.*'X' is a dense"):
        HDF5SessionDataset(corpus, key="X", join="outer", sparse="dense")
    with pytest.raises(ConfigError, match=r"'obs/cell_type' is none"):
        HDF5SessionDataset(corpus, key="obs/cell_type", join="outer")


def test_join_without_a_var_index_is_refused_by_name(corpus: list[Path], tmp_path: Path) -> None:
    bare = tmp_path / "bare.h5ad"
    with h5py.File(bare, "w") as f:
        f.create_dataset("X", data=np.ones((4, 10), np.float32))
    with pytest.raises(ConfigError, match=rf"join='outer' aligns.*{bare}\) has none"):
        HDF5SessionDataset([corpus[0], bare], key="X", join="outer")
    with HDF5SessionDataset([bare], key="X", genes=[3, 1]) as ds:  # positions need no names
        np.testing.assert_array_equal(_read_all(ds), np.ones((4, 2), np.float32))
        assert ds.handles.columns is None


def test_a_batch_naming_a_cell_twice_gets_it_twice(corpus: list[Path]) -> None:
    want = _concat(corpus, "outer")[:, ["g13", "g0", "g13"]]
    picks = [75, 5, 40, 5, 75, 31]
    with HDF5SessionDataset(corpus, key="X", genes=["g13", "g0", "g13"]) as ds:
        got = np.asarray(ds.__getitems__(picks))
        np.testing.assert_array_equal(got, want.X[picks])


def test_raw_x_is_aligned_by_raw_var(tmp_path: Path) -> None:
    raws = []
    for k, names in enumerate(STUDIES[1:]):
        path = _write(tmp_path / f"r{k}.h5ad", names, 40 + k)
        adata = anndata.read_h5ad(path)
        adata.raw = adata  # raw/X over raw/var: these names
        anndata.AnnData(X=np.zeros((CELLS, 2), np.float32), raw=adata.raw).write_h5ad(path)
        raws.append(adata)
    want = anndata.concat(raws, join="inner")
    with HDF5SessionDataset(
        [tmp_path / "r0.h5ad", tmp_path / "r1.h5ad"], key="raw/X", join="inner"
    ) as ds:
        assert ds.handles.var_names == list(want.var_names)
        np.testing.assert_array_equal(_read_all(ds), want.X)


def test_a_dense_join_through_a_node_cache_is_refused_by_name(
    corpus: list[Path], tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=r"'X' read each file's var index.*without cache="):
        HDF5SessionDataset(corpus, key="X", join="outer", cache=SessionCache(tmp_path / "c"))


def test_files_of_one_width_whose_genes_differ_are_refused_without_join(
    tmp_path: Path,
) -> None:
    """Same width, other names (or order): never read as if the columns were the same genes."""
    names = [f"g{i}" for i in range(10)]
    a = _write(tmp_path / "a.h5ad", names, 1)
    b = _write(tmp_path / "b.h5ad", names[::-1], 2)
    with pytest.raises(ConfigError, match=rf"{b}.*position 0 holds 'g9'.*join='outer'"):
        HDF5SessionDataset([a, b], key="X")
    same = _write(tmp_path / "same.h5ad", names, 3)
    with HDF5SessionDataset([a, same], key="X") as ds:  # one var index: read as before
        assert len(ds) == 2 * len(HDF5SessionDataset([a], key="X"))
    with HDF5SessionDataset([a, b], key="X", join="outer") as ds:
        want = _concat([a, b], "outer")
        np.testing.assert_array_equal(_read_all(ds), np.asarray(want.X, np.float32))
