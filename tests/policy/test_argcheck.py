"""loaderkit's own messages for torch's arguments and for a path passed as the dataset.

Every case goes through ``create_dataloader`` and ``loaderkit.DataLoader`` as a user calls
them, and, where torch refuses the value too, the message starts with torch's own words.
"""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import pytest
import torch

import loaderkit
from loaderkit import ConfigError, create_dataloader
from loaderkit.errors import ArgumentTypeError
from loaderkit.policy.argcheck import check_arguments, check_dataset
from loaderkit.policy.request import LoaderRequest
from tests.helpers import CountingIterable, SquareDataset

FACTORIES = [create_dataloader, loaderkit.DataLoader]


def _refused(factory: Any, kind: type[Exception], **kwargs: Any) -> str:
    with pytest.raises(kind) as caught:
        factory(SquareDataset(), **kwargs)
    return str(caught.value)


def _batches(loader: Any) -> list[list[Any]]:
    return [[part.tolist() for part in batch] for batch in loader]


def _torch_message(**kwargs: Any) -> str | None:
    """torch's own check's message (``None`` when torch builds the loader or fails raw)."""
    try:
        torch.utils.data.DataLoader(SquareDataset(), **kwargs)
    except ValueError as exc:
        return str(exc)
    except TypeError:  # not a check: a comparison of a str with an int, say
        return None
    return None


@pytest.mark.parametrize("factory", FACTORIES)
@pytest.mark.parametrize(
    ("kwargs", "kind", "words"),
    [
        ({"batch_size": "64"}, ArgumentTypeError, ["batch_size='64'", "(a str)", "int >= 1"]),
        ({"batch_size": 2.0}, ArgumentTypeError, ["batch_size=2.0", "(a float)"]),
        ({"batch_size": True}, ArgumentTypeError, ["batch_size=True", "(a bool)"]),
        ({"batch_size": np.int64(4)}, ArgumentTypeError, ["int64", "int(...), here 4"]),
        ({"batch_size": 0}, ConfigError, ["batch_size=0", "int >= 1", "batch_size=None"]),
        ({"batch_size": -3}, ConfigError, ["batch_size=-3"]),
        ({"drop_last": "yes"}, ArgumentTypeError, ["drop_last='yes'", "(a str)"]),
        ({"timeout": "5"}, ArgumentTypeError, ["timeout='5'", "(a str)", "seconds"]),
        ({"timeout": -1}, ConfigError, ["timeout=-1", "wait forever"]),
        ({"timeout": False}, ArgumentTypeError, ["timeout=False", "(a bool)"]),
        (
            {"num_workers": 2, "prefetch_factor": "2"},
            ArgumentTypeError,
            ["prefetch_factor='2'", "(a str)", "int >= 1"],
        ),
        ({"num_workers": 2, "prefetch_factor": 1.5}, ArgumentTypeError, ["prefetch_factor=1.5"]),
        ({"num_workers": 2, "prefetch_factor": 0}, ConfigError, ["prefetch_factor=0", "no batch"]),
        ({"num_workers": 2, "prefetch_factor": -1}, ConfigError, ["prefetch_factor=-1"]),
        (
            {"sampler": [0, 1], "shuffle": True},
            ConfigError,
            ["sampler=[0, 1] (a list)", "shuffle=True", "leave shuffle unset"],
        ),
        ({"sampler": 5}, ArgumentTypeError, ["sampler=5 (a int)", "iterable of indices"]),
        ({"batch_sampler": 5}, ArgumentTypeError, ["batch_sampler=5", "index lists"]),
        (
            {"batch_sampler": [[0, 1]], "batch_size": 2},
            ConfigError,
            ["batch_sampler=[[0, 1]] (a list)", "batch_size=2", "leave the others unset"],
        ),
        ({"batch_sampler": [[0, 1]], "shuffle": True}, ConfigError, ["shuffle=True"]),
        ({"batch_sampler": [[0, 1]], "drop_last": True}, ConfigError, ["drop_last=True"]),
        ({"batch_sampler": [[0, 1]], "sampler": [0, 1]}, ConfigError, ["sampler=[0, 1]"]),
        (
            {"batch_size": None, "drop_last": True},
            ConfigError,
            ["drop_last=True", "served alone"],
        ),
    ],
)
def test_bad_argument_named_with_value_type_and_what_to_do(
    factory: Any, kwargs: dict[str, Any], kind: type[Exception], words: list[str]
) -> None:
    message = _refused(factory, kind, **kwargs)
    for word in words:
        assert word in message, (word, message)
    torch_said = _torch_message(**kwargs)
    if torch_said is not None:
        # torch refuses it too: its words first, so code matching them keeps working
        assert message.startswith(torch_said.split(", but got")[0]), (message, torch_said)


