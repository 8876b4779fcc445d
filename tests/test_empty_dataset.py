"""A dataset with no samples: refused when loaderkit builds the sampler, torch's otherwise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import TensorDataset

from loaderkit import ConfigError, DataLoader, HDF5SessionDataset, create_dataloader
from tests.dist_utils import run_distributed
from tests.hdf5.helpers import write_sessions


def _empty_sessions(root: Path) -> HDF5SessionDataset:
    return HDF5SessionDataset(write_sessions(root, [0, 0, 0]), key="betas")


@pytest.mark.parametrize(
    "options",
    [
        {"shuffle": "block"},
        {"shuffle": "block", "num_workers": 2},
        {"shuffle": True},
        {"training": True},
    ],
)
def test_all_empty_sessions_are_refused_at_construction(tmp_path: Path, options: Any) -> None:
    dataset = _empty_sessions(tmp_path)
    with pytest.raises(ConfigError, match="has no samples") as info:
        DataLoader(dataset, batch_size=4, **options)
    message = str(info.value)
    assert "HDF5SessionDataset" in message and "0 rows" in message
    assert "betas_session01.hdf5" in message
    assert isinstance(info.value, ValueError)  # as torch's RandomSampler raises


def test_torch_values_keep_torch_behaviour_on_an_empty_dataset(tmp_path: Path) -> None:
    empty = TensorDataset(torch.zeros(0, 3))
    # torch: a SequentialSampler over nothing gives 0 batches, no error
    assert list(create_dataloader(empty, batch_size=2)) == []
    assert list(create_dataloader(empty, batch_size=2, shuffle=False)) == []
    assert list(DataLoader(_empty_sessions(tmp_path), batch_size=2, shuffle=None)) == []
    with pytest.raises(ValueError, match="num_samples should be a positive integer value"):
        torch.utils.data.DataLoader(empty, shuffle=True)
    with pytest.raises(ValueError, match="num_samples should be a positive integer value"):
        create_dataloader(empty, shuffle=True)


def test_a_dataset_with_samples_is_not_refused(tmp_path: Path) -> None:
    ds = HDF5SessionDataset(write_sessions(tmp_path, [0, 5, 0]), key="betas")
    assert sum(len(b) for b in DataLoader(ds, batch_size=2, shuffle="block", seed=0)) == 5


def _empty_on_ranks(rank: int, world_size: int, root: str, training: bool) -> str:
    dataset = TensorDataset(torch.zeros(0, 3))
    try:
        create_dataloader(dataset, batch_size=2, training=training)
    except ConfigError as error:
        return str(error)
    return "built"


@pytest.mark.parametrize("training", [True, False])
def test_distributed_shards_of_nothing_are_refused(tmp_path: Path, training: bool) -> None:
    results = run_distributed(_empty_on_ranks, 2, tmp_path, str(tmp_path), training)
    sampler = "DistributedSampler" if training else "ShardSampler"
    assert all("has no samples" in r and sampler in r for r in results), results
