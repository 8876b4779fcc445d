"""Worker policies: how many, persistent or not, the start method, torch's threads, the hand-off.

Pure functions of the request and a ``PlatformInfo``; see ``loaderkit.policy``.
"""

from __future__ import annotations

from loaderkit.errors import ConfigError
from loaderkit.machine.distributed import DistInfo
from loaderkit.machine.platform import PlatformInfo, resolve_start_method
from loaderkit.plan import counted
from loaderkit.policy.request import Decision, Draft, LoaderRequest, asked

__all__ = [
    "HANDOFF_CHOICES",
    "HANDOFF_HELD",
    "MAX_AUTO_WORKERS",
    "SENT_TO_WORKERS",
    "decide_start_method",
    "recommended_num_workers",
    "resolve_handoff",
    "resolve_main_threads",
    "resolve_num_workers",
    "resolve_persistent_workers",
    "resolve_workers",
    "unpicklable_is_error",
]

#: Upper bound of ``num_workers="auto"`` per local rank. Past ~8 workers a loader rarely gets
#: faster (the main process's collation and the GPU become the bottleneck), while every worker
#: costs memory (its copy of the dataset, its open files, ``prefetch_factor`` batches in shared
#: memory) and start-up time (a full interpreter under spawn/forkserver).
MAX_AUTO_WORKERS = 8


# --------------------------------------------------------------------------- workers


def _windows_forbids_workers(
    platform: PlatformInfo, force_zero_workers_on_windows: bool | None
) -> bool:
    """The zero-worker policy: Windows and ``force_zero_workers_on_windows=True`` (given)."""
    return platform.is_windows and force_zero_workers_on_windows is True


def recommended_num_workers(
    platform: PlatformInfo | None = None,
    *,
    local_world_size: int | None = None,
    force_zero_workers_on_windows: bool | None = True,
) -> int:
    """The worker count ``num_workers="auto"`` uses.

    The usable CPUs (``PlatformInfo.usable_cpus``: the CPU affinity, or the cgroup's CPU quota
    when lower; not ``os.cpu_count()``) are shared between the processes of this node
    (``local_world_size``, default ``LOCAL_WORLD_SIZE`` from the launcher, else 1); each rank
    keeps one CPU for its own training loop and gets the rest as workers, at most
    ``MAX_AUTO_WORKERS``. A rank with one CPU or less gets none: a worker process would only
    take turns with the training loop on that CPU, and hold memory of its own. The answer is
    0 on Windows while the zero-worker policy is on.

    Args:
        platform: The platform to decide for (detected when ``None``).
        local_world_size: Processes per node; overrides the platform's value.
        force_zero_workers_on_windows: Whether the Windows zero-worker policy applies.

    Returns:
        The recommended ``num_workers``.

    Examples:
        >>> from dataclasses import replace
        >>> from loaderkit.machine.platform import detect_platform
        >>> p = replace(detect_platform(), usable_cpus=32, is_windows=False)
        >>> recommended_num_workers(p, local_world_size=4)
        7
        >>> recommended_num_workers(replace(p, usable_cpus=1))  # e.g. a quota of half a CPU
        0
    """
    if platform is None:
        from loaderkit.machine.platform import detect_platform

        platform = detect_platform()
    if _windows_forbids_workers(platform, force_zero_workers_on_windows):
        return 0
    ranks = local_world_size or platform.local_world_size or 1
    if ranks < 1:
        raise ConfigError(f"local_world_size must be >= 1, got {ranks}")
    per_rank = platform.usable_cpus // ranks
    return max(0, min(MAX_AUTO_WORKERS, per_rank - 1))


