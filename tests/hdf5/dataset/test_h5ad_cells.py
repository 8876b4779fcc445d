"""``cells=``: the cells of each ``.h5ad`` file chosen by a function of its obs.

Three files written by anndata (200 cells x 50 genes; ``cell_type`` categorical ``B``/``T``/
``NK`` in turn, file 1 ``B``/``T``/missing; ``n_counts`` float32 row sums); every chosen
row is compared with anndata's own ``adata[mask]``. The dataset's samples are the chosen cells
in file order, for the loader's orders (shuffled, block), every worker method, resume (which
refuses a state saved with other chosen cells) and the plan.
"""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch

from loaderkit import DataLoader, create_dataloader
from loaderkit.errors import ConfigError, HDF5FileError
from loaderkit.hdf5 import BlockShuffleSampler, HDF5SessionDataset
from loaderkit.storage import SessionCache

anndata = pytest.importorskip("anndata")
pd = pytest.importorskip("pandas")

from tests.dist_utils import run_distributed  # noqa: E402
from tests.hdf5.h5adfiles import (  # noqa: E402
    matrix,
    write_current,
    write_legacy,
    write_nullable_strings,
)
from tests.helpers import START_METHODS, tiered  # noqa: E402

TYPES = [("B", "T", "NK"), ("B", "T", None), ("B", "T", "NK")]


def b_cells(obs: Any) -> Any:
    """The B cells with more than 5 counts (scanpy: ``obs.cell_type == "B"`` and a cut)."""
    return (obs["cell_type"] == "B") & (obs["n_counts"] > 5)


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("h5ad-cells")
    return [
        write_current(root / f"s{i}.h5ad", matrix(i), cell_types=TYPES[i], **kw)
        for i, kw in enumerate([{}, {"compression": "gzip"}, {}])
    ]


def anndata_rows(paths: list[Path], choose: Any) -> np.ndarray:
    """anndata's ``adata[mask].X`` of every file, in file order (dense)."""
    rows = []
    for path in paths:
        adata = anndata.read_h5ad(path)
        mask = choose(adata.obs)
        rows.append(adata[np.asarray(mask)].X.toarray())
    return np.concatenate(rows)


def dense(batch: Any) -> np.ndarray:
    return batch.to_dense().numpy() if batch.layout != torch.strided else batch.numpy()


def test_a_mask_gives_anndatas_rows_in_file_order(paths: list[Path]) -> None:
    truth = anndata_rows(paths, lambda obs: (obs.cell_type == "B") & (obs.n_counts > 5))
    with HDF5SessionDataset(paths, key="X", sparse="dense", cells=b_cells) as ds:
        assert len(ds) == truth.shape[0] > 0
        assert np.array_equal(np.stack([ds[i] for i in range(len(ds))]), truth)
        assert np.array_equal(np.stack(ds.__getitems__([*range(len(ds))])), truth)
        assert ds.handles.cells is not None and sum(ds.handles.cells.chosen) == len(ds)
        assert ds.handles.cells.cells == (200, 200, 200)
        session, row = ds.locate(len(ds) - 1)
        assert session == 2 and row == int(np.flatnonzero(b_cells(_obs(paths[2])))[-1])
    with HDF5SessionDataset(paths, key="X", cells=b_cells) as csr:  # the CSR form: same rows
        assert np.array_equal(np.stack([csr[i].to_dense().numpy() for i in range(len(csr))]), truth)


def _obs(path: Path) -> dict[str, np.ndarray]:
    obs = anndata.read_h5ad(path).obs
    types = obs["cell_type"].astype(object)
    return {
        "cell_type": np.array(types.where(obs["cell_type"].notna(), None)),
        "n_counts": obs["n_counts"].to_numpy(),
    }


def test_positions_choose_rows_of_a_dense_x_with_labels_beside_it(tmp_path: Path) -> None:
    files = []
    for i in range(2):
        names = pd.Index([f"f{i}c{j}" for j in range(200)], name="barcode")  # a named index
        obs = pd.DataFrame({"n": np.arange(200) * i}, index=names)
        adata = anndata.AnnData(X=matrix(i).toarray(), obs=obs)
        files.append(tmp_path / f"d{i}.h5ad")
        adata.write_h5ad(files[-1])
    chosen = {0: np.array([3, 4, 150]), 1: np.array([], np.int64)}

    def pick(obs: Any) -> Any:
        assert obs["_index"] is obs["barcode"] and list(obs) == ["_index", "n"]
        return chosen[int(obs["_index"][0][1])]  # "f0c0" -> file 0

    with HDF5SessionDataset(files, key=("X", "obs/n"), cells=pick) as ds:
        assert len(ds) == 3  # file 1 gives no cell
        truth = anndata.read_h5ad(files[0]).X[chosen[0]]
        assert np.array_equal(np.stack([ds[i]["X"] for i in range(3)]), truth)
        assert [int(ds[i]["obs/n"]) for i in range(3)] == [0, 0, 0]
        assert ds.handles.cells is not None and ds.handles.cells.chosen == (3, 0)


