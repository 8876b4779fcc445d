"""A process's limits as its cgroups set them: memory and CPU quota on its own cgroup path.

A job's limits are rarely at the root of the cgroup tree: Slurm puts a job's memory limit on
``/slurm/uid_N/job_M`` (cgroup v1) or ``/system.slice/slurmstepd.scope/job_M`` (v2), systemd
on ``*.scope`` / ``*.slice`` paths, a container without a cgroup namespace on its own path.
So the limit a process has is the lowest one on the path from its own cgroup up to the root:

* ``/proc/self/cgroup`` names the process's cgroup in each hierarchy: v2's one line
  ``0::/path``, v1's ``N:memory:/path`` and ``N:cpu,cpuacct:/path``;
* ``/proc/self/mountinfo`` says where each hierarchy is mounted and which of its cgroups the
  mount shows at its mount point (a container without a cgroup namespace mounts its own
  cgroup there); without it the usual layout (``/sys/fs/cgroup``) is assumed;
* memory, at each level: v2 ``memory.max`` and ``memory.high``, v1
  ``memory.limit_in_bytes``; ``max``, -1, v1's "unlimited" (about 2**63) and any value at or
  above physical memory mean no limit there;
* CPUs, at each level: v2 ``cpu.max`` (``"quota period"`` or ``"max period"``), v1
  ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (quota -1: none).

Worker processes inherit their parent's cgroups: one limit covers the main process, its
workers, their shared memory and the page cache they fill.

Every reader takes the ``proc`` and ``root`` directories it reads, so made-up trees test v1,
v2, hybrid, Slurm's nested layouts and containers on any machine. Parsing is pure
(``parse_proc_cgroup``, ``parse_mountinfo``).

Example:
    >>> limit = memory_limit(physical=1 << 40)
    >>> limit is None or limit.value < 1 << 40
    True
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CgroupMount",
    "Limit",
    "cgroup_levels",
    "cpu_quota",
    "memory_limit",
    "parse_mountinfo",
    "parse_proc_cgroup",
    "quota_cpus",
]

#: At or above this a v1 limit means "unlimited" (the kernel writes ``PAGE_COUNTER_MAX``
#: pages, 9223372036854771712 with 4 KiB pages).
_V1_UNLIMITED = 1 << 62

#: The unified (v2) hierarchy's key in ``parse_proc_cgroup``'s answer.
UNIFIED = ""


@dataclass(frozen=True)
class Limit:
    """A limit found on a process's cgroup path, and where.

    Attributes:
        value: Bytes of memory, or CPUs (a float: a quota of half a CPU is 0.5).
        version: 1 or 2: the cgroup hierarchy it was read in.
        path: The cgroup that sets it (as ``/proc/self/cgroup`` names it, e.g.
            ``/slurm/uid_0/job_7``).
        file: The file it was read from (``memory.limit_in_bytes``, ``cpu.max``...).

    Example:
        >>> Limit(1536 << 20, 1, "/slurm/uid_0/job_7", "memory.limit_in_bytes").source
        'cgroup v1 /slurm/uid_0/job_7 memory.limit_in_bytes'
    """

    value: float
    version: int
    path: str
    file: str

    @property
    def source(self) -> str:
        """Where the limit was read: ``cgroup v1 /slurm/uid_0/job_7 memory.limit_in_bytes``."""
        return f"cgroup v{self.version} {self.path} {self.file}"


@dataclass(frozen=True)
class CgroupMount:
    """One mounted cgroup hierarchy (a line of ``/proc/self/mountinfo``).

    Attributes:
        version: 1 or 2.
        root: The cgroup the mount shows at its mount point (``/`` on a host or inside a
            cgroup namespace; the container's own path in a container without one).
        mount_point: Where it is mounted (``/sys/fs/cgroup/memory``, ``/sys/fs/cgroup``).
        controllers: v1: the controllers of the hierarchy (``{"cpu", "cpuacct"}``); v2: empty
            (its controllers are per cgroup).

    Example:
        >>> CgroupMount(1, "/", "/sys/fs/cgroup/memory", frozenset({"memory"})).version
        1
    """

    version: int
    root: str
    mount_point: str
    controllers: frozenset[str] = frozenset()


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """The process's cgroup path per controller, from ``/proc/self/cgroup``.

    Args:
        text: The file's contents.

    Returns:
        Controller name → path for v1 hierarchies (``"cpu"`` and ``"cpuacct"`` both for
        ``cpu,cpuacct``; named hierarchies such as ``name=systemd`` left out), and
        ``UNIFIED`` (``""``) → path for v2's ``0::`` line.

    Example:
        >>> text = "4:memory:/slurm/job_7|1:cpu,cpuacct:/|0::/user.slice".replace("|", chr(10))
        >>> parse_proc_cgroup(text)
        {'memory': '/slurm/job_7', 'cpu': '/', 'cpuacct': '/', '': '/user.slice'}
    """
    found: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        number, names, path = parts
        if number == "0" and names == "":
            found[UNIFIED] = path
            continue
        for name in names.split(","):
            if name and not name.startswith("name="):
                found[name] = path
    return found


def _unescape(field: str) -> str:
    """A mountinfo path with its octal escapes (a backslash and 040 for a space) undone."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[CgroupMount]:
    """The cgroup hierarchies mounted in this process's view, from ``/proc/self/mountinfo``.

    Args:
        text: The file's contents.

    Returns:
        One ``CgroupMount`` per ``cgroup`` (v1) or ``cgroup2`` mount, in the file's order.

    Example:
        >>> line = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory"
        >>> parse_mountinfo(line)[0].controllers
        frozenset({'memory'})
    """
    mounts = []
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, after = head.split(), tail.split()
        if not sep or len(fields) < 5 or len(after) < 1:
            continue
        root, mount_point = _unescape(fields[3]), _unescape(fields[4])
        if after[0] == "cgroup2":
            mounts.append(CgroupMount(2, root, mount_point))
        elif after[0] == "cgroup" and len(after) >= 3:
            names = frozenset(
                opt for opt in after[2].split(",") if opt not in ("rw", "ro") and "=" not in opt
            )
            mounts.append(CgroupMount(1, root, mount_point, names))
    return mounts


def _default_mounts(root: Path) -> list[CgroupMount]:
    """The usual layout where mountinfo cannot be read: v2 at, or v1 below, /sys/fs/cgroup."""
    base = root / "sys/fs/cgroup"
    if (base / "cgroup.controllers").exists():
        return [CgroupMount(2, "/", "/sys/fs/cgroup")]
    mounts = []
    for name in ("memory", "cpu"):
        if (base / name).is_dir():
            mounts.append(CgroupMount(1, "/", f"/sys/fs/cgroup/{name}", frozenset({name})))
    return mounts


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):  # unreadable, absent, a directory: no limit there
        return None


