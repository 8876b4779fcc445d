"""When a loader's workers start with ``fork`` instead of the interpreter's default.

Python 3.14 made ``forkserver`` the default start method on Linux. Two kinds of program that
ran under Python 3.13's ``fork`` break under it:

* a script that builds and iterates its loader at top level, with no
  ``if __name__ == "__main__":`` guard: every worker runs that top level again (a raw
  bootstrapping ``RuntimeError``; under ``torchrun`` a second ``init_process_group`` and a hang);
* a dataset (or ``collate_fn``, ``worker_init_fn``) that cannot be pickled: defined in
  ``python -c``, a notebook, or holding an unpicklable object.

Where the start method was left to the interpreter (no ``multiprocessing_context``, no
``multiprocessing.set_start_method``), the platform is Linux and CUDA is not initialised in the
process, such a loader's workers use ``fork`` (what Python 3.13 did), with a warning and a plan
row. Everywhere else the program cannot work as written, and it is a ``ConfigError`` that names
the file and line and shows the guard. An explicit start method is never changed.

Pure functions of a ``PlatformInfo`` and what the planner found.

Examples:
    >>> from dataclasses import replace
    >>> from loaderkit.machine.platform import detect_platform
    >>> linux = replace(detect_platform(), os_name="Linux", is_windows=False,
    ...                 start_method="forkserver", start_method_source="default",
    ...                 python_version=(3, 14, 0), cuda_initialized=False)
    >>> fork_blocker(linux, "default") is None
    True
    >>> fork_blocker(linux, "argument")
    "the start method was chosen explicitly (multiprocessing_context='forkserver')"
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from loaderkit.errors import ConfigError
from loaderkit.machine.main_module import MainRerun, guard_example
from loaderkit.machine.platform import PlatformInfo

__all__ = [
    "StartMethodFit",
    "fit_for_main_rerun",
    "fit_for_unpicklable",
    "fit_start_method",
    "fork_blocker",
]


@dataclass(frozen=True)
class StartMethodFit:
    """A start method loaderkit chose instead of the interpreter's default.

    Attributes:
        start_method: The start method the loader's workers use (``"fork"``).
        reason: The plan row's reason.
        warning: The warning text (once per cause and file in a process).
        key: What makes this warning the same as an earlier one (for warning once).
    """

    start_method: str
    reason: str
    warning: str
    key: tuple[str, ...]


def _python(platform: PlatformInfo) -> str:
    return ".".join(map(str, platform.python_version[:2]))


def fork_blocker(platform: PlatformInfo, source: str) -> str | None:
    """Why ``fork`` cannot stand in for the start method in effect (``None``: it can).

    Args:
        platform: The platform (``os_name``, ``cuda_initialized``, ``start_method``).
        source: Where the start method came from (``"argument"``, ``"global"``,
            ``"default"``: ``PlatformInfo.start_method_source``).

    Returns:
        The reason, for messages, or ``None`` when fork may be used.
    """
    if source == "argument":
        return (
            "the start method was chosen explicitly "
            f"(multiprocessing_context={platform.start_method!r})"
        )
    if source == "global":
        return (
            "the start method was chosen explicitly "
            f"(multiprocessing.set_start_method({platform.start_method!r}))"
        )
    if platform.os_name != "Linux":
        return f"fork is not safe on {platform.os_name}"
    if platform.cuda_initialized:
        return "CUDA is initialised in this process, and a forked worker cannot use it"
    return None


def fit_for_main_rerun(
    platform: PlatformInfo, start_method: str, source: str, rerun: MainRerun
) -> StartMethodFit:
    """Fork for a loader made at an unguarded top level of the main script, or refuse it.

    Args:
        platform: The platform.
        start_method: The start method in effect (``"spawn"`` or ``"forkserver"``).
        source: Where it came from (see ``fork_blocker``).
        rerun: Where the main script's top level makes the loader.

    Returns:
        The fit: ``fork``, with its reason and warning.

    Raises:
        ConfigError: Fork cannot stand in (an explicit start method, not Linux, CUDA
            initialised): the message names the file and line and shows the guard.
    """
    effect = (
        f"the '{start_method}' start method makes every worker import the main script again "
        f"(as __mp_main__), which runs its top level a second time: the workers would start "
        "workers of their own while bootstrapping (multiprocessing's RuntimeError), and under "
        "torchrun call init_process_group again and hang"
    )
    guard = guard_example(rerun)
    blocker = fork_blocker(_in_effect(platform, start_method), source)
    if blocker is not None:
        raise ConfigError(
            f"{rerun.where()} makes a loader with workers at the top level of the main script, "
            f'outside an `if __name__ == "__main__":` guard, and {effect}. loaderkit cannot '
            f"use fork instead: {blocker}. Fix: guard the script's top level:\n{guard}"
        )
    reason = (
        f"fork instead of Python {_python(platform)}'s default '{start_method}': "
        f"{Path(rerun.file).name}:{rerun.line} makes the loader outside a main guard, so "
        f"'{start_method}' workers would run the script's top level again"
    )
    warning = (
        f"{rerun.where()} makes a loader with workers at the top level of the main script, "
        f'outside an `if __name__ == "__main__":` guard, and {effect}. Its workers start '
        f"with 'fork' instead (as on Python 3.13 and earlier). Fix: guard the script's top "
        f"level, which also makes it work on macOS and Windows:\n{guard}"
    )
    return StartMethodFit("fork", reason, warning, ("main", rerun.file))


def fit_for_unpicklable(
    platform: PlatformInfo, start_method: str, source: str, problem: str
) -> StartMethodFit | None:
    """Fork for a loader whose dataset (or function) spawned workers cannot receive.

    Args:
        platform: The platform.
        start_method: The start method in effect (``"spawn"`` or ``"forkserver"``).
        source: Where it came from (see ``fork_blocker``).
        problem: The picklability check's message (what cannot be pickled and the fix).

    Returns:
        The fit (``fork``), or ``None`` when fork cannot stand in: the caller raises the
        picklability ``ConfigError`` as it is.
    """
    if fork_blocker(_in_effect(platform, start_method), source) is not None:
        return None
    head = problem.split(":", 1)[0]
    reason = (
        f"fork instead of Python {_python(platform)}'s default '{start_method}': {head}, and "
        "forked workers inherit it instead of unpickling it"
    )
    warning = (
        f"{problem} Its workers start with 'fork' instead of Python {_python(platform)}'s "
        f"default '{start_method}' (as on Python 3.13 and earlier), which needs no pickling. "
        "Pass multiprocessing_context='fork' to choose this yourself, or fix the pickling to "
        "keep the default."
    )
    return StartMethodFit(
        "fork", reason, warning, ("pickle", re.sub(r" at 0x[0-9a-f]+", "", problem))
    )


def _in_effect(platform: PlatformInfo, start_method: str) -> PlatformInfo:
    """``platform`` with ``start_method`` in effect (messages name the one in effect)."""
    if platform.start_method == start_method:
        return platform
    return replace(platform, start_method=start_method)


def fit_start_method(
    platform: PlatformInfo,
    start_method: str,
    source: str,
    *,
    rerun: MainRerun | None,
    problem: str | None,
) -> StartMethodFit | None:
    """The start method a spawn-like loader needs, from what the planner found.

    Args:
        platform: The platform.
        start_method: The start method in effect (``"spawn"`` or ``"forkserver"``).
        source: Where it came from (see ``fork_blocker``).
        rerun: Where the main script's unguarded top level makes the loader (``None``: not).
        problem: The first picklability error of what workers receive (``None``: none).

    Returns:
        ``fork`` with its reason and warning, or ``None`` when the start method stays.

    Raises:
        ConfigError: The program cannot work under ``start_method`` and fork cannot stand in.
    """
    if rerun is not None:
        return fit_for_main_rerun(platform, start_method, source, rerun)
    if problem is None:
        return None
    fit = fit_for_unpicklable(platform, start_method, source, problem)
    if fit is None:
        raise ConfigError(problem)
    return fit
