"""Batches read straight into their final tensor, and the collate function that keeps them.

torch's fetcher hands a dataset's ``__getitems__`` result to ``collate_fn``. A dataset that can
read a whole batch into one buffer (``HDF5SessionDataset`` with its default reads) allocates
that buffer as ``default_collate`` would allocate the batch (in shared memory inside a worker,
so sending it to the main process copies nothing), fills it from the file, and returns a
``RowBatch``: a list of per-sample views of the buffer, carrying the buffer itself.

* ``collate`` (the ``collate_fn`` loaderkit fills in when you leave it unset and the dataset
  reads batches natively) returns that buffer as the batch: no split, no stack, no copy.
  Everything else goes to ``default_collate`` unchanged.
* Any other ``collate_fn`` receives an ordinary list of samples (numpy rows, views of the
  buffer), exactly what per-sample reads gave before.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info
from torch.utils.data._utils.collate import default_collate

__all__ = ["RowBatch", "batch_buffer", "collate", "share_batches", "torch_dtype"]

#: Whether this worker process allocates batch buffers in shared memory (``share_batches``).
_SHARED_BATCHES = False


def share_batches(enabled: bool) -> None:
    """Make this worker allocate batch buffers in shared memory (or stop doing so).

    A loaderkit loader whose ``collate_fn`` is ``collate`` turns it on in each of its workers
    (through its ``worker_init_fn``): the buffer is then the batch torch sends to the main
    process, already in shared memory. Anywhere else (torch's own DataLoader, another
    ``collate_fn``) the buffer is only read from, so a private allocation is cheaper.

    Args:
        enabled: Allocate in shared memory inside a worker.

    Examples:
        >>> share_batches(False)
    """
    global _SHARED_BATCHES
    _SHARED_BATCHES = bool(enabled)


class RowBatch(list[Any]):
    """Per-sample views of one batch tensor, read in place; ``collate`` returns the tensor.

    Attributes:
        tensor: The whole batch, ``(len(self), *sample_shape)``.

    Examples:
        >>> tensor, rows = batch_buffer(2, (3,), np.dtype("f4"))
        >>> rows[:] = 1.0
        >>> batch = RowBatch(tensor, rows)
        >>> len(batch), batch[0].tolist(), collate(batch) is tensor
        (2, [1.0, 1.0, 1.0], True)
    """

    def __init__(self, tensor: torch.Tensor, rows: np.ndarray) -> None:
        super().__init__(rows)
        self.tensor = tensor


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


def batch_buffer(
    n: int, shape: tuple[int, ...], dtype: np.dtype
) -> tuple[torch.Tensor, np.ndarray]:
    """A batch tensor allocated as ``default_collate`` allocates one, and a numpy view of it.

    Inside a worker of a loader that keeps the batch as read (``share_batches``) the storage is
    created in shared memory, so the batch reaches the main process without a copy (torch moves
    any other tensor into shared memory first). Otherwise it is a numpy allocation shared with
    torch (huge pages for large batches).

    Args:
        n: Samples in the batch.
        shape: Shape of one sample.
        dtype: A numpy dtype ``torch_dtype`` accepts.

    Returns:
        ``(tensor, array)`` sharing one buffer of shape ``(n, *shape)``.

    Raises:
        TypeError: ``dtype`` has no torch equivalent.

    Examples:
        >>> tensor, array = batch_buffer(4, (2, 2), np.dtype("i2"))
        >>> tensor.shape, tensor.dtype, array.shape
        (torch.Size([4, 2, 2]), torch.int16, (4, 2, 2))
    """
    kind = torch_dtype(dtype)
    if kind is None:
        raise TypeError(f"no torch dtype holds {dtype} as it is")
    if _SHARED_BATCHES and get_worker_info() is not None:
        numel = n * math.prod(shape)
        storage = torch.empty(0, dtype=kind)._typed_storage()._new_shared(numel, device="cpu")
        tensor = torch.empty(0, dtype=kind).new(storage).resize_(n, *shape)
        return tensor, tensor.numpy()
    # numpy's allocator asks for huge pages on large arrays: a batch of many MiB is faulted in
    # far fewer pages than torch.empty's, and torch shares the memory as it is
    array = np.empty((n, *shape), dtype=dtype)
    return torch.from_numpy(array), array


def collate(batch: Any) -> Any:
    """``default_collate``, except that a ``RowBatch`` is already its own batch tensor.

    loaderkit fills this in as ``collate_fn`` when you leave it unset and the dataset reads
    batches natively (the plan says so); for any other input it is ``default_collate``.

    Args:
        batch: What the dataset's ``__getitems__`` returned, or a list of samples.

    Returns:
        The collated batch.

    Examples:
        >>> collate([(1, 2.0), (3, 4.0)])
        [tensor([1, 3]), tensor([2., 4.], dtype=torch.float64)]
    """
    if type(batch) is RowBatch:
        return batch.tensor
    return default_collate(batch)
