"""Optional, duck-typed hooks: ``set_epoch``, ``close`` and the like, called where they exist.

torch's samplers and datasets, HDF5 datasets and framework loaders share informal protocols:
an object *may* have ``set_epoch(epoch)`` or ``close()``. ``call_hook`` is the one place that
asks, so every caller treats a missing or non-callable attribute the same way.
"""

from __future__ import annotations

from typing import Any

__all__ = ["call_hook"]


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
