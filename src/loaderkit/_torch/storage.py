"""Shared storages: mapping a descriptor, counting a storage's users, allocating shared memory.

Checked on torch 2.4.1, 2.6.0, 2.9.1, 2.12.0, 2.13.0, 2.14.1 and 2.15.0.

* ``storage_from_fd``: ``torch.UntypedStorage._new_shared_fd_cpu(fd, size)`` maps a shared
  memory descriptor as a storage torch treats as shared (``is_shared()``), the way torch maps
  the batches its workers send. The slot hand-off (``loaderkit.workers.handoff``) maps each slot
  once.
* ``storage_use_count``: ``torch._C._storage_Use_Count`` is the storage's C++ reference count
  (1 when only the Python storage object holds it): how the hand-off knows that no tensor of a
  batch is left.
* ``new_shared_tensor``: a tensor allocated straight in shared memory
  (``TypedStorage._new_shared``), as torch's ``default_collate`` allocates a batch in a worker.

``storage_probe`` tries the first two on a real descriptor; ``loaderkit._torch.probes`` runs it.

Examples:
    >>> new_shared_tensor(torch.float32, (2, 3)).is_shared()
    True
"""

from __future__ import annotations

import math
import os
from typing import Any, cast

import torch

__all__ = ["new_shared_tensor", "storage_from_fd", "storage_probe", "storage_use_count"]


def storage_from_fd(fd: int, size: int) -> torch.UntypedStorage:
    """Map ``size`` bytes of shared memory descriptor ``fd`` as a shared CPU storage.

    The storage keeps its own duplicate of the descriptor's mapping: ``fd`` may be closed after.

    Raises:
        RuntimeError: torch cannot map it (or this torch has no such call).
    """
    make = getattr(torch.UntypedStorage, "_new_shared_fd_cpu", None)
    if make is None:
        raise RuntimeError("this torch cannot map a shared descriptor (_new_shared_fd_cpu)")
    storage: torch.UntypedStorage = make(fd, size)
    return storage


def storage_use_count(storage: torch.UntypedStorage) -> int:
    """How many C++ references the storage has (1: only its Python object holds it)."""
    return int(cast(Any, torch._C)._storage_Use_Count(cast(Any, storage)._cdata))


def new_shared_tensor(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """An uninitialised contiguous tensor whose storage is created in shared memory.

    Falls back to allocating privately and moving to shared memory (a copy) where torch's
    direct allocation is missing.
    """
    numel = math.prod(shape)
    try:
        empty = cast(Any, torch.empty(0, dtype=dtype))
        storage = empty._typed_storage()._new_shared(numel, device="cpu")
        tensor: torch.Tensor = empty.new(storage).resize_(*shape)
        return tensor
    except (AttributeError, TypeError):  # pragma: no cover - a torch without the private call
        return torch.empty(shape, dtype=dtype).share_memory_()


def storage_probe() -> str | None:
    """``None`` when a shared descriptor maps as a storage whose use count tracks tensors.

    Returns:
        What failed, in words.
    """
    if not hasattr(os, "memfd_create"):
        return None  # nothing to map on this OS: the slot pool is off anyway
    fd = os.memfd_create("loaderkit-probe", getattr(os, "MFD_CLOEXEC", 0))
    try:
        os.ftruncate(fd, 4096)
        storage = storage_from_fd(fd, 4096)
    except Exception as exc:
        return f"mapping a shared descriptor failed ({type(exc).__name__}: {exc})"
    finally:
        os.close(fd)
    try:
        alone = storage_use_count(storage)
        view = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (16,), (1,))
        shared = storage_use_count(storage)
        del view
        after = storage_use_count(storage)
    except Exception as exc:
        return f"counting a storage's users failed ({type(exc).__name__}: {exc})"
    if not storage.is_shared():
        return "a mapped descriptor is not a shared storage"
    if not (alone == after == 1 and shared == 2):
        return f"a storage's use count did not follow its tensors ({alone}, {shared}, {after})"
    return None
