"""A read failing mid-epoch, through the loader: its file and rows named, nothing served wrong.

The files are real ``.h5ad`` CSR groups written by h5py; a file is cut short (``truncate``)
while the loader is part-way through a buffered block shuffle, so the reads of its lost rows
come back short from the kernel — read ahead, planned, or in a worker process or thread.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch

from loaderkit import BlockShuffleSampler, HDF5SessionDataset, create_dataloader
from loaderkit.errors import HDF5FileError
from tests.hdf5.h5adfiles import matrix, write_csr

BATCH = 8


def _dense(batch: torch.Tensor) -> np.ndarray:
    return batch.to_dense().numpy() if batch.layout != torch.strided else batch.numpy()


@pytest.mark.parametrize(
    "how",
    [
        {},
        {"num_workers": 2, "worker_method": "thread"},
        {"num_workers": 2, "multiprocessing_context": "fork"},
        {"num_workers": 2, "multiprocessing_context": "spawn"},
    ],
    ids=["0 workers", "threads", "fork", "spawn"],
)
def test_a_file_cut_mid_epoch_is_named_and_no_batch_is_wrong(
    tmp_path: Path, how: dict[str, Any]
) -> None:
    mats = [matrix(s) for s in range(3)]
    paths = [write_csr(tmp_path / f"c{s}.h5ad", m) for s, m in enumerate(mats)]
    truth = np.concatenate([m.toarray() for m in mats])
    with h5py.File(paths[1], "r") as f:
        cut = f["X/data"].id.get_offset() + 4 * 40  # session 1 keeps its first 40 values
    ds = HDF5SessionDataset(paths, key="X")
    sampler = BlockShuffleSampler(ds, block_size=4, seed=3, batch_size=BATCH, fetch_factor=4)
    order = np.array(list(sampler))
    loader = create_dataloader(ds, batch_size=BATCH, sampler=sampler, **how)
    served = 0
    try:
        with pytest.raises(HDF5FileError) as caught:
            for i, batch in enumerate(loader):
                rows = order[i * BATCH : (i + 1) * BATCH]
                assert np.array_equal(_dense(batch), truth[rows]), f"batch {i} served wrong"
                served += 1
                if i == 3:
                    os.truncate(paths[1], cut)
    finally:
        loader.close()
        ds.close()
    message = str(caught.value)
    assert str(paths[1]) in message, message
    # a process that had it open names the rows it could not read; one that opens it after
    # the cut (a worker's first batch of it) is refused by HDF5: the whole file is named
    assert ("row" in message and "'X" in message) or "cannot open" in message, message
    # session 1's rows past the cut all lie in the batches after the fourth (each fetch of 4
    # batches mixes blocks from every file): the error came where they were first read
    lost = np.flatnonzero((order >= 200) & (order < 400))
    assert served >= 4 and served * BATCH <= lost[-1], (served, lost[:3])
