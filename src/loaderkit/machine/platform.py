"""What this machine is: the only module that reads the machine.

``detect_platform`` gathers everything loaderkit's policies depend on into a frozen
``PlatformInfo``. Policies (``loaderkit.policy``) are pure functions of a
``PlatformInfo``, so Windows, macOS, Python 3.14 and CUDA behaviour can be exercised on any
machine by passing a hand-made one::

    windows = dataclasses.replace(detect_platform(), os_name="Windows", is_windows=True,
                                  start_method="spawn")
    loader = create_dataloader(dataset, num_workers=4, platform=windows)
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import os
import platform as _stdlib_platform
import shutil
import sys
from dataclasses import dataclass
from typing import Any

import torch

from loaderkit import _torch
from loaderkit.machine.cgroups import cpu_quota, memory_limit, quota_cpus
from loaderkit.machine.distributed import launcher_int
from loaderkit.machine.intraop_threads import torch_threads
from loaderkit.plan import counted, wrap_column

__all__ = [
    "PlatformInfo",
    "default_start_method",
    "detect_platform",
    "memory_bytes",
    "open_descriptors",
    "open_file_limits",
    "process_cpus",
    "process_memory",
    "resolve_start_method",
]


@dataclass(frozen=True)
class PlatformInfo:
    """A snapshot of the facts loaderkit's policies depend on.

    Build one with ``detect_platform``; build a different one by hand (or with
    ``dataclasses.replace``) to ask "what would happen on Windows?".

    Attributes:
        os_name: ``platform.system()``: ``"Linux"``, ``"Windows"``, ``"Darwin"``...
        is_windows: True on Windows (where the zero-worker policy applies).
        start_method: The multiprocessing start method workers will use.
        start_method_source: Where ``start_method`` came from: ``"argument"`` (the
            ``multiprocessing_context`` passed to the loader), ``"global"`` (set with
            ``multiprocessing.set_start_method`` to another method than the interpreter's
            default) or ``"default"`` (the interpreter's default).
        usable_cpus: CPUs this process may run on: its CPU affinity (a cgroup cpuset, taskset),
            or the CPU quota on its own cgroup path rounded up, when lower (``process_cpus``).
        cpu_count: Logical CPUs of the machine (``os.cpu_count()``).
        cuda_available: ``torch.cuda.is_available()``.
        cuda_device_count: Number of visible CUDA devices.
        shm_bytes: Total size of ``/dev/shm`` in bytes, ``None`` where there is none.
        shm_free_bytes: Free bytes in ``/dev/shm``, ``None`` where there is none.
        open_files_soft: Soft ``RLIMIT_NOFILE``; ``None`` when unlimited or unknown (Windows).
        open_files_hard: Hard ``RLIMIT_NOFILE``; ``None`` when unlimited or unknown.
        python_version: ``(major, minor, micro)`` of the interpreter.
        torch_version: ``torch.__version__``.
        local_world_size: Processes per node from the launcher (``LOCAL_WORLD_SIZE``, set by
            torchrun), ``None`` when not launched that way.
        cuda_bad_fork: This process was forked after its parent had initialised CUDA
            (torch's own bad-fork check): CUDA is visible (``cuda_available`` may be
            True) but cannot be initialised here, so anything that touches it (pinning a
            batch, a ``.to("cuda")``) raises "Cannot re-initialize CUDA in forked subprocess".
            ``False`` by default, so hand-made ``PlatformInfo`` objects keep their meaning.
        memory_bytes: Memory this process may use: the lowest limit on its own cgroup path up
            to the root (a Slurm job's, a systemd scope's, a container's), else physical
            memory (``process_memory``); ``None`` when unknown (the default).
        open_fds: Descriptors this process held when detected (its own share of its
            ``RLIMIT_NOFILE``, which every process has separately); ``None`` when unknown (the
            default: the budgets then assume ``loaderkit.policy.budgets.FDS_MAIN_PROCESS``).
        torch_threads: torch's intra-op threads in this process (``torch.get_num_threads()``);
            ``None`` when unknown (the default: torch's threads are then left alone).
        torch_threads_chosen: The user chose that number (``OMP_NUM_THREADS`` or
            ``MKL_NUM_THREADS`` set, or ``torch.set_num_threads`` called after loaderkit was
            imported): loaderkit never changes it then.
        torch_fallbacks: The pieces of torch's internals loaderkit relies on that this torch
            does not provide as expected (``loaderkit._torch.support()``): each falls back to
            torch's public path. Empty (the default) when every probe passed.
        torch_loader_args: The arguments this torch's ``DataLoader`` accepts (``None``: not
            known, every argument is passed). An older torch is never given one it lacks.
        numpy_bools_collate: torch's ``default_collate`` takes numpy bool scalars (``False``
            where it refuses them, torch 2.6 under numpy 2.4+, or warns it soon will, torch 2.4
            under numpy 2.2: ``loaderkit._torch.NUMPY_BOOLS_COLLATE``).
        cuda_initialized: CUDA is initialised in this process (``torch.cuda.is_initialized()``):
            a worker forked from it cannot use CUDA, so loaderkit never puts ``fork`` in
            place of a spawn-like default then. ``False`` by default.
        memory_source: Where ``memory_bytes`` came from: ``"physical memory"``, or the cgroup
            and file of the limit (``"cgroup v1 /slurm/uid_0/job_7 memory.limit_in_bytes"``);
            ``"given"`` (the default) for a hand-made ``PlatformInfo``.
        cpu_quota: The lowest CPU quota on the process's cgroup path, in CPUs (0.5: half a
            CPU); ``None`` where there is none (the default).
        cpus_source: Which limit decided ``usable_cpus``: the CPU affinity, or the quota and
            its cgroup; ``"given"`` (the default) for a hand-made ``PlatformInfo``.

    Examples:
        >>> info = detect_platform()
        >>> info.usable_cpus >= 1
        True
        >>> info.cuda_usable == (info.cuda_available and not info.cuda_bad_fork)
        True
    """

    os_name: str
    is_windows: bool
    start_method: str
    start_method_source: str
    usable_cpus: int
    cpu_count: int
    cuda_available: bool
    cuda_device_count: int
    shm_bytes: int | None
    shm_free_bytes: int | None
    open_files_soft: int | None
    open_files_hard: int | None
    python_version: tuple[int, int, int]
    torch_version: str
    local_world_size: int | None = None
    cuda_bad_fork: bool = False
    memory_bytes: int | None = None
    open_fds: int | None = None
    torch_threads: int | None = None
    torch_threads_chosen: bool = False
    torch_fallbacks: tuple[str, ...] = ()
    torch_loader_args: frozenset[str] | None = None
    numpy_bools_collate: bool = True
    cuda_initialized: bool = False
    memory_source: str = "given"
    cpu_quota: float | None = None
    cpus_source: str = "given"

    @property
    def cuda_usable(self) -> bool:
        """CUDA is available *and* can be initialised in this process (not a bad fork).

        Examples:
            >>> from dataclasses import replace
            >>> gpu = replace(detect_platform(), cuda_available=True, cuda_device_count=1)
            >>> gpu.cuda_usable, replace(gpu, cuda_bad_fork=True).cuda_usable
            (True, False)
        """
        return self.cuda_available and not self.cuda_bad_fork

    def describe(self, width: int = 100) -> str:
        """Render every field as ``name  value`` lines, a long value wrapped under itself.

        Args:
            width: The widest line.

        Examples:
            >>> "start_method" in detect_platform().describe()
            True
        """
        from dataclasses import fields

        names = max(len(f.name) for f in fields(self))

        def shown(value: Any) -> str:
            return repr(sorted(value)) if isinstance(value, frozenset) else repr(value)

        def line(name: str, value: Any) -> str:
            parts = wrap_column(shown(value), width, names + 2)
            return "\n".join(
                [f"{name:<{names}}  {parts[0]}", *(" " * (names + 2) + p for p in parts[1:])]
            )

        return "\n".join(line(f.name, getattr(self, f.name)) for f in fields(self))


def default_start_method(os_name: str, python_version: tuple[int, ...]) -> str:
    """The start method an interpreter uses when nobody sets one.

    Windows and macOS use ``spawn``; other POSIX systems use ``fork`` before Python 3.14 and
    ``forkserver`` from 3.14 on.

    Args:
        os_name: ``platform.system()`` value.
        python_version: Interpreter version tuple, e.g. ``(3, 14, 0)``.

    Returns:
        ``"spawn"``, ``"fork"`` or ``"forkserver"``.

    Examples:
        >>> default_start_method("Linux", (3, 14, 0))
        'forkserver'
        >>> default_start_method("Darwin", (3, 11, 7))
        'spawn'
    """
    if os_name in ("Windows", "Darwin"):
        return "spawn"
    return "forkserver" if tuple(python_version[:2]) >= (3, 14) else "fork"


def _context_name(context: Any) -> str:
    """The start method named by a ``multiprocessing_context`` argument (string or context)."""
    if isinstance(context, str):
        return context
    if isinstance(context, multiprocessing.context.BaseContext):
        return context.get_start_method()
    # torch.multiprocessing and the multiprocessing module itself act as the default context.
    getter = getattr(context, "get_start_method", None)
    if callable(getter):
        return str(getter())
    raise TypeError(
        "multiprocessing_context should be a start method name or a multiprocessing context, "
        f"got {context!r}"
    )


def resolve_start_method(
    multiprocessing_context: Any, global_start_method: str | None, default: str
) -> tuple[str, str]:
    """Resolve the start method as torch's DataLoader will: argument, then global, then default.

    Args:
        multiprocessing_context: The loader's ``multiprocessing_context`` argument (``None``, a
            start method name, or a context object).
        global_start_method: ``multiprocessing.get_start_method(allow_none=True)``.
        default: The interpreter's default (see ``default_start_method``).

    Returns:
        ``(start_method, source)`` where source is ``"argument"``, ``"global"`` or ``"default"``.
        A global start method that is the interpreter's default counts as the default:
        multiprocessing cannot tell ``set_start_method(default)`` from the default that any
        ``multiprocessing.get_start_method()`` call (torch's, a library's) fixes in place.

    Examples:
        >>> resolve_start_method("spawn", "fork", "fork")
        ('spawn', 'argument')
        >>> resolve_start_method(None, None, "forkserver")
        ('forkserver', 'default')
        >>> resolve_start_method(None, "forkserver", "forkserver")
        ('forkserver', 'default')
        >>> resolve_start_method(None, "spawn", "forkserver")
        ('spawn', 'global')
    """
    if multiprocessing_context is not None:
        return _context_name(multiprocessing_context), "argument"
    if global_start_method is not None and global_start_method != default:
        return global_start_method, "global"
    return default, "default"


def _usable_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except OSError:  # pragma: no cover - exotic kernels
            pass
    process_cpu_count = getattr(os, "process_cpu_count", None)  # Python 3.13+
    if process_cpu_count is not None:  # pragma: no cover - depends on the interpreter
        return max(1, process_cpu_count() or 1)
    return max(1, os.cpu_count() or 1)


def _shm() -> tuple[int | None, int | None]:
    if not os.path.isdir("/dev/shm"):
        return None, None
    try:
        usage = shutil.disk_usage("/dev/shm")
    except OSError:
        return None, None
    return usage.total, usage.free


def open_file_limits() -> tuple[int | None, int | None]:
    """The soft and hard ``RLIMIT_NOFILE`` of this process (``None``: unlimited or Windows).

    Examples:
        >>> soft, hard = open_file_limits()
        >>> soft is None or soft >= 1
        True
    """
    try:
        import resource
    except ImportError:  # Windows
        return None, None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)

    def norm(value: int) -> int | None:
        return None if value == resource.RLIM_INFINITY or value < 0 else int(value)

    return norm(soft), norm(hard)


def open_descriptors() -> int | None:
    """How many file descriptors this process holds now (``None`` where it cannot be read).

    Read from ``/proc/self/fd`` (Linux) or ``/dev/fd`` (macOS, BSD), else from ``psutil``.

    Examples:
        >>> (open_descriptors() or 3) >= 3
        True
    """
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            entries = os.listdir(folder)
        except OSError:
            continue
        return max(0, len(entries) - 1)  # listing the folder opened one of them
    try:
        import psutil

        return int(psutil.Process().num_fds())
    except Exception:  # pragma: no cover - Windows has no descriptor count; never fail
        return None


def _physical_memory() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except Exception:  # pragma: no cover - psutil is a dependency; never fail detection
        return None


def process_memory() -> tuple[int | None, str]:
    """Memory this process may use, and where that figure came from.

    The lowest memory limit on the process's own cgroup path up to the root
    (``loaderkit.machine.cgroups.memory_limit``: a Slurm job, a systemd scope, a container),
    else physical memory.

    Returns:
        ``(bytes, source)``: ``source`` is ``"cgroup v1 /path memory.limit_in_bytes"`` (or
        v2's ``memory.max`` / ``memory.high``), ``"physical memory"``, or ``"unknown"`` with
        ``None`` bytes.

    Examples:
        >>> nbytes, source = process_memory()
        >>> (nbytes or 1) > 0 and (source == "physical memory" or source.startswith("cgroup"))
        True
    """
    physical = _physical_memory()
    limit = memory_limit(physical)
    if limit is not None:
        return int(limit.value), limit.source
    if physical is None:  # pragma: no cover - psutil is a dependency
        return None, "unknown"
    return physical, "physical memory"


def memory_bytes() -> int | None:
    """Memory this process may use (``process_memory``'s bytes).

    Examples:
        >>> (memory_bytes() or 1) > 0
        True
    """
    return process_memory()[0]


def process_cpus() -> tuple[int, float | None, str]:
    """CPUs this process may use: its CPU affinity, or its cgroup's CPU quota when lower.

    A quota (``cpu.max``, ``cpu.cfs_quota_us``: a Kubernetes CPU limit, a Slurm or systemd
    ``CPUQuota``) lets the process's threads run that many CPUs' worth of time, whichever
    CPUs they run on: more busy threads than the quota rounded up only wait for their turn.

    Returns:
        ``(cpus, quota, source)``: the whole CPUs (at least 1), the quota in CPUs (``None``:
        none on the path), and which limit decided.

    Examples:
        >>> cpus, quota, source = process_cpus()
        >>> cpus >= 1 and (source.startswith("CPU affinity") or source.startswith("cgroup"))
        True
    """
    affinity = _usable_cpus()
    total = max(1, os.cpu_count() or 1)
    quota = cpu_quota()
    if quota is None:
        return affinity, None, f"CPU affinity: {affinity} of {counted(total, 'CPU')}"
    cpus = quota_cpus(quota.value)
    if cpus < affinity:
        return (
            cpus,
            quota.value,
            f"{quota.source}: a quota of {quota.value:g} CPU{'' if quota.value == 1 else 's'}, "
            "rounded up "
            f"(CPU affinity: {affinity} of {total})",
        )
    return (
        affinity,
        quota.value,
        f"CPU affinity: {affinity} of {counted(total, 'CPU')} (a quota of {quota.value:g} at "
        f"{quota.source})",
    )


def detect_platform(multiprocessing_context: Any = None) -> PlatformInfo:
    """Read the machine once and return a frozen ``PlatformInfo``.

    Args:
        multiprocessing_context: The ``multiprocessing_context`` a loader will be given; it
            decides the start method when set (as in torch).

    Returns:
        The detected platform.

    Examples:
        >>> detect_platform("spawn").start_method
        'spawn'
    """
    os_name = _stdlib_platform.system() or sys.platform
    python_version = (sys.version_info.major, sys.version_info.minor, sys.version_info.micro)
    start_method, source = resolve_start_method(
        multiprocessing_context,
        multiprocessing.get_start_method(allow_none=True),
        default_start_method(os_name, python_version),
    )
    cuda_available = bool(torch.cuda.is_available())
    shm_total, shm_free = _shm()
    soft, hard = open_file_limits()
    threads, threads_chosen = torch_threads()
    cpus, quota, cpus_source = process_cpus()
    memory, memory_source = process_memory()
    return PlatformInfo(
        os_name=os_name,
        is_windows=sys.platform == "win32",
        start_method=start_method,
        start_method_source=source,
        usable_cpus=cpus,
        cpu_count=max(1, os.cpu_count() or 1),
        cuda_available=cuda_available,
        cuda_device_count=torch.cuda.device_count() if cuda_available else 0,
        shm_bytes=shm_total,
        shm_free_bytes=shm_free,
        open_files_soft=soft,
        open_files_hard=hard,
        python_version=python_version,
        torch_version=str(torch.__version__),
        local_world_size=launcher_int("LOCAL_WORLD_SIZE"),
        cuda_bad_fork=_torch.in_bad_fork(),
        memory_bytes=memory,
        open_fds=open_descriptors(),
        torch_threads=threads,
        torch_threads_chosen=threads_chosen,
        torch_fallbacks=tuple(probe.piece for probe in _torch.support().failed),
        torch_loader_args=_torch.loader_parameters(),
        numpy_bools_collate=_torch.NUMPY_BOOLS_COLLATE,
        cuda_initialized=bool(torch.cuda.is_initialized()),
        memory_source=memory_source,
        cpu_quota=quota,
        cpus_source=cpus_source,
    )