def cgroup_levels(
    controller: str,
    *,
    proc: str | os.PathLike[str] = "/proc/self",
    root: str | os.PathLike[str] = "/",
) -> tuple[int, list[tuple[str, Path]]] | None:
    """The process's cgroup and every cgroup above it, in the hierarchy that has ``controller``.

    A v1 hierarchy with the controller is used where there is one (hybrid hosts mount v2
    beside v1 without the controllers), else the unified (v2) one.

    Args:
        controller: ``"memory"`` or ``"cpu"``.
        proc: The process's ``/proc`` directory (``/proc/self``).
        root: Where the filesystem starts (``/``; a made-up tree in tests).

    Returns:
        ``(version, [(cgroup path, directory), ...])`` from the process's own cgroup up to the
        mount's root, only the levels whose directories exist; ``None`` where the process is
        in no such hierarchy (no cgroups: macOS, Windows, a bare container).

    Example:
        >>> found = cgroup_levels("memory")
        >>> found is None or found[0] in (1, 2)
        True
    """
    proc, root = Path(proc), Path(root)
    text = _read(proc / "cgroup")
    if not text:
        return None
    paths = parse_proc_cgroup(text)
    info = _read(proc / "mountinfo")
    mounts = parse_mountinfo(info) if info else _default_mounts(root)
    v1 = [m for m in mounts if m.version == 1 and controller in m.controllers]
    v2 = [m for m in mounts if m.version == 2]
    if controller in paths and v1:
        version, path, candidates = 1, paths[controller], v1
    elif UNIFIED in paths and v2:
        version, path, candidates = 2, paths[UNIFIED], v2
    else:
        return None
    for mount in candidates:
        levels = list(_levels(path, mount, root))
        if levels:
            return version, levels
    return None


