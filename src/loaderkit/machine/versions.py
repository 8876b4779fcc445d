"""Policies for the torch a loader runs on: which arguments it is given, what falls back.

Pure functions of a ``PlatformInfo`` (its ``torch_version``, ``torch_loader_args`` and
``torch_fallbacks``, read by ``loaderkit.machine.platform`` from ``loaderkit._torch``):

* ``fit_torch_arguments``: an argument left unset never reaches a torch that does not know it;
  a value an older torch cannot honour is a ``ConfigError`` naming the argument, the value and
  the torch release that added it (``in_order=False`` before torch 2.6).
* ``torch_decision``: the plan row ``torch``: the version, whether it is tested, and what falls
  back to torch's public path where a probe of torch's internals failed.

Examples:
    >>> from dataclasses import replace
    >>> from loaderkit.machine.platform import detect_platform
    >>> old = replace(detect_platform(), torch_version="2.4.1",
    ...               torch_loader_args=frozenset({"batch_size", "shuffle"}))
    >>> fit_torch_arguments({"batch_size": 4, "in_order": True}, old)
    {'batch_size': 4}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loaderkit._torch import ARGUMENTS_SINCE, PIECES, TESTED_FROM, TESTED_TO, parse_version
from loaderkit.errors import ArgumentTypeError
from loaderkit.machine.platform import PlatformInfo
from loaderkit.plan import Decision

__all__ = ["fit_torch_arguments", "torch_decision", "torch_fallback_warning"]


def _release(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def fit_torch_arguments(kwargs: Mapping[str, Any], platform: PlatformInfo) -> dict[str, Any]:
    """``kwargs`` for torch's ``DataLoader.__init__``, without what this torch does not accept.

    An argument this torch lacks is dropped when its value is what torch does without it (the
    default: ``in_order=True``), and refused otherwise.

    Args:
        kwargs: The keyword arguments loaderkit would pass.
        platform: The platform (``torch_loader_args``: what torch accepts; ``None``: all).

    Returns:
        The arguments to pass.

    Raises:
        ArgumentTypeError: A value this torch cannot honour, naming the argument and the
            release that added it (a ``ConfigError`` that is also the ``TypeError`` torch
            itself raises for an argument it does not know).
    """
    accepted = platform.torch_loader_args
    if accepted is None:
        return dict(kwargs)
    fitted = {}
    for name, value in kwargs.items():
        if name in accepted:
            fitted[name] = value
            continue
        since, default = ARGUMENTS_SINCE.get(name, (None, None))
        if since is not None and value == default:
            continue  # torch's behaviour without the argument: nothing to pass
        added = f"torch {_release(since)}" if since is not None else "a newer torch"
        raise ArgumentTypeError(  # torch itself: TypeError, unexpected keyword argument
            f"{name}={value!r} needs {added}; this is torch {platform.torch_version}, whose "
            f"DataLoader has no {name!r} argument. Upgrade torch (pip install "
            f"'torch>={_release(since) if since else platform.torch_version}'), or leave "
            f"{name} unset."
        )
    return fitted


def torch_decision(platform: PlatformInfo) -> Decision[str]:
    """The plan row ``torch``: the version, whether it is tested, and what falls back.

    A release newer than the tested range is "not yet tested", with every probe's result
    (nothing about it is an error); one older than the range is "untested".

    Examples:
        >>> from dataclasses import replace
        >>> from loaderkit.machine.platform import detect_platform
        >>> p = replace(detect_platform(), torch_version="2.16.0", torch_fallbacks=())
        >>> torch_decision(p).reason.startswith("not yet tested")
        True
    """
    version = parse_version(platform.torch_version)
    span = f"{_release(TESTED_FROM)} to {_release(TESTED_TO)}"
    if TESTED_FROM <= version[:2] <= TESTED_TO:
        head = f"tested (loaderkit supports torch {span})"
    elif version[:2] > TESTED_TO:
        head = f"not yet tested: newer than the releases loaderkit is tested on ({span})"
    else:
        head = f"untested: older than the releases loaderkit is tested on ({span})"
    if not platform.numpy_bools_collate:
        head += (
            "; its default_collate refuses numpy bool scalars under this numpy (or warns "
            "it soon will), so loaderkit's HDF5 datasets collate them with "
            "loaderkit.workers.collate"
        )
    if not platform.torch_fallbacks:
        checked = ", ".join(PIECES)
        return Decision(
            platform.torch_version,
            f"{head}; every torch internal it relies on checked ({checked}: ok)",
        )
    passed = ", ".join(piece for piece in PIECES if piece not in platform.torch_fallbacks)
    return Decision(
        platform.torch_version,
        f"{head}; ok: {passed or 'none'}; changed in this torch, so fell back: "
        f"{_fallbacks(platform)}",
    )


def _fallbacks(platform: PlatformInfo) -> str:
    """Each piece that fell back and what it does instead."""
    return "; ".join(
        f"{piece} -> {PIECES[piece][1] if piece in PIECES else 'torch public path'}"
        for piece in platform.torch_fallbacks
    )


def torch_fallback_warning(platform: PlatformInfo) -> str | None:
    """The warning text for the fallbacks in force (``None``: none)."""
    if not platform.torch_fallbacks:
        return None
    return (
        f"torch {platform.torch_version} changed internals loaderkit relies on, so these fall "
        f"back to torch's own path: {_fallbacks(platform)}. Loading works and stays correct; "
        "see loader.plan['torch'] and docs/torch-versions.md."
    )
