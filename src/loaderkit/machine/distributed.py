"""Rank and world-size detection under ``torch.distributed``.

Only this module asks ``torch.distributed`` (and the launcher's ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``) where the current process stands; everything else
receives a ``DistInfo`` or the numbers it holds. Sampler selection for
``distributed="auto"`` lives in ``loaderkit.policy`` (a pure decision) and the samplers
themselves in ``loaderkit.order.samplers``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch.distributed as dist

__all__ = [
    "DistInfo",
    "accelerate_initialized",
    "dist_info",
    "launcher_int",
    "local_world_size",
    "process_rank_and_world",
]


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


def launcher_int(name: str) -> int | None:
    """An integer the launcher (torchrun, Lightning, Accelerate) put in the environment.

    The only place loaderkit reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and
    ``LOCAL_WORLD_SIZE``: ``None`` when the variable is unset or not an integer.

    Examples:
        >>> launcher_int("LOADERKIT_SURELY_UNSET") is None
        True
    """
    value = os.environ.get(name, "").strip()
    try:
        return int(value) if value else None
    except ValueError:
        return None


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


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


def process_rank_and_world() -> tuple[int, int]:
    """``(rank, world size)`` of this process, worker processes included.

    From the default process group when one is initialized; otherwise from the launcher's
    ``RANK``/``WORLD_SIZE`` (a spawned DataLoader worker has no process group, but inherits
    the environment); ``(0, 1)`` outside any launcher.

    Examples:
        >>> rank, world = process_rank_and_world()
        >>> 0 <= rank < world
        True
    """
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank()), int(dist.get_world_size())
    world = max(1, _or(launcher_int("WORLD_SIZE"), 1))
    rank = _or(launcher_int("RANK"), 0)
    return (rank, world) if 0 <= rank < world else (0, world)


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
        local_rank=_or(launcher_int("LOCAL_RANK"), 0),
        local_world_size=_or(launcher_int("LOCAL_WORLD_SIZE"), world_size),
        accelerate=accelerate,
    )


def local_world_size() -> int:
    """Processes of this job on this node (ranks that share its disk and its session cache).

    From the default process group when one is initialized (``dist_info``); otherwise from the
    launcher's ``LOCAL_WORLD_SIZE`` (torchrun sets it before the group exists, when datasets
    are often built); 1 outside any launcher.

    Examples:
        >>> local_world_size() >= 1
        True
    """
    info = dist_info()
    if info.initialized:
        return max(1, info.local_world_size)
    return max(1, _or(launcher_int("LOCAL_WORLD_SIZE"), 1))