def test_obs_columns_read_as_pandas_shows_them(tmp_path: Path) -> None:
    path = write_current(tmp_path / "o.h5ad", matrix(0, cells=6), cell_types=("B", None))
    adata = anndata.read_h5ad(path)
    adata.obs["passed"] = pd.array([True, None, False, True, True, None], dtype="boolean")
    adata.obs["genes"] = pd.array([5, 6, None, 8, 9, 10], dtype="Int64")
    adata.write_h5ad(path)  # nullable booleans and integers, as anndata stores them
    with h5py.File(path, "r+") as f:  # a string column with missing values (pandas 3)
        write_nullable_strings(f["obs"], "donor", ["d1", None, "d2", "d1", None, "d3"])
    seen: dict[str, Any] = {}

    def look(obs: Any) -> Any:
        seen.update({name: obs[name] for name in obs})
        seen["keys"] = list(obs.keys())
        return np.ones(6, bool)

    HDF5SessionDataset([path], key="X", cells=look).close()
    adata = anndata.read_h5ad(path)
    assert seen["keys"][:4] == ["_index", "cell_type", "n_counts", "batch"]
    assert seen["_index"].tolist() == adata.obs_names.tolist()
    assert seen["cell_type"].tolist() == ["B", None, "B", None, "B", None]
    assert seen["n_counts"].dtype == np.float32
    assert np.array_equal(seen["n_counts"], adata.obs["n_counts"].to_numpy())
    assert seen["batch"].dtype == np.int64
    assert seen["donor"].tolist() == ["d1", None, "d2", "d1", None, "d3"]
    assert seen["passed"].tolist() == [True, None, False, True, True, None]
    assert seen["genes"].tolist() == [5, 6, None, 8, 9, 10]
    assert not seen["n_counts"].flags.writeable  # read-only: shared by every ask


def test_a_legacy_files_obs_table_gives_its_fields(tmp_path: Path) -> None:
    m = matrix(0)
    path = write_legacy(tmp_path / "legacy.h5ad", m)  # obs: a compound table, field "index"

    def named(obs: Any) -> Any:
        assert list(obs) == ["_index"]
        return np.isin(obs["index"], ["c3", "c7"])  # the index under its own name too

    with HDF5SessionDataset([path], key="X", sparse="dense", cells=named) as ds:
        assert [ds.locate(i)[1] for i in range(len(ds))] == [3, 7]
        assert np.array_equal(ds[1], m[7].toarray().ravel())


def test_a_column_is_read_only_when_the_function_asks_for_it(tmp_path: Path) -> None:
    path = write_current(tmp_path / "d.h5ad", matrix(0))
    t_cells = int((anndata.read_h5ad(path).obs.cell_type == "T").sum())
    with h5py.File(path, "r+") as f:  # a damaged column no one asks for
        del f["obs/batch"]
        f["obs"].create_group("batch").attrs["encoding-type"] = "categorical"  # no codes
    asked: list[Any] = []

    def types(obs: Any) -> Any:
        asked.append(obs)
        assert "batch" in obs and list(obs)[-1] == "batch"  # listed, not read
        return obs["cell_type"] == "T"

    with HDF5SessionDataset([path], key="X", cells=types) as ds:
        assert len(ds) == t_cells
    assert asked[0].read == ["cell_type"]
    with pytest.raises(HDF5FileError, match="no integer 'codes'") as info:
        HDF5SessionDataset([path], key="X", cells=lambda obs: obs["batch"] == 0)
    assert "in cells= for session 0" in "".join(getattr(info.value, "__notes__", []))


def test_a_missing_column_names_the_file_and_the_columns(paths: list[Path]) -> None:
    with pytest.raises(KeyError, match="has no obs column 'celltype'") as info:
        HDF5SessionDataset(paths, key="X", cells=lambda obs: obs["celltype"] == "B")
    assert str(paths[0]) in str(info.value) and "'cell_type'" in str(info.value)


