"""The finished-batch contract: where a reading process writes its batches is handed to it.

A loaderkit loader hands each worker process a ``WorkerMemory`` through
``LoaderSupport.use_batch_memory`` as it starts (its batch slot); the main process, worker
threads and torch's own ``DataLoader`` leave a dataset with plain memory. Real worker
processes under every start method; the HDF5 dataset's reader is asked what it was handed.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader as TorchDataLoader

from loaderkit import DataLoader, HDF5SessionDataset, LoaderSupport
from loaderkit.batches import PLAIN, BatchMemory, RowBatch
from loaderkit.workers.collate import WorkerMemory, collate
from tests.helpers import START_METHODS, tiered, write_h5_sessions


class Handed(LoaderSupport):
    """Records the memory the loader hands over on its dataset."""

    def __init__(self, dataset: MemoryDataset) -> None:
        self.dataset = dataset

    def use_batch_memory(self, memory: BatchMemory) -> None:
        self.dataset.memory = memory


class MemoryDataset(torch.utils.data.Dataset):
    """Each sample says which memory this process's copy of the dataset was handed."""

    def __init__(self) -> None:
        self.memory: Any = PLAIN

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> str:
        return type(self.memory).__name__

    def loader_support(self) -> Handed:
        return Handed(self)


def _names(loader: Any) -> set[str]:
    return {name for batch in loader for name in batch}


def test_plain_memory_and_a_worker_memory_pickle_as_plain_memory() -> None:
    assert pickle.loads(pickle.dumps(PLAIN)) is PLAIN
    assert pickle.loads(pickle.dumps(WorkerMemory(shared=True))) is PLAIN
    assert isinstance(PLAIN, BatchMemory) and isinstance(WorkerMemory(), BatchMemory)
    tensor, array = PLAIN.buffer(3, (2,), np.dtype("f4"))
    array[:] = 1
    batch = RowBatch(tensor, array)
    assert collate(batch) is tensor and len(batch) == 3
    with pytest.raises(TypeError, match="no torch dtype"):
        PLAIN.buffer(1, (), np.dtype(">f4"))


@pytest.mark.parametrize("method", tiered(START_METHODS, ("fork",)))
def test_a_loaderkit_worker_process_is_handed_its_batch_slot(method: str) -> None:
    loader = DataLoader(
        MemoryDataset(), batch_size=2, num_workers=1, multiprocessing_context=method
    )
    with loader:
        assert _names(loader) == {"WorkerMemory"}


def test_the_main_process_threads_and_torchs_loader_keep_plain_memory() -> None:
    assert _names(DataLoader(MemoryDataset(), batch_size=2)) == {"PlainMemory"}
    threads = DataLoader(MemoryDataset(), batch_size=2, num_workers=2, worker_method="thread")
    with threads:
        assert _names(threads) == {"PlainMemory"}
    torch_loader = TorchDataLoader(MemoryDataset(), batch_size=2, num_workers=1)
    assert _names(torch_loader) == {"PlainMemory"}


class ReaderMemory(HDF5SessionDataset):
    """Each sample: its row, and which memory the reader writes batches in."""

    def read(self, session: Any, row: int) -> Any:
        return type(self.handles.reader.memory).__name__


def test_the_hdf5_reader_writes_where_the_loader_says(tmp_path: Path) -> None:
    paths = write_h5_sessions(tmp_path, sessions=2, rows=8)
    with HDF5SessionDataset(paths, key="betas") as ds:
        plain = next(iter(DataLoader(ds, batch_size=4, num_workers=0)))
        assert ds.handles.reader.memory is PLAIN and plain.shape[0] == 4
    with ReaderMemory(paths, key="betas") as ds:
        loader = DataLoader(ds, batch_size=4, num_workers=1, multiprocessing_context="fork")
        with loader:
            assert _names(loader) == {"WorkerMemory"}
        assert _names(TorchDataLoader(ds, batch_size=4, num_workers=1)) == {"PlainMemory"}
    with HDF5SessionDataset(paths, key="betas") as ds:
        loader = DataLoader(ds, batch_size=4, num_workers=1, multiprocessing_context="fork")
        with loader:  # the batches still arrive whole and right
            got = torch.cat([batch for batch in loader])
        assert got.shape[0] == 16
