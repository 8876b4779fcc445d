"""Read strategies of ``HDF5SessionDataset``: which one a class gets, and how a batch is cut.

A dataset reads in one of three ``ReadMode``s, fixed by what its class overrides
(``read_mode``): ``FAST`` (the default ``read``: ``loaderkit.hdf5.read.reader.SessionReader`` reads
coalesced slabs straight into the batch buffers; ``transform`` may follow per sample), ``ROWS``
(``read_rows`` overridden: coalesced runs through that hook, ``runs.read_runs``) or
``ITEM`` (``read`` or ``__getitem__`` overridden: one ``self[i]`` per item). How a batch is cut
into runs of consecutive rows is ``loaderkit.hdf5.read.runs.plan_runs``.
"""

from __future__ import annotations

import enum

__all__ = [
    "ReadMode",
    "describe_read_path",
    "overrides",
    "read_mode",
    "uses_default_read",
]


class ReadMode(enum.Enum):
    """How ``__getitems__`` reads a batch.

    Attributes:
        FAST: Default ``read``: coalesced slab reads (``preadv`` where possible).
        ROWS: The subclass overrides ``read_rows``: coalesced runs through that hook.
        ITEM: The subclass overrides ``read`` or ``__getitem__`` only: one ``self[i]`` per item.

    Example:
        >>> ReadMode.FAST.name
        'FAST'
    """

    FAST = "fast"
    ROWS = "rows"
    ITEM = "item"


def overrides(cls: type, base: type, name: str) -> bool:
    """Whether ``cls`` replaces ``base``'s attribute ``name``.

    Example:
        >>> class A:
        ...     def f(self): ...
        >>> class B(A):
        ...     def f(self): ...
        >>> overrides(B, A, "f"), overrides(A, A, "f")
        (True, False)
    """
    return getattr(cls, name) is not getattr(base, name)


def uses_default_read(cls: type, base: type) -> bool:
    """Whether ``cls`` keeps ``base.read``, so loaderkit may read rows itself (fast paths).

    Example:
        >>> class A:
        ...     def read(self): ...
        >>> uses_default_read(A, A)
        True
    """
    return not overrides(cls, base, "read")


def read_mode(cls: type, base: type) -> ReadMode:
    """The ``ReadMode`` of a dataset class ``cls`` derived from ``base``.

    A subclass that overrides ``read`` or ``__getitem__`` (say, to add a transform) gets one
    ``self[i]`` per item, so batched loading returns exactly what indexing does, unless it
    opts into batching by overriding ``read_rows``.

    Args:
        cls: The dataset's class.
        base: ``HDF5SessionDataset``.

    Returns:
        The read mode.

    Example:
        >>> class Base:
        ...     def read(self): ...
        ...     def read_rows(self): ...
        ...     def __getitem__(self, i): ...
        >>> class Custom(Base):
        ...     def read(self): ...
        >>> read_mode(Base, Base), read_mode(Custom, Base)
        (<ReadMode.FAST: 'fast'>, <ReadMode.ITEM: 'item'>)
    """
    if overrides(cls, base, "read_rows"):
        return ReadMode.ROWS
    if overrides(cls, base, "read") or overrides(cls, base, "__getitem__"):
        return ReadMode.ITEM
    return ReadMode.FAST


def describe_read_path(
    mode: ReadMode, name: str, transforms: bool, numbers: bool
) -> tuple[str, str]:
    """How a dataset class reads batches (``"batch-native"``, ``"runs"``, ``"per-sample"``).

    Args:
        mode: The class's ``ReadMode``.
        name: The class's name, for the reason.
        transforms: The class overrides ``transform``.
        numbers: A sample is one number array (not records or several keys).

    Example:
        >>> describe_read_path(ReadMode.ROWS, "Mine", False, True)[0]
        'runs'
    """
    if mode is ReadMode.ITEM:
        return (
            "per-sample",
            f"{name} overrides read or __getitem__: one self[i] per sample "
            "(override transform instead to keep batched reads)",
        )
    if mode is ReadMode.ROWS:
        return "runs", f"{name} overrides read_rows: one call per run of consecutive rows"
    if transforms:
        return (
            "batch-native",
            "rows read into one batch buffer, then transform per sample "
            "(default_collate stacks the results)",
        )
    what = "one batch tensor" if numbers else "one buffer per key, split into per-field batches"
    return (
        "batch-native",
        f"rows read straight into {what} (in shared memory in a worker); "
        "collation returns it as is",
    )