@pytest.mark.parametrize(
    ("result", "said"),
    [
        (np.ones(199, bool), "returned a mask of length 199"),
        (np.ones(200, np.float32), "returned an array of dtype float32"),
        (np.array([5, 3]), "entries 0 and 1 (5, 3) are not sorted"),
        (np.array([3, 3]), "entries 0 and 1 (3, 3) are repeated"),
        (np.array([-1, 3]), "entry 0 is -1, out of range"),
        (np.array([3, 200]), "entry 1 is 200, out of range"),
        (np.ones((200, 1), bool), "returned an array of shape (200, 1)"),
        ("B", "returned a str"),
        (None, "returned a NoneType"),
    ],
    ids=["length", "dtype", "unsorted", "repeated", "negative", "past-end", "2-d", "str", "none"],
)
def test_a_wrong_return_is_refused_naming_the_file(
    paths: list[Path], result: Any, said: str
) -> None:
    with pytest.raises(ConfigError) as info:
        HDF5SessionDataset({"donor1": paths[0]}, key="X", cells=lambda obs: result)
    message = str(info.value)
    assert said in message, message
    assert "session 'donor1'" in message and str(paths[0]) in message
    assert "boolean mask of the file's 200 cells" in message and "sorted unique" in message


class OwnIndex(HDF5SessionDataset):
    def build_index(self) -> Any:
        return [(0, 0)]


def test_a_subclass_with_its_own_index_and_cells_is_refused_by_name(paths: list[Path]) -> None:
    with pytest.raises(ConfigError, match="OwnIndex overrides build_index"):
        OwnIndex(paths, key="X", cells=b_cells)


def test_a_node_cache_and_a_function_that_is_not_one_are_refused(
    paths: list[Path], tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match="from local files without cache= only"):
        HDF5SessionDataset(paths, key="X", cells=b_cells, cache=SessionCache(tmp_path / "c"))
    with pytest.raises(ConfigError, match="cells= must be a function"):
        HDF5SessionDataset(paths, key="X", cells=np.ones(200, bool))  # type: ignore[arg-type]


def test_no_chosen_cell_is_an_empty_dataset(paths: list[Path]) -> None:
    with HDF5SessionDataset(paths, key="X", cells=lambda obs: np.zeros(0, np.int64)) as ds:
        assert (
            len(ds) == 0 and ds.handles.cells is not None and ds.handles.cells.chosen == (0, 0, 0)
        )
        with pytest.raises(ConfigError, match="has no samples: cells= chose no cell") as info:
            DataLoader(ds, batch_size=4, shuffle=True)
        assert "0 of 600 cells in 3 files" in str(info.value)
        assert list(DataLoader(ds, batch_size=4)) == []


def test_the_function_is_not_kept_and_the_dataset_pickles(paths: list[Path]) -> None:
    with HDF5SessionDataset(paths, key="X", sparse="dense", cells=lambda obs: b_cells(obs)) as ds:
        copy = pickle.loads(pickle.dumps(ds))
        assert len(copy) == len(ds)
        assert np.array_equal(copy[len(ds) - 1], ds[len(ds) - 1])
        copy.close()


def test_the_plan_says_what_each_file_gave(paths: list[Path], tmp_path: Path) -> None:
    copies = [shutil.copy(p, tmp_path / f"{k}{p.name}") for k in "abc" for p in paths]
    with HDF5SessionDataset(copies, key="X", cells=b_cells) as ds:
        chosen = ds.handles.cells.chosen if ds.handles.cells is not None else ()
        with DataLoader(ds, batch_size=8) as loader:
            row = loader.plan["cells"]
        assert row.value == len(ds) == sum(chosen)
        assert row.reason.startswith(f"{len(ds):,} of 1,800 cells in 9 files chosen by cells=")
        assert f"0: {chosen[0]} of 200" in row.reason and "(5 more files)" in row.reason
    with HDF5SessionDataset(paths, key="X") as every, DataLoader(every, batch_size=8) as loader:
        assert "cells" not in loader.plan


def _epoch(ds: Any, **kwargs: Any) -> list[np.ndarray]:
    with create_dataloader(ds, batch_size=16, seed=3, **kwargs) as loader:
        return [dense(b) for b in loader]


def test_block_order_reads_every_chosen_cell_once(paths: list[Path]) -> None:
    truth = anndata_rows(paths, lambda obs: (obs.cell_type == "B") & (obs.n_counts > 5))
    with HDF5SessionDataset(paths, key="X", sparse="dense", cells=b_cells) as ds:
        sampler = BlockShuffleSampler(ds, seed=0, block_size=4)
        order = list(sampler)
        assert sorted(order) == list(range(len(ds)))
        assert np.array_equal(np.concatenate(_epoch(ds, sampler=sampler)), truth[order])
        block = np.concatenate(_epoch(ds, shuffle="block"))
        assert np.array_equal(np.sort(block, axis=0), np.sort(truth, axis=0))


