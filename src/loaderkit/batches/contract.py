"""A finished batch and where it is written: the contract between a loader and a dataset.

torch's fetcher hands what a dataset's ``__getitems__`` returns to ``collate_fn``. A dataset
that reads a whole batch into one buffer (``HDF5SessionDataset`` with its default reads)
returns a ``RowBatch``: a real list of per-sample views for any ``collate_fn``, which carries
the finished batch itself (``RowBatch.tensor``). loaderkit's ``collate``
(``loaderkit.workers.collate.collate``, filled in where ``collate_fn`` is left unset and the
dataset reads batches natively) returns that tensor as the batch: no split, no stack, no copy.
The whole contract, in one place:

* **the finished batch**: ``RowBatch(tensor, rows, ragged=None)``; ``tensor`` is what
  ``default_collate`` would make of ``rows`` (a tensor, a dict of them, a list of ``str``,
  ``Padded`` tokens), ``None`` where the rows cannot be stacked (``collate`` then raises
  ``RaggedBatchError`` naming ``ragged``). Only ``collate`` unwraps it; any other
  ``collate_fn`` sees the list.
* **where it is written**: the loader hands each reading process a ``BatchMemory``
  (``LoaderSupport.use_batch_memory``): in a worker process of a loaderkit loader, the
  worker's batch slot (``loaderkit.workers.collate.WorkerMemory``), so the batch crosses to the
  main process as a slot number; in shared memory where the slot pool is off and the batch is
  sent as read; anywhere else (the main process, worker threads, torch's own ``DataLoader``)
  plain memory, ``PLAIN``. A dataset allocates every batch buffer through the memory it was
  handed, never by asking which process it is in.
* **dtypes**: ``torch_dtype`` says which numpy dtypes a batch tensor holds as they are.

This package imports torch and numpy only: ``support``, ``workers`` and ``hdf5`` build on it.

Example:
    >>> tensor, rows = PLAIN.buffer(2, (3,), np.dtype("f4"))
    >>> RowBatch(tensor, rows).tensor.shape
    torch.Size([2, 3])
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np
import torch

__all__ = ["PLAIN", "BatchMemory", "Padded", "PlainMemory", "RowBatch", "torch_dtype"]


class RowBatch(list[Any]):
    """The samples of a batch read in place; ``collate`` returns the batch it was read into.

    A real ``list`` of samples for any ``collate_fn``. For dict samples (compound rows,
    several keys) the samples are built only when something looks at them (the first
    ``len``, index, iteration, ``sort``...): ``collate`` never does, so batched reads make no
    per-sample Python objects. Pickling gives a plain list.

    Attributes:
        tensor: What ``collate`` returns: the whole batch tensor ``(len(self), *sample_shape)``
            for numeric rows, a dict of per-field (or per-key) batches for compound rows and
            several keys, a list of ``str`` for strings; ``None`` when the rows cannot be
            stacked (ragged rows: ``collate`` raises ``RaggedBatchError``).
        ragged: For ragged rows, what to call them in the error (``"'spikes' of <dataset>"``).

    Examples:
        >>> tensor, rows = PLAIN.buffer(2, (3,), np.dtype("f4"))
        >>> rows[:] = 1.0
        >>> batch = RowBatch(tensor, rows)
        >>> len(batch), batch[0].tolist(), batch.tensor is tensor
        (2, [1.0, 1.0, 1.0], True)
        >>> lazy = RowBatch({"x": tensor}, lambda: [{"x": row} for row in rows])
        >>> len(lazy), sorted(lazy[0])
        (2, ['x'])
    """

    def __init__(
        self,
        tensor: Any,
        rows: Iterable[Any] | Callable[[], Iterable[Any]],
        *,
        ragged: str | None = None,
    ) -> None:
        self.tensor = tensor
        self.ragged = ragged
        self._build: Callable[[], Iterable[Any]] | None = None
        if callable(rows):
            super().__init__()
            self._build = rows
        else:
            super().__init__(rows)

    def _materialize(self) -> None:
        build = self.__dict__.get("_build")
        if build is not None:
            self._build = None
            list.extend(self, build())

    def __reduce_ex__(self, protocol: Any) -> Any:
        self._materialize()
        return (list, (list(list.__iter__(self)),))

    def __repr__(self) -> str:
        self._materialize()
        return list.__repr__(self)


def _materializing(name: str) -> Callable[..., Any]:
    method = getattr(list, name)

    def wrapper(self: RowBatch, *args: Any, **kwargs: Any) -> Any:
        self._materialize()
        return method(self, *args, **kwargs)

    wrapper.__name__ = name
    wrapper.__doc__ = method.__doc__
    return wrapper


for _name in (
    "__len__", "__getitem__", "__iter__", "__reversed__", "__contains__", "__eq__", "__ne__",
    "__lt__", "__le__", "__gt__", "__ge__", "__add__", "__mul__", "__rmul__", "__iadd__",
    "__imul__", "__setitem__", "__delitem__", "__bool__", "append", "extend", "insert", "pop",
    "remove", "index", "count", "sort", "reverse", "copy", "clear",
):  # fmt: skip
    if hasattr(list, _name):
        setattr(RowBatch, _name, _materializing(_name))
RowBatch.__hash__ = None


class Padded(NamedTuple):
    """A batch of variable-length samples padded to the longest: what ``pad_collate`` returns.

    Attributes:
        values: ``(batch, longest, ...)``, the samples padded at the end of their first axis.
        lengths: ``(batch,)`` int64, each sample's own length.

    Examples:
        >>> Padded(torch.zeros(2, 3), torch.tensor([3, 1])).lengths.tolist()
        [3, 1]
    """

    values: torch.Tensor
    lengths: torch.Tensor


@functools.lru_cache(maxsize=64)
def torch_dtype(dtype: np.dtype) -> torch.dtype | None:
    """The torch dtype holding ``dtype``'s values as they are, or ``None`` (no such dtype).

    Only native-byte-order numeric types qualify: what ``torch.from_numpy`` accepts.

    Examples:
        >>> torch_dtype(np.dtype("f4")), torch_dtype(np.dtype(">f4"))
        (torch.float32, None)
    """
    if dtype.fields is not None or dtype.kind not in "biufc" or not dtype.isnative:
        return None
    try:
        return torch.from_numpy(np.empty(0, dtype=dtype)).dtype
    except TypeError:
        return None


@runtime_checkable
class BatchMemory(Protocol):
    """Where a reading process writes its batches: one call per batch buffer.

    Example:
        >>> isinstance(PLAIN, BatchMemory)
        True
    """

    def buffer(self, n: int, shape: tuple[int, ...], dtype: np.dtype) -> tuple[Any, np.ndarray]:
        """A batch tensor ``(n, *shape)`` of ``dtype`` and a numpy view of the same memory.

        Raises:
            TypeError: ``dtype`` has no torch equivalent (``torch_dtype``).
        """
        ...


class PlainMemory:
    """Batches in plain memory: a numpy allocation torch shares as it is.

    numpy's allocator asks for huge pages on large arrays: a batch of many MiB is faulted in
    far fewer pages than ``torch.empty``'s. Stateless: one ``PLAIN`` serves every process.

    Example:
        >>> tensor, array = PLAIN.buffer(4, (2, 2), np.dtype("i2"))
        >>> tensor.shape, tensor.dtype, array.shape
        (torch.Size([4, 2, 2]), torch.int16, (4, 2, 2))
    """

    def buffer(
        self, n: int, shape: tuple[int, ...], dtype: np.dtype
    ) -> tuple[torch.Tensor, np.ndarray]:
        """A plain batch buffer (see ``BatchMemory.buffer``)."""
        if torch_dtype(dtype) is None:
            raise TypeError(f"no torch dtype holds {dtype} as it is")
        array = np.empty((n, *shape), dtype=dtype)
        return torch.from_numpy(array), array

    def __reduce__(self) -> str:
        return "PLAIN"  # one object per process, also after pickling


#: Plain memory: where batches are written unless a loader hands over another memory.
PLAIN = PlainMemory()
