"""Moving batches to a device: ``to_device`` and the ``non_blocking`` decision.

``to_device`` walks a batch (mappings, lists, tuples, namedtuples, dataclasses and any object
with a ``.to()`` method) and moves every tensor to the target device, keeping the container types.
``non_blocking`` is decided per tensor: an asynchronous copy is only requested when it is both
safe and useful, i.e. a pinned CPU tensor going to a CUDA device (see
``resolve_non_blocking``). ``DevicePrefetcher`` (``loaderkit.device.prefetch``) copies one batch
ahead on a side stream with the same walk (``move``).

Examples:
    >>> import torch
    >>> to_device({"x": torch.ones(2)}, "cpu")["x"].device.type
    'cpu'
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import logging
import weakref
from collections import UserDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar, cast

import torch

from loaderkit import _torch
from loaderkit.errors import ConfigError, warn

__all__ = [
    "DeviceLike",
    "as_device",
    "check_non_blocking",
    "holds_pageable_memory",
    "move",
    "resolve_non_blocking",
    "to_device",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: What ``to_device`` and ``DevicePrefetcher`` accept as a device: a ``torch.device``,
#: a string such as ``"cuda:1"`` or an index on the current accelerator (CUDA on NVIDIA machines).
DeviceLike = torch.device | str | int

# Leaves returned as they are without further checks: the common non-tensor batch members, and
# classes (whose ``.to`` attribute, if any, is an unbound method).
_LEAF_TYPES: tuple[type, ...] = (str, bytes, bytearray, int, float, complex, type(None), type)
# Exact types of the most common leaves, checked by a set lookup before anything else (a batch
# often carries long lists of ints or strings).
_EXACT_LEAVES: frozenset[type] = frozenset({str, bytes, int, float, bool, complex, type(None)})


# --------------------------------------------------------------------------- decisions


def resolve_non_blocking(
    requested: bool | None,
    *,
    source_device_type: str,
    source_pinned: bool,
    target_device_type: str,
) -> bool:
    """Decide the ``non_blocking`` flag of one host-to-device copy.

    An explicit ``True``/``False`` is returned unchanged. ``None`` (the default of
    ``to_device``) means ``True`` exactly when a pinned CPU tensor goes to a CUDA device: only
    then is an asynchronous copy both safe and useful. Copies to the CPU stay blocking (the host
    could read the destination before the copy finished), and so do copies to MPS or any other
    device, and copies from pageable memory (which cannot run asynchronously anyway).

    Args:
        requested: The caller's ``non_blocking`` (``None`` for "decide for me").
        source_device_type: Device type of the source tensor (``"cpu"``, ``"cuda"``, ...).
        source_pinned: Whether the source is in pinned (page-locked) host memory.
        target_device_type: Device type of the destination.

    Returns:
        The flag to pass to ``Tensor.to``.

    Examples:
        >>> resolve_non_blocking(
        ...     None, source_device_type="cpu", source_pinned=True, target_device_type="cuda"
        ... )
        True
        >>> resolve_non_blocking(
        ...     None, source_device_type="cpu", source_pinned=True, target_device_type="mps"
        ... )
        False
    """
    if requested is not None:
        return bool(requested)
    return source_pinned and source_device_type == "cpu" and target_device_type == "cuda"


def as_device(device: DeviceLike) -> torch.device:
    """Normalise a ``DeviceLike`` to a ``torch.device``, with clear errors."""
    if isinstance(device, torch.device):
        return device
    if isinstance(device, bool):  # bool is an int subclass; True is not "cuda:1"
        raise TypeError("device must be a torch.device, str or int, got bool")
    if isinstance(device, int):
        if device < 0:
            raise ConfigError(f"device index must be >= 0, got {device}")
        return torch.device(_torch.accelerator_type() or "cuda", device)
    if isinstance(device, str):
        try:
            return torch.device(device)
        except RuntimeError as exc:
            raise ConfigError(f"invalid device {device!r}: {exc}") from exc
    raise TypeError(f"device must be a torch.device, str or int, got {type(device).__name__}")


def check_non_blocking(non_blocking: bool | None) -> None:
    """``TypeError`` unless ``non_blocking`` is ``None``, ``True`` or ``False``."""
    if non_blocking is not None and not isinstance(non_blocking, bool):
        raise TypeError(
            f"non_blocking must be None, True or False, got {type(non_blocking).__name__}"
        )


# --------------------------------------------------------------------------- .to() objects

# Per type: does its ``.to`` accept ``non_blocking``? True/False from the signature, None when
# the signature cannot be read (then a TypeError naming non_blocking triggers the fallback).
_TO_ACCEPTS_NON_BLOCKING: weakref.WeakKeyDictionary[type, bool | None] = weakref.WeakKeyDictionary()
# Mapping types already reported as rebuilt as a plain dict (warned once per type).
_WARNED_MAPPING_TYPES: weakref.WeakSet[type] = weakref.WeakSet()


def _to_accepts_non_blocking(cls: type) -> bool | None:
    try:
        return _TO_ACCEPTS_NON_BLOCKING[cls]
    except KeyError:
        pass
    accepts: bool | None
    try:
        params = inspect.signature(cls.to).parameters.values()  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        accepts = None
    else:
        accepts = any(
            p.kind is inspect.Parameter.VAR_KEYWORD
            or (p.name == "non_blocking" and p.kind is not inspect.Parameter.POSITIONAL_ONLY)
            for p in params
        )
    with contextlib.suppress(TypeError):  # a type that cannot be weakly referenced: no cache
        _TO_ACCEPTS_NON_BLOCKING[cls] = accepts
    return accepts


def _call_to(obj: Any, device: torch.device, non_blocking: bool | None) -> Any:
    """Call ``obj.to(device, non_blocking=...)``, or ``obj.to(device)`` when it takes no flag."""
    if non_blocking is None:
        return obj.to(device)
    accepts = _to_accepts_non_blocking(type(obj)) if hasattr(type(obj), "to") else None
    if accepts is False:
        return obj.to(device)
    if accepts is True:
        return obj.to(device, non_blocking=non_blocking)
    try:
        return obj.to(device, non_blocking=non_blocking)
    except TypeError as exc:
        if "non_blocking" not in str(exc):
            raise
    return obj.to(device)


# --------------------------------------------------------------------------- traversal


class _CycleError(Exception):
    """Internal: a container refers back to one of its ancestors."""

    def __init__(self, depth: int) -> None:
        super().__init__()
        self.depth = depth  # depth of the container that is referred back to
        self.segments: list[str] = []  # path from the root, collected innermost first


class _Mover:
    """One traversal of one batch: the target, the flags and the bookkeeping of the walk."""

    __slots__ = ("active", "device", "memo", "non_blocking", "produced", "to_cuda", "unpinned")

    def __init__(
        self, device: torch.device, non_blocking: bool | None, *, collect: bool = False
    ) -> None:
        self.device = device
        self.to_cuda = device.type == "cuda"  # read once: torch.device.type is not free
        self.non_blocking = non_blocking
        # id -> (original, result). Holding the original keeps the id from being reused during
        # the walk; sharing the result keeps aliasing (a tensor referenced twice moves once).
        self.memo: dict[int, tuple[Any, Any]] = {}
        self.active: dict[int, int] = {}  # id of a container being rebuilt -> its depth
        self.produced: list[torch.Tensor] | None = [] if collect else None
        self.unpinned = False  # a CPU tensor in pageable memory was copied to CUDA

    def move(self, obj: Any) -> Any:
        cls = type(obj)
        if cls in _EXACT_LEAVES:
            return obj
        if cls is dict:  # exact builtin containers first: no ABC checks, no .to lookup
            return self._container(obj, self._mapping)
        if cls is list:
            return self._container(obj, self._list)
        if cls is tuple:
            return self._container(obj, self._tuple)
        if isinstance(obj, torch.Tensor):
            return self._memoized(obj, self._tensor)
        if isinstance(obj, _LEAF_TYPES):
            return obj
        if callable(getattr(obj, "to", None)):
            return self._memoized(obj, self._object)
        if isinstance(obj, Mapping):
            return self._container(obj, self._mapping)
        if isinstance(obj, tuple):
            return self._container(obj, self._tuple)
        if isinstance(obj, list):
            return self._container(obj, self._list)
        if dataclasses.is_dataclass(obj):
            return self._container(obj, self._dataclass)
        return obj

    def _memoized(self, obj: Any, convert: Callable[[Any], Any]) -> Any:
        key = id(obj)
        hit = self.memo.get(key)
        if hit is not None:
            return hit[1]
        result = convert(obj)
        self.memo[key] = (obj, result)
        return result

    def _container(self, obj: Any, rebuild: Callable[[Any], Any]) -> Any:
        key = id(obj)
        depth = self.active.get(key)
        if depth is not None:
            raise _CycleError(depth)
        hit = self.memo.get(key)
        if hit is not None:
            return hit[1]
        self.active[key] = len(self.active)
        try:
            result = rebuild(obj)
        finally:
            del self.active[key]
        self.memo[key] = (obj, result)
        return result

    def _child(self, value: Any, segment: str, key: Any) -> Any:
        # ``segment.format(key)`` is this child's part of the path, only rendered on error.
        try:
            return self.move(value)
        except _CycleError as exc:
            exc.segments.append(segment.format(key))
            raise

    # -- leaves

    def _tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        non_blocking = self.non_blocking
        if self.to_cuda:
            source_type = tensor.device.type
            pinned = source_type == "cpu" and tensor.is_pinned()
            if source_type == "cpu" and not pinned:
                self.unpinned = True
            if non_blocking is None:
                non_blocking = resolve_non_blocking(
                    None,
                    source_device_type=source_type,
                    source_pinned=pinned,
                    target_device_type="cuda",
                )
        elif non_blocking is None:
            non_blocking = False  # as resolve_non_blocking: only copies to CUDA are asynchronous
        result = tensor.to(self.device, non_blocking=non_blocking)
        if self.produced is not None:
            self.produced.append(result)
        return result

    def _object(self, obj: Any) -> Any:
        non_blocking = self.non_blocking
        if non_blocking is None and self.to_cuda:
            # The tensor rule, for objects that can tell whether they are pinned (torch's own
            # PackedSequence can). Others get their own ``.to`` default.
            is_pinned = getattr(obj, "is_pinned", None)
            if callable(is_pinned) and is_pinned() is True:
                non_blocking = True
        result = _call_to(obj, self.device, non_blocking)
        if self.produced is not None:
            self.produced.extend(_iter_tensors(result))
        return result

    # -- containers

    def _mapping(self, mapping: Mapping[Any, Any]) -> Mapping[Any, Any]:
        items = [
            (k, v if type(v) in _EXACT_LEAVES else self._child(v, "[{!r}]", k))
            for k, v in mapping.items()
        ]
        cls = type(mapping)
        if cls is dict:
            return dict(items)
        if isinstance(mapping, (dict, UserDict)):
            # A shallow copy keeps the subclass, its attributes (defaultdict's default_factory,
            # any instance state) and the key order, then the values are replaced.
            try:
                clone = copy.copy(mapping)
                for k, v in items:
                    clone[k] = v
                return clone
            except (TypeError, copy.Error):
                pass
        try:
            return cls(dict(items))  # type: ignore[call-arg]
        except TypeError:
            pass
        if cls not in _WARNED_MAPPING_TYPES:
            with contextlib.suppress(TypeError):
                _WARNED_MAPPING_TYPES.add(cls)
            warn(
                f"to_device: cannot rebuild a {cls.__qualname__} with its values moved, so a "
                f"plain dict is returned instead; give {cls.__qualname__} a constructor that "
                "accepts a mapping, or a .to() method"
            )
        return dict(items)

    def _tuple(self, tup: tuple[Any, ...]) -> tuple[Any, ...]:
        fields = getattr(tup, "_fields", None)
        if isinstance(fields, tuple) and len(fields) == len(tup):
            values = [
                v if type(v) in _EXACT_LEAVES else self._child(v, ".{}", name)
                for name, v in zip(fields, tup, strict=True)
            ]
            make = getattr(type(tup), "_make", None)
            try:  # _make bypasses a custom __new__, so the fields are stored as given
                return make(values) if callable(make) else type(tup)(*values)
            except TypeError:
                return tuple(values)
        values = [
            v if type(v) in _EXACT_LEAVES else self._child(v, "[{}]", i) for i, v in enumerate(tup)
        ]
        if type(tup) is tuple:
            return tuple(values)
        try:
            return type(tup)(values)
        except TypeError:
            return tuple(values)

    def _list(self, lst: list[Any]) -> list[Any]:
        values = [
            v if type(v) in _EXACT_LEAVES else self._child(v, "[{}]", i) for i, v in enumerate(lst)
        ]
        if type(lst) is list:
            return values
        try:  # a list subclass: keep its type and instance attributes
            clone = copy.copy(lst)
            clone[:] = values
            return clone
        except TypeError:
            return values

    def _dataclass(self, obj: Any) -> Any:
        # Every field is moved, ``init=False`` ones included (they are part of the batch, e.g. a
        # mask computed in __post_init__). The instance is copied and its fields replaced, so
        # __init__/__post_init__ do not run again and frozen dataclasses work too.
        new_values = {}
        for f in dataclasses.fields(obj):
            try:
                value = getattr(obj, f.name)
            except AttributeError:  # an init=False field that was never set
                continue
            new_values[f.name] = self._child(value, ".{}", f.name)
        try:
            clone = copy.copy(obj)
        except TypeError:
            init_names = {f.name for f in dataclasses.fields(obj) if f.init}
            clone = type(obj)(**{k: v for k, v in new_values.items() if k in init_names})
        for name, value in new_values.items():
            object.__setattr__(clone, name, value)
        return clone


def _walk_leaves(obj: Any, *, stop_at_movable: bool) -> Iterator[Any]:
    """Tensors reachable through the containers ``to_device`` understands.

    With ``stop_at_movable``, objects with a ``.to()`` method are yielded too, not entered
    (``to_device`` hands them to their own ``.to``).
    """
    seen: set[int] = set()
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            yield item
            continue
        if type(item) in _EXACT_LEAVES or isinstance(item, _LEAF_TYPES) or id(item) in seen:
            continue
        seen.add(id(item))
        if stop_at_movable and callable(getattr(item, "to", None)):
            yield item
        elif isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif dataclasses.is_dataclass(item):
            stack.extend(getattr(item, f.name, None) for f in dataclasses.fields(item))


def _iter_tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Tensors reachable through the containers ``to_device`` understands."""
    return _walk_leaves(obj, stop_at_movable=False)