def resolve_num_workers(
    requested: int | str,
    platform: PlatformInfo,
    *,
    force_zero_workers_on_windows: bool | None = True,
    local_world_size: int | None = None,
) -> Decision[int]:
    """Decide ``num_workers``: ``"auto"`` is resolved, Windows may force 0, else as given.

    Negative or non-integer values are passed through for torch to reject with its own
    ``ValueError`` (drop-in behaviour), except strings other than ``"auto"``.

    Examples:
        >>> from dataclasses import replace
        >>> from loaderkit.machine.platform import detect_platform
        >>> win = replace(detect_platform(), os_name="Windows", is_windows=True)
        >>> resolve_num_workers(4, win).value
        0
    """
    if isinstance(requested, str):
        if requested != "auto":
            raise ConfigError(f"num_workers={requested!r}: expected a non-negative int or 'auto'")
        value = recommended_num_workers(
            platform,
            local_world_size=local_world_size,
            force_zero_workers_on_windows=force_zero_workers_on_windows,
        )
        if _windows_forbids_workers(platform, force_zero_workers_on_windows):
            return Decision(0, "'auto' on Windows: worker processes are off (zero-worker policy)")
        ranks = local_world_size or platform.local_world_size or 1
        cpus = platform.usable_cpus
        outcome = (
            "no worker processes (one CPU or less a rank)"
            if value == 0
            else f"at most {MAX_AUTO_WORKERS}"
        )
        return Decision(
            value,
            f"'auto': {counted(cpus, 'usable CPU')} ({platform.cpus_source}) / "
            f"{counted(ranks, 'local rank')}, one kept for the training loop: {outcome}",
        )
    if (
        isinstance(requested, int)
        and requested > 0
        and _windows_forbids_workers(platform, force_zero_workers_on_windows)
    ):
        return Decision(
            0,
            "Windows: worker processes start slowly and crash on unpicklable state; loading "
            "in the main process (pass force_zero_workers_on_windows=False to keep workers)",
        )
    return Decision(requested, "as given")


def resolve_persistent_workers(
    requested: bool | None, *, training: bool | None, num_workers: int
) -> Decision[bool]:
    """Decide ``persistent_workers`` from ``training`` when the caller left it unset.

    Examples:
        >>> resolve_persistent_workers(None, training=True, num_workers=2).value
        True
        >>> resolve_persistent_workers(None, training=False, num_workers=2).value
        False
    """
    if requested is not None:
        return Decision(bool(requested), "as given")
    if training is True and isinstance(num_workers, int) and num_workers > 0:
        return Decision(True, "training=True: workers are kept between epochs (no restart cost)")
    if training is False:
        return Decision(False, "training=False: workers exit after each pass (guaranteed cleanup)")
    return Decision(False, "torch default")


def resolve_workers(
    request: LoaderRequest, platform: PlatformInfo, dist: DistInfo, res: Draft
) -> None:
    """``num_workers`` and the options that only exist with workers."""
    workers = resolve_num_workers(
        request.num_workers,
        platform,
        force_zero_workers_on_windows=request.force_zero_workers_on_windows,
        local_world_size=dist.local_world_size if dist.initialized else None,
    )
    num_workers = workers.value
    res.values["num_workers"] = num_workers
    res.record("num_workers", request.num_workers, num_workers, workers.reason)
    forced_off = (
        isinstance(request.num_workers, int) and request.num_workers > 0 and num_workers == 0
    )
    if forced_off:
        res.warnings.append(
            f"Windows: num_workers={request.num_workers} became 0 (loading in the main "
            "process); pass force_zero_workers_on_windows=False to keep worker processes"
        )

    persistent = resolve_persistent_workers(
        request.persistent_workers, training=request.training, num_workers=num_workers
    )
    res.values["persistent_workers"] = persistent.value
    res.values["prefetch_factor"] = request.prefetch_factor
    res.values["multiprocessing_context"] = request.multiprocessing_context
    res.values["timeout"] = request.timeout
    if forced_off:
        # torch rejects these without workers: drop what the Windows policy made meaningless.
        dropped = "dropped: no worker processes under the Windows policy"
        if request.persistent_workers:
            persistent = Decision(False, dropped)
            res.values["persistent_workers"] = False
        for name, empty in (
            ("prefetch_factor", None),
            ("multiprocessing_context", None),
            ("timeout", 0),
        ):
            if getattr(request, name):
                res.values[name] = empty
                res.record(name, getattr(request, name), empty, dropped)
    res.record(
        "persistent_workers",
        asked(request.persistent_workers),
        persistent.value,
        persistent.reason,
    )


