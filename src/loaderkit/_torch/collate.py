"""torch's collate and pin-memory internals: the tensor rule of ``default_collate``, pinning.

Checked on torch 2.4.1, 2.6.0, 2.9.1, 2.12.0, 2.13.0 and 2.14.1.

* ``install_tensor_collate``: ``default_collate`` stacks tensors with the function registered
  for ``torch.Tensor`` in ``torch.utils.data._utils.collate.default_collate_fn_map`` (the same
  map every ``collate_fn`` built on ``torch.utils.data.collate`` uses). Inside a worker of a
  loader with batch slots, loaderkit registers its own rule there, so stacked batches are
  allocated in the worker's slot (``loaderkit.worker``).
* ``pin_memory``: torch's recursive pinning of a batch (``_utils.pin_memory.pin_memory``:
  tensors, mappings, namedtuples, sequences, objects with ``pin_memory()``), falling back to a
  recursion over the public ``Tensor.pin_memory`` where torch's helper is missing.
* ``is_exception_wrapper``: what a worker sends when its dataset raised
  (``torch._utils.ExceptionWrapper``).

Examples:
    >>> tensor_rule() is not None
    True
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

__all__ = [
    "TensorCollate",
    "install_tensor_collate",
    "is_exception_wrapper",
    "pin_memory",
    "tensor_rule",
]

#: ``fn(batch, *, collate_fn_map=None) -> Tensor``: how ``default_collate`` stacks tensors.
TensorCollate = Callable[..., torch.Tensor]

try:
    from torch.utils.data._utils import collate as _collate
except ImportError:  # pragma: no cover - a torch without the module
    _collate = None  # type: ignore[assignment]

try:
    from torch._utils import ExceptionWrapper as _ExceptionWrapper
except ImportError:  # pragma: no cover - a torch without the class
    _ExceptionWrapper = None  # type: ignore[assignment, misc]

#: torch's own rule, kept before anything is installed.
_TORCH_RULE: TensorCollate | None = None
_MAP = getattr(_collate, "default_collate_fn_map", None)
if isinstance(_MAP, dict) and callable(_MAP.get(torch.Tensor)):
    _TORCH_RULE = _MAP[torch.Tensor]


def tensor_rule() -> TensorCollate | None:
    """Torch's own rule for stacking tensors (``None``: this torch has no rule map)."""
    return _TORCH_RULE


def install_tensor_collate(rule: TensorCollate) -> bool:
    """Make ``default_collate`` stack tensors with ``rule`` in this process.

    Only ever called in a worker process. Returns ``False`` (nothing installed) where torch has
    no rule map: batches are then made by torch's own code and copied where they must go.
    """
    if _TORCH_RULE is None or not isinstance(_MAP, dict):
        return False
    _MAP[torch.Tensor] = rule
    return True


def is_exception_wrapper(data: Any) -> bool:
    """Whether ``data`` is what a worker sends in place of a batch when reading it raised."""
    if _ExceptionWrapper is not None:
        return isinstance(data, _ExceptionWrapper)
    return type(data).__name__ == "ExceptionWrapper"  # pragma: no cover


def _pin_public(data: Any, device: Any) -> Any:
    if isinstance(data, torch.Tensor):
        return data.pin_memory() if device is None else data.pin_memory(device)
    if isinstance(data, (str, bytes)):
        return data
    if isinstance(data, Mapping):
        return type(data)({k: _pin_public(v, device) for k, v in data.items()})  # type: ignore[call-arg]
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(_pin_public(v, device) for v in data))
    if isinstance(data, tuple):
        return tuple(_pin_public(v, device) for v in data)
    if isinstance(data, Sequence):
        return [_pin_public(v, device) for v in data]
    if hasattr(data, "pin_memory"):
        return data.pin_memory()
    return data


def pin_memory(data: Any, device: Any = None) -> Any:
    """``data`` with every tensor copied into pinned memory, as torch's pin-memory thread does."""
    try:
        from torch.utils.data._utils.pin_memory import pin_memory as torch_pin
    except ImportError:  # pragma: no cover - a torch without the helper
        return _pin_public(data, device)
    return torch_pin(data, device)
