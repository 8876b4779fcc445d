"""Optional, duck-typed hooks: ``set_epoch``, ``close`` and the like, called where they exist.

torch's samplers and datasets, HDF5 datasets and framework loaders share informal protocols:
an object *may* have ``set_epoch(epoch)`` or ``close()``. ``call_hook`` is the one place that
asks, so every caller treats a missing or non-callable attribute the same way;
``epoch_targets`` names the objects of a loader that get ``set_epoch``, each once.
"""

from __future__ import annotations

from typing import Any

__all__ = ["call_hook", "epoch_targets"]


def call_hook(obj: Any, name: str, *args: Any) -> bool:
    """Call ``obj.<name>(*args)`` when ``obj`` has such a callable attribute.

    Args:
        obj: Any object (``None`` has no hooks).
        name: The hook's name, e.g. ``"set_epoch"`` or ``"close"``.
        *args: Arguments for the hook.

    Returns:
        True when the hook was called.

    Examples:
        >>> from torch.utils.data import DistributedSampler
        >>> sampler = DistributedSampler(range(4), num_replicas=1, rank=0)
        >>> call_hook(sampler, "set_epoch", 3), sampler.epoch
        (True, 3)
        >>> call_hook([1, 2], "close")
        False
    """
    hook = getattr(obj, name, None)
    if not callable(hook):
        return False
    hook(*args)
    return True


def epoch_targets(sampler: Any, batch_sampler: Any, dataset: Any) -> list[Any]:
    """A loader's objects that may take ``set_epoch``, each once (by identity), in order.

    The sampler, the batch sampler, the batch sampler's own sampler and the dataset.

    Examples:
        >>> from torch.utils.data import BatchSampler, SequentialSampler
        >>> sampler = SequentialSampler(range(4))
        >>> batches = BatchSampler(sampler, 2, drop_last=False)
        >>> epoch_targets(sampler, batches, None) == [sampler, batches]
        True
    """
    targets: list[Any] = []
    seen: set[int] = set()
    for obj in (sampler, batch_sampler, getattr(batch_sampler, "sampler", None), dataset):
        if obj is not None and id(obj) not in seen:
            seen.add(id(obj))
            targets.append(obj)
    return targets
