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
  buffer), exactly what per-sample reads give.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, cast

import numpy as np
import torch
from torch.utils.data import get_worker_info

from loaderkit import _torch
from loaderkit.errors import RaggedBatchError
from loaderkit.workers import worker
from loaderkit.workers.worker import share_batches

__all__ = [
    "Padded",
    "RowBatch",
    "batch_buffer",
    "collate",
    "pad_collate",
    "share_batches",
    "stack_sparse",
    "torch_dtype",
]


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
        >>> tensor, rows = batch_buffer(2, (3,), np.dtype("f4"))
        >>> rows[:] = 1.0
        >>> batch = RowBatch(tensor, rows)
        >>> len(batch), batch[0].tolist(), collate(batch) is tensor
        (2, [1.0, 1.0, 1.0], True)
        >>> lazy = RowBatch({"x": tensor}, lambda: [{"x": row} for row in rows])
        >>> collate(lazy) is lazy.tensor, len(lazy), sorted(lazy[0])
        (True, 2, ['x'])
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

    Inside a worker of a loaderkit loader with the slot pool (``loaderkit.workers.worker``) it lies
    in the worker's batch slot, so the batch reaches the main process without a copy and without a
    new shared-memory segment. Inside a worker of a loader that keeps the batch as read
    (``share_batches``) without the pool, the storage is created in shared memory (torch moves
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
    in_worker = get_worker_info() is not None
    block = worker.allocate(n * math.prod(shape) * dtype.itemsize) if in_worker else None
    if block is not None:
        # the worker's batch slot (loaderkit's hand-off): no new shared memory per batch
        array = block.view(dtype).reshape(n, *shape)
        return torch.from_numpy(array), array
    if in_worker and worker.shared_batches():
        tensor = _torch.new_shared_tensor(kind, (n, *shape))
        return tensor, tensor.numpy()
    # numpy's allocator asks for huge pages on large arrays: a batch of many MiB is faulted in
    # far fewer pages than torch.empty's, and torch shares the memory as it is
    array = np.empty((n, *shape), dtype=dtype)
    return torch.from_numpy(array), array


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
