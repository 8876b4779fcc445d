"""What a process holds: open file descriptors, open files, child processes, memory.

Long training runs die of slow leaks: a descriptor per epoch, a worker process per evaluation
loop, an HDF5 handle per session. ``snapshot`` records what the current process (and its
children) hold; ``LeakCheck`` wraps a loop and reports what grew::

    with LeakCheck(raise_on_leak=True) as check:
        for _ in range(50):
            evaluate(model, create_dataloader(dataset, num_workers=2, training=False))
    logger.info("after 50 evaluation loops: %s", check.report)

Everything is read with psutil, so it works on Linux, macOS and Windows (descriptor counts are
handle counts on Windows).

One-time start-up is not growth: the first pinned batch in a process initialises CUDA (driver
descriptors, a CUDA context, over 100 MiB of RSS) and all of that stays until the process exits.
``LeakCheck`` therefore starts the runtimes a loader would start (``start_runtimes``) *before* it
takes its baseline, and reports that cost apart (``LeakCheck.startup``).
"""

from __future__ import annotations

import gc
import logging
import os
import time
from dataclasses import dataclass, field
from types import TracebackType

import psutil
import torch

from loaderkit.errors import ResourceLeakError, warn
from loaderkit.platform import PlatformInfo, detect_platform

__all__ = [
    "ChildProcess",
    "LeakCheck",
    "LeakReport",
    "ResourceLeakError",
    "ResourceSnapshot",
    "compare",
    "snapshot",
    "start_runtimes",
    "worker_processes",
]

logger = logging.getLogger("loaderkit")

_MIB = 2**20


#: Command-line markers of multiprocessing's own long-lived helpers: one per parent process,
#: started on first use of spawn/forkserver, alive until the parent exits. Not leaks.
_MP_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


@dataclass(frozen=True)
class ChildProcess:
    """A child process at snapshot time.

    Attributes:
        pid: Process id.
        name: Process name.
        status: psutil status (``"running"``, ``"sleeping"``, ``"zombie"``...).
        rss: Resident memory in bytes (0 when unreadable).
        helper: True for multiprocessing's resource tracker or forkserver (one per parent,
            alive until it exits: not counted as a leak).
    """

    pid: int
    name: str
    status: str
    rss: int
    helper: bool = False


@dataclass(frozen=True)
class ResourceSnapshot:
    """What one process held at one moment.

    Attributes:
        pid: The process measured.
        time: ``time.monotonic()`` when taken.
        num_fds: Open file descriptors (handles on Windows), ``None`` when unreadable.
        open_files: Paths of regular files open in the process (sorted, with repeats).
        children: Live child processes (recursive), zombies excluded.
        rss: Resident memory of the process in bytes.

    Examples:
        >>> snap = snapshot()
        >>> snap.rss > 0
        True
    """

    pid: int
    time: float
    num_fds: int | None
    open_files: tuple[str, ...]
    children: tuple[ChildProcess, ...] = field(default_factory=tuple)
    rss: int = 0

    @property
    def children_rss(self) -> int:
        """Resident memory of all children together, in bytes."""
        return sum(child.rss for child in self.children)

    def describe(self) -> str:
        """One line: descriptors, files, children, memory."""
        return (
            f"pid {self.pid}: {self.num_fds} fds, {len(self.open_files)} open files, "
            f"{len(self.children)} child processes, RSS {self.rss / _MIB:.1f} MiB"
            + (f" (+{self.children_rss / _MIB:.1f} MiB in children)" if self.children else "")
        )


def _is_helper(child: psutil.Process, parent_pid: int) -> bool:
    """Whether ``child`` is multiprocessing's resource tracker or forkserver server.

    Forkserver workers inherit the server's command line, so only a direct child qualifies.
    """
    return child.ppid() == parent_pid and any(
        marker in " ".join(child.cmdline()) for marker in _MP_HELPERS
    )


def worker_processes(pid: int | None = None) -> list[psutil.Process]:
    """Live descendants of a process, without multiprocessing's own helper processes.

    DataLoader workers (and anything else the process started), not the resource tracker or
    forkserver server that multiprocessing keeps for the life of the process.

    Example:
        >>> worker_processes() == [] or True
        True
    """
    parent = psutil.Process(pid or os.getpid())
    out = []
    for child in parent.children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE and not _is_helper(child, parent.pid):
                out.append(child)
        except psutil.Error:
            continue
    return out


def _num_fds(process: psutil.Process) -> int | None:
    try:
        if hasattr(process, "num_fds"):
            return int(process.num_fds())
        return int(process.num_handles())  # pragma: no cover - Windows
    except (psutil.Error, OSError):
        return None


