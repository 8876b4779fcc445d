"""The main process's side of the worker hand-off: slots mapped once, lent out per batch.

Each worker of a loader with the slot pool (``loaderkit.workers.worker``) sends its batches as
``SlotBatch`` messages. Unpickling one here (``receive``, in whichever thread reads torch's
result queue) maps the slot the first time, as one torch shared storage (so batches are
``is_shared()`` as torch's are), and marks it lent. The batch handed to the caller is made of
tensors over that storage; every tensor, view and slice of the batch holds it. ``poll`` (run by
the iterator at every ``next``) sets a lent slot ``FREE`` again only when nothing but this
module refers to its storage: no tensor (the storage's use count) and no Python reference to the
storage object itself (its reference count). So a slot is reused only once nothing can see the
batch any more. A loop that keeps its batches gets them copied out of their slots past the
slots it may hold (``Receiver``), so workers never run short. With ``pin_memory=True`` torch's
pin-memory thread asks the message to pin itself: a slot registered with CUDA
(``cudaHostRegister``, once, when mapped) is returned as it is only while a
``DevicePrefetcher`` consumes (it orders the slot's reuse after its copies); otherwise the
batch is copied into torch's pinned memory, and the slot is free as soon as the copy is done.

``HandoffStats`` (``loader.handoff_stats()``) counts what took which path.

Examples:
    >>> counts = HandoffCounts()
    >>> receiver = Receiver(counts)
    >>> wire.registered(receiver.token)
    True
    >>> receiver.close(); wire.registered(receiver.token)
    False
"""

from __future__ import annotations

import ctypes
import logging
import os
import secrets
import sys
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from loaderkit import _torch
from loaderkit.workers import wire
from loaderkit.workers.wire import ALIGN, FREE, HEADER, Leaf, itemsize, rebuild

__all__ = [
    "HandoffCounts",
    "HandoffStats",
    "PinBackend",
    "Received",
    "Receiver",
]

logger = logging.getLogger("loaderkit")

#: Guards ``_HELD``.
_LOCK = threading.Lock()


@dataclass(frozen=True)
class HandoffStats:
    """How a loader's batches crossed from its workers, counted since it was built.

    Attributes:
        path: ``"slots"`` (loaderkit's slot pool) or ``"torch"`` (torch's per-batch shared
            memory: no workers, or the pool is off; ``loader.plan["handoff"]`` says why).
        batches: Batches received from workers.
        pooled: Batches that crossed in a slot (no new shared memory).
        copied: Of those, batches whose tensors were made outside the slot and copied in (a
            ``collate_fn`` other than torch's or loaderkit's, or the first batch, which sizes
            the slots).
        fallback: Tensor batches that took torch's path because no slot was free: the loop
            held on to more batches than the pool has (none was ever overwritten).
        other: Batches with no tensor (or tensors the pool does not carry: sparse other than
            CSR, on a device, requiring grad), sent by torch as they are.
        slots: Slots per worker (0 with torch's path).
        slot_bytes: Size of the largest slot mapped so far.
        pinned: Slots registered as pinned memory (CUDA hosts with ``pin_memory=True``); only
            ``DevicePrefetcher`` reads them directly, which orders their reuse after its copies.
        kept: Of the pooled batches, those copied out of their slot in this process because
            the loop was keeping more batches than the slots it may hold (the slot went back
            to its worker at once; the copy is the loop's to keep, with no descriptor).

    Examples:
        >>> HandoffStats("slots", 10, 9, 1, 1, 0, 5, 1 << 20, False).other
        0
    """

    path: str
    batches: int
    pooled: int
    copied: int
    fallback: int
    other: int
    slots: int
    slot_bytes: int
    pinned: bool
    kept: int = 0


class HandoffCounts:
    """The running counts behind ``HandoffStats`` (one per loader, shared by its iterators).

    Examples:
        >>> HandoffCounts().snapshot("torch", 0).batches
        0
    """

    def __init__(self) -> None:
        self.batches = 0
        self.pooled = 0
        self.copied = 0
        self.fallback = 0
        self.slot_bytes = 0
        self.pinned = False
        self.kept = 0

    def snapshot(self, path: str, slots: int) -> HandoffStats:
        """The counts now, as a frozen ``HandoffStats``."""
        other = max(0, self.batches - self.pooled - self.fallback)
        return HandoffStats(
            path,
            self.batches,
            self.pooled,
            self.copied,
            self.fallback,
            other,
            slots,
            self.slot_bytes,
            self.pinned,
            self.kept,
        )


