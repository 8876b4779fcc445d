"""Find and close the loaderkit loaders inside whatever a framework holds.

Frameworks keep loaders in containers (a list of validation loaders, a dict of named training
loaders, Lightning's ``CombinedLoader``) and sometimes rebuild them, so the object a framework
iterated is not always the one your code built. These helpers walk such containers.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from loaderkit.loader import DataLoader

__all__ = ["close_loaders", "find_loaders"]


def find_loaders(*objects: Any) -> list[DataLoader[Any]]:
    """Every ``loaderkit.DataLoader`` in ``objects``, each once, in the order found.

    Looks inside lists, tuples, sets, mappings (values) and objects with an ``iterables``
    attribute (Lightning's ``CombinedLoader``); anything else that is not a loaderkit loader is
    skipped.

    Args:
        *objects: Loaders or containers of loaders (``None`` is allowed and skipped).

    Returns:
        The loaders, without duplicates.

    Examples:
        >>> from loaderkit import DataLoader
        >>> a, b = DataLoader([1, 2]), DataLoader([3])
        >>> find_loaders({"x": a}, [b, a], None) == [a, b]
        True
    """
    found: dict[int, DataLoader[Any]] = {}
    for obj in objects:
        for loader in _walk(obj, set()):
            found.setdefault(id(loader), loader)
    return list(found.values())


def _walk(obj: Any, seen: set[int]) -> Iterator[DataLoader[Any]]:
    if obj is None or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, DataLoader):
        yield obj
    elif isinstance(obj, Mapping):
        for value in obj.values():
            yield from _walk(value, seen)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for value in obj:
            yield from _walk(value, seen)
    elif hasattr(obj, "iterables") and not isinstance(obj, type):
        yield from _walk(obj.iterables, seen)


def close_loaders(*objects: Any) -> int:
    """Close every ``loaderkit.DataLoader`` found in ``objects`` (see ``find_loaders``).

    Closing stops the loader's worker processes and closes its dataset (HDF5 files); a closed
    loader can still be iterated again, so closing one too many costs a worker start, never
    correctness. Every loader is closed even when one raises; the first error is raised after.

    Args:
        *objects: Loaders or containers of loaders.

    Returns:
        How many loaders were closed.

    Examples:
        >>> from loaderkit import DataLoader
        >>> close_loaders([DataLoader([1, 2]), DataLoader([3])])
        2
    """
    loaders = find_loaders(*objects)
    error: BaseException | None = None
    for loader in loaders:
        try:
            loader.close()
        except Exception as exc:  # close the others before reporting it
            error = error or exc
    if error is not None:
        raise error
    return len(loaders)
