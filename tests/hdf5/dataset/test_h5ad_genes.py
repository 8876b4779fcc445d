"""``genes=`` is exactly ``adata[:, genes]``; ``join=`` is ``anndata.concat(join=...)``.

Files are written by anndata itself. Every form (``csr``, ``dense``, ``tokens``) is read back
as dense rows and compared with what anndata gives for the same selection: a name twice gives
both copies, integers are positions, a mask is over the var index; a name a file's var index
holds twice is refused where anndata raises. Files whose var indexes differ (other genes, other
order) are aligned with anndata's words and order, the same batches come out with no workers,
fork, spawn and threads, and 2 gloo ranks read the joined corpus as one process does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from loaderkit import DataLoader, create_dataloader
from loaderkit.errors import ConfigError, HDF5FileError
from loaderkit.hdf5 import HDF5SessionDataset
from tests.dist_utils import run_distributed

anndata = pytest.importorskip("anndata")
sp = pytest.importorskip("scipy.sparse")
pd = pytest.importorskip("pandas")

FORMS = ("csr", "dense", "tokens")


def _write(path: Path, names: list[str], seed: int, cells: int = 30) -> Path:
    """Counts (some rows empty) over genes ``names``, written by anndata."""
    m = sp.random(cells, len(names), density=0.3, format="csr", dtype=np.float32, random_state=seed)
    m.data = np.ceil(m.data * 9).astype(np.float32)
    m = sp.csr_matrix(sp.diags((np.arange(cells) % 7 != 0).astype(np.float32)) @ m)
    m.eliminate_zeros()
    obs = pd.DataFrame(index=[f"f{seed}c{i}" for i in range(cells)])
    anndata.AnnData(X=sp.csr_matrix(m), obs=obs, var=pd.DataFrame(index=names)).write_h5ad(path)
    return path


def _dense(batch: Any, n_out: int) -> np.ndarray:
    """Any form's batch as dense float rows."""
    if isinstance(batch, dict):  # tokens: padded gene ids and values, with their lengths
        genes, values = batch["genes"], batch["values"]
        out = np.zeros((genes.values.shape[0], n_out), np.float32)
        for r, length in enumerate(genes.lengths.tolist()):
            out[r, genes.values[r, :length].numpy()] = values.values[r, :length].numpy()
        return out
    if batch.layout == torch.sparse_csr:
        crow, cols = batch.crow_indices(), batch.col_indices()
        for a, b in zip(crow[:-1].tolist(), crow[1:].tolist(), strict=True):
            row = cols[a:b]
            assert torch.all(row[1:] > row[:-1]), "columns increasing in a row"
        return batch.to_dense().numpy()
    return batch.numpy()


def _read_all(ds: HDF5SessionDataset) -> np.ndarray:
    """Every sample through the loader (batch-native reads), as dense rows."""
    with create_dataloader(ds, batch_size=7) as loader:
        return np.concatenate([_dense(b, ds.handles.n_vars) for b in loader])


def _want(adata: Any) -> np.ndarray:
    x = adata.X
    return np.asarray(x.toarray() if sp.issparse(x) else x, np.float32)


NAMES = [f"g{i}" for i in range(12)]


