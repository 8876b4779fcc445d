"""Picklability preflight for spawn / forkserver workers.

Under ``spawn`` and ``forkserver`` (macOS, Windows, and Linux from Python 3.14 on) every worker
receives the dataset, ``collate_fn`` and ``worker_init_fn`` by pickle. When one of them holds a
lambda, a local function, an open file, a lock or an h5py object, torch fails while starting
the workers with a message that names none of them. ``find_unpicklable`` pickles the objects
up front and, on failure, walks down to the first unpicklable leaf and names its attribute path
(``dataset.transform.fn``), why it fails and how to fix it.

Tensors are not serialized by the check: torch moves their storage to shared memory instead of
copying it into every worker, so they count neither as failures nor towards the pickled size.

``AttributeWalk`` is the walk itself, breadth-first and bounded: over what pickle sends (the
diagnosis above) or over the attributes as they are in this process, which is what a forked
worker inherits (``loaderkit.memory.containers`` looks there for Python containers workers would
copy).
"""

from __future__ import annotations

import collections
import contextlib
import copyreg
import functools
import io
import pickle
import sys
import threading
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from multiprocessing import context as _mp_context
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch

__all__ = [
    "AttributeWalk",
    "PickleCheck",
    "PickleProblem",
    "check_pickle",
    "find_unpicklable",
    "live_attributes",
    "pickled_size",
]

_MAX_DEPTH = 40
_LOCK_TYPES = tuple(
    {type(threading.Lock()), type(threading.RLock()), threading.Condition, threading.Semaphore}
)


class _CountingSink:
    """A write-only file that only counts bytes (no memory grows with the dataset)."""

    def __init__(self) -> None:
        self.size = 0

    def write(self, data: Any) -> int:
        n = memoryview(data).nbytes  # bytes, or a PickleBuffer for protocol-5 arrays
        self.size += n
        return n


def _rebuild_placeholder() -> None:  # pragma: no cover - never unpickled
    return None


def _interactive_main() -> bool:
    main = sys.modules.get("__main__")
    return main is not None and not getattr(main, "__file__", None)


class _CheckingPickler(ForkingPickler):
    """The pickler workers use (with multiprocessing's reducers), minus tensor payloads."""

    def __init__(self, file: Any) -> None:
        super().__init__(file, pickle.HIGHEST_PROTOCOL)
        self.shared_bytes = 0
        self.interactive_refs: list[str] = []

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            if obj.device.type == "cpu" and not obj.is_sparse:
                self.shared_bytes += obj.element_size() * obj.nelement()
            return (_rebuild_placeholder, ())
        if isinstance(obj, (torch.UntypedStorage, torch.storage.TypedStorage)):
            return (_rebuild_placeholder, ())
        if (
            isinstance(obj, (types.FunctionType, type))
            and getattr(obj, "__module__", None) == "__main__"
            and _interactive_main()
        ):
            self.interactive_refs.append(getattr(obj, "__qualname__", repr(obj)))
        return NotImplemented


@dataclass(frozen=True)
class _PickleResult:
    size: int
    shared_bytes: int
    interactive_refs: tuple[str, ...]


class _PreflightPopen:
    """Stands in for the ``Popen`` of a worker being started under spawn/forkserver.

    multiprocessing's own objects (``Lock``, ``Semaphore``, ``Event``, ``Value``, ``Array``,
    ``Queue``, ``Pipe`` ends) refuse to pickle except while a process is being started
    (``multiprocessing.context.assert_spawning``); torch sends the dataset to its workers
    exactly then, so they do reach the workers. The preflight pickles as if spawning.
    """

    def duplicate_for_child(self, fd: Any) -> Any:
        return fd

    class DupFd:
        def __init__(self, fd: int) -> None:
            self.fd = fd

        def detach(self) -> int:
            return self.fd


@contextlib.contextmanager
def _as_if_spawning() -> Any:
    previous = _mp_context.get_spawning_popen()
    # duck-typed: pickling only asks the spawning Popen for duplicate_for_child
    _mp_context.set_spawning_popen(_PreflightPopen())  # type: ignore[arg-type]
    try:
        yield
    finally:
        _mp_context.set_spawning_popen(previous)


def _pickle(obj: Any) -> _PickleResult:
    sink = _CountingSink()
    pickler = _CheckingPickler(sink)
    with _as_if_spawning():
        pickler.dump(obj)
    return _PickleResult(sink.size, pickler.shared_bytes, tuple(pickler.interactive_refs))


