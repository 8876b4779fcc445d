"""An exception in collate_fn keeps its type and says which batch, worker and process."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import torch
from torch.utils.data import TensorDataset

from loaderkit import create_dataloader
from loaderkit.workers.collate_context import CollateWithContext
from tests.helpers import tiered


def failing_collate(batch: list[Any]) -> Any:
    """Refuses any batch: a user's collate_fn with a bug."""
    raise KeyError("no field 'label' in the sample")


def _notes(error: BaseException) -> str:
    return "\n".join([str(error), *getattr(error, "__notes__", [])])


def test_main_process_collate_error_has_the_note() -> None:
    loader = create_dataloader(
        TensorDataset(torch.arange(8.0)), batch_size=4, collate_fn=failing_collate
    )
    assert loader.collate_fn is failing_collate  # the attribute stays the caller's
    with pytest.raises(KeyError, match="no field 'label'") as info:
        next(iter(loader))
    text = _notes(info.value)
    assert "collate_fn tests.workers.test_collate_context.failing_collate failed" in text
    assert "a batch of 4 samples" in text and "main process (pid" in text


# a spawned worker's error crosses the same queue as a forked one's; spawn in the slow tier
@pytest.mark.parametrize("context", tiered(["fork", "spawn"], {"fork"}))
def test_worker_collate_error_keeps_type_and_names_the_worker(context: str) -> None:
    loader = create_dataloader(
        TensorDataset(torch.arange(8.0)),
        batch_size=4,
        num_workers=2,
        collate_fn=failing_collate,
        multiprocessing_context=context,
    )
    with pytest.raises(KeyError) as info:
        next(iter(loader))
    text = _notes(info.value)
    assert "DataLoader worker process 0" in text  # torch's wrapper
    assert "failing_collate failed on a batch of 4 samples in worker 0 of 2 (pid" in text
    loader.close()


def test_default_collate_errors_have_the_note_too() -> None:
    ragged = [torch.zeros(2), torch.zeros(3)]
    loader = create_dataloader(ragged, batch_size=2)
    with pytest.raises(RuntimeError, match="stack expects each tensor") as info:
        next(iter(loader))
    assert "collate_fn" in _notes(info.value) and "a batch of 2 samples" in _notes(info.value)


def test_the_wrapper_pickles_by_the_users_function() -> None:
    wrapped = pickle.loads(pickle.dumps(CollateWithContext(failing_collate)))
    assert wrapped.fn is failing_collate