def holds_pageable_memory(batch: Any) -> bool:
    """Whether a copy of ``batch`` to CUDA would read pageable host memory (and so block).

    True when a CPU tensor reached through the containers ``to_device`` understands is not
    pinned, or an object with ``.to()`` says ``is_pinned() is False``; objects that cannot tell
    count as pinned (their own ``.to`` decides).
    """
    for leaf in _walk_leaves(batch, stop_at_movable=True):
        if isinstance(leaf, torch.Tensor):
            if leaf.device.type == "cpu" and not leaf.is_pinned():
                return True
            continue
        is_pinned = getattr(leaf, "is_pinned", None)
        if callable(is_pinned) and is_pinned() is False:
            return True
    return False


def _run(mover: _Mover, batch: Any) -> Any:
    try:
        return mover.move(batch)
    except _CycleError as exc:
        segments = exc.segments[::-1]
        raise ConfigError(
            f"to_device: batch{''.join(segments)} refers back to "
            f"batch{''.join(segments[: exc.depth])} (a reference cycle); a batch must be a tree "
            "of containers, cycles cannot be rebuilt on the device"
        ) from None


def to_device(batch: T, device: DeviceLike, *, non_blocking: bool | None = None) -> T:
    """Move every tensor of ``batch`` to ``device``, keeping the structure and container types.

    Handled recursively: mappings (``dict``, ``OrderedDict``, ``defaultdict`` with its
    ``default_factory``, other ``Mapping`` types rebuilt as ``type(m)(items)``, and a plain
    ``dict`` with a ``LoaderkitWarning`` when that is impossible; keys are
    not moved), lists, tuples, namedtuples, and dataclasses (frozen ones too; the instance is
    copied and every field replaced, ``init=False`` fields included, without running
    ``__init__``/``__post_init__`` again). Tensors and any other object with a ``.to()`` method
    are moved by their own ``.to(device, non_blocking=...)`` (``.to(device)`` when it takes no
    ``non_blocking``). Strings, bytes, numbers, ``None`` and other objects are returned as they
    are. An object referenced twice is moved once and stays shared in the result. A batch that
    contains itself raises ``ConfigError``.

    ``non_blocking=None`` decides per tensor with ``resolve_non_blocking``: ``True`` exactly
    for a pinned CPU tensor going to a CUDA device. An explicit ``True``/``False`` is passed to
    every ``.to()`` unchanged, including cases where it is unsafe (``non_blocking=True`` to the
    CPU: synchronize before reading the result).

    Args:
        batch: The batch, any nesting of the types above.
        device: Target device (``torch.device``, ``"cuda:0"``, or an index on the current
            accelerator).
        non_blocking: ``None`` to decide per tensor, or a flag passed to every ``.to()``.

    Returns:
        A batch of the same structure with its tensors on ``device``. Tensors already there are
        the same objects (``Tensor.to`` returns ``self``).

    Raises:
        ConfigError: ``device`` is not a valid device, or the batch contains a reference cycle.
        TypeError: ``device`` or ``non_blocking`` has the wrong type.

    Examples:
        >>> import torch
        >>> batch = {"x": torch.zeros(2, 3), "ids": [1, 2], "meta": ("a", torch.ones(1))}
        >>> moved = to_device(batch, "cpu")
        >>> moved["x"].device, moved["ids"], moved["meta"][0]
        (device(type='cpu'), [1, 2], 'a')
    """
    check_non_blocking(non_blocking)
    return cast(T, _run(_Mover(as_device(device), non_blocking), batch))


def move(
    batch: Any,
    device: torch.device,
    non_blocking: bool | None,
    *,
    produced: list[torch.Tensor] | None = None,
) -> Any:
    """``to_device`` for a normalised device (``as_device``); new tensors go to ``produced``.

    Used by ``loaderkit.device.prefetch`` to know which tensors a copy made (it marks them with the
    consumer's stream).
    """
    mover = _Mover(device, non_blocking, collect=produced is not None)
    moved = _run(mover, batch)
    if produced is not None and mover.produced is not None:
        produced.extend(mover.produced)
    return moved
