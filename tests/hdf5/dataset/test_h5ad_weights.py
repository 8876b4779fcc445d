"""``balanced_weights`` over ``.h5ad`` files written by anndata, and the loader it feeds.

The truth is anndata's own reading: each file's ``adata.obs["cell_type"]`` as strings (a
missing label NaN), concatenated in file order and taken at the dataset's samples; a category
weighs ``1 / (present categories x its samples)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loaderkit import (
    ConfigError,
    HDF5SessionDataset,
    MissingKeyError,
    WeightedSampler,
    balanced_weights,
    create_dataloader,
)
from loaderkit.hdf5 import SampleIndex

anndata = pytest.importorskip("anndata")
pd = pytest.importorskip("pandas")

from tests.hdf5.h5adfiles import matrix, write_current  # noqa: E402

KEY = ("X", "obs/cell_type")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], np.ndarray]:
    """3 files x 200 cells; their category lists differ in names and order.

    s0: B/T/NK in turn; s1 (gzip): T/Mono/missing/T, so its list is [Mono, T]; s2: a 90/9/1
    split of B/T/NK whose list also holds "Absent", a category no cell has. Returns the
    paths and every cell's label as anndata reads it (``None`` where missing).
    """
    root = tmp_path_factory.mktemp("weights")
    split = ("B",) * 90 + ("T",) * 9 + ("NK",)
    s1 = ("T", "Mono", None, "T")
    paths = [
        write_current(root / "s0.h5ad", matrix(0)),
        write_current(root / "s1.h5ad", matrix(1), compression="gzip", cell_types=s1),
        write_current(root / "s2.h5ad", matrix(2), cell_types=split),
    ]
    adata = anndata.read_h5ad(paths[2])
    adata.obs["cell_type"] = adata.obs["cell_type"].cat.add_categories(["Absent"])
    adata.write_h5ad(paths[2])
    labels = [anndata.read_h5ad(p).obs["cell_type"].astype(object) for p in paths]
    assert list(anndata.read_h5ad(paths[1]).obs["cell_type"].cat.categories) == ["Mono", "T"]
    every = pd.concat(labels).to_numpy(object)
    return paths, np.array([None if pd.isna(x) else x for x in every], object)


def truth(labels: np.ndarray) -> np.ndarray:
    present = pd.Series([x for x in labels if x is not None]).value_counts()
    return np.array([0.0 if x is None else 1.0 / (len(present) * present[x]) for x in labels])


def test_every_category_weighs_the_same(corpus: tuple[list[Path], np.ndarray]) -> None:
    paths, labels = corpus
    with HDF5SessionDataset(paths, key=KEY) as ds:
        weights = balanced_weights(ds, "obs/cell_type")
    assert weights.dtype == np.float64 and weights.shape == (600,)
    np.testing.assert_allclose(weights, truth(labels), rtol=1e-12)
    sums = {name: weights[labels == name].sum() for name in ("B", "T", "NK", "Mono")}
    np.testing.assert_allclose(list(sums.values()), 0.25, rtol=1e-12)  # "Absent" left out
    missing = np.array([x is None for x in labels])
    assert missing.sum() == 50 and np.all(weights[missing] == 0)


class Chosen(HDF5SessionDataset):
    """Some rows only: every row of s1, then the "B" rows of s0 (rows 0, 3, 6, ...)."""

    def build_index(self) -> SampleIndex:
        rows = np.concatenate([np.arange(200), np.arange(0, 200, 3)])
        return SampleIndex(np.repeat([1, 0], [200, 67]), rows)


def test_weights_follow_the_datasets_samples(corpus: tuple[list[Path], np.ndarray]) -> None:
    """Sample i's weight is its own cell's; a category no sample has (NK) is left out."""
    paths, labels = corpus
    chosen = np.concatenate([200 + np.arange(200), np.arange(0, 200, 3)])
    with Chosen(paths, key=KEY) as ds:
        weights = balanced_weights(ds, "obs/cell_type")
    assert set(labels[chosen]) == {"B", "T", "Mono", None}
    np.testing.assert_allclose(weights, truth(labels[chosen]), rtol=1e-12)
    np.testing.assert_allclose(weights.sum(), 1.0)


def test_the_name_a_dataset_serves_a_key_under(corpus: tuple[list[Path], np.ndarray]) -> None:
    paths, labels = corpus
    with HDF5SessionDataset(paths, key={"x": "X", "label": "obs/cell_type"}) as ds:
        np.testing.assert_allclose(balanced_weights(ds, "label"), truth(labels), rtol=1e-12)


@pytest.mark.parametrize(
    ("key", "error", "match"),
    [
        ("obs/n_counts", ConfigError, r"key 'obs/n_counts' of session 0 \(.*s0.h5ad\) is a "),
        ("obsm/X_pca", ConfigError, "'obsm/X_pca' .* not categorical"),
        ("obs/donor", MissingKeyError, r"session 0 \(.*s0.h5ad\) has no key 'obs/donor'"),
    ],
)
def test_a_key_without_categories_is_refused_by_name(
    corpus: tuple[list[Path], np.ndarray], key: str, error: type[Exception], match: str
) -> None:
    with HDF5SessionDataset(corpus[0], key=KEY) as ds, pytest.raises(error, match=match):
        balanced_weights(ds, key)


def _batches(loader: Any, epochs: int) -> list[list[tuple[list[int], list[list[float]]]]]:
    return [
        [(b["obs/cell_type"].tolist(), b["X"].to_dense().tolist()) for b in loader]
        for _ in range(epochs)
    ]


def test_balanced_batches_read_batch_native(corpus: tuple[list[Path], np.ndarray]) -> None:
    paths, _ = corpus
    ds = HDF5SessionDataset(paths, key=KEY)
    categories = ["B", "T", "NK", "Mono", "Absent"]  # the files' lists joined, first seen first
    calls: list[list[int]] = []
    read = ds.__getitems__

    def spy(indices: list[int]) -> Any:
        calls.append(list(indices))
        return read(indices)

    ds.__getitems__ = spy  # type: ignore[method-assign]  # torch's fetcher calls it by name
    sampler = WeightedSampler(balanced_weights(ds, "obs/cell_type"), num_samples=len(ds))
    with create_dataloader(ds, batch_size=50, sampler=sampler, seed=0) as loader:
        assert loader.plan["read_path"].value == "batch-native"
        assert "your WeightedSampler" in loader.plan["sampler"].reason
        drawn: list[int] = []
        for epoch in range(4):
            labels = [code for b in loader for code in b["obs/cell_type"].tolist()]
            assert loader.sampler.epoch == epoch
            expected = loader.sampler.indices().tolist()  # this pass's draws
            assert [i for call in calls[-12:] for i in call] == expected, epoch
            drawn += labels
    assert [len(call) for call in calls] == [50] * 48  # whole batches, 12 an epoch
    counts = np.bincount(drawn, minlength=len(categories))
    assert counts[categories.index("Absent")] == 0 and -1 not in drawn
    shares = counts[:4] / len(drawn)
    assert np.all(np.abs(shares - 0.25) < 0.06), dict(zip(categories, counts, strict=False))


# 0 workers, then 2 fork workers: the same draws and the same rows
def test_resume_mid_epoch_on_more_workers(corpus: tuple[list[Path], np.ndarray]) -> None:
    paths, _ = corpus

    def make(workers: int) -> Any:
        ds = HDF5SessionDataset(paths, key=KEY)
        sampler = WeightedSampler(balanced_weights(ds, "obs/cell_type"), 300)
        context = "fork" if workers else None
        return create_dataloader(
            ds,
            batch_size=32,
            sampler=sampler,
            seed=3,
            num_workers=workers,
            multiprocessing_context=context,
        )

    with make(0) as loader:
        reference = _batches(loader, 2)
    with make(0) as loader:
        iterator = iter(loader)
        for _ in range(4):
            next(iterator)
        state = loader.state_dict()
        del iterator
    with make(2) as resumed:
        resumed.load_state_dict(state)
        assert _batches(resumed, 2) == [reference[0][4:], reference[1]]
    assert state["loader"]["order"]["kind"] == "weighted"
