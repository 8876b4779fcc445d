"""Large Python containers reachable from a dataset, found and sized by sampling.

Forked workers share the parent's memory until they write to it, and reading a Python object
writes its reference count: a worker that reads the items of a large list, dict or object
column copies the pages holding them and ends up with its own copy of the objects
(copy-on-read, PyTorch issue 13246). ``survey_containers`` walks the dataset's live attributes
(the preflight's ``AttributeWalk``) and estimates, for each container of Python objects it
reaches, the bytes of the objects it holds from a sample of its items. The cost depends on the
number of attributes walked and on the sample sizes, never on a container's length.

What counts: builtin lists, tuples, dicts, sets and deques (and their subclasses), numpy
arrays of dtype ``object``, and pandas objects with object (or Python-backed string) columns.
What does not: numeric numpy arrays, tensors, ``bytes``/``str`` (one object each), and
``loaderkit.SharedSequence`` (one buffer). Detection only: what to do about a finding is
decided by ``loaderkit.policy.memory.advise_copy_on_read``.
"""

from __future__ import annotations

import sys
import types
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any

import numpy as np
import torch

from loaderkit.memory.preflight import AttributeWalk, live_attributes
from loaderkit.memory.sequence import SharedSequence

__all__ = ["ContainerFinding", "ContainerSurvey", "survey_containers"]

_MIB = 2**20
#: A reference-count write copies the page holding the object's header: an object counts for
#: its size, at most one page.
PAGE_BYTES = 4096
#: Containers up to this length are walked into like attributes (a dict of named lists);
#: longer ones are sized by sampling.
NAMESPACE_ITEMS = 64
#: Items sampled at each level of nesting (a list of records holding lists of tuples...).
SAMPLES = (256, 16, 4, 2)
#: Containers whose objects are estimated below this are not reported.
REPORT_BYTES = 1 * _MIB

_CONTAINERS = (list, tuple, dict, set, frozenset, deque)
_SCALARS = (str, bytes, bytearray, memoryview, int, float, complex, bool, type(None), range)
#: Top-level modules whose objects are leaves: data in buffers (numpy, h5py, pyarrow) or
#: machinery (threads, files, logging) with nothing a dataset reads item by item.
_LEAF_MODULES = frozenset(
    {
        "numpy",
        "h5py",
        "pandas",
        "pyarrow",
        "polars",
        "threading",
        "multiprocessing",
        "io",
        "_io",
        "logging",
        "psutil",
        "weakref",
        "socket",
        "ssl",
        "sqlite3",
    }
)
_PLURALS = {
    "str": "strings",
    "bytes": "bytes objects",
    "NoneType": "None values",
    "int": "ints",
    "float": "floats",
    "bool": "bools",
    "tuple": "tuples",
    "list": "lists",
    "dict": "dicts",
    "set": "sets",
}


@dataclass(frozen=True)
class ContainerFinding:
    """One container of Python objects reachable from the dataset.

    Attributes:
        path: Attribute path, e.g. ``dataset.items`` or ``dataset.meta['paths']``.
        kind: ``list``, ``tuple``, ``dict``, ``set``, ``deque`` (or a subclass's name),
            ``numpy object array``, ``pandas DataFrame``, ``pandas Series`` or ``pandas Index``.
        length: Items (entries of a dict, rows of a pandas object).
        contents: What the items are, e.g. ``tuples``, ``entries (str -> int)``.
        nbytes: Estimated bytes of the Python objects it holds (itself included): what a worker
            that reads every item ends up copying.

    Examples:
        >>> ContainerFinding("dataset.items", "list", 2_000_000, "tuples", 350 * 2**20).describe()
        'dataset.items: list of 2,000,000 tuples, ~350 MiB'
    """

    path: str
    kind: str
    length: int
    contents: str
    nbytes: int

    def describe(self) -> str:
        """One line: path, kind, length, contents, estimated size."""
        return f"{self.path}: {self.kind} of {self.length:,} {self.contents}, ~{mib(self.nbytes)}"


@dataclass(frozen=True)
class ContainerSurvey:
    """What ``survey_containers`` found.

    Attributes:
        findings: Containers of at least ``REPORT_BYTES`` of objects, largest first.
        visited: Objects the walk visited.
        truncated: True when the walk stopped at its limit before seeing everything.
        largest: The largest container found, reported or not (``None`` when none).

    Examples:
        >>> survey_containers([1, 2, 3]).findings
        ()
    """

    findings: tuple[ContainerFinding, ...]
    visited: int
    truncated: bool = False
    largest: ContainerFinding | None = None

    @property
    def nbytes(self) -> int:
        """Estimated bytes of the objects of every reported container together."""
        return sum(f.nbytes for f in self.findings)


