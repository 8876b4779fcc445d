"""What a process holds: open file descriptors, open files, child processes, memory.

Long training runs die of slow leaks: a descriptor per epoch, a worker process per evaluation
loop, an HDF5 handle per session. ``snapshot`` records what the current process (and its
children) hold, ``compare`` says what grew between two snapshots (``LeakReport``), and
``WorkerSampler`` samples the unique set size (USS: pages no other process shares) of this
process's worker processes, so that growth in the workers is told apart from growth here:
forked workers that copy the dataset's Python objects as they read them (copy-on-read) grow by
the size of those objects each, while this process does not.

Everything is read with psutil, so it works on Linux, macOS and Windows (descriptor counts are
handle counts on Windows).

``LeakCheck``, the context manager built on these, and ``start_runtimes`` live in
``loaderkit.memory.leakcheck``, which imports this module (never the other way).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import psutil

from loaderkit.errors import ResourceLeakError

__all__ = [
    "ChildProcess",
    "LeakReport",
    "ResourceLeakError",
    "ResourceSnapshot",
    "WorkerMemory",
    "WorkerSampler",
    "compare",
    "process_uss",
    "snapshot",
    "worker_processes",
    "worker_uss",
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


def _own(children: Sequence[ChildProcess]) -> int:
    """Children that are not multiprocessing's helpers (forkserver server, resource tracker)."""
    return sum(not c.helper for c in children)


def _helpers_note(children: Sequence[ChildProcess]) -> str:
    """`` (+ N of multiprocessing's helpers, kept for the process's life)`` or ``""``."""
    helpers = len(children) - _own(children)
    if not helpers:
        return ""
    return f" (+ {helpers} of multiprocessing's helpers, kept for the process's life)"


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


def process_uss(pid: int | None = None) -> int | None:
    """Unique set size of a process in bytes: the memory it alone holds (``None`` if unreadable).

    What a process would give back if it exited; unlike RSS it does not count the pages a
    forked worker still shares with its parent.

    Examples:
        >>> process_uss() > 0
        True
    """
    try:
        return int(psutil.Process(pid or os.getpid()).memory_full_info().uss)
    except (psutil.Error, OSError, AttributeError):  # gone, not ours, or no USS on this OS
        return None


def worker_uss(pid: int | None = None) -> dict[int, int]:
    """USS in bytes of each live worker process of a process (``worker_processes``), by pid.

    Examples:
        >>> worker_uss() == {} or True
        True
    """
    out = {}
    for child in worker_processes(pid):
        uss = process_uss(child.pid)
        if uss:  # 0: exiting, its memory already gone
            out[child.pid] = uss
    return out


@dataclass(frozen=True)
class WorkerMemory:
    """The unique memory (USS) of one worker process, from when it was first seen to the last.

    Attributes:
        pid: Process id.
        first_uss: USS in bytes when first seen: when sampling began for a worker that already
            ran, else its first sample after it started.
        last_uss: USS in bytes when last seen alive.
        peak_uss: The largest USS sampled.
        samples: How many times it was measured.
        started_inside: It started after sampling began (inside the ``LeakCheck`` block).

    Examples:
        >>> WorkerMemory(7, 10 * 2**20, 310 * 2**20, 310 * 2**20, 5).growth // 2**20
        300
    """

    pid: int
    first_uss: int
    last_uss: int
    peak_uss: int
    samples: int
    started_inside: bool = False

    @property
    def growth(self) -> int:
        """``last_uss - first_uss`` in bytes."""
        return self.last_uss - self.first_uss


