"""Which torch this is, and the releases loaderkit is tested on.

Checked on torch 2.4.1, 2.6.0, 2.9.1, 2.12.0, 2.13.0, 2.14.1 and 2.15.0 (public API only).

Examples:
    >>> TESTED_FROM <= (2, 13) <= TESTED_TO
    True
"""

from __future__ import annotations

import re

import torch

__all__ = [
    "CHECKED_ON",
    "TESTED_FROM",
    "TESTED_TO",
    "TORCH_VERSION",
    "newer_than_tested",
    "parse_version",
    "version_text",
]

#: The oldest and newest torch releases (major, minor) loaderkit is tested on.
TESTED_FROM = (2, 4)
TESTED_TO = (2, 15)
#: The releases the pieces of ``loaderkit._torch`` were checked on.
CHECKED_ON = ("2.4.1", "2.6.0", "2.9.1", "2.12.0", "2.13.0", "2.14.1", "2.15.0")


def parse_version(text: str) -> tuple[int, int, int]:
    """``(major, minor, patch)`` of a torch version string (local and pre-release parts dropped).

    Examples:
        >>> parse_version("2.4.1+cu121"), parse_version("2.15.0a0+git1234")
        ((2, 4, 1), (2, 15, 0))
    """
    numbers = [int(n) for n in re.findall(r"\d+", text.split("+")[0])[:3]]
    numbers += [0] * (3 - len(numbers))
    return numbers[0], numbers[1], numbers[2]


#: This process's torch, as ``(major, minor, patch)``.
TORCH_VERSION = parse_version(torch.__version__)


def version_text() -> str:
    """``torch.__version__`` (e.g. ``"2.13.0+cpu"``)."""
    return str(torch.__version__)


def newer_than_tested(version: tuple[int, ...] = TORCH_VERSION) -> bool:
    """Whether ``version`` is a torch release newer than the newest one loaderkit is tested on.

    Examples:
        >>> newer_than_tested((2, 15, 0)), newer_than_tested((2, 16, 0))
        (False, True)
    """
    return tuple(version[:2]) > TESTED_TO
