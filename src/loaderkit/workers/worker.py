"""What runs inside a DataLoader worker process: the shared-batch switch and the slot pool.

torch hands every batch from a worker to the main process as a *new* shared-memory segment:
created and faulted in by the worker, its descriptor passed over a socket, mapped and faulted
in again by the main process, then unmapped. For a batch of a few MiB that costs more than
reading it. loaderkit's hand-off instead gives each worker a few long-lived batch *slots*:

* one segment per slot (anonymous memory from ``memfd_create``: it never appears in
  ``/dev/shm``, and it is freed by the kernel when the last process holding it lets go, however
  that process ends): ``HEADER`` bytes holding the slot's state, then the batch;
* batch buffers (``loaderkit.workers.collate.batch_buffer``) and the tensors torch's
  ``default_collate`` stacks are allocated straight in a free slot (the worker's *arena* for the
  batch being made); any other tensor of the batch is copied into the slot (one ``memcpy`` into
  memory that is already faulted in);
* the batch crosses torch's result queue as a ``SlotBatch``: slot number, and per tensor an
  offset, dtype and shape. The segment's descriptor travels once, with the first batch of a new
  segment; the main process maps it once (``loaderkit.workers.handoff``);
* a slot is ``BUSY`` from the moment the worker takes it until the main process sets it
  ``FREE``, which it does only when nothing outside loaderkit can see the batch any more (the
  last tensor, view or slice of it is gone, or the pin-memory thread has copied it). With no
  slot free the batch takes torch's path (counted by the main process as a fallback).

Batches that hold no tensor (strings, numbers only, custom objects) take torch's path as they
are. The switch ``share_batches`` (natively read batches allocated in shared memory when the
pool is off) also lives here. Everything in this module runs in the worker, except the
``HandoffConfig`` the main process builds.

Examples:
    >>> config = HandoffConfig(token=1, slots=4)
    >>> config.slots
    4
"""

from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from loaderkit import _torch
from loaderkit.workers.wire import (
    ALIGN,
    BUSY,
    FREE,
    HEADER,
    CompressedRows,
    FallbackBatch,
    Leaf,
    SlotBatch,
    walk,
)

__all__ = [
    "HandoffCollate",
    "HandoffConfig",
    "allocate",
    "memfd_supported",
    "share_batches",
    "shared_batches",
]

logger = logging.getLogger("loaderkit")

#: Slots are whole pages.
_PAGE = 4096
#: A slot grown for a bigger batch is at least this much bigger (fewer regrowths).
_GROWTH = 1.25

#: Whether this worker process allocates batch buffers in shared memory (``share_batches``).
_SHARED_BATCHES = False


def share_batches(enabled: bool) -> None:
    """Make this worker allocate batch buffers in shared memory (or stop doing so).

    A loaderkit loader whose ``collate_fn`` is ``loaderkit.workers.collate.collate`` turns it on in
    each of its workers (through its ``worker_init_fn``): when the slot pool is off, the buffer is
    then the batch torch sends to the main process, already in shared memory. Anywhere else
    (torch's own DataLoader, another ``collate_fn``) the buffer is only read from, so a private
    allocation is cheaper.

    Args:
        enabled: Allocate in shared memory inside a worker.

    Examples:
        >>> share_batches(False); shared_batches()
        False
    """
    global _SHARED_BATCHES
    _SHARED_BATCHES = bool(enabled)


def shared_batches() -> bool:
    """Whether ``share_batches`` is on in this process.

    Examples:
        >>> isinstance(shared_batches(), bool)
        True
    """
    return _SHARED_BATCHES


def memfd_supported() -> bool:
    """Whether this interpreter can create anonymous shared memory (``os.memfd_create``).

    Examples:
        >>> isinstance(memfd_supported(), bool)
        True
    """
    return hasattr(os, "memfd_create")