def snapshot(pid: int | None = None, *, children: bool = True) -> ResourceSnapshot:
    """Record the descriptors, open files, children and memory of a process.

    Args:
        pid: Process to measure (default: this one).
        children: Also list live child processes (recursively) with their memory.

    Returns:
        A ``ResourceSnapshot``.

    Examples:
        >>> before = snapshot()
        >>> f = open(__file__)
        >>> snapshot().num_fds == before.num_fds + 1
        True
        >>> f.close()
    """
    process = psutil.Process(pid or os.getpid())
    with process.oneshot():
        try:
            files = tuple(sorted(f.path for f in process.open_files()))
        except (psutil.Error, OSError):
            files = ()
        try:
            rss = int(process.memory_info().rss)
        except (psutil.Error, OSError):
            rss = 0
        num_fds = _num_fds(process)
    kids: list[ChildProcess] = []
    if children:
        for child in process.children(recursive=True):
            try:
                with child.oneshot():
                    status = child.status()
                    if status == psutil.STATUS_ZOMBIE:
                        continue
                    helper = _is_helper(child, process.pid)
                    child_rss = int(child.memory_info().rss)
                    kids.append(ChildProcess(child.pid, child.name(), status, child_rss, helper))
            except (psutil.Error, OSError):
                continue
    return ResourceSnapshot(
        pid=process.pid,
        time=time.monotonic(),
        num_fds=num_fds,
        open_files=files,
        children=tuple(kids),
        rss=rss,
    )


@dataclass(frozen=True)
class LeakReport:
    """What grew between two snapshots.

    Attributes:
        before: The first snapshot.
        after: The second snapshot.
        fd_growth: Change in open descriptors.
        new_open_files: Files open after that were not before (with multiplicity).
        new_children: Child processes alive after that were not before (multiprocessing's
            resource tracker and forkserver excluded).
        new_helpers: Multiprocessing helpers (resource tracker, forkserver) started in
            between; each keeps one descriptor open in this process until it exits, which
            ``leaked`` does not count.
        rss_growth: Change in resident memory of the process, in bytes.

    Examples:
        >>> report = compare(snapshot(), snapshot())
        >>> report.leaked()
        False
    """

    before: ResourceSnapshot
    after: ResourceSnapshot
    fd_growth: int
    new_open_files: tuple[str, ...]
    new_children: tuple[ChildProcess, ...]
    rss_growth: int
    new_helpers: tuple[ChildProcess, ...] = ()

    def leaked(self, *, fd_tolerance: int = 0, rss_tolerance: int | None = None) -> bool:
        """Whether descriptors, files or processes grew (and memory, when a tolerance is set).

        Args:
            fd_tolerance: Descriptors allowed to stay open (logging handlers, caches).
            rss_tolerance: Bytes of memory growth allowed; ``None`` ignores memory (the
                allocator keeps freed memory, so small growth is not a leak).
        """
        fds = self.fd_growth - len(self.new_helpers)
        if fds > fd_tolerance or self.new_open_files or self.new_children:
            return True
        return rss_tolerance is not None and self.rss_growth > rss_tolerance

    def __str__(self) -> str:
        lines = [
            f"file descriptors: {self.before.num_fds} -> {self.after.num_fds} "
            f"({self.fd_growth:+d})",
            f"child processes: {len(self.before.children)} -> {len(self.after.children)}",
            f"RSS: {self.before.rss / _MIB:.1f} -> {self.after.rss / _MIB:.1f} MiB "
            f"({self.rss_growth / _MIB:+.1f} MiB)",
        ]
        if self.new_open_files:
            lines.append("files still open: " + ", ".join(self.new_open_files))
        if self.new_children:
            lines.append(
                "processes still running: "
                + ", ".join(f"{c.pid} ({c.name}, {c.status})" for c in self.new_children)
            )
        return "\n".join(lines)


def compare(before: ResourceSnapshot, after: ResourceSnapshot) -> LeakReport:
    """Report what grew from ``before`` to ``after``.

    Examples:
        >>> compare(snapshot(), snapshot()).new_children
        ()
    """
    remaining = list(before.open_files)
    new_files = []
    for path in after.open_files:
        if path in remaining:
            remaining.remove(path)
        else:
            new_files.append(path)
    old_pids = {child.pid for child in before.children}
    fds_before = before.num_fds or 0
    fds_after = after.num_fds or 0
    return LeakReport(
        before=before,
        after=after,
        fd_growth=fds_after - fds_before,
        new_open_files=tuple(new_files),
        new_children=tuple(c for c in after.children if c.pid not in old_pids and not c.helper),
        rss_growth=after.rss - before.rss,
        new_helpers=tuple(c for c in after.children if c.pid not in old_pids and c.helper),
    )


def _cuda_initialized() -> bool:
    return bool(torch.cuda.is_initialized())


def _start_cuda() -> None:
    """What the first pinned batch of a loader does to CUDA: context, pinned host allocator."""
    torch.cuda.init()
    torch.empty(1).pin_memory()


