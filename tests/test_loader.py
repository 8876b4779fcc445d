"""loaderkit.DataLoader: drop-in equivalence with torch, close(), epochs."""

from __future__ import annotations

import itertools
import os
import signal
import time
from typing import Any

import pytest
import torch
from torch.utils.data import BatchSampler, SequentialSampler, SubsetRandomSampler

import loaderkit
from loaderkit import ConfigError, create_dataloader, detect_platform
from loaderkit.policy import resolve_pin_memory
from tests.helpers import (
    TORCH_HAS_IN_ORDER,
    ClosableDataset,
    CountingIterable,
    DictDataset,
    EpochRecordingDataset,
    RecordingSampler,
    SlowDataset,
    SquareDataset,
    child_pids,
    tuple_collate,
    wait_children_gone,
    wait_workers_gone,
    workers_of,
)

#: Worker behaviours shared by worker processes and worker threads run for both.
METHODS = ["process", "thread"]

# ---------------------------------------------------------------- drop-in equivalence


def _outcome(factory: Any, dataset: Any, kwargs: dict[str, Any], unordered: bool) -> Any:
    """Two epochs of batches, or the exception type torch's argument checks raised.

    A ``ConfigError`` counts as the ``ValueError`` it also is.
    """
    kwargs = dict(kwargs)
    for key in ("generator", "sampler", "batch_sampler"):
        if callable(kwargs.get(key)):
            kwargs[key] = kwargs[key]()  # fresh, identically seeded objects per loader
    try:
        loader = factory(dataset, **kwargs)
    except ConfigError:  # loaderkit's own check of an argument torch refuses with ValueError
        return ValueError
    except (ValueError, TypeError) as exc:
        return type(exc)
    try:
        epochs = []
        for _ in range(2):
            batches = [_plain(b) for b in loader]
            epochs.append(sorted(batches, key=repr) if unordered else batches)
        return epochs
    finally:
        if isinstance(loader, loaderkit.DataLoader):
            loader.close()


def _plain(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return (str(batch.dtype), batch.tolist())
    if isinstance(batch, dict):
        return {k: _plain(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return [_plain(x) for x in batch]
    return batch


def _seeded_generator() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


def _subset_sampler() -> SubsetRandomSampler:
    return SubsetRandomSampler([1, 3, 4, 6, 8], generator=torch.Generator().manual_seed(7))


def _batch_sampler() -> BatchSampler:
    return BatchSampler(SequentialSampler(range(9)), batch_size=4, drop_last=False)


WORKER_CONFIGS = [
    # (loader arguments, valid for torch)
    ({"num_workers": 0}, True),
    ({"num_workers": 2}, True),
    ({"num_workers": 2, "persistent_workers": True, "prefetch_factor": 3}, True),
    *([({"num_workers": 2, "in_order": False}, True)] if TORCH_HAS_IN_ORDER else []),
    ({"num_workers": 0, "prefetch_factor": 2}, False),
    ({"num_workers": 0, "persistent_workers": True}, False),
    ({"num_workers": -1}, False),
]


@pytest.mark.parametrize(
    ("workers", "valid"),
    WORKER_CONFIGS,
    ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()) if isinstance(c, dict) else str(c),
)
def test_batches_equal_torch_dataloader(workers: dict[str, Any], valid: bool) -> None:
    with_workers = workers["num_workers"] > 0
    # The full grid in the main process; a smaller one with real workers (each pass forks).
    grid = itertools.product(
        [3, None] if with_workers else [1, 3, None],  # batch_size
        [False, True],  # shuffle
        [None, _subset_sampler],  # sampler
        [None, _batch_sampler],  # batch_sampler
        [False, True],  # drop_last
        [None] if with_workers else [None, tuple_collate],  # collate_fn
        [SquareDataset(9)] if with_workers else [SquareDataset(9), DictDataset(9)],
    )
    factories = (create_dataloader,) if with_workers else (create_dataloader, loaderkit.DataLoader)
    compared = rejected = 0
    for batch_size, shuffle, sampler, batch_sampler, drop_last, collate, dataset in grid:
        kwargs = {
            "batch_size": batch_size,
            "shuffle": shuffle,
            "sampler": sampler,
            "batch_sampler": batch_sampler,
            "drop_last": drop_last,
            "collate_fn": collate,
            "generator": _seeded_generator,
            **workers,
            # fork: every pass of the grid starts workers (as the interpreter's default on 3.13)
            **({"multiprocessing_context": "fork"} if with_workers else {}),
        }
        unordered = workers.get("in_order") is False
        expected = _outcome(torch.utils.data.DataLoader, dataset, kwargs, unordered)
        for factory in factories:
            got = _outcome(factory, dataset, kwargs, unordered)
            assert got == expected, f"{factory.__name__} differs from torch for {kwargs}"
        if isinstance(expected, type):
            rejected += 1
        else:
            compared += 1
    assert (compared > 0) is valid
    assert rejected > 0  # the grid includes combinations torch rejects


_TORCH_DEFAULT_ATTRS = (
    "batch_size",
    "num_workers",
    "pin_memory",
    "drop_last",
    "timeout",
    "prefetch_factor",
    "persistent_workers",
    "in_order",
    "pin_memory_device",
    "generator",
    "multiprocessing_context",
)


def test_default_arguments_equal_torch_defaults(make_platform) -> None:
    # On a machine without usable CUDA every default is torch's, pin_memory included.
    cpu = make_platform(cuda_available=False, cuda_device_count=0, cuda_bad_fork=False)
    ours = create_dataloader(SquareDataset(), platform=cpu)
    theirs = torch.utils.data.DataLoader(SquareDataset())
    for attr in _TORCH_DEFAULT_ATTRS:
        if hasattr(theirs, attr):  # torch before 2.6 has no in_order (loaderkit keeps True)
            assert getattr(ours, attr) == getattr(theirs, attr), attr
    assert type(ours.sampler) is type(theirs.sampler)
    assert ours.collate_fn is theirs.collate_fn


def test_default_arguments_on_this_machine_differ_from_torch_only_by_policy() -> None:
    # Whatever this machine is (CPU only, a CUDA host, a bad fork), the only default that
    # differs from torch's is pin_memory, and it is what the pin-memory policy decides here.
    ours = create_dataloader(SquareDataset())
    theirs = torch.utils.data.DataLoader(SquareDataset())
    decided = resolve_pin_memory(None, detect_platform())
    assert ours.pin_memory is decided.value
    assert ours.plan["pin_memory"].reason == decided.reason
    for attr in _TORCH_DEFAULT_ATTRS:
        if attr != "pin_memory" and hasattr(theirs, attr):
            assert getattr(ours, attr) == getattr(theirs, attr), attr


def test_is_a_torch_dataloader() -> None:
    loader = create_dataloader(SquareDataset())
    assert isinstance(loader, torch.utils.data.DataLoader)
    assert isinstance(loader, loaderkit.DataLoader)
    assert len(loader) == 10


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_workers": -1},
        {"timeout": -1},
        {"num_workers": 0, "prefetch_factor": 2},
        {"num_workers": 0, "persistent_workers": True},
        {"sampler": [0, 1], "shuffle": True},
        {"batch_sampler": [[0, 1]], "batch_size": 2},
        {"batch_sampler": [[0, 1]], "drop_last": True},
        {"batch_size": None, "drop_last": True},
        {"num_workers": 1, "multiprocessing_context": "no-such-method"},
        {"num_workers": 0, "multiprocessing_context": "spawn"},
    ],
)
def test_torch_argument_errors_still_raise_value_error(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError) as torch_error:
        torch.utils.data.DataLoader(SquareDataset(), **kwargs)
    with pytest.raises(ValueError) as ours:
        create_dataloader(SquareDataset(), **kwargs)
    if isinstance(ours.value, ConfigError):  # loaderkit's own check: torch's words, then more
        assert str(ours.value).startswith(str(torch_error.value)), (ours.value, torch_error.value)
    else:
        assert str(ours.value) == str(torch_error.value)