def decide_start_method(platform: PlatformInfo, res: Draft) -> None:
    """The start method workers will use: the context argument, else the platform's."""
    context = res.values["multiprocessing_context"]
    if context is not None:
        try:
            start_method, source = resolve_start_method(context, None, platform.start_method)
        except TypeError:  # an invalid context: torch raises its own error for it
            start_method, source = "invalid", "argument"
    else:
        start_method, source = platform.start_method, platform.start_method_source
    res.start_method = start_method
    if not res.values["num_workers"]:
        return
    python = ".".join(map(str, platform.python_version[:2]))
    reason = {
        "argument": "multiprocessing_context argument",
        "global": "set globally with multiprocessing.set_start_method",
        "default": f"default on {platform.os_name} with Python {python}",
    }.get(source, source)
    if start_method != "fork":
        reason += "; dataset, collate_fn and worker_init_fn are pickled for each worker"
    res.record("start_method", asked(context), start_method, reason)


# --------------------------------------------------------------------------- pickling


#: Loader arguments torch pickles for every spawn/forkserver worker.
SENT_TO_WORKERS = ("dataset", "collate_fn", "worker_init_fn")


def unpicklable_is_error(name: str) -> bool:
    """Whether an argument that cannot be pickled makes a spawn/forkserver loader fail.

    True for what torch sends to every worker (``SENT_TO_WORKERS``): the workers would crash
    at start. False for what torch keeps in the main process (``sampler``,
    ``batch_sampler``): the loader works, as it does under torch, so it is only a warning.

    Examples:
        >>> unpicklable_is_error("dataset"), unpicklable_is_error("sampler")
        (True, False)
    """
    return name in SENT_TO_WORKERS


#: Pieces of torch's internals (``loaderkit._torch.PIECES``) the slot pool needs.
_SLOT_PIECES = ("loader hooks", "iterators", "slot storage")

#: Batches a loop usually holds while asking for the next one (the current and the previous:
#: ``for batch in loader`` rebinds ``batch`` only after the next one arrived), plus one spare.
HANDOFF_HELD = 3


#: What ``handoff=`` accepts: loaderkit decides, the slot pool, or torch's own hand-off.
HANDOFF_CHOICES = ("auto", "slots", "torch")


