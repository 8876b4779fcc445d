"""Exception and warning types raised by loaderkit.

Every error loaderkit raises on purpose derives from :class:`LoaderkitError`, so callers can
catch all of them with one ``except``. Configuration mistakes are :class:`ConfigError`, which is
also a :class:`ValueError`: code written for ``torch.utils.data.DataLoader`` that catches
``ValueError`` keeps working. Warnings use :class:`LoaderkitWarning` so they can be filtered as a
group (``warnings.simplefilter("ignore", LoaderkitWarning)``) without hiding anyone else's.
"""

from __future__ import annotations

__all__ = ["ConfigError", "LoaderkitError", "LoaderkitWarning"]


class LoaderkitError(Exception):
    """Base class of every error raised by loaderkit.

    Example:
        >>> try:
        ...     raise ConfigError("num_workers must be >= 0")
        ... except LoaderkitError as exc:
        ...     print(type(exc).__name__)
        ConfigError
    """


class ConfigError(LoaderkitError, ValueError):
    """An argument or combination of arguments that cannot work.

    The message names the argument (or attribute path), what was expected and how to fix it.
    Being a :class:`ValueError` too, it is caught by code written against torch's DataLoader.

    Example:
        >>> isinstance(ConfigError("bad"), ValueError)
        True
    """


class LoaderkitWarning(UserWarning):
    """A warning issued by loaderkit: something works, but not the way you probably want.

    Example:
        >>> import warnings
        >>> warnings.simplefilter("ignore", LoaderkitWarning)
    """