def mib(nbytes: float) -> str:
    """A size in MiB for messages: one decimal below 10 MiB.

    Examples:
        >>> mib(350 * 2**20), mib(1.5 * 2**20)
        ('350 MiB', '1.5 MiB')
    """
    size = nbytes / _MIB
    return f"{size:,.1f} MiB" if size < 10 else f"{size:,.0f} MiB"


def _is_leaf(obj: Any) -> bool:
    """Objects the walk does not enter and whose items are not Python objects to size."""
    if isinstance(obj, (*_SCALARS, SharedSequence, np.generic)):
        return True
    if isinstance(obj, (torch.Tensor, torch.UntypedStorage, torch.Generator)):
        return True
    if isinstance(obj, np.ndarray) and obj.dtype != object:
        return True
    if isinstance(obj, (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType)):
        return True
    module = type(obj).__module__ or ""
    return module.partition(".")[0] in _LEAF_MODULES


def _pandas_kind(obj: Any) -> str | None:
    """``DataFrame``, ``Series`` or ``Index`` for those pandas objects, else ``None``."""
    cls = type(obj)
    if (cls.__module__ or "").partition(".")[0] != "pandas":
        return None
    for base in cls.__mro__:
        if base.__name__ in ("DataFrame", "Series", "Index"):
            return base.__name__
    return None


def _holds_objects(dtype: Any) -> bool:
    """A numpy or pandas dtype whose values are Python objects."""
    return getattr(dtype, "kind", None) == "O" or getattr(dtype, "storage", None) == "python"


def _object_bytes(obj: Any) -> int:
    """Bytes of ``obj`` a reference-count write can copy: the object, at most one page."""
    if isinstance(obj, np.ndarray):  # the header; the data lives in its own allocation
        size = sys.getsizeof(obj) - (obj.nbytes if obj.flags.owndata else 0)
    elif isinstance(obj, torch.Tensor):
        size = object.__sizeof__(obj)
    else:
        try:
            size = sys.getsizeof(obj)
        except Exception:  # an exotic __sizeof__
            size = 64
    return min(max(size, 0), PAGE_BYTES)