def _align(n: int, to: int = ALIGN) -> int:
    return -(-n // to) * to


@dataclass(frozen=True)
class HandoffConfig:
    """How the workers of one iterator hand batches over (built in the main process).

    Attributes:
        token: Names the main-process receiver that maps this iterator's slots.
        slots: Slots per worker.

    Examples:
        >>> HandoffConfig(token=7, slots=5).token
        7
    """

    token: int
    slots: int

    def __post_init__(self) -> None:
        if not 1 <= self.slots <= 256:
            raise ValueError(f"slots must be in [1, 256], got {self.slots}")


# --------------------------------------------------------------------------- the pool


class _Slot:
    """One slot: its own anonymous shared memory, a state byte first, the batch after ``HEADER``.

    One segment per slot lets the main process map each as one torch storage (batches it hands
    out are then ``is_shared()`` as torch's are, and the storage's use count says when no tensor
    of the batch is left).
    """

    def __init__(self, slot_bytes: int) -> None:
        size = HEADER + slot_bytes
        fd = os.memfd_create("loaderkit-batches", getattr(os, "MFD_CLOEXEC", 0))
        try:
            os.ftruncate(fd, size)
            self.mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        self.fd: int | None = fd  # closed once sent (the mapping keeps the memory)
        self.size = size
        self.array = np.frombuffer(self.mm, np.uint8)
        self.data = self.array[HEADER:]
        self.base = int(self.array.ctypes.data) + HEADER

    def descriptor(self) -> tuple[Any, int] | None:
        """The slot's descriptor for the main process, the first time only."""
        if self.fd is None:
            return None
        from multiprocessing.reduction import DupFd

        fd, self.fd = self.fd, None
        try:
            return (DupFd(fd), self.size)
        finally:
            os.close(fd)  # DupFd keeps its own duplicate until the main process takes it


class _Segment:
    """One worker's slots of one size (a new generation when batches outgrow them)."""

    def __init__(self, slots: int, slot_bytes: int, generation: int) -> None:
        self.slot_bytes = slot_bytes
        self.generation = generation
        self.parts = [_Slot(slot_bytes) for _ in range(slots)]

    def slot(self, i: int) -> np.ndarray:
        return self.parts[i].data

    def state(self, i: int) -> int:
        return int(self.parts[i].array[0])

    def set_state(self, i: int, value: int) -> None:
        self.parts[i].array[0] = value

    def slot_of(self, address: int) -> int | None:
        for i, part in enumerate(self.parts):
            if part.base <= address < part.base + self.slot_bytes:
                return i
        return None

    def offset(self, i: int, address: int) -> int:
        return address - self.parts[i].base

    def take(self) -> int | None:
        """A free slot, now ``BUSY`` (owned by this worker until the main process frees it)."""
        for i, part in enumerate(self.parts):
            if part.array[0] == FREE:
                part.array[0] = BUSY
                return i
        return None

    def descriptor(self, i: int) -> tuple[Any, int] | None:
        return self.parts[i].descriptor()


class WorkerPool:
    """The slots of this worker and the batch being made in one of them (its arena)."""

    def __init__(self, config: HandoffConfig, worker_id: int) -> None:
        self.config = config
        self.worker_id = worker_id
        self.pid = os.getpid()
        self.segment: _Segment | None = None
        self.generation = 0
        self.arena: int | None = None  # the slot the current batch is allocated in
        self.used = 0  # bytes of the arena allocated so far
        self.arena_ok = True  # batches of this loader do end up in slots

    # ------------------------------------------------------------------ allocation

    def allocate(self, nbytes: int) -> np.ndarray | None:
        """``nbytes`` of the arena (aligned), or ``None`` (no free slot, or it is full)."""
        segment = self.segment
        if segment is None or not self.arena_ok:
            return None
        if self.arena is None:
            self.arena = segment.take()
            self.used = 0
            if self.arena is None:
                return None
        start = _align(self.used)
        if start + nbytes > segment.slot_bytes:
            return None
        self.used = start + nbytes
        return segment.slot(self.arena)[start : start + nbytes]

    def _retire_arena(self) -> None:
        """Forget the arena without freeing it: something may still refer to its memory."""
        self.arena = None
        self.used = 0

    def _reset_arena(self) -> None:
        """The arena's allocations belong to nobody: keep the slot for the next batch."""
        self.used = 0

    # ------------------------------------------------------------------ packing

    def pack(self, batch: Any) -> Any:
        """The message for ``batch``: a ``SlotBatch``, a ``FallbackBatch``, or ``batch``."""
        tensors: list[torch.Tensor] = []
        structure = _strip(batch, tensors)
        if structure is _UNSUPPORTED or not tensors:
            if self.arena is not None and self.used:
                # the batch may hold views of the arena (numpy rows, odd tensors): it is sent
                # by value later, by the queue's feeder thread, so the slot is never reused
                self._retire_arena()
                self.arena_ok = False
            return batch
        arena = self.arena
        segment = self.segment
        inside: list[int | None] = []
        need = 0
        for t in tensors:
            offset = None
            if segment is not None and arena is not None and t.is_contiguous():
                where = segment.slot_of(t.data_ptr())
                if where == arena:
                    start = segment.offset(arena, t.data_ptr())
                    if start + t.nbytes <= segment.slot_bytes:
                        offset = start
            inside.append(offset)
            if offset is None:
                need += _align(t.nbytes)
        copied = need > 0
        if (
            segment is None
            or (arena is None and need > segment.slot_bytes)
            or (arena is not None and _align(self.used) + need > segment.slot_bytes)
        ):
            # slots missing or too small: a new segment sized for this batch, everything copied
            total = sum(_align(t.nbytes) for t in tensors)
            old = segment.slot_bytes if segment is not None else 0
            slot_bytes = _align(max(total, int(old * _GROWTH) if old else total, 1), _PAGE)
            if arena is not None and self.used:
                self._retire_arena()
            self.generation += 1
            self.segment = segment = _Segment(self.config.slots, slot_bytes, self.generation)
            self.arena = arena = None
            inside = [None] * len(tensors)
            copied = True
        if arena is None:
            arena = segment.take()
            self.used = 0
            if arena is None:
                return FallbackBatch(self.config.token, batch, "no free slot")
        region = segment.slot(arena)
        leaves: list[Leaf] = []
        used = self.used
        for t, offset in zip(tensors, inside, strict=True):
            if offset is None:
                offset = _align(used)
                used = offset + t.nbytes
                if t.nbytes:
                    dst = torch.from_numpy(region[offset : offset + t.nbytes])
                    dst.view(t.dtype).view(t.shape).copy_(t)
            leaves.append(Leaf(offset, t.dtype, tuple(t.shape)))
        message = SlotBatch(
            token=self.config.token,
            worker_id=self.worker_id,
            generation=segment.generation,
            slot=arena,
            structure=_fill(structure, leaves),
            copied=copied,
            segment=segment.descriptor(arena),
        )
        self.arena = None  # sealed: BUSY until the main process frees it
        self.used = 0
        return message


class _Unsupported:
    pass


_UNSUPPORTED: Any = _Unsupported()


class _Hole:
    """Where the i-th tensor goes back into the structure."""

    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i


def _plain(t: torch.Tensor) -> bool:
    return (
        t.device.type == "cpu"
        and t.layout == torch.strided
        and not t.requires_grad
        and not t.is_quantized
        and not t.is_nested
        and type(t) is torch.Tensor
        and not t.is_neg()
        and not t.is_conj()
    )


def _strip(obj: Any, tensors: list[torch.Tensor]) -> Any:
    """``obj`` with each tensor replaced by a ``_Hole`` (tensors collected in order)."""
    if isinstance(obj, torch.Tensor):
        if obj.layout is torch.sparse_csr and obj.device.type == "cpu" and not obj.requires_grad:
            return _strip(CompressedRows.of(obj), tensors)  # its parts, made again on arrival
        if not _plain(obj):
            return _UNSUPPORTED
        tensors.append(obj)
        return _Hole(len(tensors) - 1)
    kind = type(obj)
    if kind is dict:
        out = {}
        for key, value in obj.items():
            part = _strip(value, tensors)
            if part is _UNSUPPORTED:
                return _UNSUPPORTED
            out[key] = part
        return out
    if kind is list or kind is tuple or (isinstance(obj, tuple) and hasattr(obj, "_fields")):
        parts = []
        for value in obj:
            part = _strip(value, tensors)
            if part is _UNSUPPORTED:
                return _UNSUPPORTED
            parts.append(part)
        if kind is list:
            return parts
        if kind is tuple:
            return tuple(parts)
        return kind._make(parts)
    return obj  # sent by value, as torch would (strings, numbers, other objects)


def _fill(structure: Any, values: Sequence[Any]) -> Any:
    """``structure`` with each ``_Hole`` replaced by ``values[hole.i]``."""
    return walk(structure, _Hole, lambda hole: values[hole.i])


# --------------------------------------------------------------------------- this process

_POOL: WorkerPool | None = None


def _current_pool() -> WorkerPool | None:
    pool = _POOL
    if pool is None or pool.pid != os.getpid():  # inherited through fork: not ours
        return None
    return pool


def allocate(nbytes: int) -> np.ndarray | None:
    """``nbytes`` of the batch slot this worker is filling, or ``None``.

    ``None`` outside a worker, when the pool is off, before the first batch (slots are sized
    from it) and when no slot is free: the caller then allocates as it would without a pool.

    Args:
        nbytes: Bytes wanted.

    Returns:
        A ``uint8`` array over shared memory, aligned to ``ALIGN`` bytes.

    Examples:
        >>> allocate(16) is None   # the main process has no pool
        True
    """
    pool = _current_pool()
    if pool is None:
        return None
    return pool.allocate(nbytes)


def _collate_tensors_into_slot(
    batch: Sequence[torch.Tensor],
    *,
    collate_fn_map: dict[type | tuple[type, ...], Callable[..., Any]] | None = None,
) -> torch.Tensor:
    """Torch's tensor collate, with the stacked batch allocated in this worker's slot."""
    elem = batch[0]
    if (
        isinstance(elem, torch.Tensor)
        and _plain(elem)
        and all(type(x) is torch.Tensor and x.shape == elem.shape for x in batch)
    ):
        nbytes = len(batch) * elem.nbytes
        block = allocate(nbytes)
        if block is not None:
            out = torch.from_numpy(block).view(elem.dtype).view(len(batch), *elem.shape)
            return torch.stack(list(batch), 0, out=out)
    rule = _torch.tensor_rule()
    assert rule is not None  # installed only where torch has a rule map
    return rule(batch, collate_fn_map=collate_fn_map)


def _install(config: HandoffConfig) -> WorkerPool | None:
    """The pool of this worker for ``config`` (created on the first batch)."""
    global _POOL
    pool = _current_pool()
    if pool is not None and pool.config == config:
        return pool
    info = get_worker_info()
    if info is None or not memfd_supported():
        return None
    _POOL = pool = WorkerPool(config, info.id)
    # torch's default_collate (and any collate_fn built on it) stacks tensors into the slot
    _torch.install_tensor_collate(_collate_tensors_into_slot)
    return pool


class HandoffCollate:
    """The ``collate_fn`` workers run with the slot pool: collate, then pack into a slot.

    Installed by the main process on the iterator (never on the loader) before its workers
    start; picklable when the wrapped function is (spawn and forkserver send it to each
    worker). In the main process (``num_workers=0``) it is the wrapped function.

    Attributes:
        fn: The collate function (the caller's, wrapped with loaderkit's error context).
        config: The iterator's hand-off.
    """

    def __init__(self, fn: Callable[[Any], Any], config: HandoffConfig) -> None:
        self.fn = fn
        self.config = config

    def __call__(self, batch: Any) -> Any:
        """Collate ``batch``, then hand it over in a slot when it holds tensors."""
        pool = _install(self.config)
        if pool is None:
            return self.fn(batch)
        try:
            data = self.fn(batch)
        except BaseException:
            pool._reset_arena()  # nothing of it is sent
            raise
        try:
            return pool.pack(data)
        except Exception:  # never lose a batch over the pool: torch's path takes it
            logger.debug("loaderkit: packing a batch into a slot failed", exc_info=True)
            pool._retire_arena()
            return data

    def __reduce__(self) -> tuple[Any, ...]:
        return (HandoffCollate, (self.fn, self.config))