class WorkerSampler:
    """Samples the USS of a process's worker processes, in a background thread.

    Worker processes start and exit inside the code being measured (a loader without
    persistent workers stops them at the end of every pass), so their memory is sampled every
    ``interval_s`` seconds while it runs, and once more when ``stop`` is called.

    Args:
        pid: The process whose workers (live descendants, multiprocessing's helpers excluded)
            are sampled; default: this one.
        interval_s: Seconds between samples; ``None`` samples only at ``start`` and ``stop``.

    Examples:
        >>> sampler = WorkerSampler(interval_s=None)
        >>> sampler.start()
        >>> sampler.stop()
        ()
    """

    def __init__(self, pid: int | None = None, interval_s: float | None = 0.2) -> None:
        self.pid = pid or os.getpid()
        self.interval_s = interval_s
        self._records: dict[int, list[int]] = {}  # pid -> [first, last, peak, samples, inside]
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = False

    def sample(self) -> None:
        """Measure every live worker now."""
        inside = int(self._started)
        measured = worker_uss(self.pid)
        with self._lock:
            for pid, uss in measured.items():
                record = self._records.get(pid)
                if record is None:
                    self._records[pid] = [uss, uss, uss, 1, inside]
                else:
                    record[1], record[2], record[3] = uss, max(record[2], uss), record[3] + 1

    def _run(self) -> None:
        assert self.interval_s is not None
        while not self._stop.wait(self.interval_s):
            self.sample()

    def start(self) -> None:
        """Take the first sample (workers already running) and start sampling."""
        self.sample()
        self._started = True
        if self.interval_s is not None:
            self._thread = threading.Thread(
                target=self._run, name="loaderkit-worker-uss", daemon=True
            )
            self._thread.start()

    def stop(self) -> tuple[WorkerMemory, ...]:
        """Stop sampling, take a last sample, and return what each worker did, by pid."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.sample()
        with self._lock:
            return tuple(
                WorkerMemory(pid, first, last, peak, count, bool(inside))
                for pid, (first, last, peak, count, inside) in sorted(self._records.items())
            )


#: Worker growth (per worker, on average) from which a report points at copy-on-read.
_COPY_ON_READ_NOTE_BYTES = 64 * _MIB


def _workers_lines(
    workers: tuple[WorkerMemory, ...], uss_before: int | None, uss_after: int | None
) -> list[str]:
    """The report's memory lines: worker USS growth, this process's, and what it suggests."""
    lines = []
    own = None if uss_before is None or uss_after is None else uss_after - uss_before
    if workers:
        total = sum(w.growth for w in workers)
        mean = total / len(workers)
        inside = sum(w.started_inside for w in workers)
        started = f", {inside} started inside the block" if inside else ""
        first = sum(w.first_uss for w in workers) / len(workers)
        last = sum(w.last_uss for w in workers) / len(workers)
        lines.append(
            f"worker processes: {len(workers)} seen{started}; USS {mean / _MIB:+.1f} MiB each on "
            f"average, from first seen to last seen ({first / _MIB:.1f} -> {last / _MIB:.1f} "
            f"MiB; {total / _MIB:+.1f} MiB in all)"
        )
        if mean >= _COPY_ON_READ_NOTE_BYTES and (own is None or mean > 4 * max(own, 0)):
            lines.append(
                "  the workers grew, this process did not: with forked workers that is "
                "typically each worker copying the dataset's Python objects as it reads them "
                "(copy-on-read, bounded by their size), not a leak; loader.plan['copy_on_read'] "
                "names them, loaderkit.SharedSequence avoids it"
            )
    if own is not None:
        lines.append(f"this process: USS {own / _MIB:+.1f} MiB")
    return lines


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
        workers: USS of each worker process over the measured code (``LeakCheck`` samples
            them; ``()`` from ``compare``).
        uss_before: USS of the process at the start, in bytes (``LeakCheck``; else ``None``).
        uss_after: USS of the process at the end, in bytes.

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
    workers: tuple[WorkerMemory, ...] = ()
    uss_before: int | None = None
    uss_after: int | None = None

    @property
    def uss_growth(self) -> int | None:
        """Change in this process's USS in bytes (``None`` when not measured)."""
        if self.uss_before is None or self.uss_after is None:
            return None
        return self.uss_after - self.uss_before

    @property
    def worker_uss_growth(self) -> int:
        """The workers' USS growth in bytes, all workers together (``WorkerMemory.growth``)."""
        return sum(worker.growth for worker in self.workers)

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
            f"child processes: {_own(self.before.children)} -> {_own(self.after.children)}"
            + _helpers_note(self.after.children),
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
        lines += _workers_lines(self.workers, self.uss_before, self.uss_after)
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
