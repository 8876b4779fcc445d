"""``loaderkit doctor``: checks of this machine against what data loading needs, with advice.

Every check is a pure function of a ``PlatformInfo`` (plus a few versions and
environment values passed in), so each outcome can be tested with any input. The CLI prints
the results; nothing here prints.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from loaderkit._torch import TESTED_FROM, TESTED_TO, parse_version
from loaderkit.machine.platform import PlatformInfo
from loaderkit.machine.versions import torch_decision
from loaderkit.plan import counted
from loaderkit.policy import recommended_num_workers as _recommended
from loaderkit.policy.budgets import check_open_file_budget, loader_fds

__all__ = [
    "FAIL",
    "PASS",
    "WARN",
    "CacheReport",
    "Check",
    "run_checks",
    "session_cache_report",
    "software_versions",
]

PASS, WARN, FAIL = "pass", "warn", "fail"
_GIB = 2**30
#: Below this, /dev/shm can hold only a few batches in flight (Docker's default is 64 MB).
SHM_MIN_BYTES = 1 * _GIB


@dataclass(frozen=True)
class Check:
    """One doctor line: a status, what was found, and what to do.

    Attributes:
        name: Short name of the check.
        status: ``"pass"``, ``"warn"`` or ``"fail"``.
        finding: What was measured.
        advice: What it implies or what to do.

    Examples:
        >>> Check("cuda", PASS, "no CUDA device", "pin_memory stays off").status
        'pass'
    """

    name: str
    status: str
    finding: str
    advice: str


def software_versions() -> dict[str, str]:
    """Versions of the pieces that matter (python, torch, numpy, h5py, HDF5, psutil).

    Examples:
        >>> "torch" in software_versions()
        True
    """
    import platform as stdlib_platform

    import numpy
    import psutil
    import torch

    versions = {
        "python": stdlib_platform.python_version(),
        "torch": str(torch.__version__),
        "numpy": numpy.__version__,
        "psutil": psutil.__version__,
    }
    try:
        import h5py

        versions["h5py"] = h5py.version.version
        versions["HDF5"] = h5py.version.hdf5_version
    except ImportError:  # pragma: no cover - h5py is a dependency
        versions["h5py"] = "not installed"
    return versions


def _start_method(p: PlatformInfo) -> Check:
    implications = {
        "fork": "workers start fast and inherit the parent's memory; do not initialize CUDA or "
        "use h5py from threads in the parent before workers start; a worker shares that memory "
        "until it writes to it, and reading a Python object writes its reference count, so "
        "large lists and dicts in the dataset end up copied in every worker (copy-on-read: "
        "loader.plan['copy_on_read'] names them; keep them in loaderkit.SharedSequence or "
        "numpy arrays)",
        "spawn": "each worker starts a fresh interpreter (slower start) and receives the "
        "dataset, collate_fn and worker_init_fn by pickle: they must be picklable and defined "
        "in importable modules; loaderkit checks this before starting workers",
        "forkserver": "workers fork from a clean server process (Python 3.14's Linux default) "
        "and receive the dataset by pickle: it must be picklable; loaderkit checks this before "
        "starting workers. Where forkserver is the default (no multiprocessing_context, no "
        "set_start_method) on Linux without CUDA initialised, a loader whose dataset cannot be "
        'pickled, or that a script makes outside an `if __name__ == "__main__":` guard, '
        "starts its workers with fork instead (warned, and in loader.plan['start_method'])",
    }
    return Check(
        "start method",
        PASS,
        f"{p.start_method} ({p.start_method_source})",
        implications.get(
            p.start_method, "an unusual start method: workers receive state by pickle"
        ),
    )


def _workers(p: PlatformInfo) -> Check:
    recommended = _recommended(p, force_zero_workers_on_windows=None)
    finding = (
        f"{p.usable_cpus} usable of {counted(p.cpu_count, 'CPU')} ({p.cpus_source}); "
        f"num_workers='auto' -> {recommended}"
        + (f" per rank ({p.local_world_size} local ranks)" if p.local_world_size else "")
    )
    if p.is_windows:
        return Check(
            "workers",
            WARN,
            finding + "; Windows: workers are threads of the training process",
            "worker processes start slowly here and need picklable datasets in importable "
            "modules: loaders use threads (worker_method='thread'); worker_method='process' "
            "only for such datasets, force_zero_workers_on_windows=True for no workers",
        )
    if p.usable_cpus < p.cpu_count:
        limit = (
            "a CPU quota on this process's cgroup (a container's CPU limit, a Slurm or "
            "systemd CPUQuota)"
            if p.cpus_source.startswith("cgroup")
            else "CPU affinity (taskset, cgroup cpuset, a job scheduler)"
        )
        return Check(
            "workers",
            WARN,
            finding,
            f"{limit} restricts this process; worker counts based on os.cpu_count() would "
            "oversubscribe it (num_workers='auto' follows it)",
        )
    return Check("workers", PASS, finding, "use num_workers='auto' to follow the CPUs you have")


def _memory(p: PlatformInfo) -> Check:
    if p.memory_bytes is None:
        return Check(
            "memory",
            WARN,
            "unknown",
            "loaderkit holds no session in memory and reads no more than asked; pass "
            "max_session_bytes= to hold sessions",
        )
    finding = f"{p.memory_bytes / _GIB:.2f} GiB ({p.memory_source})"
    advice = (
        "a limit on this process's own cgroup (a job, a scope, a container): every budget "
        "loaderkit fits (held sessions, open files, reads around a miss and ahead, batch "
        "slots) is fitted to it, for the main process and its workers together"
        if p.memory_source.startswith("cgroup")
        else "no cgroup limit on this process's path: budgets are fitted to the machine's memory"
    )
    return Check("memory", PASS, finding, advice)


def _shared_memory(p: PlatformInfo) -> Check:
    if p.shm_bytes is None:
        return Check(
            "/dev/shm",
            PASS,
            "no /dev/shm on this system",
            "workers share batches through the OS's own shared memory",
        )
    finding = f"{p.shm_bytes / _GIB:.1f} GiB ({(p.shm_free_bytes or 0) / _GIB:.1f} GiB free)"
    if p.shm_bytes < SHM_MIN_BYTES:
        return Check(
            "/dev/shm",
            WARN,
            finding,
            "workers pass batches through /dev/shm; a small one kills them with a bus "
            "error. Enlarge it (docker run --shm-size=8g) or call "
            "torch.multiprocessing.set_sharing_strategy('file_system')",
        )
    return Check("/dev/shm", PASS, finding, "room for prefetched batches of several workers")


def _open_files(p: PlatformInfo, max_open_files: int) -> Check:
    workers = _recommended(p, force_zero_workers_on_windows=False)
    verdict = check_open_file_budget(
        workers,
        max_open_files,
        p.open_files_soft,
        main_fds=p.open_fds,
        start_method=p.start_method,
        hard_limit=p.open_files_hard,
    )
    if verdict.needed is None:
        return Check("open files", PASS, "no open-file limit", "nothing to budget")
    fds = loader_fds(workers, main_fds=p.open_fds, start_method=p.start_method)
    finding = (
        f"ulimit -n {p.open_files_soft} per process (hard {p.open_files_hard}); planned with "
        f"{counted(workers, 'worker')} and max_open_files={max_open_files}: main process "
        f"{fds.main + max_open_files}"
        + (f", each worker {fds.worker + max_open_files}" if workers else "")
        + " descriptors"
    )
    status = {"ok": PASS, "warn": WARN, "error": FAIL}[verdict.level]
    advice = "enough headroom" if status == PASS else verdict.message.split("Fix: ")[-1]
    if status != PASS and "Consider: " in advice:
        advice = advice.split("Consider: ")[-1]
    return Check("open files", status, finding, advice.rstrip("."))


def _cuda(p: PlatformInfo) -> Check:
    if p.cuda_available and p.cuda_bad_fork:
        return Check(
            "CUDA",
            WARN,
            f"{p.cuda_device_count} device(s), but this process was forked after its parent "
            "initialised CUDA: CUDA cannot be used here",
            "pin_memory defaults to False here; start processes that need CUDA with spawn or "
            "forkserver, or fork before the parent first uses CUDA",
        )
    if p.cuda_available:
        return Check(
            "CUDA",
            PASS,
            f"{p.cuda_device_count} device(s)",
            "pin_memory defaults to True; use DevicePrefetcher to overlap copies with compute",
        )
    return Check(
        "CUDA",
        PASS,
        "no CUDA device",
        "pin_memory defaults to False (pinning would only cost time)",
    )


def _versions(versions: Mapping[str, str]) -> Check:
    finding = ", ".join(f"{k} {v}" for k, v in versions.items())
    h5py_version = versions.get("h5py", "0")
    try:
        major, minor = (int(x) for x in h5py_version.split(".")[:2])
    except ValueError:
        return Check("versions", WARN, finding, "h5py is not installed or has an odd version")
    if (major, minor) < (3, 14):
        return Check(
            "versions",
            WARN,
            finding,
            "h5py < 3.14 can deadlock when the parent used h5py from threads before "
            "forking workers: upgrade h5py, or use the spawn/forkserver start method",
        )
    return Check("versions", PASS, finding, "h5py is fork-safe with threads (>= 3.14)")


#: Python releases loaderkit supports (major, minor), and the newest torch each one has.
PYTHONS = {(3, 10): (2, 14), (3, 11): None, (3, 12): None, (3, 13): None, (3, 14): None}


def _python_note(platform: PlatformInfo) -> str | None:
    """What is wrong with this Python for loaderkit (``None``: supported with this torch)."""
    python = platform.python_version[:2]
    shown = ".".join(map(str, python))
    if python not in PYTHONS:
        newest = ".".join(map(str, max(PYTHONS)))
        oldest = ".".join(map(str, min(PYTHONS)))
        if python > max(PYTHONS):
            return f"Python {shown} is not yet tested (loaderkit supports {oldest} to {newest})"
        return f"Python {shown} is not supported (loaderkit supports {oldest} to {newest})"
    newest_torch = PYTHONS[python]
    if newest_torch is not None and parse_version(platform.torch_version)[:2] > newest_torch:
        return (
            f"Python {shown} is supported only up to torch {newest_torch[0]}.{newest_torch[1]} "
            f"(torch {newest_torch[0]}.{newest_torch[1] + 1} ships no Python {shown} wheels): "
            "use Python 3.11 or newer with this torch"
        )
    return None


def _torch(platform: PlatformInfo) -> Check:
    decision = torch_decision(platform)
    python = ".".join(map(str, platform.python_version[:3]))
    finding = f"torch {decision.value} on Python {python}"
    python_note = _python_note(platform)
    if platform.torch_fallbacks:
        return Check(
            "torch",
            WARN,
            finding,
            f"{decision.reason}. Loading works; use a torch loaderkit is tested on for the rest"
            + (f". {python_note}" if python_note else ""),
        )
    version = parse_version(platform.torch_version)
    if not TESTED_FROM <= version[:2] <= TESTED_TO:
        return Check(
            "torch", WARN, finding, decision.reason + (f". {python_note}" if python_note else "")
        )
    if python_note:
        return Check("torch", WARN, finding, f"{python_note}; {decision.reason}")
    return Check("torch", PASS, finding, decision.reason)


def _file_locking(environ: Mapping[str, str]) -> Check:
    value = environ.get("HDF5_USE_FILE_LOCKING")
    if value is None:
        return Check(
            "HDF5 file locking",
            PASS,
            "HDF5_USE_FILE_LOCKING unset (locking on)",
            "on network filesystems (NFS, Lustre, GPFS) or read-only mounts pass "
            "h5py_options={'locking': False} for files nobody writes during training",
        )
    return Check(
        "HDF5 file locking",
        PASS,
        f"HDF5_USE_FILE_LOCKING={value}",
        "this environment variable overrides the locking option of every file open",
    )


@dataclass(frozen=True)
class CacheReport:
    """The node's session cache as read once (``session_cache_report``), for ``_session_cache``.

    Attributes:
        dir: The cache directory.
        text: ``SessionCache.describe()``: usage, limits, hits, misses, bytes fetched, seconds
            waiting, evictions, free disk.
        free: Free bytes on its disk.
        min_free: The free bytes it keeps.
    """

    dir: str
    text: str
    free: int
    min_free: int


def session_cache_report(environ: Mapping[str, str] | None = None) -> CacheReport | None:
    """The session cache that remote datasets would use here, if it exists (else ``None``).

    ``$LOADERKIT_CACHE``, else ``~/.cache/loaderkit``; ``None`` also without the ``remote``
    extra.
    """
    env = os.environ if environ is None else environ
    directory = env.get("LOADERKIT_CACHE") or os.path.expanduser("~/.cache/loaderkit")
    if not os.path.isdir(directory):
        return None
    try:
        from loaderkit.storage import SessionCache

        cache = SessionCache(directory)
        stats = cache.stats()
        return CacheReport(str(cache.dir), cache.describe(), stats.free_bytes, cache.min_free)
    except Exception:  # no extra, or an unreadable directory: nothing to report
        return None


def _session_cache(report: CacheReport | None) -> Check:
    if report is None:
        return Check(
            "session cache",
            PASS,
            "none here ($LOADERKIT_CACHE or ~/.cache/loaderkit does not exist)",
            "remote session files (s3://, gs://...) are fetched into it whole; put it on the "
            "node's local disk (NVMe): export LOADERKIT_CACHE=/local/nvme/loaderkit",
        )
    finding = "; ".join(line.strip() for line in report.text.splitlines())
    if report.free < report.min_free:
        return Check(
            "session cache",
            WARN,
            finding,
            "its disk has less free space than min_free: entries are evicted early, and an "
            "unset min_free is lowered to leave room for one session per reader (not below "
            "1 GiB; a fuller disk is refused); free space, or run `loaderkit cache clear`",
        )
    return Check(
        "session cache",
        PASS,
        finding,
        "`loaderkit fetch URL...` warms it before a job; `loaderkit cache ls|du|clear` shows "
        "and empties it",
    )


def run_checks(
    platform: PlatformInfo,
    *,
    max_open_files: int = 8,
    versions: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
    cache: CacheReport | None = None,
) -> list[Check]:
    """Run every doctor check.

    Args:
        platform: The platform to check.
        max_open_files: The HDF5 handle budget per process to plan for.
        versions: Software versions (default: ``software_versions``).
        environ: Environment (default: ``os.environ``).
        cache: The node's session cache (``session_cache_report``), if any.

    Returns:
        One ``Check`` per topic, in display order.

    Examples:
        >>> from loaderkit.machine.platform import detect_platform
        >>> [c.name for c in run_checks(detect_platform())][:2]
        ['start method', 'workers']
    """
    return [
        _start_method(platform),
        _workers(platform),
        _memory(platform),
        _shared_memory(platform),
        _open_files(platform, max_open_files),
        _cuda(platform),
        _torch(platform),
        _versions(software_versions() if versions is None else versions),
        _file_locking(os.environ if environ is None else environ),
        _session_cache(cache),
    ]