def resolve_handoff(
    platform: PlatformInfo,
    prefetch_factor: int | None,
    *,
    pin_memory: bool = False,
    requested: str = "auto",
) -> Decision[int]:
    """How batches cross from workers: slots per worker of loaderkit's pool, or 0 (torch's).

    Each worker gets ``prefetch_factor`` slots for the batches in flight plus
    ``HANDOFF_HELD`` for those the loop still holds; a batch the loop keeps beyond those is
    copied out of its slot in this process, so a worker never waits for a slot and no kept
    batch holds a descriptor (``loader.handoff_stats()`` counts them). ``requested`` is the
    ``handoff=`` argument: ``"auto"`` (the pool where it can work), ``"slots"`` (the pool, or a
    ``ConfigError`` where it cannot work) or ``"torch"`` (torch's own hand-off: a new shared
    memory segment per batch, e.g. to rule the pool out while debugging).

    Raises:
        ConfigError: ``requested`` is not one of ``HANDOFF_CHOICES``, or ``"slots"`` where the
            pool cannot work.

    Examples:
        >>> from dataclasses import replace
        >>> from loaderkit.machine.platform import detect_platform
        >>> linux = replace(detect_platform(), os_name="Linux", is_windows=False)
        >>> resolve_handoff(linux, 2).value
        5
        >>> resolve_handoff(linux, 2, requested="torch").value
        0
        >>> resolve_handoff(replace(linux, os_name="Darwin"), 2).value
        0
    """
    if requested not in HANDOFF_CHOICES:
        raise ConfigError(
            f"handoff={requested!r}: expected one of {', '.join(map(repr, HANDOFF_CHOICES))} "
            "('auto': loaderkit's slot pool where it works; 'torch': torch's own hand-off)."
        )
    if requested == "torch":
        return Decision(
            0,
            "as given: torch's own hand-off (each batch a new shared-memory segment, "
            "mapped and unmapped per batch)",
        )
    unavailable = None
    if platform.os_name != "Linux":
        unavailable = (
            f"{platform.os_name}: anonymous shared memory (memfd) is Linux-only, so each batch "
            "is a new shared-memory segment (torch's path)"
        )
    else:
        changed = [p for p in _SLOT_PIECES if p in platform.torch_fallbacks]
        if changed:
            unavailable = (
                f"torch {platform.torch_version} changed what the slot pool relies on "
                f"({', '.join(changed)}): each batch is a new shared-memory segment (torch's "
                "path)"
            )
    if unavailable is not None:
        if requested == "slots":
            raise ConfigError(
                f"handoff='slots' cannot work here: {unavailable}. Leave handoff unset "
                "('auto') to use torch's hand-off where the slot pool cannot work."
            )
        return Decision(0, unavailable)
    slots = (prefetch_factor or 2) + HANDOFF_HELD
    pinned = (
        "; on CUDA, batches are pinned by torch's caching allocator (DevicePrefetcher reads "
        "the slots, registered once, directly)"
        if pin_memory and platform.cuda_available
        else ""
    )
    given = "as given: " if requested == "slots" else ""
    return Decision(
        slots,
        f"{given}each worker fills {slots} long-lived batch slots ({prefetch_factor or 2} in "
        f"flight + {HANDOFF_HELD} held by the loop) in anonymous shared memory, mapped once "
        "here: a batch crosses as a slot number, not a new segment; a slot is reused only once "
        "no tensor of its batch is alive, and a batch the loop keeps beyond those is copied out "
        f"here{pinned}",
    )


def resolve_main_threads(platform: PlatformInfo, num_workers: int) -> Decision[int | None]:
    """Torch's intra-op threads in this process while a pass of ``num_workers`` workers runs.

    Where torch's threads plus the workers exceed the usable CPUs, the threads are lowered to
    the CPUs the workers leave (at least 1) for each pass: OpenMP threads spin-wait after every
    parallel op of the loop and would take the CPU the workers read with. A count the user
    chose (``PlatformInfo.torch_threads_chosen``) is kept, as is one that fits.

    Returns:
        The thread count during a pass, or ``None`` to leave torch's threads alone.

    Examples:
        >>> from dataclasses import replace
        >>> from loaderkit.machine.platform import detect_platform
        >>> two = replace(detect_platform(), usable_cpus=2, torch_threads=2)
        >>> resolve_main_threads(two, 1).value
        1
        >>> resolve_main_threads(replace(two, torch_threads_chosen=True), 1).value is None
        True
        >>> resolve_main_threads(replace(two, usable_cpus=16), 8).value is None
        True
    """
    threads, cpus = platform.torch_threads, platform.usable_cpus
    if threads is None:
        return Decision(None, "torch's thread count is unknown: left alone")
    if platform.torch_threads_chosen:
        return Decision(None, f"torch's {threads} intra-op threads were chosen by you: kept")
    if threads + num_workers <= cpus:
        return Decision(
            None,
            f"torch's {counted(threads, 'thread')} and {counted(num_workers, 'worker')} fit in "
            f"{counted(cpus, 'CPU')}: kept",
        )
    limit = max(1, cpus - num_workers)
    if limit >= threads:
        return Decision(None, f"torch's {threads} thread already leaves the CPUs to the workers")
    return Decision(
        limit,
        f"torch's {threads} intra-op threads here plus {counted(num_workers, 'worker')} exceed "
        f"the {cpus} "
        f"usable CPUs: OpenMP threads spin after every parallel op of the loop and take the CPU "
        f"the workers read with; lowered to {limit} while a pass runs, restored after it (call "
        "torch.set_num_threads or set OMP_NUM_THREADS to keep your own)",
    )