@pytest.fixture(scope="module")
def one(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(tmp_path_factory.mktemp("genes") / "one.h5ad", NAMES, 0)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(
    "genes",
    [
        ["g7", "g2", "g9", "g2"],  # a name twice: both copies
        [5, 0, -1, 5],  # positions, one from the end, one twice
        np.arange(12) % 3 == 0,  # a mask over the var index
        ["g11"],
    ],
    ids=["name-twice", "positions", "mask", "one-name"],
)
def test_genes_is_exactly_anndatas_selection(one: Path, form: str, genes: Any) -> None:
    want = _want(anndata.read_h5ad(one)[:, genes])
    with HDF5SessionDataset([one], key="X", sparse=form, genes=genes) as ds:
        got = _read_all(ds)
        assert ds.handles.columns == list(anndata.read_h5ad(one)[:, genes].var_names)
        assert ds.handles.var_names == NAMES  # before genes=
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(_dense_sample(ds, 3, form), want[3])


def _dense_sample(ds: HDF5SessionDataset, i: int, form: str) -> np.ndarray:
    sample = ds[i]
    if form == "tokens":
        out = np.zeros(ds.handles.n_vars, np.float32)
        out[sample["genes"].numpy()] = sample["values"].numpy()
        return out
    return sample.to_dense().numpy() if form == "csr" else np.asarray(sample)


def test_integers_are_positions_even_where_names_look_like_integers(tmp_path: Path) -> None:
    path = _write(tmp_path / "digits.h5ad", ["3", "7", "0"], 1)
    adata = anndata.read_h5ad(path)
    for genes in ([0], ["0"], [2, 0]):
        with HDF5SessionDataset([path], key="X", sparse="dense", genes=genes) as ds:
            np.testing.assert_array_equal(_read_all(ds), _want(adata[:, genes]))
    with HDF5SessionDataset([path], key="X", genes=[0]) as ds:
        assert ds.handles.columns == ["3"]


def test_a_name_the_var_index_holds_twice_is_refused_as_anndata_does(tmp_path: Path) -> None:
    path = _write(tmp_path / "twice.h5ad", ["A", "B", "A", "C"], 2)
    with pytest.warns(UserWarning):  # anndata warns at reading such a file
        adata = anndata.read_h5ad(path)
    with pytest.raises(Exception):  # noqa: B017 - anndata's own error
        adata[:, ["A"]]
    with pytest.raises(ConfigError, match=rf"'A'.*{path}.*more than once.*position"):
        HDF5SessionDataset([path], key="X", genes=["A"])
    # names held once are unambiguous (anndata refuses every name on such an index): served
    picks = {"names": (["B", "C"], [1, 3]), "positions": ([0, 2], [0, 2])}
    picks["mask"] = (np.array([True, False, True, False]), [0, 2])
    for genes, columns in picks.values():
        with HDF5SessionDataset([path], key="X", sparse="dense", genes=genes) as ds:
            np.testing.assert_array_equal(_read_all(ds), _want(adata[:, columns]))


@pytest.mark.parametrize(
    ("genes", "match"),
    [
        (["g1", "nope"], r"1 gene\(s\) no file's var index holds.*'nope'"),
        ([12], r"position 12, outside -12..11"),
        ([-13], r"position -13"),
        (np.ones(5, bool), r"mask of shape \(5,\).*\(12,\)"),
        ("g1", r"one string.*genes=\['g1'\]"),
        ([], "selects no gene"),
        ([1.5], "dtype float64"),
    ],
)
def test_bad_genes_are_refused_by_name(one: Path, genes: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        HDF5SessionDataset([one], key="X", genes=genes)


# ------------------------------------------------------------------ a corpus: join=

#: Three studies: other genes (80 % shared with the first), other orders.
STUDIES = [
    [f"g{i}" for i in range(10)],
    [f"g{i}" for i in (9, 7, 12, 3, 1, 0, 5, 2, 11, 8)],
    [f"g{i}" for i in (4, 13, 2, 6, 9, 0, 3, 8, 1, 7)],
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("corpus")
    return [_write(root / f"study{k}.h5ad", names, 10 + k) for k, names in enumerate(STUDIES)]


def _concat(paths: list[Path], join: str) -> Any:
    return anndata.concat([anndata.read_h5ad(p) for p in paths], join=join, fill_value=0)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("join", ["outer", "inner"])
def test_join_gives_anndata_concat(corpus: list[Path], join: str, form: str) -> None:
    want = _concat(corpus, join)
    with HDF5SessionDataset(corpus, key="X", join=join, sparse=form) as ds:
        assert ds.handles.var_names == list(want.var_names)
        assert ds.handles.columns == list(want.var_names)
        assert len(ds) == want.n_obs
        np.testing.assert_array_equal(_read_all(ds), _want(want))
        np.testing.assert_array_equal(_dense_sample(ds, 45, form), _want(want)[45])


@pytest.mark.parametrize("join", ["outer", "inner", None])
def test_genes_after_a_join_or_alone_across_differing_files(
    corpus: list[Path], join: str | None
) -> None:
    genes = ["g12", "g0", "g13", "g0", "g4"] if join != "inner" else ["g8", "g0", "g8"]
    want = _concat(corpus, join or "outer")[:, genes]
    with HDF5SessionDataset(corpus, key="X", join=join, genes=genes, sparse="dense") as ds:
        assert ds.handles.columns == genes
        np.testing.assert_array_equal(_read_all(ds), _want(want))
    with pytest.raises(ConfigError, match=r"no file's var index holds.*'g99'"):
        HDF5SessionDataset(corpus, key="X", join=join, genes=["g0", "g99"])


def test_positions_and_masks_apply_to_the_joined_index(corpus: list[Path]) -> None:
    want = _concat(corpus, "outer")
    mask = np.arange(want.n_vars) % 2 == 1
    for genes in ([3, 0, 3], mask):
        with HDF5SessionDataset(corpus, key="X", join="outer", genes=genes) as ds:
            np.testing.assert_array_equal(_read_all(ds), _want(want[:, genes]))
    with pytest.raises(ConfigError, match=r"differs from.*join='outer'"):
        HDF5SessionDataset(corpus, key="X", genes=[0, 1])  # positions over which index?


def test_files_that_differ_are_refused_without_join_and_joins_are_named(
    corpus: list[Path], tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=rf"{corpus[1]}.*differs.*join='outer'.*join='inner'"):
        HDF5SessionDataset(corpus, key="X")
    with pytest.raises(ConfigError, match=r"join='left'.*\['outer', 'inner'\]"):
        HDF5SessionDataset(corpus, key="X", join="left")
    other = _write(tmp_path / "other.h5ad", ["x", "y"], 3)
    with pytest.raises(ConfigError, match="share no gene"):
        HDF5SessionDataset([corpus[0], other], key="X", join="inner")
    twice = _write(tmp_path / "twice.h5ad", ["g1", "g2", "g1"], 4)
    with pytest.raises(ConfigError, match=rf"{twice}.*'g1' twice"):
        HDF5SessionDataset([corpus[0], twice], key="X", join="outer")
    dense = tmp_path / "dense.h5ad"
    anndata.AnnData(X=np.ones((3, 2), np.float32)).write_h5ad(dense)
    with pytest.raises(ConfigError, match="sparse='dense' applies to a sparse"):
        HDF5SessionDataset([dense], key="X", join="outer", sparse="dense")  # join: dense too


def test_column_ids_are_checked_against_each_files_own_width(
    corpus: list[Path], tmp_path: Path
) -> None:
    import h5py

    small = _write(tmp_path / "small.h5ad", ["g0", "g5"], 5, cells=10)
    with h5py.File(small, "r+") as f:
        indices = f["X/indices"]
        indices[0] = 5  # inside the join's 11 columns, outside this file's 2
        row = int(np.searchsorted(f["X/indptr"][()], 0, side="right")) - 1
    with HDF5SessionDataset([corpus[0], small], key="X", join="outer") as ds:
        assert ds.handles.n_vars == 10
        with pytest.raises(HDF5FileError, match=rf"{small}.*row {row} holds column id 5.*0..1"):
            ds.__getitems__(list(range(30, 40)))


def _batches(paths: list[Path], **kwargs: Any) -> list[np.ndarray]:
    ds = HDF5SessionDataset(paths, key="X", join="outer", genes=["g0", "g13", "g0", "g7"])
    with create_dataloader(ds, batch_size=8, shuffle=True, seed=3, **kwargs) as loader:
        return [_dense(b, 4) for b in loader]


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
    got = _batches(corpus, **how)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def _rank(rank: int, world: int, paths: list[str]) -> list[list[float]]:
    ds = HDF5SessionDataset(paths, key="X", join="outer", sparse="dense")
    with DataLoader(ds, batch_size=8 // world, training=True, seed=5) as loader:
        return [b.sum(dim=1).tolist() for b in loader]


@pytest.mark.distributed
def test_two_gloo_ranks_read_the_joined_corpus_as_one_process(
    corpus: list[Path], tmp_path: Path
) -> None:
    paths = [str(p) for p in corpus]
    one = _rank(0, 1, paths)
    ranks = run_distributed(_rank, 2, tmp_path, paths)
    merged = [a + b for a, b in zip(ranks[0], ranks[1], strict=True)]
    assert merged == one


def test_resume_refuses_a_state_saved_with_other_columns(corpus: list[Path]) -> None:
    def make(**kwargs: Any) -> DataLoader:
        ds = HDF5SessionDataset(corpus, key="X", **kwargs)
        return create_dataloader(ds, batch_size=8, shuffle=True, seed=1)

    with make(join="outer") as loader:
        iterator = iter(loader)
        next(iterator)
        state = loader.state_dict()
        del iterator
    for other in ({"join": "inner"}, {"join": "outer", "genes": ["g0", "g1"]}):
        with make(**other) as loader, pytest.raises(ConfigError, match="chosen samples differ"):
            loader.load_state_dict(state)
    with make(join="outer") as loader:  # the same columns: resumed after the first batch
        loader.load_state_dict(state)
        assert len(list(loader)) == len(loader) - 1


def test_normalised_totals_are_over_the_joined_columns(corpus: list[Path]) -> None:
    """normalize_total + log1p on a joined batch: scanpy's formula over the served genes."""
    from loaderkit.singlecell import log1p, normalize_total

    want = _want(_concat(corpus, "outer")[:, ["g12", "g0", "g4", "g9"]])
    totals = want.sum(axis=1, keepdims=True)
    scale = np.divide(1e4, totals, out=np.zeros_like(totals), where=totals > 0)
    want = np.log1p(want * scale)
    ds = HDF5SessionDataset(corpus, key="X", join="outer", genes=["g12", "g0", "g4", "g9"])
    with create_dataloader(ds, batch_size=16) as loader:
        got = np.concatenate([log1p(normalize_total(b)).to_dense().numpy() for b in loader])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
