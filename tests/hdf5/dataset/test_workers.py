"""Real worker processes: fork, spawn and forkserver DataLoaders over HDF5SessionDataset."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from loaderkit.hdf5 import BlockShuffleSampler
from tests.hdf5.helpers import Probe, expected, hdf5_fds, row_value, write_sessions
from tests.helpers import START_METHODS, tiered

#: fork: handles reopened after fork; spawn: paths only pickled (forkserver: as spawn, slow tier)
CONTEXTS = tiered(START_METHODS, {"fork", "spawn"})


def _collect(loader: DataLoader) -> tuple[list[int], list[np.ndarray], list[int], set[int]]:
    indices: list[int] = []
    samples: list[np.ndarray] = []
    fds: list[int] = []
    pids: set[int] = set()
    for index, sample, open_fds, pid in loader:
        indices += index.tolist()
        samples += list(sample.numpy())
        fds += open_fds.tolist()
        pids |= set(pid.tolist())
    return indices, samples, fds, pids


@pytest.mark.parametrize("context", CONTEXTS)
def test_workers_read_every_sample_within_the_bound(tmp_path: Path, context: str) -> None:
    paths = write_sessions(tmp_path, [23, 17, 30, 11, 19], chunks=4 if context == "fork" else None)
    ds = Probe(paths, key="betas", max_open_files=2, root=str(tmp_path))
    if context == "fork":
        for s in range(5):  # handles opened in the parent before the workers fork
            ds.file(s)
        assert ds.handles.open_files == 2
    workers = 1 if context == "forkserver" else 2
    loader = DataLoader(
        ds,
        batch_size=7,
        shuffle=True,
        num_workers=workers,
        multiprocessing_context=context,
        generator=torch.Generator().manual_seed(0),
    )
    indices, samples, fds, pids = _collect(loader)
    assert sorted(indices) == list(range(len(ds)))
    assert indices != list(range(len(ds)))  # shuffled
    for i, sample in zip(indices, samples, strict=True):
        np.testing.assert_array_equal(sample, expected(ds, i))
    assert os.getpid() not in pids and len(pids) == workers
    # Measured in the workers with psutil: the worker's own files never exceed the bound
    # (a forked worker first drops the two handles it inherited).
    assert 1 <= max(fds) <= 2
    if context == "fork":
        assert ds.handles.open_files == 2  # the parent's handles are untouched and still usable
        np.testing.assert_array_equal(ds[0], row_value(0, 0))
    else:
        assert ds.handles.open_files == 0
    del loader
    ds.close()
    assert hdf5_fds(tmp_path) == []


def test_block_sampler_with_fork_workers(tmp_path: Path) -> None:
    from loaderkit.hdf5 import HDF5SessionDataset

    paths = write_sessions(tmp_path, [40, 33, 50], chunks=8, compression="gzip")
    ds = HDF5SessionDataset(paths, key="betas", max_open_files=2)
    sampler = BlockShuffleSampler(ds, seed=3)
    loader = DataLoader(
        ds, batch_size=16, sampler=sampler, num_workers=2, multiprocessing_context="fork"
    )
    seen = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        order = sampler.indices().tolist()
        got = torch.cat(list(loader)).numpy()
        assert got.shape == (len(ds), 3, 4)
        for i, sample in zip(order, got, strict=True):
            np.testing.assert_array_equal(sample, expected(ds, i))
        seen.append(order)
    assert seen[0] != seen[1]


def test_same_dataset_in_process_then_persistent_fork_workers(tmp_path: Path) -> None:
    from loaderkit.hdf5 import HDF5SessionDataset

    paths = write_sessions(tmp_path, [12, 9, 14])
    ds = HDF5SessionDataset(paths, key="betas", max_open_files=2)
    want = torch.stack([torch.from_numpy(expected(ds, i)) for i in range(len(ds))])
    in_process = torch.cat(list(DataLoader(ds, batch_size=5, num_workers=0)))
    assert torch.equal(in_process, want) and ds.handles.open_files == 2
    loader = DataLoader(
        ds, batch_size=5, num_workers=2, persistent_workers=True, multiprocessing_context="fork"
    )
    for _ in range(2):  # the same workers serve both epochs
        assert torch.equal(torch.cat(list(loader)), want)
    del loader