def test_iterable_dataset_errors_match_torch() -> None:
    for kwargs in ({"shuffle": True}, {"sampler": [0]}, {"batch_sampler": [[0]]}):
        with pytest.raises(ValueError):
            torch.utils.data.DataLoader(CountingIterable(), **kwargs)
        with pytest.raises(ValueError):
            create_dataloader(CountingIterable(), **kwargs)


def test_iterable_dataset_with_workers_matches_torch() -> None:
    ours = sorted(
        x
        for b in create_dataloader(CountingIterable(), batch_size=2, num_workers=2)
        for x in b.tolist()
    )
    assert ours == list(range(7))


def test_bad_loaderkit_arguments_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="num_workers='lots'"):
        create_dataloader(SquareDataset(), num_workers="lots")
    with pytest.raises(ConfigError, match="training="):
        create_dataloader(SquareDataset(), training="yes")
    with pytest.raises(ConfigError, match="shuffle='block' needs an HDF5SessionDataset"):
        create_dataloader(SquareDataset(), shuffle="block")
    with pytest.raises(ConfigError, match="platform"):
        create_dataloader(SquareDataset(), platform="linux")


# ---------------------------------------------------------------- close()


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("persistent", [False, True])
def test_close_leaves_no_workers(persistent: bool, method: str) -> None:
    before = workers_of(method)
    loader = create_dataloader(
        SquareDataset(20),
        batch_size=2,
        num_workers=2,
        persistent_workers=persistent,
        worker_method=method,
    )
    assert len(list(loader)) == 10
    if persistent:
        assert len(workers_of(method) - before) == 2  # workers kept between epochs
    loader.close()
    assert wait_workers_gone(method, before, timeout=10) == set()


@pytest.mark.parametrize("method", METHODS)
def test_close_stops_workers_of_an_abandoned_iterator(method: str) -> None:
    before = workers_of(method)
    loader = create_dataloader(
        SlowDataset(200, 0.005), batch_size=2, num_workers=2, worker_method=method
    )
    iterator = iter(loader)
    next(iterator)  # mid-epoch: workers busy, iterator still referenced
    assert len(workers_of(method) - before) == 2
    start = time.monotonic()
    loader.close()
    assert time.monotonic() - start < 15
    assert wait_workers_gone(method, before, timeout=5) == set()
    del iterator


