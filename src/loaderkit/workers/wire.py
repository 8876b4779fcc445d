"""The hand-off's wire format: slot layout, the messages a worker sends, and who receives them.

Both sides of the slot hand-off use this module: the workers (``loaderkit.workers.worker``) lay
batches out in slots and send ``SlotBatch``/``FallbackBatch`` messages; the main process
(``loaderkit.workers.handoff``) registers a receiver per iterator and turns messages back into
batches.

* A slot is ``HEADER`` bytes (its state byte, ``FREE`` or ``BUSY``, padded to a page), then
  the batch, every tensor at an ``ALIGN``-byte offset.
* A ``SlotBatch`` names its receiver (a token), the worker, the slot and, per tensor, a
  ``Leaf`` (offset, dtype, shape) in the batch's structure; unpickled in the main process it
  calls the receiver registered for its token (``register``). A batch whose iterator is gone
  becomes an ``Orphan`` (its slot is not mapped, so it cannot be read), whatever else was
  imported: this module takes nothing from the modules that use it.

Examples:
    >>> rebuild({"x": [Leaf(0, torch.float32, (2,))]}, lambda leaf: leaf.shape)
    {'x': [(2,)]}
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

__all__ = [
    "ALIGN",
    "BUSY",
    "FREE",
    "HEADER",
    "CompressedRows",
    "FallbackBatch",
    "Leaf",
    "Orphan",
    "SlotBatch",
    "itemsize",
    "rebuild",
    "register",
    "unregister",
    "walk",
]

#: Slot states (one byte at the start of each slot).
FREE, BUSY = 0, 1
#: Bytes before a slot's batch: its state, padded to a page.
HEADER = 4096
#: Alignment of every tensor inside a slot (any dtype can be viewed at it).
ALIGN = 64


@dataclass(frozen=True)
class Leaf:
    """Where one tensor of a pooled batch lies in its slot.

    Attributes:
        offset: Byte offset from the start of the slot.
        dtype: The tensor's dtype.
        shape: The tensor's shape (the tensor is contiguous).
    """

    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Bytes the tensor occupies."""
        return math.prod(self.shape) * itemsize(self.dtype)


class CompressedRows(NamedTuple):
    """A sparse CSR tensor on the wire: its three parts (plain tensors) and its size.

    A worker sends a batch's ``torch.sparse_csr_tensor`` as this, its parts laid out in the
    slot like any tensor; ``rebuild`` makes the tensor again, without checking its invariants
    (they held where it was built), so torch never checks or warns about them in transit.

    Example:
        >>> t = torch.sparse_csr_tensor([0, 1, 1], [2], [5.0], (2, 3))
        >>> CompressedRows.of(t).tensor().to_dense().tolist()
        [[0.0, 0.0, 5.0], [0.0, 0.0, 0.0]]
    """

    crow: Any
    col: Any
    values: Any
    size: tuple[int, ...]

    @classmethod
    def of(cls, tensor: torch.Tensor) -> CompressedRows:
        """The parts of a sparse CSR ``tensor``."""
        parts = (tensor.crow_indices(), tensor.col_indices(), tensor.values())
        return cls(*parts, tuple(tensor.shape))

    def tensor(self) -> Any:
        """The sparse CSR tensor again (this, unchanged, while its parts are not tensors)."""
        if not isinstance(self.values, torch.Tensor):
            return self
        return torch.sparse_csr_tensor(
            self.crow, self.col, self.values, self.size, check_invariants=False
        )


@functools.lru_cache(maxsize=64)
def itemsize(dtype: torch.dtype) -> int:
    """Bytes per element of ``dtype``.

    Examples:
        >>> itemsize(torch.float64)
        8
    """
    return torch.empty((), dtype=dtype).element_size()


def walk(structure: Any, leaf: type, make: Callable[[Any], Any]) -> Any:
    """``structure`` (dicts, lists, tuples, namedtuples) with each ``leaf`` replaced by ``make``."""
    if isinstance(structure, leaf):
        return make(structure)
    kind = type(structure)
    if kind is dict:
        return {key: walk(value, leaf, make) for key, value in structure.items()}
    if kind is list:
        return [walk(value, leaf, make) for value in structure]
    if kind is tuple:
        return tuple(walk(value, leaf, make) for value in structure)
    if isinstance(structure, tuple) and hasattr(structure, "_fields"):
        return kind._make(walk(value, leaf, make) for value in structure)
    return structure