class PinBackend:
    """The CUDA calls that pin a mapped segment, in one place (tests substitute a fake).

    Examples:
        >>> isinstance(PinBackend.available(), bool)
        True
    """

    @staticmethod
    def available() -> bool:
        """Whether CUDA can pin memory in this process."""
        return torch.cuda.is_available()

    @staticmethod
    def register(address: int, size: int) -> bool:
        """``cudaHostRegister`` the memory; False when CUDA refuses (the copy path stays)."""
        cudart = torch.cuda.cudart()
        status = cudart.cudaHostRegister(address, size, 0)
        return int(status) == 0

    @staticmethod
    def unregister(address: int) -> None:
        """``cudaHostUnregister`` memory ``register`` pinned."""
        torch.cuda.cudart().cudaHostUnregister(address)


def _unregister(backend: Any, address: int) -> None:
    try:
        backend.unregister(address)
    except Exception:  # pragma: no cover - CUDA already torn down at exit
        logger.debug("loaderkit: cudaHostUnregister failed", exc_info=True)


class _Mapped:
    """One slot of one worker, mapped in this process once (a torch shared storage)."""

    def __init__(self, fd: int, size: int, generation: int, pin: Any | None = None) -> None:
        self.storage = _torch.storage_from_fd(fd, size)
        self.size = size
        self.generation = generation
        self.address = int(self.storage.data_ptr())
        self.state = ctypes.c_uint8.from_address(self.address)  # no reference to the storage
        # what sys.getrefcount says while only this object holds the storage (the exact count
        # differs between Python versions, so it is measured, not assumed)
        self.idle_refs = self._refs()
        self.pin = None
        if pin is not None:
            try:
                if pin.register(self.address, size):
                    self.pin = pin
            except Exception:
                logger.debug("loaderkit: cudaHostRegister failed", exc_info=True)

    @property
    def pinned(self) -> bool:
        return self.pin is not None

    def _refs(self) -> int:
        storage = self.storage
        return sys.getrefcount(storage)

    def idle(self) -> bool:
        """Nothing outside this module refers to the slot's memory: no tensor, no storage."""
        return _torch.storage_use_count(self.storage) == 1 and self._refs() <= self.idle_refs

    def free(self) -> None:
        self.state.value = FREE

    def release(self) -> None:
        """Unpin (the storage goes with this object; only call once idle)."""
        if self.pin is not None:
            _unregister(self.pin, self.address)
            self.pin = None


#: Slots of closed receivers still held by the caller (unpinned and dropped once idle).
_HELD: list[_Mapped] = []


def _sweep_held() -> None:
    with _LOCK:
        held = list(_HELD)
    for mapped in held:
        if mapped.idle():
            mapped.release()
            with _LOCK:
                if mapped in _HELD:
                    _HELD.remove(mapped)