# fork: the index inherited; spawn: the index pickled, no function (forkserver: as spawn,
# slow tier); threads: one reader shared by two threads
@pytest.mark.parametrize(
    "options",
    tiered(
        [{"num_workers": 2, "multiprocessing_context": m} for m in START_METHODS]
        + [{"num_workers": 2, "worker_method": "thread"}],
        [{"num_workers": 2, "multiprocessing_context": m} for m in ("fork", "spawn")]
        + [{"num_workers": 2, "worker_method": "thread"}],
        ids=[*START_METHODS, "threads"],
    ),
)
def test_every_worker_method_reads_the_same_batches(
    paths: list[Path], options: dict[str, Any]
) -> None:
    truth = anndata_rows(paths, lambda obs: (obs.cell_type == "B") & (obs.n_counts > 5))
    with HDF5SessionDataset(paths, key="X", cells=lambda obs: b_cells(obs)) as ds:
        alone = _epoch(ds, shuffle=True)
        assert np.array_equal(np.sort(np.concatenate(alone), axis=0), np.sort(truth, axis=0))
        other = _epoch(ds, shuffle=True, **options)
        assert all(np.array_equal(a, b) for a, b in zip(alone, other, strict=True))


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch_over_the_chosen_cells(paths: list[Path], workers: int) -> None:
    ds = HDF5SessionDataset(paths, key="X", sparse="dense", cells=b_cells)
    full = _epoch(ds, shuffle=True)
    options = {"num_workers": workers, **({"multiprocessing_context": "fork"} if workers else {})}
    with create_dataloader(ds, batch_size=16, seed=3, shuffle=True, **options) as first:
        iterator = iter(first)
        seen = [dense(next(iterator)) for _ in range(2)]
        state = first.state_dict()
    with create_dataloader(ds, batch_size=16, seed=3, shuffle=True, **options) as second:
        second.load_state_dict(state)
        rest = [dense(b) for b in second]
    assert len(seen) + len(rest) == len(full)
    assert all(np.array_equal(a, b) for a, b in zip(seen + rest, full, strict=True))
    ds.close()


def test_a_state_saved_with_other_chosen_cells_is_refused_by_name(paths: list[Path]) -> None:
    b = HDF5SessionDataset(paths[:1], key="X", cells=lambda obs: obs["cell_type"] == "B")
    t = HDF5SessionDataset(paths[:1], key="X", cells=lambda obs: obs["cell_type"] == "T")
    assert len(b) == len(t)  # 67 of each: only which cells tells them apart
    with create_dataloader(b, batch_size=8, seed=3, shuffle=True) as loader:
        next(iter(loader))
        state = loader.state_dict()
    with create_dataloader(t, batch_size=8, seed=3, shuffle=True) as other:
        with pytest.raises(ConfigError, match="the dataset's chosen samples differ") as info:
            other.load_state_dict(state)
        assert "cells=" in str(info.value) and "dataset length" not in str(info.value)
        state["loader"].pop("samples_key")  # a state saved before the key existed: loads
        other.load_state_dict(state)
    again = HDF5SessionDataset(paths[:1], key="X", cells=lambda obs: obs["cell_type"] == "B")
    with create_dataloader(again, batch_size=8, seed=3, shuffle=True) as same:
        same.load_state_dict(_state(b))  # the same choice built again: resumes
    for ds in (b, t, again):
        ds.close()


def _state(ds: HDF5SessionDataset) -> dict[str, Any]:
    with create_dataloader(ds, batch_size=8, seed=3, shuffle=True) as loader:
        next(iter(loader))
        return loader.state_dict()


def _global_batches(rank: int, world: int, paths: list[str]) -> list[np.ndarray]:
    ds = HDF5SessionDataset(paths, key="X", sparse="dense", cells=b_cells)
    with DataLoader(ds, batch_size=8 // world, shuffle=True, seed=5, training=True) as loader:
        return [dense(b) for b in loader]


@pytest.mark.distributed
def test_two_gloo_ranks_read_one_process_global_batches_of_the_chosen_cells(
    paths: list[Path], tmp_path: Path
) -> None:
    files = [str(p) for p in paths]
    one = _global_batches(0, 1, files)
    truth = anndata_rows(paths, lambda obs: (obs.cell_type == "B") & (obs.n_counts > 5))
    assert np.array_equal(np.sort(np.concatenate(one), axis=0), np.sort(truth, axis=0))
    ranks = run_distributed(_global_batches, 2, tmp_path, files)
    merged = [np.concatenate([r[k] for r in ranks]) for k in range(len(ranks[0]))]
    assert len(merged) == len(one)
    assert all(np.array_equal(a, b) for a, b in zip(merged, one, strict=True))
