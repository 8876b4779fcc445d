"""Collate errors that say where they happened: the batch size, the process, the worker.

``CollateWithContext`` is the collate function loaderkit's iterators run: the caller's (or
torch's ``default_collate``, or loaderkit's), wrapped so an exception it raises keeps its type
and gains a note naming the batch's size, the process and the worker, and how to debug it.
Installed on the iterator before its workers start, never on the loader: ``loader.collate_fn``
stays the object the caller passed (frameworks rebuild loaders from it).

Examples:
    >>> def fails(batch):
    ...     raise ValueError("cannot stack")
    >>> try:
    ...     CollateWithContext(fails)([1, 2])
    ... except ValueError as error:
    ...     print(error.__notes__[0].split(" failed on ")[1][:18])
    a batch of 2 sampl
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch.utils.data

from loaderkit.errors import add_note

__all__ = ["CollateWithContext", "note_collate_failure"]


class CollateWithContext:
    """The caller's ``collate_fn`` as loaderkit's iterators run it: failures say where.

    Picklable when the wrapped function is (spawn sends it to each worker).

    Attributes:
        fn: The wrapped collate function.
    """

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def __call__(self, batch: Any) -> Any:
        """Collate ``batch``; an exception gains the note and is raised as it is."""
        try:
            return self.fn(batch)
        except Exception as exc:
            note_collate_failure(exc, self.fn, batch)
            raise

    def __reduce__(self) -> tuple[Any, ...]:
        return (CollateWithContext, (self.fn,))


def note_collate_failure(exc: BaseException, fn: Any, batch: Any) -> None:
    """Add loaderkit's note to an exception raised by ``collate_fn`` ``fn`` on ``batch``."""
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    module = getattr(fn, "__module__", None)
    size = f"a batch of {len(batch)} samples" if hasattr(batch, "__len__") else "a sample"
    info = torch.utils.data.get_worker_info()
    where = (
        f"worker {info.id} of {info.num_workers} (pid {os.getpid()})"
        if info is not None
        else f"the main process (pid {os.getpid()}, num_workers=0)"
    )
    add_note(
        exc,
        f"loaderkit: collate_fn {module + '.' if module else ''}{name} failed on {size} in "
        f"{where}; rerun with num_workers=0 to debug it in the main process",
    )
