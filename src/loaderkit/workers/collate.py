"""Batches read straight into their final tensor, and the collate function that keeps them.

The contract (``RowBatch``, ``BatchMemory``) is written in ``loaderkit.batches.contract``;
this module holds the loader's side of it. A dataset that reads a whole batch into one buffer
(``HDF5SessionDataset`` with its default reads) writes it where the loader's ``BatchMemory``
says (``WorkerMemory`` in a worker process: its batch slot, so sending the batch to the main
process copies nothing), fills it from the file, and returns a ``RowBatch``: a list of
per-sample views of the buffer, carrying the buffer itself.

* ``collate`` (the ``collate_fn`` loaderkit fills in when you leave it unset and the dataset
  reads batches natively) returns that buffer as the batch: no split, no stack, no copy.
  Everything else goes to ``default_collate`` unchanged.
* Any other ``collate_fn`` receives an ordinary list of samples (numpy rows, views of the
  buffer), exactly what per-sample reads give.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from torch.utils.data import get_worker_info

from loaderkit import _torch
from loaderkit.batches.contract import PLAIN, Padded, PlainMemory, RowBatch, torch_dtype
from loaderkit.errors import RaggedBatchError
from loaderkit.workers import worker
from loaderkit.workers.worker import share_batches

__all__ = [
    "Padded",
    "RowBatch",
    "WorkerMemory",
    "batch_buffer",
    "collate",
    "pad_collate",
    "share_batches",
    "stack_sparse",
    "torch_dtype",
]


def _as_tensor(sample: Any) -> torch.Tensor | None:
    if isinstance(sample, torch.Tensor):
        return sample
    if isinstance(sample, np.ndarray) and torch_dtype(sample.dtype.newbyteorder("=")) is not None:
        return torch.from_numpy(np.ascontiguousarray(sample, sample.dtype.newbyteorder("=")))
    return None


def pad_collate(batch: Any, padding_value: float = 0) -> Any:
    """``default_collate`` that pads samples of different lengths instead of failing.

    Wherever the samples at one place of the structure (the samples themselves, a dict
    field, a tuple element) are tensors or arrays whose first axis differs in length, they
    become a ``Padded(values, lengths)``: padded at the end with ``padding_value``, with each
    sample's length (other axes must agree). Everything else is collated by
    ``default_collate``. Padding is chosen over ``torch.nested`` tensors because a padded
    batch works with every operation, ``pin_memory``, ``to_device`` and ``DevicePrefetcher``,
    and masks or packing (``torch.nn.utils.rnn.pack_padded_sequence``) follow from ``lengths``.

    Args:
        batch: A list of samples (what a dataset's ``__getitems__`` or indexing returns).
        padding_value: The value written past each sample's end.

    Returns:
        The collated batch.

    Examples:
        >>> out = pad_collate([torch.tensor([1, 2, 3]), torch.tensor([4])])
        >>> out.values.tolist(), out.lengths.tolist()
        ([[1, 2, 3], [4, 0, 0]], [3, 1])
        >>> pad_collate([{"x": torch.ones(2), "y": 1}, {"x": torch.ones(1), "y": 2}])["y"]
        tensor([1, 2])
    """
    samples = list(batch)
    if not samples:
        return _torch.default_collate(samples)
    first = samples[0]
    if isinstance(first, Mapping) and not isinstance(first, (str, bytes)):
        return {key: pad_collate([s[key] for s in samples], padding_value) for key in first}
    if isinstance(first, tuple) and not hasattr(first, "_fields"):
        return [pad_collate(list(column), padding_value) for column in zip(*samples, strict=True)]
    tensors = [_as_tensor(s) for s in samples]
    if all(t is not None and t.dim() >= 1 for t in tensors):
        shapes = {tuple(t.shape) for t in tensors if t is not None}
        if len(shapes) > 1:
            parts = [cast(torch.Tensor, t) for t in tensors]
            values = torch.nn.utils.rnn.pad_sequence(
                parts, batch_first=True, padding_value=padding_value
            )
            lengths = torch.tensor([t.shape[0] for t in parts], dtype=torch.int64)
            return Padded(values, lengths)
    return _torch.default_collate(samples)


@dataclass(frozen=True)
class WorkerMemory:
    """The ``BatchMemory`` a loaderkit loader hands each of its worker processes.

    A batch buffer lies in the worker's batch slot (the slot pool, ``loaderkit.workers.worker``),
    so the batch reaches the main process without a copy and without a new shared-memory
    segment; where no slot serves (the pool off, none free, the first batch that sizes them)
    and the loader keeps batches as read (``shared``: its ``collate_fn`` is ``collate``), the
    storage is created in shared memory (torch would move any other tensor there first); else
    plain memory (``PLAIN``). The loader's worker start (``loaderkit.order.seeding.WorkerInit``)
    hands it over through ``LoaderSupport.use_batch_memory``.

    Attributes:
        shared: Allocate in shared memory where no slot serves.

    Example:
        >>> tensor, array = WorkerMemory(shared=False).buffer(2, (3,), np.dtype("f4"))
        >>> tensor.shape  # in the main process: no slot, plain memory
        torch.Size([2, 3])
    """

    shared: bool = False

    def buffer(
        self, n: int, shape: tuple[int, ...], dtype: np.dtype
    ) -> tuple[torch.Tensor, np.ndarray]:
        """The batch buffer (``loaderkit.batches.BatchMemory.buffer``)."""
        kind = torch_dtype(dtype)
        if kind is None:
            raise TypeError(f"no torch dtype holds {dtype} as it is")
        block = worker.allocate(n * math.prod(shape) * dtype.itemsize)
        if block is not None:  # the worker's batch slot: no new shared memory per batch
            array = block.view(dtype).reshape(n, *shape)
            return torch.from_numpy(array), array
        if self.shared:
            tensor = _torch.new_shared_tensor(kind, (n, *shape))
            return tensor, tensor.numpy()
        return PLAIN.buffer(n, shape, dtype)

    def __reduce__(self) -> Any:
        return (_plain_memory, ())  # a copy of the dataset elsewhere writes plain memory


def _plain_memory() -> PlainMemory:
    """``PLAIN`` (what a pickled ``WorkerMemory`` becomes)."""
    return PLAIN


def batch_buffer(
    n: int, shape: tuple[int, ...], dtype: np.dtype
) -> tuple[torch.Tensor, np.ndarray]:
    """A batch buffer as this process's worker state says: ``WorkerMemory`` in a worker.

    For code that has no ``BatchMemory`` handed to it: inside a torch worker, the worker's slot
    or shared memory as ``share_batches`` says; elsewhere plain memory.

    Examples:
        >>> tensor, array = batch_buffer(4, (2, 2), np.dtype("i2"))
        >>> tensor.shape, tensor.dtype, array.shape
        (torch.Size([4, 2, 2]), torch.int16, (4, 2, 2))
    """
    if get_worker_info() is None:
        return PLAIN.buffer(n, shape, dtype)
    return WorkerMemory(shared=worker.shared_batches()).buffer(n, shape, dtype)


def stack_sparse(samples: Sequence[torch.Tensor]) -> torch.Tensor:
    """Sparse samples as one sparse batch: 1-D rows as a ``(n, length)`` CSR tensor.

    torch's ``default_collate`` refuses sparse tensors. 1-D sparse COO samples of one length
    (what ``HDF5SessionDataset`` gives for a row of a sparse matrix) become one
    ``torch.sparse_csr_tensor``, the form its batched reads give; other sparse COO samples of
    one shape are stacked by ``torch.stack`` (a sparse COO batch).

    Args:
        samples: Sparse tensors, one a sample.

    Returns:
        The batch.

    Raises:
        TypeError: The samples differ in layout or shape, or are sparse in another layout.

    Examples:
        >>> rows = [torch.tensor([0.0, 2.0, 0.0]).to_sparse(), torch.zeros(3).to_sparse()]
        >>> batch = stack_sparse(rows)
        >>> batch.layout, batch.to_dense().tolist()
        (torch.sparse_csr, [[0.0, 2.0, 0.0], [0.0, 0.0, 0.0]])
    """
    first = samples[0]
    shape = first.shape
    if any(t.layout is not torch.sparse_coo or t.shape != shape for t in samples):
        found = sorted({f"{t.layout} {tuple(t.shape)}" for t in samples})
        raise TypeError(
            "sparse samples are stacked when all are sparse COO tensors of one shape; this "
            f"batch holds {', '.join(found)}: pass a collate_fn for them"
        )
    if first.dim() != 1:
        return torch.stack(list(samples))
    rows = [t if t.is_coalesced() else t.coalesce() for t in samples]
    counts = torch.tensor([t.values().shape[0] for t in rows], dtype=torch.int64)
    crow = torch.zeros(len(rows) + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=crow[1:])
    return torch.sparse_csr_tensor(
        crow,
        torch.cat([t.indices()[0] for t in rows]),
        torch.cat([t.values() for t in rows]),
        (len(rows), shape[0]),
        check_invariants=False,
    )


def collate(batch: Any) -> Any:
    """``default_collate``, except that a ``RowBatch`` is already its own batch.

    loaderkit fills this in as ``collate_fn`` when you leave it unset and the dataset reads
    batches natively or gives sparse samples (the plan says so); for any other input it is
    ``default_collate``, with sparse samples stacked by ``stack_sparse`` wherever they are
    (a row of a sparse matrix, a dict sample's sparse field).

    Args:
        batch: What the dataset's ``__getitems__`` returned, or a list of samples.

    Returns:
        The collated batch.

    Raises:
        RaggedBatchError: The batch holds variable-length rows, which cannot be stacked.

    Examples:
        >>> collate([(1, 2.0), (3, 4.0)])
        [tensor([1, 3]), tensor([2., 4.], dtype=torch.float64)]
    """
    if type(batch) is RowBatch:
        if batch.tensor is None:
            raise RaggedBatchError(
                f"rows of {batch.ragged or 'this dataset'} are ragged (variable-length): "
                "samples of different lengths cannot be stacked into one tensor. Pass "
                "collate_fn=loaderkit.pad_collate (padded values plus lengths), a transform "
                "that crops or pads every sample to one length, or batch_size=None."
            )
        return batch.tensor
    return _torch.default_collate(batch, sparse=stack_sparse)
