"""Drop-in cases found by running PyTorch's own DataLoader test suite against loaderkit.

Each test mirrors an upstream test (pytorch/data test/stateful_dataloader/test_dataloader.py)
that once passed on torch's DataLoader and failed on loaderkit's.
"""

from __future__ import annotations

import gc
import warnings
import weakref

import pytest
import torch
from torch.utils.data import DistributedSampler

import loaderkit
from loaderkit import LoaderkitWarning, create_dataloader
from tests.helpers import SharedStateDataset, SquareDataset, double, tiered


@pytest.mark.parametrize("context", tiered(["spawn", "forkserver"], {"spawn"}))
def test_multiprocessing_primitives_reach_spawned_workers(context) -> None:
    """upstream: test_get_worker_info, test_proper_exit (mp.Value, Event, Semaphore)."""
    dataset = SharedStateDataset(context)
    with create_dataloader(
        dataset, batch_size=3, num_workers=2, multiprocessing_context=context
    ) as loader:
        assert sorted(int(i) for b in loader for i in b) == list(range(6))
    assert dataset.counter.value == 6  # the workers really shared the Value


@pytest.mark.parametrize("num_workers", [0, 2])
def test_invalid_context_raises_torchs_own_error(num_workers) -> None:
    """upstream: test_invalid_ctor_args_combinations."""
    bad = object()
    with pytest.raises(Exception) as theirs:
        torch.utils.data.DataLoader(
            SquareDataset(), num_workers=num_workers, multiprocessing_context=bad
        )
    with pytest.raises(Exception) as ours:
        create_dataloader(SquareDataset(), num_workers=num_workers, multiprocessing_context=bad)
    assert type(ours.value) is type(theirs.value)
    assert str(ours.value) == str(theirs.value)


def test_datapipes_are_checked_the_way_torch_sends_them() -> None:
    """upstream: test_multiprocessing_iterdatapipe_with_dill (torch wraps DataPipes)."""
    from torch.utils.data.datapipes.iter import IterableWrapper

    pipe = IterableWrapper(range(6)).map(double)
    with create_dataloader(
        pipe, batch_size=None, num_workers=1, multiprocessing_context="spawn"
    ) as loader:
        assert sorted(int(x) for x in loader) == [0, 2, 4, 6, 8, 10]


def test_loader_class_is_generic_like_torchs() -> None:
    """upstream: test_typing (annotations such as DataLoader[list[Tensor]])."""

    def annotated() -> loaderkit.DataLoader[list[torch.Tensor]]:
        return loaderkit.DataLoader(SquareDataset())

    assert isinstance(annotated(), torch.utils.data.DataLoader)
    assert loaderkit.DataLoader[int] is not None


def test_many_workers_under_a_low_fd_limit_only_warn(make_platform) -> None:
    """upstream: test_excessive_thread_creation_warning under `ulimit -n 1024`."""
    low = make_platform(open_files_soft=1024)
    with pytest.warns(LoaderkitWarning, match="file descriptors"):
        loader = create_dataloader(SquareDataset(), num_workers=80, platform=low)
    assert loader.num_workers == 80  # torch only warns about too many workers; so do we


def test_pin_memory_device_alone_keeps_torchs_default(make_platform) -> None:
    """upstream: test_pin_memory_with_only_device (CUDA machines)."""
    cuda = make_platform(cuda_available=True, cuda_device_count=1)
    loader = create_dataloader(SquareDataset(), pin_memory_device="cuda", platform=cuda)
    assert loader.pin_memory is False
    assert "pin_memory_device" in loader.plan["pin_memory"].reason


def test_torch_style_sampler_set_epoch_is_followed() -> None:
    """Code written for torch calls sampler.set_epoch(e) itself, e.g. when resuming at e."""

    def order(loader):
        return [int(x) for b in loader for x in b[0]]

    def reference(epoch):
        sampler = DistributedSampler(SquareDataset(12), num_replicas=1, rank=0, seed=4)
        sampler.set_epoch(epoch)
        return order(torch.utils.data.DataLoader(SquareDataset(12), sampler=sampler, batch_size=4))

    sampler = DistributedSampler(SquareDataset(12), num_replicas=1, rank=0, seed=4)
    loader = create_dataloader(SquareDataset(12), sampler=sampler, batch_size=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for epoch in (5, 6, 7):  # a job resumed at epoch 5
            sampler.set_epoch(epoch)
            assert order(loader) == reference(epoch)
            assert loader.epoch == epoch and sampler.epoch == epoch
    sampler.set_epoch(5)  # torch repeats epoch 5's order when asked; so do we
    assert order(loader) == reference(5)
    loader.set_epoch(9)  # the loader's own request wins over the counter
    assert order(loader) == reference(9)
    assert order(loader) == reference(10)  # and counting continues without manual calls


def test_create_dataloader_can_stand_in_for_the_class_in_annotations() -> None:
    """upstream: test_typing, with create_dataloader in place of DataLoader."""

    def annotated() -> loaderkit.create_dataloader[list[torch.Tensor]]:
        return loaderkit.create_dataloader(SquareDataset())

    loader = annotated()
    assert type(loader) is loaderkit.DataLoader
    assert loaderkit.create_dataloader[int] == loaderkit.DataLoader[int]


def test_the_index_sampler_does_not_keep_the_loader_alive() -> None:
    """upstream: test_iterable_style_dataset (persistent workers exit on `del loader`).

    The resume bookkeeping once made the index sampler refer to its loader strongly: a cycle
    (loader -> persistent iterator -> index sampler -> loader) that kept the workers alive until
    the garbage collector ran.
    """
    loader = loaderkit.DataLoader(
        list(range(20)), batch_size=2, num_workers=2, persistent_workers=True
    )
    iterator = iter(loader)
    next(iterator)
    workers = iterator._workers  # type: ignore[attr-defined]
    ref = weakref.ref(loader)
    gc.disable()
    try:
        del iterator, loader
        assert ref() is None
    finally:
        gc.enable()
    for worker in workers:
        worker.join(10)
        assert worker.exitcode == 0
