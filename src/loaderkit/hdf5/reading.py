"""Read strategies of ``HDF5SessionDataset``: which one a class gets, and how a batch is cut.

A dataset reads in one of three ``ReadMode``s, fixed by what its class overrides
(``read_mode``): ``FAST`` (the default ``read``: ``loaderkit.hdf5.reader.SessionReader`` reads
coalesced slabs straight into the batch buffers; ``transform`` may follow per sample), ``ROWS``
(``read_rows`` overridden: coalesced runs through that hook, ``read_runs_hook``) or ``ITEM``
(``read`` or ``__getitem__`` overridden: one ``self[i]`` per item). ``plan_runs`` groups a
batch's packed keys into runs of consecutive rows.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from loaderkit.errors import ConfigError
from loaderkit.hdf5.index import _ROW_BITS, _ROW_MASK

if TYPE_CHECKING:
    from loaderkit.hdf5.reader import SessionReader

__all__ = [
    "ReadMode",
    "overrides",
    "plan_runs",
    "read_mode",
    "read_runs_hook",
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


def plan_runs(
    keys: np.ndarray, *, sort: bool, always: bool
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Choose how to read a batch given its packed (session, row) keys.

    Returns ``(order, starts)``: ``order`` is the permutation to read in (``None``: request
    order) and ``starts`` the offsets, in that order, where a new run of consecutive rows of one
    session begins (consecutive keys differ by exactly 1). ``starts`` is ``None`` when
    per-sample reads in request order are best (nothing to coalesce through HDF5). On chunked
    data a sorted order is always used, so rows sharing a chunk are read one after another and
    the chunk is decompressed once. With ``always`` (contiguous data read with ``preadv``) runs
    in request order are always used: one system call per run, however short.

    Args:
        keys: Packed keys of the batch, in request order.
        sort: Read in sorted order (chunked data).
        always: Read runs in request order (contiguous data).

    Returns:
        ``(order, starts)`` as described above.

    Example:
        >>> order, starts = plan_runs(np.array([5, 6, 7, 1, 2]), sort=False, always=False)
        >>> order is None, starts.tolist()
        (True, [0, 3])
    """
    n = keys.shape[0]
    brk = np.flatnonzero(np.diff(keys) != 1)
    if (brk.size + 1) * 2 <= n or always:
        return None, np.concatenate(([0], brk + 1))
    order = np.argsort(keys, kind="stable")
    brk2 = np.flatnonzero(np.diff(keys[order]) != 1)
    if (brk2.size + 1) * 2 <= n or sort:
        return order, np.concatenate(([0], brk2 + 1))
    return None, None


def read_runs_hook(
    reader: SessionReader,
    read_rows: Callable[[Hashable, int, int], Sequence[Any]],
    idx: np.ndarray,
    keys: np.ndarray,
    order: np.ndarray | None,
    starts: np.ndarray | None,
) -> list[Any]:
    """Coalesced reads through a subclass's ``read_rows``; caller holds the handle lock.

    Args:
        reader: The dataset's reader (sessions, handles, error context).
        read_rows: The subclass's hook.
        idx: Dataset indices of the batch (for messages).
        keys: Their packed keys.
        order: Read order from ``plan_runs``.
        starts: Run starts from ``plan_runs`` (``None``: one run per sample).

    Returns:
        One sample per key, in request order.

    Raises:
        ConfigError: ``read_rows`` returned the wrong number of samples.
    """
    n = idx.size
    if starts is None:
        starts = np.arange(n)
    run_keys = (keys[starts] if order is None else keys[order[starts]]).tolist()
    bounds = starts.tolist()
    bounds.append(n)
    result: list[Any] = [None] * n
    targets = list(range(n)) if order is None else order.tolist()
    ids = reader.ids
    for r, key in enumerate(run_keys):
        pos, a = key >> _ROW_BITS, key & _ROW_MASK
        k, k2 = bounds[r], bounds[r + 1]
        try:
            samples = read_rows(ids[pos], a, a + (k2 - k))
            if len(samples) != k2 - k:
                raise ConfigError(
                    f"read_rows({ids[pos]!r}, {a}, {a + k2 - k}) returned {len(samples)} "
                    f"samples, expected {k2 - k}."
                )
        except Exception as exc:
            reader.cache.discard(reader.canonical[pos])
            reader.note(exc, pos, a, int(idx[targets[k]]))
            raise
        for t, sample in zip(targets[k:k2], samples, strict=True):
            result[t] = sample
    return result
