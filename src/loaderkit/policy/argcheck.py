"""Checks of the torch arguments a caller passed, with loaderkit's own messages.

torch checks some of its ``DataLoader`` arguments itself, in words that can mislead
(``batch_size="64"`` is refused as "got batch_size=64"), and leaves others to fail later as
raw errors (``prefetch_factor="2"`` dies of "can only concatenate str (not "int") to str" in a
worker; ``prefetch_factor=0`` of an ``AssertionError`` at the first iteration).
``check_arguments`` refuses each before anything starts, naming the argument, its value with
its type and what is expected. Where torch has a message for a case, loaderkit's starts with
torch's words, so code matching torch's text keeps working. ``check_dataset`` refuses a path
passed as the dataset (torch would iterate the string letter by letter).

Valid values pass untouched: torch's own behaviour for them is unchanged.

Examples:
    >>> from loaderkit.policy.request import LoaderRequest
    >>> check_arguments(LoaderRequest(batch_size=64))
    >>> check_arguments(LoaderRequest(batch_size="64"))
    Traceback (most recent call last):
    ...
    loaderkit.errors.ArgumentTypeError: batch_size should be a positive integer value, but got \
batch_size='64' (a str): pass an int >= 1, or batch_size=None to turn off automatic batching
"""

from __future__ import annotations

import numbers
import os
from typing import Any

from loaderkit.errors import ArgumentTypeError, ConfigError
from loaderkit.policy.request import LoaderRequest

__all__ = ["check_arguments", "check_dataset"]


def _shown(value: Any) -> str:
    """``value`` as a message shows it: its repr (cut to 60 characters) and its type."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} (a {type(value).__name__})"


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_arguments(request: LoaderRequest, iterable: bool = False) -> None:
    """Refuse torch arguments that cannot work, in torch's order, with loaderkit's messages.

    Checked: ``timeout`` (a number of seconds >= 0), ``prefetch_factor`` (``None`` or an int
    >= 1), the ``sampler`` / ``batch_sampler`` / ``shuffle`` / ``batch_size`` / ``drop_last``
    combinations torch refuses, ``sampler`` and ``batch_sampler`` being iterable, then
    ``batch_size`` (``None`` or an int >= 1) and ``drop_last`` (a bool). ``num_workers``,
    ``shuffle``'s own values and ``training`` are checked by the policies that read them.

    An ``IterableDataset`` takes no ``sampler``, ``batch_sampler`` or ``shuffle`` at all:
    torch refuses those first, so for one (``iterable=True``) they are left to that check.

    Args:
        request: The caller's arguments.
        iterable: The dataset is an ``IterableDataset``.

    Raises:
        ArgumentTypeError: A value of the wrong type (also a ``TypeError``).
        ConfigError: A value out of range or a combination that cannot work (a ``ValueError``).

    Examples:
        >>> check_arguments(LoaderRequest(batch_size=None, timeout=1.5))
        >>> check_arguments(LoaderRequest(timeout=-1))
        Traceback (most recent call last):
        ...
        loaderkit.errors.ConfigError: timeout option should be non-negative: got timeout=-1; \