class Received:
    """A batch in a lent slot, before it becomes tensors (what torch's queue yields).

    Attributes:
        storage: The slot's storage (held: the slot stays lent while this object lives).
        structure: The batch, with ``Leaf`` where each tensor goes.
        pinned: The slot's memory is pinned.
    """

    __slots__ = ("pinned", "storage", "structure")

    def __init__(self, storage: torch.UntypedStorage | None, structure: Any, pinned: bool) -> None:
        self.storage = storage
        self.structure = structure
        self.pinned = pinned

    def materialize(self) -> Any:
        """The batch: tensors over the slot (they keep it lent while any of them lives)."""
        storage, self.storage = self.storage, None
        if storage is None:
            raise RuntimeError("loaderkit: this batch was already handed out or its loader closed")
        return rebuild(self.structure, lambda leaf: _over(storage, leaf))

    def copy_out(self, stock: _Stock | None = None) -> Any:
        """The batch copied into this process's own memory (one block); the slot is idle.

        For a batch the loop may keep: it holds no part of the slot and no descriptor.

        Args:
            stock: Where the block comes from (memory faulted in ahead), else a new allocation.
        """
        storage, self.storage = self.storage, None
        if storage is None:
            raise RuntimeError("loaderkit: this batch was already handed out or its loader closed")
        leaves: list[Leaf] = []
        rebuild(self.structure, leaves.append)
        offsets, total = [], 0
        for leaf in leaves:
            offsets.append(total)
            total += -(-leaf.nbytes // ALIGN) * ALIGN
        block = stock.take(total) if stock is not None else _new_block(total)
        copies: dict[int, torch.Tensor] = {}
        for leaf, offset in zip(leaves, offsets, strict=True):
            out = block[offset : offset + leaf.nbytes].view(leaf.dtype).view(leaf.shape)
            out.copy_(_over(storage, leaf))
            copies[id(leaf)] = out
        return rebuild(self.structure, lambda leaf: copies[id(leaf)])

    def pin_memory(self, device: Any = None) -> Any:
        """What torch's pin-memory thread gets: pinned slots as they are, else a pinned copy."""
        batch = self.materialize()
        if self.pinned:
            return batch
        return _torch.pin_memory(batch, device)  # the slot is idle once the copy is made


def _new_block(nbytes: int) -> torch.Tensor:
    """``nbytes`` of this process's own memory (numpy asks for huge pages on large ones)."""
    return torch.from_numpy(np.empty(max(nbytes, 1), np.uint8))


class _Stock:
    """Blocks for kept batches, their pages faulted in ahead by a background thread.

    A kept batch needs memory of its own, and on a fresh allocation touching every page costs
    about as much as the loop's own work on the batch (a page fault per 4 KiB); copying into
    memory that is already there costs a tenth of it. The thread keeps ``depth`` blocks of the
    size last asked for ready (torch releases the GIL while it zeroes them), and starts with the
    first batch a loop keeps: a loop that lets its batches go never has one.

    Args:
        depth: Blocks kept ready.
    """

    def __init__(self, depth: int = 4) -> None:
        self.depth = depth
        self._cond = threading.Condition()
        self._ready: list[torch.Tensor] = []
        self._size = 0
        self._thread: threading.Thread | None = None
        self._closed = False

    def take(self, nbytes: int) -> torch.Tensor:
        """A block of at least ``nbytes`` (one from the stock when one is big enough)."""
        nbytes = max(nbytes, 1)
        block = None
        with self._cond:
            if self._closed:
                return _new_block(nbytes)
            if nbytes > self._size:
                self._size = nbytes
                self._ready = [b for b in self._ready if b.numel() >= nbytes]
            if self._ready:
                block = self._ready.pop()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._fill, name="loaderkit-kept-batches", daemon=True
                )
                self._thread.start()
            self._cond.notify()
        return block[:nbytes] if block is not None else _new_block(nbytes)

    def _fill(self) -> None:
        while True:
            with self._cond:
                while not self._closed and len(self._ready) >= self.depth:
                    self._cond.wait()
                if self._closed:
                    return
                size = self._size
            block = torch.empty(size, dtype=torch.uint8)
            block.zero_()  # every page faulted in now, outside the GIL
            with self._cond:
                if self._closed:
                    return
                if size >= self._size:
                    self._ready.append(block)

    def close(self) -> None:
        """Drop the blocks ready and stop the thread."""
        with self._cond:
            self._closed = True
            self._ready.clear()
            self._cond.notify()