def start_runtimes(platform: PlatformInfo | None = None) -> tuple[str, ...]:
    """Start, once per process, the runtimes a loader would start on its first batch.

    Today that is CUDA, where it is usable in this process (available and not a child forked
    after its parent initialised it, ``PlatformInfo.cuda_usable``): loaderkit pins batches
    there by default, and the first pinned batch creates the CUDA context and the pinned host
    allocator, whose descriptors and memory stay until the process exits. Where CUDA is
    already initialised, or not usable, nothing happens.

    Args:
        platform: The platform to decide for (default: ``detect_platform()``).

    Returns:
        The names of the runtimes started now (``("CUDA",)`` or ``()``).

    Examples:
        >>> from dataclasses import replace
        >>> start_runtimes(replace(detect_platform(), cuda_available=False))
        ()
    """
    platform = platform or detect_platform()
    if not platform.cuda_usable or _cuda_initialized():
        return ()
    _start_cuda()
    return ("CUDA",)


class LeakCheck:
    """Context manager that reports descriptors, files, processes and memory that grew.

    The rule for one-time start-up: on entry, before taking its baseline, it starts the
    runtimes a loader would start in this process (``start_runtimes``: CUDA where it is usable
    and not yet initialised, since loaderkit pins batches there by default). Their start-up
    (CUDA's driver descriptors and context) is a cost paid once per process, not growth; it is
    measured and kept apart in ``startup`` and never judged. Pass ``warmup=False`` to take the
    baseline as the process is (CUDA then stays uninitialised, and a first CUDA use inside the
    block counts as growth).

    On exit it collects garbage and gives worker processes up to ``settle_s`` seconds to exit
    (they shut down asynchronously), then compares with the baseline. A leak emits a
    ``LoaderkitWarning``, or raises ``ResourceLeakError`` with ``raise_on_leak=True``. The
    report stays available as ``report``. Batches you still hold at exit count: a batch from a
    worker process keeps a shared-memory descriptor open.

    Args:
        fd_tolerance: Descriptors allowed to stay open.
        rss_tolerance: Bytes of RSS growth allowed; ``None`` (default) reports memory without
            judging it.
        settle_s: Seconds to wait for descriptors and child processes to return to the
            starting point before judging.
        raise_on_leak: Raise instead of warning.
        warmup: Start the runtimes a loader would start before taking the baseline.
        platform: The platform ``warmup`` decides for (default: ``detect_platform()``).

    Attributes:
        report: What grew (``LeakReport``), set on exit.
        startup: What the warm-up added (``LeakReport``), ``None`` when it started nothing.
        started: Names of the runtimes the warm-up started (``("CUDA",)`` or ``()``).

    Examples:
        >>> from loaderkit import create_dataloader
        >>> with LeakCheck(raise_on_leak=True) as check:
        ...     with create_dataloader(list(range(8)), num_workers=2) as loader:
        ...         batches = sum(1 for _ in loader)
        >>> batches, check.report.new_children, check.report.leaked()
        (8, (), False)
    """

    def __init__(
        self,
        *,
        fd_tolerance: int = 0,
        rss_tolerance: int | None = None,
        settle_s: float = 5.0,
        raise_on_leak: bool = False,
        warmup: bool = True,
        platform: PlatformInfo | None = None,
    ) -> None:
        self.fd_tolerance = fd_tolerance
        self.rss_tolerance = rss_tolerance
        self.settle_s = settle_s
        self.raise_on_leak = raise_on_leak
        self.warmup = warmup
        self.platform = platform
        self.before: ResourceSnapshot | None = None
        self.report: LeakReport | None = None
        self.startup: LeakReport | None = None
        self.started: tuple[str, ...] = ()

    def __enter__(self) -> LeakCheck:
        gc.collect()
        self.before = snapshot()
        self.startup, self.started = None, ()
        if self.warmup:
            self.started = start_runtimes(self.platform)
            if self.started:
                gc.collect()
                start, self.before = self.before, snapshot()
                self.startup = compare(start, self.before)
                logger.info(
                    "LeakCheck: %s start-up before the baseline (not counted): %+d fds, "
                    "%+.1f MiB RSS",
                    "/".join(self.started),
                    self.startup.fd_growth,
                    self.startup.rss_growth / _MIB,
                )
        return self

    def _leaked(self, report: LeakReport) -> bool:
        return report.leaked(fd_tolerance=self.fd_tolerance, rss_tolerance=self.rss_tolerance)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        assert self.before is not None, "LeakCheck exited without entering"
        deadline = time.monotonic() + self.settle_s
        while True:
            gc.collect()
            report = compare(self.before, snapshot())
            if not self._leaked(report) or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        self.report = report
        if exc_type is not None or not self._leaked(report):
            return
        message = f"resources grew inside LeakCheck:\n{report}"
        if self.startup is not None:
            message += (
                f"\n(not counted: {'/'.join(self.started)} start-up before the baseline, "
                f"{self.startup.fd_growth:+d} fds, {self.startup.rss_growth / _MIB:+.1f} MiB RSS)"
            )
        if self.raise_on_leak:
            raise ResourceLeakError(message)
        warn(message)
