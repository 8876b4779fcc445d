"""Exception and warning types raised by loaderkit.

Every error loaderkit raises on purpose derives from ``LoaderkitError``, so callers can
catch all of them with one ``except``. Configuration mistakes are ``ConfigError``, which is
also a ``ValueError``: code written for ``torch.utils.data.DataLoader`` that catches
``ValueError`` keeps working. Warnings use ``LoaderkitWarning`` so they can be filtered as a
group (``warnings.simplefilter("ignore", LoaderkitWarning)``) without hiding anyone else's.
"""

from __future__ import annotations

import sys
import warnings

__all__ = ["ConfigError", "LoaderkitError", "LoaderkitWarning", "warn"]


class LoaderkitError(Exception):
    """Base class of every error raised by loaderkit.

    Examples:
        >>> try:
        ...     raise ConfigError("num_workers must be >= 0")
        ... except LoaderkitError as exc:
        ...     print(type(exc).__name__)
        ConfigError
    """


class ConfigError(LoaderkitError, ValueError):
    """An argument or combination of arguments that cannot work.

    The message names the argument (or attribute path), what was expected and how to fix it.
    Being a ``ValueError`` too, it is caught by code written against torch's DataLoader.

    Examples:
        >>> isinstance(ConfigError("bad"), ValueError)
        True
    """


class LoaderkitWarning(UserWarning):
    """A warning issued by loaderkit: something works, but not the way you probably want.

    Examples:
        >>> import warnings
        >>> warnings.simplefilter("ignore", LoaderkitWarning)
    """


def warn(message: str) -> None:
    """Emit a ``LoaderkitWarning`` attributed to the first caller outside loaderkit.

    Examples:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn("careful")
        >>> caught[0].category is LoaderkitWarning
        True
    """
    level = 1
    frame = sys._getframe(0)
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] == "loaderkit":
        frame = frame.f_back
        level += 1
    warnings.warn(message, LoaderkitWarning, stacklevel=level)
