"""Subclasses over a sparse (CSR) key: hooks that call ``super()`` batch as the plain dataset.

A ``read`` override gives 1-D sparse rows per sample, which torch's ``default_collate``
refuses; the loader fills in ``loaderkit.workers.collate.collate``, which stacks them into
the sparse CSR batch the plain dataset's batched reads give, in every worker kind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from loaderkit import create_dataloader
from loaderkit.hdf5 import HDF5SessionDataset
from loaderkit.workers.collate import collate, stack_sparse

pytest.importorskip("anndata")

from tests.hdf5.h5adfiles import matrix, write_current


class Reads(HDF5SessionDataset):
    """Per-sample reads through the default ``read``."""

    def read(self, session_id: Any, row: int) -> Any:
        return super().read(session_id, row)


class Scales(HDF5SessionDataset):
    """A per-sample transform of the sparse row (batched reads, then the transform)."""

    def transform(self, sample: Any, index: int) -> Any:
        return sample * 2


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("h5ad_subclass")
    return [
        write_current(root / "s0.h5ad", matrix(0)),
        write_current(root / "s1.h5ad", matrix(1), compression="gzip"),
    ]


def _epoch(ds: Any, **options: Any) -> list[Any]:
    with create_dataloader(ds, batch_size=48, seed=5, shuffle=True, **options) as loader:
        return list(loader)


def _dense(batch: Any) -> np.ndarray:
    assert batch.layout == torch.sparse_csr
    return batch.to_dense().numpy()


WORKERS = [
    {"num_workers": 0},
    {"num_workers": 2, "multiprocessing_context": "fork"},
    {"num_workers": 2, "multiprocessing_context": "spawn"},
    {"num_workers": 2, "worker_method": "thread"},
]
IDS = ["main", "fork", "spawn", "threads"]


@pytest.mark.parametrize("options", WORKERS, ids=IDS)
def test_a_read_subclass_batches_sparse_rows_as_the_plain_dataset(
    files: list[Path], options: dict[str, Any]
) -> None:
    with HDF5SessionDataset(files, key="X") as plain, Reads(files, key="X") as mine:
        expected = [_dense(b) for b in _epoch(plain)]
        with create_dataloader(mine, batch_size=48, seed=5, shuffle=True, **options) as loader:
            plan = loader.describe()
            got = [_dense(b) for b in loader]
    assert "loaderkit.workers.collate.collate" in plan and "sparse" in plan
    assert len(got) == len(expected)
    assert all(np.array_equal(a, b) for a, b in zip(expected, got, strict=True))


@pytest.mark.parametrize("options", WORKERS[::3], ids=IDS[::3])
def test_a_transform_subclass_and_dict_samples_keep_sparse_rows(
    files: list[Path], options: dict[str, Any]
) -> None:
    with HDF5SessionDataset(files, key="X") as plain, Scales(files, key="X") as mine:
        expected = [2 * _dense(b) for b in _epoch(plain)]
        got = [_dense(b) for b in _epoch(mine, **options)]
    assert all(np.array_equal(a, b) for a, b in zip(expected, got, strict=True))
    keys = ("X", "obs/n_counts")
    with HDF5SessionDataset(files, key=keys) as plain, Reads(files, key=keys) as mine:
        expected_dicts = _epoch(plain)
        got_dicts = _epoch(mine, **options)
    for a, b in zip(expected_dicts, got_dicts, strict=True):
        assert np.array_equal(_dense(a["X"]), _dense(b["X"]))
        assert torch.equal(a["obs/n_counts"], b["obs/n_counts"])


def test_an_explicit_collate_fn_wins(files: list[Path]) -> None:
    def as_list(samples: list[Any]) -> list[Any]:
        return samples

    with Reads(files, key="X") as mine:
        with create_dataloader(mine, batch_size=4, collate_fn=as_list) as loader:
            batch = next(iter(loader))
    assert isinstance(batch, list) and batch[0].layout == torch.sparse_coo


def test_stack_sparse_rows_and_refusals() -> None:
    rows = [torch.tensor([0.0, 3.0, 0.0, 1.0]).to_sparse(), torch.zeros(4).to_sparse()]
    ids, values = torch.tensor([[3, 0, 3]]), torch.tensor([1.0, 2, 4])
    uncoalesced = torch.sparse_coo_tensor(ids, values, (4,))
    batch = stack_sparse([*rows, uncoalesced])
    assert batch.layout == torch.sparse_csr and batch.shape == (3, 4)
    assert batch.to_dense().tolist() == [[0, 3, 0, 1], [0, 0, 0, 0], [2, 0, 0, 5]]
    matrices = [torch.eye(2).to_sparse(), torch.ones(2, 2).to_sparse()]
    stacked = torch.stack([torch.eye(2), torch.ones(2, 2)])
    assert torch.equal(stack_sparse(matrices).to_dense(), stacked)
    with pytest.raises(TypeError, match=r"one shape.*\(4,\).*\(5,\)"):
        stack_sparse([rows[0], torch.zeros(5).to_sparse()])
    nested = collate([{"x": rows[0], "y": 1}, {"x": rows[1], "y": 2}])
    assert nested["x"].layout == torch.sparse_csr and nested["y"].tolist() == [1, 2]
    assert torch.equal(collate([torch.ones(2), torch.zeros(2)]), torch.tensor([[1.0, 1], [0, 0]]))


class Fails(HDF5SessionDataset):
    def transform(self, sample: Any, index: int) -> Any:
        raise ValueError(f"no good: {index}")


def test_an_error_in_a_hook_names_the_keys_as_given(files: list[Path]) -> None:
    for key, named in (("X", "'X'"), (("X", "obs/n_counts"), "['X', 'obs/n_counts']")):
        with Fails(files, key=key) as ds, pytest.raises(ValueError, match="no good: 7") as info:
            ds[7]
        note = "\n".join(getattr(info.value, "__notes__", []))
        assert f"(key {named}, process" in note and "indices" not in note