def _over(storage: torch.UntypedStorage, leaf: Leaf) -> torch.Tensor:
    """The tensor ``leaf`` describes, over the slot's storage."""
    size = itemsize(leaf.dtype)
    out = torch.empty(0, dtype=leaf.dtype)
    return out.set_(storage, (HEADER + leaf.offset) // size, leaf.shape, _strides(leaf.shape))


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = []
    step = 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


class Receiver:
    """Maps the slots of one iterator's workers, lends them out and frees them when idle.

    A worker's slots are ``prefetch_factor`` for the batches in flight plus ``hold`` for the
    batches the loop holds. When the loop already holds ``hold`` batches of a worker in slots (it
    keeps what it receives: an evaluation set, a replay buffer), the next batch of that worker
    is copied out of its slot here (``Received.copy_out``, counted as ``kept``) and the slot goes
    back at once: the worker never runs out of slots, and a kept batch holds no descriptor.

    Slots registered with CUDA (``pin``) are lent as pinned batches only while
    ``lend_pinned`` is on: ``DevicePrefetcher`` turns it on for its iterator, because it issues
    the copies itself and keeps each source batch until its copy's event has completed, so a
    slot is never written again while a copy queued from it may still read it. Otherwise the
    pin-memory thread copies the batch into torch's caching pinned memory (whose allocator
    orders reuse after the copies queued from it) and the slot is free once that copy is made.

    Args:
        counts: Where to count (the loader's ``HandoffCounts``).
        pin: A ``PinBackend`` when slots should be pinned once mapped (CUDA hosts with
            ``pin_memory=True``), else ``None``.
        hold: Slots of a worker the loop may hold before batches are copied out (``None``:
            never copy out).
    """

    def __init__(
        self, counts: HandoffCounts, pin: Any | None = None, hold: int | None = None
    ) -> None:
        self.counts = counts
        self.pin = pin
        self.hold = hold
        self.lend_pinned = False
        self.stock = _Stock()
        self.token = secrets.randbits(62)
        self.slots: dict[tuple[int, int], _Mapped] = {}
        self.lent: dict[tuple[int, int, int], _Mapped] = {}
        wire.register(self.token, self)

    def receive(
        self,
        worker_id: int,
        generation: int,
        slot: int,
        structure: Any,
        copied: bool,
        segment: tuple[Any, int] | None,
    ) -> Any:
        """Map the slot if it is new, lend it out, and return the batch before materializing.

        Returns a ``Received`` (the batch in its lent slot), or the batch already copied out
        when the loop holds ``hold`` slots of this worker.
        """
        key = (worker_id, slot)
        if segment is not None:
            carrier, size = segment
            fd = carrier.detach()
            try:
                mapped = _Mapped(fd, size, generation, self.pin)
            finally:
                os.close(fd)
            self.slots[key] = mapped
            self.counts.slot_bytes = max(self.counts.slot_bytes, size - HEADER)
            self.counts.pinned = self.counts.pinned or mapped.pinned
        known = self.slots.get(key)
        if known is None or known.generation != generation:
            raise RuntimeError(
                f"loaderkit: worker {worker_id} sent slot {slot} of a segment this process "
                "never mapped (a message was lost); please report this"
            )
        self.counts.pooled += 1
        self.counts.copied += bool(copied)
        if self.hold is not None and self._held(worker_id) >= self.hold:
            batch = Received(known.storage, structure, False).copy_out(self.stock)
            self.counts.kept += 1
            known.free()  # nothing refers to the slot: the copy is this process's memory
            return batch
        self.lent[(worker_id, slot, generation)] = known
        return Received(known.storage, structure, known.pinned and self.lend_pinned)

    def _held(self, worker_id: int) -> int:
        """Slots of ``worker_id`` still referred to outside this module (the loop holds them)."""
        return sum(
            1
            for (w, _, _), mapped in list(self.lent.items())
            if w == worker_id and not mapped.idle()
        )

    def poll(self) -> int:
        """Free every lent slot nothing refers to any more; return how many were freed."""
        freed = 0
        for key, mapped in list(self.lent.items()):
            if mapped.idle():
                del self.lent[key]
                mapped.free()
                freed += 1
                if self.slots.get(key[:2]) is not mapped:  # replaced by a bigger slot
                    mapped.release()
        return freed

    def close(self) -> None:
        """Forget the slots: idle ones are unpinned now, held ones once the caller lets go."""
        wire.unregister(self.token)
        self.stock.close()
        mappings = {id(m): m for m in [*self.slots.values(), *self.lent.values()]}
        self.slots.clear()
        self.lent.clear()
        for mapped in mappings.values():
            if mapped.pin is None:
                continue
            if mapped.idle():
                mapped.release()
            else:
                with _LOCK:
                    _HELD.append(mapped)
        _sweep_held()