def _spread(length: int, k: int) -> range | list[int]:
    """``k`` positions spread evenly over ``range(length)`` (all of them when fewer)."""
    if length <= k:
        return range(length)
    return [(i * length) // k for i in range(k)]


def _sample(obj: Any, k: int) -> tuple[list[Any], int]:
    """Up to ``k`` of ``obj``'s children, and how many children it has in all."""
    if isinstance(obj, (list, tuple)):
        return [obj[i] for i in _spread(len(obj), k)], len(obj)
    if isinstance(obj, dict):
        pairs = list(islice(obj.items(), k))
        return [x for pair in pairs for x in pair], 2 * len(obj)
    if isinstance(obj, (set, frozenset, deque)):
        return list(islice(obj, k)), len(obj)
    if isinstance(obj, np.ndarray) and obj.dtype == object:
        flat = obj.reshape(-1)
        return [flat[i] for i in _spread(flat.size, k)], flat.size
    if _is_leaf(obj):
        return [], 0
    values = [value for _, value in live_attributes(obj)]
    return values[:k], len(values)


class _Estimator:
    """Bytes of the objects reachable from one container, estimated from samples.

    Each level samples ``SAMPLES[level]`` children and scales their mean to the number of
    children. Objects already counted (shared strings, the same record twice, an object another
    container holds too) count once, so a container of repeated objects is not taken for one
    of distinct ones.
    """

    def __init__(self) -> None:
        self.seen: set[int] = set()

    def bytes_of(self, obj: Any, level: int = 0) -> float:
        if id(obj) in self.seen:
            return 0.0
        self.seen.add(id(obj))
        size = float(_object_bytes(obj))
        if level >= len(SAMPLES):
            return size
        children, count = _sample(obj, SAMPLES[level])
        if not children:
            return size
        sampled = sum(self.bytes_of(child, level + 1) for child in children)
        return size + sampled * count / len(children)

    def bytes_of_values(self, values: list[Any], count: int) -> float:
        """Bytes of ``count`` values estimated from the sampled ``values``."""
        if not values:
            return 0.0
        return sum(self.bytes_of(v, 1) for v in values) * count / len(values)


def _type_name(obj: Any) -> str:
    return type(obj).__name__


def _contents(items: list[Any]) -> str:
    """``tuples``, ``strings``, ``Record objects``, ``mixed objects (mostly tuples)``."""
    if not items:
        return "items"
    name, count = Counter(map(_type_name, items)).most_common(1)[0]
    plural = _PLURALS.get(name, f"{name} objects")
    return plural if count >= 0.9 * len(items) else f"mixed objects (mostly {plural})"


def _entries(keys: list[Any], values: list[Any]) -> str:
    """``entries (str -> tuple)``."""

    def common(objs: list[Any]) -> str:
        if not objs:
            return "?"
        return Counter(map(_type_name, objs)).most_common(1)[0][0]

    return f"entries ({common(keys)} -> {common(values)})"


def _measure_builtin(path: str, obj: Any, estimator: _Estimator) -> ContainerFinding:
    nbytes = estimator.bytes_of(obj)
    kind = type(obj).__name__
    if isinstance(obj, dict):
        pairs = list(islice(obj.items(), 64))
        contents = _entries([k for k, _ in pairs], [v for _, v in pairs])
    elif isinstance(obj, np.ndarray):
        kind = "numpy object array"
        contents = _contents(_sample(obj, 64)[0])
    else:
        contents = _contents(_sample(obj, 64)[0])
    return ContainerFinding(path, kind, len(obj), contents, int(nbytes))


def _named(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _measure_pandas(
    path: str, obj: Any, kind: str, estimator: _Estimator
) -> ContainerFinding | None:
    """The Python objects in a pandas object's object columns (and object index)."""
    rows = len(obj)
    positions = list(_spread(rows, SAMPLES[0]))
    nbytes = 0.0
    names: list[str] = []
    if kind == "DataFrame":
        sample = obj.iloc[positions]
        for j, (name, dtype) in enumerate(obj.dtypes.items()):
            if _holds_objects(dtype):
                names.append(str(name))
                nbytes += estimator.bytes_of_values(sample.iloc[:, j].tolist(), rows)
        index = obj.index
    elif kind == "Series":
        if _holds_objects(obj.dtype):
            nbytes += estimator.bytes_of_values(obj.iloc[positions].tolist(), rows)
            names.append(str(obj.name))
        index = obj.index
    else:
        index = obj
    if _holds_objects(getattr(index, "dtype", None)):
        nbytes += estimator.bytes_of_values(index[positions].tolist(), rows)
        names.append("index")
    if not names:
        return None
    if kind == "Index":
        contents = "labels"
    else:
        columns = "object column" if len(names) == 1 else "object columns"
        contents = f"rows with {columns} {_named(names)}"
    return ContainerFinding(path, f"pandas {kind}", rows, contents, int(nbytes))


def _is_large_container(obj: Any) -> bool:
    if isinstance(obj, _CONTAINERS):
        return len(obj) > NAMESPACE_ITEMS
    return isinstance(obj, np.ndarray) and obj.dtype == object and obj.size > NAMESPACE_ITEMS


def _walk_into(obj: Any) -> bool:
    """Whether the survey walks into ``obj``'s attributes or items."""
    if isinstance(obj, _CONTAINERS):
        return len(obj) <= NAMESPACE_ITEMS
    return not _is_leaf(obj)


def _measured(walk: AttributeWalk) -> Iterator[ContainerFinding]:
    estimator = _Estimator()  # shared: objects two containers hold count once
    for path, obj in walk:
        pandas = _pandas_kind(obj)
        if pandas is not None:
            finding = _measure_pandas(path, obj, pandas, estimator)
            if finding is not None:
                yield finding
        elif _is_large_container(obj):
            yield _measure_builtin(path, obj, estimator)


def survey_containers(
    obj: Any,
    root: str = "dataset",
    *,
    min_bytes: int = REPORT_BYTES,
    max_nodes: int = 2_000,
    max_depth: int = 12,
) -> ContainerSurvey:
    """Find the containers of Python objects reachable from ``obj`` and estimate their size.

    Walks ``obj``'s attributes as they are in this process (what a forked worker inherits;
    no object's code runs), entering objects and small containers (up to
    ``NAMESPACE_ITEMS`` items); a longer container is a finding, sized from a sample of its
    items (``SAMPLES``), nested containers sampled in turn.

    Args:
        obj: The dataset (or any object).
        root: Its name in paths.
        min_bytes: Report containers estimated at least this large.
        max_nodes: Most objects the walk visits.
        max_depth: Deepest attribute level the walk enters.

    Returns:
        A ``ContainerSurvey``.

    Examples:
        >>> class Trials:
        ...     def __init__(self):
        ...         self.items = [(f"trial_{i}.npy", i, 0.5) for i in range(100_000)]
        >>> survey = survey_containers(Trials())
        >>> survey.findings[0].path, survey.findings[0].length, survey.findings[0].contents
        ('dataset.items', 100000, 'tuples')
        >>> survey_containers(Trials(), min_bytes=2**30).findings
        ()
    """
    walk = AttributeWalk(obj, root, descend=_walk_into, max_nodes=max_nodes, max_depth=max_depth)
    found = sorted(_measured(walk), key=lambda f: f.nbytes, reverse=True)
    return ContainerSurvey(
        findings=tuple(f for f in found if f.nbytes >= min_bytes),
        visited=walk.visited,
        truncated=walk.truncated,
        largest=found[0] if found else None,
    )
