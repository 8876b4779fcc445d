"""Rank and world-size detection under ``torch.distributed``.

Only this module asks ``torch.distributed`` where the current process stands; everything else
receives a ``DistInfo``. Sampler selection for ``distributed="auto"`` lives in
``loaderkit.policy`` (a pure decision) and the samplers themselves in
``loaderkit.samplers``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch.distributed as dist

__all__ = ["DistInfo", "accelerate_initialized", "dist_info"]


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands in a ``torch.distributed`` job.

    Attributes:
        initialized: True when a default process group is initialized.
        rank: Global rank (0 when not distributed).
        world_size: Number of processes in the default group (1 when not distributed).
        local_rank: Rank on this node (``LOCAL_RANK`` set by torchrun, else 0).
        local_world_size: Processes on this node (``LOCAL_WORLD_SIZE``, else 1).
        accelerate: True when an initialized Hugging Face Accelerate state runs this process:
            ``accelerator.prepare(loader)`` then shards loaders itself.

    Examples:
        >>> DistInfo(initialized=False, rank=0, world_size=1).is_distributed
        False
    """

    initialized: bool
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    accelerate: bool = False

    @property
    def is_distributed(self) -> bool:
        """True when there is more than one process to shard data between."""
        return self.initialized and self.world_size > 1


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    try:
        return int(value)
    except ValueError:
        return default


def accelerate_initialized() -> bool:
    """Whether Hugging Face Accelerate's process state is initialized in this process.

    Reads ``accelerate.state.PartialState`` only when Accelerate is already imported (an
    ``Accelerator()`` exists); never imports it.

    Examples:
        >>> isinstance(accelerate_initialized(), bool)
        True
    """
    module = sys.modules.get("accelerate.state")
    state = getattr(module, "PartialState", None)
    return bool(getattr(state, "_shared_state", None))


def dist_info() -> DistInfo:
    """Describe the current process's place in the default ``torch.distributed`` group.

    Returns:
        A ``DistInfo``; ``rank=0, world_size=1`` when no process group is initialized
        (launcher environment variables alone do not make a process distributed).

    Examples:
        >>> info = dist_info()
        >>> info.world_size >= 1
        True
    """
    initialized = dist.is_available() and dist.is_initialized()
    accelerate = accelerate_initialized()
    if not initialized:
        return DistInfo(initialized=False, accelerate=accelerate)
    world_size = dist.get_world_size()
    return DistInfo(
        initialized=True,
        rank=dist.get_rank(),
        world_size=world_size,
        local_rank=_env_int("LOCAL_RANK", 0),
        local_world_size=_env_int("LOCAL_WORLD_SIZE", world_size),
        accelerate=accelerate,
    )