def test_batch_size_string_no_longer_reads_as_if_64_were_refused() -> None:
    torch_said = _torch_message(batch_size="64")
    assert torch_said == "batch_size should be a positive integer value, but got batch_size=64"
    ours = _refused(create_dataloader, ArgumentTypeError, batch_size="64")
    assert ours.startswith("batch_size should be a positive integer value, but got")
    assert "batch_size='64' (a str)" in ours


def test_errors_are_torch_exception_types_too() -> None:
    with pytest.raises(TypeError):
        create_dataloader(SquareDataset(), batch_size="64")
    with pytest.raises(ValueError):
        create_dataloader(SquareDataset(), batch_size="64")
    with pytest.raises(ValueError):
        create_dataloader(SquareDataset(), timeout=-1)


def test_prefetch_factor_string_refused_before_any_worker_starts() -> None:
    # torch accepts it, then a worker dies of "can only concatenate str (not "int") to str"
    with pytest.raises(ArgumentTypeError, match="prefetch_factor='2'"):
        create_dataloader(SquareDataset(), num_workers=2, prefetch_factor="2")


def test_prefetch_factor_zero_refused_when_the_loader_is_made() -> None:
    loader = torch.utils.data.DataLoader(
        SquareDataset(), num_workers=1, prefetch_factor=0, multiprocessing_context="fork"
    )
    with pytest.raises(AssertionError):  # torch: only at the first iteration, no argument named
        list(loader)
    with pytest.raises(ConfigError, match="prefetch_factor=0"):
        create_dataloader(SquareDataset(), num_workers=1, prefetch_factor=0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"batch_size": None},
        {"batch_size": 3, "drop_last": True},
        {"timeout": 2.5, "num_workers": 1},
        {"timeout": np.float32(1.0), "num_workers": 1},
        {"num_workers": 1, "prefetch_factor": 1},
        {"num_workers": 1, "prefetch_factor": np.int64(3)},
        {"sampler": [3, 1, 2], "shuffle": False},
        {"batch_sampler": [[0, 1], [2]], "shuffle": False},
        {"batch_sampler": torch.utils.data.BatchSampler(range(4), 2, drop_last=False)},
        {"sampler": torch.utils.data.SequentialSampler(range(5))},
    ],
)
def test_valid_values_pass_as_in_torch(kwargs: dict[str, Any]) -> None:
    expected = _batches(torch.utils.data.DataLoader(SquareDataset(), **kwargs))
    fork = {"multiprocessing_context": "fork"} if "num_workers" in kwargs else {}
    loader = create_dataloader(SquareDataset(), **kwargs, **fork)
    try:
        assert _batches(loader) == expected
    finally:
        loader.close()


@pytest.mark.parametrize("factory", FACTORIES)
@pytest.mark.parametrize(
    ("dataset", "shown"),
    [
        ("data.h5", "dataset='data.h5' is a path"),
        (pathlib.Path("runs/s1.h5"), "is a path"),
        (b"data.h5", "is bytes"),
    ],
)
def test_a_path_as_the_dataset_says_to_wrap_the_files(
    factory: Any, dataset: Any, shown: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        factory(dataset)
    message = str(caught.value)
    assert shown in message
    assert "HDF5SessionDataset" in message
    if not isinstance(dataset, bytes):
        assert repr(str(dataset)) in message  # the files to pass, already written out


def test_check_functions_directly() -> None:
    check_arguments(LoaderRequest())
    check_arguments(LoaderRequest(batch_size=None, timeout=0.5, prefetch_factor=4))
    check_dataset(range(3))
    check_dataset(["a.h5", "b.h5"])  # a list of strings is a dataset of strings, as in torch
    with pytest.raises(ConfigError, match="timeout option should be non-negative"):
        check_arguments(LoaderRequest(timeout=-0.5))
    # torch's order: the sampler/shuffle mix before the batch size
    with pytest.raises(ConfigError, match="sampler option is mutually exclusive"):
        check_arguments(LoaderRequest(sampler=[0], shuffle=True, batch_size=0))


@pytest.mark.parametrize("kwargs", [{"sampler": 3}, {"batch_sampler": [[0]], "batch_size": 2}])
def test_an_iterable_dataset_hears_torch_iterable_message_first(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="DataLoader with IterableDataset: expected unspecified"):
        torch.utils.data.DataLoader(CountingIterable(), **kwargs)
    with pytest.raises(ValueError, match="DataLoader with IterableDataset: expected unspecified"):
        create_dataloader(CountingIterable(), **kwargs)


def test_a_sampler_with_only_getitem_is_still_a_sampler() -> None:
    class Indices:
        def __getitem__(self, i: int) -> int:
            if i >= 3:
                raise IndexError(i)
            return 2 - i

    expected = _batches(torch.utils.data.DataLoader(SquareDataset(), sampler=Indices()))
    loader = create_dataloader(SquareDataset(), sampler=Indices())
    assert _batches(loader) == expected
