from __future__ import annotations

import dataclasses
import multiprocessing
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from loaderkit.machine.platform import PlatformInfo, detect_platform

# ---------------------------------------------------------------- test tiers
#
# `python -m pytest` (the README's command) runs the fast tier: every module and every public
# behaviour, in about five minutes on two cores. Long scenarios are marked `slow`
# (multi-process launches, soaks, SIGKILL trials, benchmark quick runs, the docs site build,
# framework launches, cells that repeat a path a fast cell takes): `python -m pytest -m slow`
# runs them alone, `python -m pytest --all` runs both. An explicit `-m` always wins.


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--all",
        action="store_true",
        default=False,
        help="run the slow tier too (by default `pytest` runs the fast tier: `-m 'not slow'`)",
    )


# ------------------------------------------------ torch's open-file probe under a worker death
#
# When a read from the workers' queue fails, torch up to 2.5 probes the open-file limit by
# opening 10 ``tempfile.NamedTemporaryFile`` in a list comprehension (later releases close
# each at once). A worker killed meanwhile makes torch's SIGCHLD handler raise its
# RuntimeError from the signal handler, which can land inside ``NamedTemporaryFile``: its own
# error path unlinks the file, and the half-built wrapper unlinks it again when it is
# collected. That second unlink's FileNotFoundError is an "exception ignored in __del__"
# that pytest's hook on Python 3.10 fails to format, failing whichever test is running (seen
# once in CI, torch 2.4.1, ``test_sigbus_in_a_memory_mapped_dataset_names_the_maps_and_files``).
# Exactly that one is dropped; every other unraisable exception reaches pytest.


def _torch_probe_leftover(unraisable: Any) -> bool:
    exc, where = unraisable.exc_value, getattr(unraisable.object, "__qualname__", "")
    return (
        isinstance(exc, FileNotFoundError)
        and where.startswith("_TemporaryFileCloser.")
        and str(exc.filename or "").startswith(tempfile.gettempdir())
    )


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    hook = sys.unraisablehook  # pytest's, installed by its unraisableexception plugin

    def filtered(unraisable: Any) -> None:
        if not _torch_probe_leftover(unraisable):
            hook(unraisable)

    sys.unraisablehook = filtered


# ------------------------------------------------------------ forkserver workers (Python 3.14)
#
# A forkserver worker is forked from a server process that first imports the program's main
# module (multiprocessing preloads ``__main__``): a user's script imports torch and loaderkit
# there once, and each worker starts with them imported. pytest-xdist's worker processes run
# ``python -c``, which has no main file, so their server would import nothing and every worker
# of every loader would import torch itself (about 1.5 s of CPU each; the whole fast tier under
# Python 3.14 took 26 minutes instead of 5). The server is given what a script's imports give
# it. Set before any server starts: each xdist worker starts its own on first use.
if "forkserver" in multiprocessing.get_all_start_methods():
    multiprocessing.set_forkserver_preload(["__main__", "loaderkit"])


def _fast_tier(config: pytest.Config) -> bool:
    return not (config.getoption("--all") or config.option.markexpr)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _fast_tier(config):
        return
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item.get_closest_marker("slow") is None]


def pytest_report_header(config: pytest.Config) -> str:
    if _fast_tier(config):
        return "tier: fast (slow tests deselected: `python -m pytest -m slow`, or `--all`)"
    return f"tier: {'all' if config.getoption('--all') else repr(config.option.markexpr)}"


def fake_platform(**overrides: Any) -> PlatformInfo:
    """This machine's PlatformInfo with some fields replaced (Windows, macOS, CUDA, ...)."""
    return dataclasses.replace(detect_platform(), **overrides)


WINDOWS = {
    "os_name": "Windows",
    "is_windows": True,
    "start_method": "spawn",
    "start_method_source": "default",
    "open_files_soft": None,
    "open_files_hard": None,
    "shm_bytes": None,
    "shm_free_bytes": None,
}
MACOS = {
    "os_name": "Darwin",
    "is_windows": False,
    "start_method": "spawn",
    "start_method_source": "default",
}
LINUX_314 = {
    "os_name": "Linux",
    "is_windows": False,
    "start_method": "forkserver",
    "start_method_source": "default",
    "python_version": (3, 14, 0),
}


@pytest.fixture
def make_platform() -> Callable[..., PlatformInfo]:
    return fake_platform


@pytest.fixture
def fork_default() -> Iterator[None]:
    """Workers start with fork during the test, as Python 3.13's default did.

    For tests whose code lives where no worker can import it (docs blocks run like a reader's
    session, an example loaded from its path under another name): spawn-like workers
    (Python 3.14's forkserver default) cannot receive it.
    """
    previous = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method("fork", force=True)
    try:
        yield
    finally:
        multiprocessing.set_start_method(previous, force=True)


@pytest.fixture(autouse=True)
def _sigint_handler_kept() -> Iterator[None]:
    """Every test starts with Python's Ctrl-C handler and leaves it as it found it.

    Lightning sets ``SIGINT`` to ``SIG_IGN`` when a fit ends in ``KeyboardInterrupt`` and to
    ``SIG_DFL`` when it tears down a process group; a later test in the same process would
    then never see a ``KeyboardInterrupt`` (or die of the signal).
    """
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