def _pickles(obj: Any) -> bool:
    try:
        result = _pickle(obj)
    except Exception:
        return False
    return not result.interactive_refs


def pickled_size(obj: Any) -> int:
    """Bytes ``obj`` pickles to for a spawned worker (tensor storage excluded: it is shared).

    Args:
        obj: Any picklable object.

    Returns:
        The pickled size in bytes.

    Raises:
        Exception: Whatever pickling raises for an unpicklable object.

    Examples:
        >>> pickled_size(list(range(10))) > 0
        True
    """
    return _pickle(obj).size


@dataclass(frozen=True)
class PickleProblem:
    """Why an object cannot be sent to a spawned worker.

    Attributes:
        path: Attribute path of the first unpicklable leaf, e.g. ``dataset.transform.fn``.
        kind: Short classification (``lambda``, ``local function``, ``open file``, ``lock``,
            ``h5py object``, ``interactive definition``, ``unpicklable object``).
        reason: Why it cannot be pickled.
        fix: What to do about it.
        error: The pickling error's text.

    Examples:
        >>> problem = find_unpicklable(lambda x: x, "collate_fn")
        >>> problem.kind
        'lambda'
    """

    path: str
    kind: str
    reason: str
    fix: str
    error: str

    def message(self, start_method: str) -> str:
        """A full error message for a loader using ``start_method``."""
        return (
            f"{self.path} cannot be pickled, but the '{start_method}' start method sends it to "
            f"every worker process: {self.reason}. Fix: {self.fix}. "
            f"(pickle said: {self.error})"
        )


def live_attributes(obj: Any) -> list[tuple[str, Any]]:
    """An object's own attributes as they are in this process (``__dict__`` and slots).

    Read without running the object's code (no ``__getstate__``, no properties): what a forked
    worker inherits, not what pickling would send. Each comes with its path suffix.

    Examples:
        >>> class Point:
        ...     def __init__(self):
        ...         self.x, self.y = 1, 2
        >>> live_attributes(Point())
        [('.x', 1), ('.y', 2)]
    """
    out: list[tuple[str, Any]] = []
    try:
        state = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        state = None
    if isinstance(state, dict):
        out += [(f".{k}", v) for k, v in state.items()]
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name in ("__dict__", "__weakref__"):
                continue
            descriptor = cls.__dict__.get(name)
            if not isinstance(descriptor, types.MemberDescriptorType):
                continue  # a mangled private name, or replaced by a property
            try:
                value = descriptor.__get__(obj, cls)
            except AttributeError:  # an empty slot
                continue
            out.append((f".{name}", value))
    return out


def _children(obj: Any, *, live: bool = False) -> list[tuple[str, Any]]:
    """The objects ``obj`` refers to, each with its path suffix.

    ``live=False``: what pickle would recurse into (through ``__reduce_ex__``, as a spawned
    worker receives it). ``live=True``: the object's attributes as they are in this process,
    as a forked worker inherits them (``live_attributes``).
    """
    builtin = type(obj).__module__ in ("builtins", "collections")
    if isinstance(obj, Mapping) and (builtin or (live and isinstance(obj, dict))):
        out: list[tuple[str, Any]] = []
        for key, value in obj.items():
            out.append((f"[{key!r}]", value))
        return out
    if isinstance(obj, (list, tuple, set, frozenset, collections.deque)) and (
        live or type(obj).__module__ == "builtins"
    ):
        return [(f"[{i}]", item) for i, item in enumerate(obj)]
    if isinstance(obj, functools.partial):
        out = [(".func", obj.func)]
        out += [(f".args[{i}]", a) for i, a in enumerate(obj.args)]
        out += [(f".keywords[{k!r}]", v) for k, v in obj.keywords.items()]
        return out
    if isinstance(obj, types.MethodType):
        return [(".__self__", obj.__self__), (".__func__", obj.__func__)]
    if isinstance(obj, (types.FunctionType, type, types.ModuleType)):
        return []
    if live:
        return live_attributes(obj)
    reducer = copyreg.dispatch_table.get(type(obj))
    try:
        with _as_if_spawning():
            reduced = (
                reducer(obj) if reducer is not None else obj.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
            )
    except Exception:
        return []
    if not isinstance(reduced, tuple):
        return []
    out = []
    args = reduced[1] if len(reduced) > 1 else ()
    newobj = getattr(copyreg, "__newobj__", None)
    if reduced[0] is newobj or getattr(reduced[0], "__name__", "") == "__newobj__":
        args = args[1:]  # (cls, *args): the class pickles by reference
    out += [(f"<arg {i}>", a) for i, a in enumerate(args or ())]
    state = reduced[2] if len(reduced) > 2 else None
    if isinstance(state, tuple) and len(state) == 2:  # (dict state, slots state)
        states = [s for s in state if isinstance(s, dict)]
    else:
        states = [state] if isinstance(state, dict) else []
        if state is not None and not isinstance(state, dict):
            out.append(("<state>", state))
    for mapping in states:
        out += [(f".{k}", v) for k, v in mapping.items()]
    if len(reduced) > 3 and reduced[3] is not None:
        out += [(f"[{i}]", v) for i, v in enumerate(reduced[3])]
    if len(reduced) > 4 and reduced[4] is not None:
        out += [(f"[{k!r}]", v) for k, v in reduced[4]]
    return out