pass the seconds to wait for a batch from the workers (0, the default: wait forever)
    """
    _check_timeout(request.timeout)
    _check_prefetch_factor(request.prefetch_factor)
    if not iterable:
        _check_mixes(request)
    for name in () if iterable else ("sampler", "batch_sampler"):
        value = getattr(request, name)
        if (
            value is not None
            and not hasattr(value, "__iter__")
            and not hasattr(value, "__getitem__")
        ):
            raise ArgumentTypeError(
                f"{name} must be an iterable of "
                f"{'index lists' if name == 'batch_sampler' else 'indices'} (a "
                f"torch.utils.data.{'BatchSampler' if name == 'batch_sampler' else 'Sampler'} "
                f"or a list), got {name}={_shown(value)}"
            )
    if request.batch_sampler is None and request.batch_size is not None:
        _check_batch_size(request.batch_size)
        if not isinstance(request.drop_last, bool):
            raise ArgumentTypeError(
                "drop_last should be a boolean value, but got "
                f"drop_last={_shown(request.drop_last)}: pass True to drop the last incomplete "
                "batch, False to keep it"
            )


def _check_timeout(timeout: Any) -> None:
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise ArgumentTypeError(
            f"timeout must be a number of seconds >= 0, got timeout={_shown(timeout)}; "
            "0 (the default) waits for the workers forever"
        )
    if timeout < 0:
        raise ConfigError(
            f"timeout option should be non-negative: got timeout={timeout!r}; pass the seconds "
            "to wait for a batch from the workers (0, the default: wait forever)"
        )


def _check_prefetch_factor(prefetch_factor: Any) -> None:
    if prefetch_factor is None:
        return
    if not _is_int(prefetch_factor):
        raise ArgumentTypeError(
            f"prefetch_factor must be an int >= 1 (batches each worker loads ahead) or None, "
            f"got prefetch_factor={_shown(prefetch_factor)}"
        )
    if prefetch_factor < 0:
        raise ConfigError(
            f"prefetch_factor option should be non-negative: got prefetch_factor="
            f"{prefetch_factor}; pass the batches each worker loads ahead (an int >= 1), or "
            "None for the default (2)"
        )
    if prefetch_factor == 0:
        raise ConfigError(
            "prefetch_factor=0 asks the workers for no batch at all (torch's loader fails at "
            "the first iteration): pass an int >= 1, or None for the default (2)"
        )


def _check_mixes(request: LoaderRequest) -> None:
    """The combinations torch refuses, with what the caller passed and what to drop."""
    if request.sampler is not None and request.shuffle not in (None, False):
        raise ConfigError(
            f"sampler option is mutually exclusive with shuffle: got sampler="
            f"{_shown(request.sampler)} and shuffle={request.shuffle!r}. The sampler decides "
            "the order: leave shuffle unset (or pass a shuffling sampler)"
        )
    if request.batch_sampler is not None:
        given = [
            f"{name}={value!r}"
            for name, value, default in (
                ("batch_size", request.batch_size, 1),
                ("shuffle", request.shuffle, None),
                ("drop_last", request.drop_last, False),
            )
            if value != default and not (name == "shuffle" and value is False)
        ]
        if request.sampler is not None:
            given.append(f"sampler={_shown(request.sampler)}")
        if given:
            raise ConfigError(
                "batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, "
                f"and drop_last: got batch_sampler={_shown(request.batch_sampler)} with "
                f"{', '.join(given)}. A batch sampler yields whole batches of indices: leave "
                "the others unset"
            )
    elif request.batch_size is None and request.drop_last:
        raise ConfigError(
            "batch_size=None option disables auto-batching and is mutually exclusive with "
            f"drop_last: got drop_last={request.drop_last!r}. With batch_size=None each sample "
            "is served alone: leave drop_last unset, or pass a batch_size"
        )


def _check_batch_size(batch_size: Any) -> None:
    if _is_int(batch_size) and not isinstance(batch_size, int):  # torch refuses numpy's ints
        raise ArgumentTypeError(
            "batch_size should be a positive integer value, but got "
            f"batch_size={_shown(batch_size)}: torch's batch sampler takes a Python int; pass "
            f"batch_size=int(...), here {int(batch_size)}"
        )
    if not _is_int(batch_size):
        raise ArgumentTypeError(
            "batch_size should be a positive integer value, but got "
            f"batch_size={_shown(batch_size)}: pass an int >= 1, or batch_size=None to turn "
            "off automatic batching"
        )
    if batch_size <= 0:
        raise ConfigError(
            f"batch_size should be a positive integer value, but got batch_size={batch_size}: "
            "pass an int >= 1, or batch_size=None to turn off automatic batching"
        )


def check_dataset(dataset: Any) -> None:
    """Refuse a path (or bytes) passed as the dataset, saying how to load files.

    torch would take a string as a sequence and serve it character by character.

    Args:
        dataset: What the caller passed as ``dataset``.

    Raises:
        ConfigError: ``dataset`` is a ``str``, ``bytes`` or ``os.PathLike``.

    Examples:
        >>> check_dataset([1, 2, 3])
        >>> check_dataset("data.h5")
        Traceback (most recent call last):
        ...
        loaderkit.errors.ConfigError: dataset='data.h5' is a path, not a dataset (torch would \
serve it letter by letter). Wrap the files in a dataset: \
loaderkit.HDF5SessionDataset(['data.h5']) for HDF5 files, or your own torch Dataset
    """
    if isinstance(dataset, (str, bytes, os.PathLike)):
        kind = "bytes" if isinstance(dataset, bytes) else "a path"
        path = os.fsdecode(dataset) if not isinstance(dataset, bytes) else None
        wrap = (
            f"loaderkit.HDF5SessionDataset([{path!r}]) for HDF5 files"
            if path is not None
            else "loaderkit.HDF5SessionDataset([...]) for HDF5 files"
        )
        raise ConfigError(
            f"dataset={dataset!r} is {kind}, not a dataset (torch would serve it "
            f"{'byte by byte' if isinstance(dataset, bytes) else 'letter by letter'}). Wrap the "
            f"files in a dataset: {wrap}, or your own torch Dataset"
        )