def rebuild(structure: Any, make: Callable[[Leaf], Any]) -> Any:
    """``structure`` (from a ``SlotBatch``) with each ``Leaf`` replaced by ``make(leaf)``.

    Sparse CSR tensors (``CompressedRows``) are made again from their parts.
    """
    built = walk(structure, Leaf, make)
    return walk(built, CompressedRows, CompressedRows.tensor)


# --------------------------------------------------------------------------- receivers

#: The main process's receivers by token (``loaderkit.workers.handoff.Receiver`` registers itself).
_RECEIVERS: dict[int, Any] = {}
_LOCK = threading.Lock()


class Orphan:
    """A slot batch unpickled after its receiver was unregistered (its iterator is gone).

    Its slot is not mapped in this process, so the batch cannot be read: ``materialize``
    raises, as a ``Received`` batch handed out twice does.

    Examples:
        >>> Orphan({"x": Leaf(0, torch.float32, (2,))}).materialize()
        Traceback (most recent call last):
        ...
        RuntimeError: loaderkit: this batch arrived after its iterator ended (its loader closed)
    """

    __slots__ = ("structure",)

    def __init__(self, structure: Any) -> None:
        self.structure = structure

    def materialize(self) -> Any:
        """Raise: the slot this batch lies in is not this process's to read."""
        raise RuntimeError(
            "loaderkit: this batch arrived after its iterator ended (its loader closed)"
        )


def register(token: int, receiver: Any) -> None:
    """Route messages naming ``token`` to ``receiver`` (its ``receive`` and ``counts``)."""
    with _LOCK:
        _RECEIVERS[token] = receiver


def unregister(token: int) -> None:
    """Stop routing ``token`` (its iterator is done)."""
    with _LOCK:
        _RECEIVERS.pop(token, None)


def registered(token: int) -> bool:
    """Whether a receiver is registered for ``token``."""
    return token in _RECEIVERS


def receive_slot(
    token: int,
    worker_id: int,
    generation: int,
    slot: int,
    structure: Any,
    copied: bool,
    segment: tuple[Any, int] | None,
) -> Any:
    """Unpickle a ``SlotBatch`` in the main process: its receiver takes it."""
    receiver = _RECEIVERS.get(token)
    if receiver is None:
        return Orphan(structure)
    return receiver.receive(worker_id, generation, slot, structure, copied, segment)


def receive_fallback(token: int, data: Any, reason: str) -> Any:
    """Unpickle a ``FallbackBatch``: count it, return the batch as torch sent it."""
    receiver = _RECEIVERS.get(token)
    if receiver is not None:
        receiver.counts.fallback += 1
    return data


# --------------------------------------------------------------------------- messages


@dataclass
class SlotBatch:
    """A batch in a slot, as it crosses torch's result queue (a few hundred bytes pickled).

    Unpickled in the main process by ``receive_slot``: its receiver maps the segment the
    first time (``segment`` carries its descriptor then) and returns the batch's lease.

    Attributes:
        token: The receiver (``loaderkit.workers.worker.HandoffConfig.token``).
        worker_id: The worker that filled the slot.
        generation: The worker's segment (a new one when slots had to grow).
        slot: The slot number.
        structure: The batch with each tensor replaced by its ``Leaf``.
        copied: Some tensor had to be copied into the slot (it was made elsewhere).
        segment: ``(descriptor, size)`` with the first batch of a slot (of a generation).
    """

    token: int
    worker_id: int
    generation: int
    slot: int
    structure: Any
    copied: bool
    segment: tuple[Any, int] | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            receive_slot,
            (
                self.token,
                self.worker_id,
                self.generation,
                self.slot,
                self.structure,
                self.copied,
                self.segment,
            ),
        )


@dataclass
class FallbackBatch:
    """A tensor batch sent on torch's path because no slot was free (counted by the receiver).

    Attributes:
        token: The receiver.
        data: The batch as torch sends it.
        reason: Why it was not pooled.
    """

    token: int
    data: Any
    reason: str

    def __reduce__(self) -> tuple[Any, ...]:
        return (receive_fallback, (self.token, self.data, self.reason))