def _classify(obj: Any, error: str) -> tuple[str, str, str]:
    """(kind, reason, fix) for an unpicklable leaf."""
    module = type(obj).__module__ or ""
    qualname = getattr(obj, "__qualname__", "")
    if isinstance(obj, types.FunctionType) and obj.__name__ == "<lambda>":
        return (
            "lambda",
            "a lambda has no importable name, and pickle stores functions by name",
            "replace it with a function defined with `def` at module level (or "
            "functools.partial of one)",
        )
    if isinstance(obj, (types.FunctionType, type)) and "<locals>" in qualname:
        what = "function" if isinstance(obj, types.FunctionType) else "class"
        return (
            f"local {what}",
            f"{qualname} is defined inside another function, so it cannot be imported by name",
            f"move the {what} to module level",
        )
    if "<locals>" in type(obj).__qualname__:
        return (
            "local class",
            f"its class {type(obj).__qualname__} is defined inside a function",
            "move the class to module level",
        )
    if (
        isinstance(obj, (types.FunctionType, type))
        and getattr(obj, "__module__", "") == "__main__"
        and _interactive_main()
    ):
        return (
            "interactive definition",
            f"{qualname} is defined in an interactive session (notebook/REPL), which spawned "
            "workers cannot import",
            "move the definition into a .py module and import it",
        )
    if module.startswith("h5py"):
        return (
            "h5py object",
            "h5py objects cannot be pickled (an open HDF5 file/dataset handle)",
            "store the file path and open it lazily in the worker (implement __getstate__ to "
            "drop the handle), or use loaderkit.HDF5SessionDataset, which does this for you",
        )
    if isinstance(obj, io.IOBase):
        return (
            "open file",
            "an open file object cannot be moved to another process",
            "store the path and open the file lazily in each worker (in __getitem__ or "
            "worker_init_fn); drop the handle in __getstate__",
        )
    if isinstance(obj, _LOCK_TYPES) or "lock" in type(obj).__name__.lower():
        return (
            "lock",
            "a threading lock only exists inside one process",
            "create it lazily in the worker, or drop it in __getstate__ and recreate it in "
            "__setstate__",
        )
    if isinstance(obj, types.GeneratorType):
        return (
            "generator",
            "a running generator cannot be pickled",
            "store what creates it (a list or a factory function) instead",
        )
    if isinstance(obj, types.ModuleType):
        return (
            "module",
            f"module {obj.__name__} is an object, not data",
            "import the module where it is used instead of storing it as an attribute",
        )
    return (
        "unpicklable object",
        f"{type(obj).__module__}.{type(obj).__qualname__} does not support pickling",
        "make it picklable (define __getstate__/__setstate__ or __reduce__), create it lazily "
        "in the worker, or use the 'fork' start method where available",
    )


@dataclass(frozen=True)
class PickleCheck:
    """Outcome of :func:`check_pickle`: the pickled size, or the problem.

    Attributes:
        size: Bytes the object pickles to (tensor storage excluded), ``None`` on failure.
        problem: ``None`` when it pickles, else the ``PickleProblem``.
    """

    size: int | None
    problem: PickleProblem | None


