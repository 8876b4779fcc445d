"""Names of ``HDF5SessionDataset`` answered by one of its parts, and the deprecated old names.

``forward(part, method)`` makes a method of the dataset that calls ``method`` on the part held
in attribute ``part`` (its name, signature and docstring are the part's); ``forward_property``
does the same for a property. ``deprecated(old, new)`` keeps an old public name working: each
access emits a ``LoaderkitDeprecationWarning`` naming the new name and returns what the new
name returns. It is a non-data descriptor, so a subclass that assigns or defines the old name
keeps its own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

from loaderkit.errors import LoaderkitDeprecationWarning, warn

__all__ = ["deprecated", "forward", "forward_property"]

P = ParamSpec("P")
R = TypeVar("R")


def forward(
    part: str, method: Callable[Concatenate[Any, P], R]
) -> Callable[Concatenate[Any, P], R]:
    """A method that calls ``method`` on ``getattr(self, part)``.

    Example:
        >>> class Part:
        ...     def twice(self, x: int) -> int:
        ...         return 2 * x
        >>> class Whole:
        ...     def __init__(self) -> None:
        ...         self._part = Part()
        ...     twice = forward("_part", Part.twice)
        >>> Whole().twice(4)
        8
    """

    def call(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return method(getattr(self, part), *args, **kwargs)

    return functools.update_wrapper(call, method)


def forward_property(part: str, owner: type, name: str) -> Any:
    """A read-only property that reads property ``name`` of ``getattr(self, part)``.

    Example:
        >>> class Part:
        ...     size = property(lambda self: 3, doc="Three.")
        >>> class Whole:
        ...     def __init__(self) -> None:
        ...         self._part = Part()
        ...     size = forward_property("_part", Part, "size")
        >>> Whole().size
        3
    """
    prop = vars(owner)[name]
    fget = prop.fget

    def get(self: Any) -> Any:
        return fget(getattr(self, part))

    get.__name__ = name
    return property(get, doc=prop.__doc__)


class deprecated:
    """An old public name of a dataset attribute, method or property: warns, then forwards.

    Args:
        new: The name that replaces it.

    Example:
        >>> import warnings
        >>> class Thing:
        ...     new_name = 1
        ...     old_name = deprecated("new_name")
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     Thing().old_name
        1
        >>> caught[0].category.__name__
        'LoaderkitDeprecationWarning'
    """

    def __init__(self, new: str) -> None:
        self.new = new
        self.old = new

    def __set_name__(self, owner: type, name: str) -> None:
        self.old = name
        self.__doc__ = f"Deprecated: use ``{self.new}``, which names the cache it is about."

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        warn(
            f"{type(obj).__name__}.{self.old} is deprecated: use .{self.new}, which answers "
            "the same and names the cache it is about.",
            LoaderkitDeprecationWarning,
        )
        return getattr(obj, self.new)
