"""``LeakCheck``: a block of code, and the descriptors, files, processes and memory it left.

Long training runs die of slow leaks: a descriptor per epoch, a worker process per evaluation
loop, an HDF5 handle per session. ``LeakCheck`` wraps a loop and reports what grew::

    with LeakCheck(raise_on_leak=True) as check:
        for _ in range(50):
            evaluate(model, create_dataloader(dataset, num_workers=2, training=False))
    logger.info("after 50 evaluation loops: %s", check.report)

One-time start-up is not growth: the first pinned batch in a process initialises CUDA (driver
descriptors, a CUDA context, over 100 MiB of RSS) and all of that stays until the process exits.
``LeakCheck`` therefore starts the runtimes a loader would start (``start_runtimes``) *before* it
takes its baseline, and reports that cost apart (``LeakCheck.startup``).

Memory that grows in the workers is not memory that grows here. ``LeakCheck`` samples the USS
of this process's worker processes while the block runs (``resources.WorkerSampler``) and
reports their growth apart from this process's (``LeakReport.workers``).

The snapshots and their comparison are ``loaderkit.memory.resources``.
"""

from __future__ import annotations

import gc
import logging
import time
from dataclasses import replace
from types import TracebackType

import torch

from loaderkit.errors import ResourceLeakError, warn
from loaderkit.machine.platform import PlatformInfo, detect_platform
from loaderkit.memory.resources import (
    LeakReport,
    ResourceSnapshot,
    WorkerSampler,
    compare,
    process_uss,
    snapshot,
)

__all__ = ["LeakCheck", "start_runtimes"]

logger = logging.getLogger("loaderkit")

_MIB = 2**20


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

    While the block runs it samples the USS of this process's worker processes every
    ``worker_sample_s`` seconds (``WorkerSampler``), and reports their growth apart from this
    process's (``report.workers``, ``report.worker_uss_growth``, ``report.uss_growth``): memory
    that grows in the workers only is told apart from memory that grows here. Worker memory is
    reported, never judged.

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
        worker_sample_s: Seconds between samples of the workers' USS (a worker started inside
            the block is first measured within that time of its start); ``None`` samples only
            on entry and exit (workers that start and stop inside the block are then missed).

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
        worker_sample_s: float | None = 0.2,
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
        self.worker_sample_s = worker_sample_s
        self._sampler: WorkerSampler | None = None
        self._uss_before: int | None = None

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
        self._uss_before = process_uss()
        self._sampler = WorkerSampler(interval_s=self.worker_sample_s)
        self._sampler.start()
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
        workers = self._sampler.stop() if self._sampler is not None else ()
        self._sampler = None
        deadline = time.monotonic() + self.settle_s
        while True:
            gc.collect()
            report = compare(self.before, snapshot())
            if not self._leaked(report) or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        report = replace(
            report, workers=workers, uss_before=self._uss_before, uss_after=process_uss()
        )
        self.report = report
        if workers:
            logger.info(
                "LeakCheck: %d worker process(es), USS %+.1f MiB in all; this process %s",
                len(workers),
                report.worker_uss_growth / _MIB,
                "unmeasured"
                if report.uss_growth is None
                else f"USS {report.uss_growth / _MIB:+.1f} MiB",
            )
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