def check_pickle(obj: Any, root: str) -> PickleCheck:
    """Pickle ``obj`` once as a spawned worker would receive it: its size, or what fails.

    Args:
        obj: The object to check (dataset, collate_fn, ...).
        root: Its name in messages, e.g. ``"dataset"``.

    Returns:
        A ``PickleCheck``; on failure its problem names the attribute path of the first
        unpicklable leaf.

    Examples:
        >>> check_pickle([1, 2], "dataset").problem is None
        True
    """
    try:
        result = _pickle(obj)
    except RecursionError as exc:
        return PickleCheck(
            None,
            PickleProblem(
                root,
                "recursion",
                "the object graph is too deep to pickle",
                "flatten the structure or define __reduce__",
                str(exc),
            ),
        )
    except Exception as exc:
        return PickleCheck(None, _diagnose(obj, root, f"{type(exc).__name__}: {exc}"))
    if result.interactive_refs:
        error = "definitions in __main__ of an interactive session: " + ", ".join(
            result.interactive_refs
        )
        return PickleCheck(None, _diagnose(obj, root, error))
    return PickleCheck(result.size, None)


def find_unpicklable(obj: Any, root: str) -> PickleProblem | None:
    """Find the first part of ``obj`` that cannot be pickled for a spawned worker.

    Args:
        obj: The object to check (dataset, collate_fn, ...).
        root: Its name in messages, e.g. ``"dataset"``.

    Returns:
        ``None`` when ``obj`` pickles, else a ``PickleProblem`` naming the attribute path
        of the first unpicklable leaf.

    Examples:
        >>> find_unpicklable([1, 2], "dataset") is None
        True
    """
    return check_pickle(obj, root).problem


def _diagnose(obj: Any, root: str, error: str) -> PickleProblem:
    """Walk down from ``obj`` to the first unpicklable leaf and classify it."""
    path, leaf = root, obj
    seen: set[int] = set()
    for _ in range(_MAX_DEPTH):
        seen.add(id(leaf))
        for suffix, child in _children(leaf):
            if id(child) in seen:
                continue
            if not _pickles(child):
                path, leaf = path + suffix, child
                break
        else:
            break
    kind, reason, fix = _classify(leaf, error)
    return PickleProblem(path, kind, reason, fix, error)


class AttributeWalk:
    """Breadth-first walk over the objects reachable from ``obj`` through its attributes.

    Yields ``(path, object)`` pairs, ``obj`` itself first (as ``root``), each object once.
    ``live=True`` follows the attributes as they are in this process (what a forked worker
    inherits: ``__dict__``, slots, the items of builtin containers) without running any of the
    objects' code; ``live=False`` follows what pickle would send (``__reduce_ex__``), as the
    picklability diagnosis does. ``descend(obj)`` decides whether the walk enters an object;
    the walk stops after ``max_nodes`` objects or below ``max_depth`` levels, and then says so
    in ``truncated``.

    Args:
        obj: Where the walk starts.
        root: Its name in paths, e.g. ``"dataset"``.
        descend: Whether to visit an object's children (default: always).
        live: Follow live attributes (``True``) or pickle's reduction (``False``).
        max_nodes: Most objects yielded.
        max_depth: Deepest level entered (the root is level 0).

    Attributes:
        visited: Objects yielded so far.
        truncated: True when a limit stopped the walk before it had seen everything.

    Examples:
        >>> class Data:
        ...     def __init__(self):
        ...         self.meta = {"labels": [1, 2]}
        >>> [path for path, _ in AttributeWalk(Data(), "dataset")][:3]
        ['dataset', 'dataset.meta', "dataset.meta['labels']"]
    """

    def __init__(
        self,
        obj: Any,
        root: str,
        *,
        descend: Callable[[Any], bool] | None = None,
        live: bool = True,
        max_nodes: int = 10_000,
        max_depth: int = _MAX_DEPTH,
    ) -> None:
        self.obj = obj
        self.root = root
        self.descend = descend
        self.live = live
        self.max_nodes = max_nodes
        self.max_depth = max_depth
        self.visited = 0
        self.truncated = False

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        seen = {id(self.obj)}
        queue: collections.deque[tuple[str, Any, int]] = collections.deque(
            [(self.root, self.obj, 0)]
        )
        while queue:
            if self.visited >= self.max_nodes:
                self.truncated = True
                return
            path, obj, depth = queue.popleft()
            self.visited += 1
            yield path, obj
            if self.descend is not None and not self.descend(obj):
                continue
            children = _children(obj, live=self.live)
            if children and depth >= self.max_depth:
                self.truncated = True
                continue
            for suffix, child in children:
                if id(child) not in seen:
                    seen.add(id(child))
                    queue.append((path + suffix, child, depth + 1))
