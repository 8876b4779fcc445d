from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from loaderkit.platform import PlatformInfo, detect_platform


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
