from __future__ import annotations

import dataclasses
from collections.abc import Callable
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