@pytest.mark.parametrize("method", METHODS)
def test_close_is_idempotent_and_loader_restarts(method: str) -> None:
    dataset = ClosableDataset(6)
    before = workers_of(method)
    loader = create_dataloader(
        dataset, batch_size=3, num_workers=2, persistent_workers=True, worker_method=method
    )
    first = [b[0].tolist() for b in loader]
    loader.close()
    loader.close()
    assert dataset.closed == 1
    assert [b[0].tolist() for b in loader] == first  # fresh workers
    loader.close()
    assert dataset.closed == 2
    assert wait_workers_gone(method, before) == set()


@pytest.mark.parametrize("method", METHODS)
def test_context_manager_closes(method: str) -> None:
    before = workers_of(method)
    dataset = ClosableDataset(4)
    with create_dataloader(
        dataset, num_workers=2, persistent_workers=True, worker_method=method
    ) as loader:
        assert len(list(loader)) == 4
    assert dataset.closed == 1
    assert wait_workers_gone(method, before) == set()


def test_close_does_not_raise_when_a_worker_already_died() -> None:
    before = child_pids()
    loader = create_dataloader(
        SlowDataset(400, 0.01), batch_size=2, num_workers=2, persistent_workers=True
    )
    iterator = iter(loader)
    next(iterator)
    victim = sorted(child_pids() - before)[0]
    with pytest.raises((RuntimeError, ConnectionError)):  # torch's error, never a hang
        os.kill(victim, signal.SIGKILL)
        for _ in iterator:
            pass
    loader.close()
    assert wait_children_gone(before, timeout=15) == set()


# ---------------------------------------------------------------- epochs


def test_set_epoch_reaches_sampler_batch_sampler_and_dataset() -> None:
    sampler = RecordingSampler(4)
    dataset = EpochRecordingDataset(4)
    loader = create_dataloader(dataset, sampler=sampler, batch_size=2)
    assert loader.epoch == 0
    for expected in range(3):
        list(loader)
        assert loader.epoch == expected
    assert sampler.epochs == [0, 1, 2]
    assert dataset.epochs == [0, 1, 2]
    loader.set_epoch(10)
    assert loader.epoch == 2  # the most recent pass until the next one starts
    epochs_seen = [b[1].tolist() for b in loader]
    assert loader.epoch == 10 and sampler.epochs[-1] == 10
    assert epochs_seen == [[10, 10], [10, 10]]
    list(loader)
    assert loader.epoch == 11


def test_set_epoch_reaches_the_sampler_inside_a_batch_sampler() -> None:
    inner = RecordingSampler(6)
    loader = create_dataloader(SquareDataset(6), batch_sampler=BatchSampler(inner, 3, False))
    list(loader)
    list(loader)
    assert inner.epochs == [0, 1]


@pytest.mark.parametrize("method", METHODS)
def test_dataset_epoch_reaches_non_persistent_workers(method: str) -> None:
    loader = create_dataloader(
        EpochRecordingDataset(4), batch_size=2, num_workers=2, worker_method=method
    )
    loader.set_epoch(4)
    assert [b[1].tolist() for b in loader] == [[4, 4], [4, 4]]
    assert [b[1].tolist() for b in loader] == [[5, 5], [5, 5]]
    loader.close()


def test_set_epoch_rejects_bad_values() -> None:
    loader = create_dataloader(SquareDataset())
    for bad in (-1, 1.5, "2", True):
        with pytest.raises(ConfigError):
            loader.set_epoch(bad)


def test_seeded_order_depends_only_on_seed_and_epoch() -> None:
    def order(loader: Any) -> list[int]:
        return [int(x) for b in loader for x in b[0]]

    full = create_dataloader(SquareDataset(12), batch_size=4, shuffle=True, seed=5)
    runs = [order(full) for _ in range(4)]
    assert len({tuple(r) for r in runs}) == 4  # a new order every epoch
    resumed = create_dataloader(SquareDataset(12), batch_size=4, shuffle=True, seed=5)
    resumed.set_epoch(3)
    assert order(resumed) == runs[3]
    # epoch 0 equals torch with a generator seeded the same way
    torch_loader = torch.utils.data.DataLoader(
        SquareDataset(12), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(5)
    )
    assert order(torch_loader) == runs[0]


@pytest.mark.parametrize("method", METHODS)
def test_dataset_epoch_reaches_persistent_workers_with_sample_seeding(method: str) -> None:
    loader = create_dataloader(
        EpochRecordingDataset(4),
        batch_size=2,
        num_workers=2,
        worker_method=method,
        persistent_workers=True,
        sample_seeding=True,
        seed=0,
    )
    assert [b[1].tolist() for b in loader] == [[0, 0], [0, 0]]
    loader.set_epoch(7)
    assert [b[1].tolist() for b in loader] == [[7, 7], [7, 7]]
    assert [b[1].tolist() for b in loader] == [[8, 8], [8, 8]]
    loader.close()