def _levels(path: str, mount: CgroupMount, root: Path) -> Iterator[tuple[str, Path]]:
    """``path`` and each cgroup above it, to the mount's root, with directories that exist."""
    base = mount.root.rstrip("/")
    if path != base and not path.startswith(base + "/"):
        path = base  # a cgroup the mount does not show (a namespace's "/.." path): its root
    parts = [part for part in path[len(base) :].split("/") if part]
    for depth in range(len(parts), -1, -1):
        relative = "/".join(parts[:depth])
        directory = root / mount.mount_point.lstrip("/") / relative
        if directory.is_dir():
            yield (f"{base}/{relative}" if relative else base or "/"), directory


def _bytes(text: str | None) -> int | None:
    """A memory limit file's value; ``None`` for none (``max``, -1, v1's unlimited, garbage)."""
    if text is None or not text.lstrip("-").isdigit():
        return None
    value = int(text)
    return value if 0 < value < _V1_UNLIMITED else None


def _lowest(
    levels: Sequence[tuple[str, Path]],
    version: int,
    files: Sequence[str],
    parse: Callable[[Path, str], float | None],
    ceiling: float | None,
) -> Limit | None:
    best: Limit | None = None
    for cgroup, directory in levels:
        for name in files:
            value = parse(directory, name)
            if value is None or (ceiling is not None and value >= ceiling):
                continue
            if best is None or value < best.value:
                best = Limit(value, version, cgroup, name)
    return best


def memory_limit(
    physical: int | None,
    *,
    proc: str | os.PathLike[str] = "/proc/self",
    root: str | os.PathLike[str] = "/",
) -> Limit | None:
    """The lowest memory limit on the process's cgroup path, below physical memory.

    Args:
        physical: The machine's physical memory (``None``: unknown; any limit counts).
        proc: The process's ``/proc`` directory.
        root: Where the filesystem starts.

    Returns:
        The ``Limit`` in bytes, or ``None`` where no cgroup on the path limits memory below
        ``physical``.

    Example:
        >>> limit = memory_limit(physical=None)
        >>> limit is None or limit.file in ("memory.max", "memory.high", "memory.limit_in_bytes")
        True
    """
    found = cgroup_levels("memory", proc=proc, root=root)
    if found is None:
        return None
    version, levels = found
    files = ("memory.limit_in_bytes",) if version == 1 else ("memory.max", "memory.high")
    best = _lowest(levels, version, files, lambda d, name: _bytes(_read(d / name)), physical)
    if best is None:
        return None
    return Limit(int(best.value), best.version, best.path, best.file)


def _v1_quota(directory: Path, name: str) -> float | None:
    quota, period = _read(directory / name), _read(directory / "cpu.cfs_period_us")
    if not quota or not period or not quota.lstrip("-").isdigit() or not period.isdigit():
        return None
    if int(quota) <= 0 or int(period) <= 0:
        return None
    return int(quota) / int(period)


def _v2_quota(directory: Path, name: str) -> float | None:
    fields = (_read(directory / name) or "").split()
    if len(fields) != 2 or not fields[0].isdigit() or not fields[1].isdigit():
        return None  # "max 100000": no quota
    quota, period = int(fields[0]), int(fields[1])
    return quota / period if quota > 0 and period > 0 else None


def cpu_quota(
    *,
    proc: str | os.PathLike[str] = "/proc/self",
    root: str | os.PathLike[str] = "/",
) -> Limit | None:
    """The lowest CPU quota on the process's cgroup path, in CPUs (0.5: half a CPU).

    Args:
        proc: The process's ``/proc`` directory.
        root: Where the filesystem starts.

    Returns:
        The ``Limit`` (``value`` in CPUs), or ``None`` where no cgroup on the path has one.

    Example:
        >>> quota = cpu_quota()
        >>> quota is None or quota.value > 0
        True
    """
    found = cgroup_levels("cpu", proc=proc, root=root)
    if found is None:
        return None
    version, levels = found
    if version == 1:
        return _lowest(levels, 1, ("cpu.cfs_quota_us",), _v1_quota, None)
    return _lowest(levels, 2, ("cpu.max",), _v2_quota, None)


def quota_cpus(quota: float) -> int:
    """The whole CPUs a quota gives: rounded up, at least 1 (0.5 → 1, 2.5 → 3).

    Example:
        >>> quota_cpus(0.5), quota_cpus(4.0), quota_cpus(2.01)
        (1, 4, 3)
    """
    return max(1, math.ceil(round(quota, 6)))
