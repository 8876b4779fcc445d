"""torch's collate and pin-memory internals: the tensor rule of ``default_collate``, pinning.

Checked on torch 2.4.1, 2.6.0, 2.9.1, 2.12.0, 2.13.0, 2.14.1 and 2.15.0.

* ``install_tensor_collate``: ``default_collate`` stacks tensors with the function registered
  for ``torch.Tensor`` in ``torch.utils.data._utils.collate.default_collate_fn_map`` (the same
  map every ``collate_fn`` built on ``torch.utils.data.collate`` uses). Inside a worker of a
  loader with batch slots, loaderkit registers its own rule there, so stacked batches are
  allocated in the worker's slot (``loaderkit.workers.worker``).
* ``pin_memory``: torch's recursive pinning of a batch (``_utils.pin_memory.pin_memory``:
  tensors, mappings, namedtuples, sequences, objects with ``pin_memory()``), falling back to a
  recursion over the public ``Tensor.pin_memory`` where torch's helper is missing.
* ``is_exception_wrapper``: what a worker sends when its dataset raised
  (``torch._utils.ExceptionWrapper``).
* ``default_collate``: torch's ``default_collate``, with one repair: torch's rule for numpy
  scalars calls ``torch.as_tensor`` on the list of them, which older torch (2.6 here) refuses
  for numpy bools under numpy 2.4 and later (``'numpy.bool' object cannot be interpreted as an
  integer``; under numpy 2.2-2.3 it warns that it soon will). Where a probe at import sees
  that, numpy bools are stacked through one array, which gives the bool tensor newer torch
  gives. With a ``sparse`` rule (loaderkit's ``collate``), strings with missing values
  (``None``: an ``.h5ad`` string column's missing cells) are a list whichever comes first, as
  torch lists strings (torch refuses a batch whose first element is ``None``).

Examples:
    >>> tensor_rule() is not None
    True
    >>> import numpy as np
    >>> default_collate([np.True_, np.False_])
    tensor([ True, False])
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate as _torch_default_collate

__all__ = [
    "NUMPY_BOOLS_COLLATE",
    "TensorCollate",
    "default_collate",
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


def _numpy_bools_collate() -> bool:
    """Whether torch's rule for numpy scalars takes numpy bools (a list of them to a tensor).

    Under numpy 2.2-2.3 older torch only warns (``DeprecationWarning``: soon an error); that
    counts as refusing them, and importing loaderkit stays silent (also under ``-W error``).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        try:
            torch.as_tensor([np.True_, np.False_])
        except (TypeError, DeprecationWarning):
            return False
    return True


#: ``False`` where this torch, with this numpy, refuses a list of numpy bools.
NUMPY_BOOLS_COLLATE = _numpy_bools_collate()


def _collate_numpy_bools(batch: Sequence[Any], *, collate_fn_map: Any = None) -> torch.Tensor:
    """Numpy bool scalars as one bool tensor, through one array (what newer torch gives)."""
    return torch.from_numpy(np.asarray(batch, dtype=np.bool_))


def _strings_or_none(batch: Sequence[Any], *, collate_fn_map: Any = None) -> list[Any]:
    """A batch of ``str`` and ``None`` (missing) as a list, as torch's rule for ``str``."""
    if all(value is None or isinstance(value, str) for value in batch):
        return list(batch)
    raise TypeError(
        "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; "
        f"found {type(None)} beside {type(next(v for v in batch if v is not None))}"
    )


def default_collate(batch: Any, sparse: TensorCollate | None = None) -> Any:
    """``default_collate`` as torch has it, numpy bool scalars included on every torch.

    Args:
        batch: A list of samples.
        sparse: How to stack sparse tensors wherever the structure holds them (torch's rule
            refuses them), and strings with missing values (``None``) listed as strings are;
            ``None``: as torch does.

    Returns:
        What ``torch.utils.data.default_collate`` returns; where this torch refuses numpy
        bools (``NUMPY_BOOLS_COLLATE``), they become a bool tensor as newer torch makes them.
    """
    if _collate is None or not isinstance(_MAP, dict):
        return _torch_default_collate(batch)
    if sparse is None and NUMPY_BOOLS_COLLATE:
        return _torch_default_collate(batch)
    # read at each call: inside a worker the map's tensor rule may be loaderkit's
    rules: dict[Any, Any] = dict(_MAP)
    if not NUMPY_BOOLS_COLLATE:
        rules[np.bool_] = _collate_numpy_bools
    if sparse is not None:
        dense = rules[torch.Tensor]

        def tensors(batch: Sequence[torch.Tensor], *, collate_fn_map: Any = None) -> Any:
            if batch[0].layout is not torch.strided:
                return sparse(batch)
            return dense(batch, collate_fn_map=collate_fn_map)

        rules[torch.Tensor] = tensors
        rules[type(None)] = _strings_or_none
    return _collate.collate(batch, collate_fn_map=rules)


def tensor_rule() -> TensorCollate | None:
    """Torch's own rule for stacking tensors (``None``: this torch has no rule map)."""
    return _TORCH_RULE


def install_tensor_collate(rule: TensorCollate) -> bool:
    """Make ``default_collate`` stack tensors with ``rule`` in this process.

    Called in a worker process (its slots), or where worker threads start (a rule that is
    torch's own outside them). Returns ``False`` (nothing installed) where torch has
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
