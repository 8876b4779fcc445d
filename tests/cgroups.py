"""Real child cgroups for tests: ``benchmarks/_cgroups.py``, skipped where none can be made.

``child_cgroup(memory_bytes=..., cpu_quota=...)`` makes children of this process's own memory
and CPU cgroups (v1, as root), ``ChildCgroup.run`` starts a command inside them and samples
its anonymous memory (see the benchmarks' module, which the out-of-core benchmarks share).
Where the cgroup files are not writable (not root, cgroup v2 without delegation, no
cgroups), the test is skipped with the reason.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

__all__ = ["child_cgroup"]

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "_cgroups.py"
_spec = importlib.util.spec_from_file_location("loaderkit_bench_cgroups", _PATH)
assert _spec is not None and _spec.loader is not None
_cgroups = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _cgroups  # dataclasses look their module up by name
_spec.loader.exec_module(_cgroups)


@contextlib.contextmanager
def child_cgroup(**limits: Any) -> Iterator[Any]:
    """``benchmarks/_cgroups.child_cgroup``; the test is skipped where none can be made."""
    try:
        with _cgroups.child_cgroup(**limits) as group:
            yield group
    except _cgroups.CgroupUnavailable as exc:
        pytest.skip(str(exc))
