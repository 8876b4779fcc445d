"""``resolve``: every policy applied to one request, in order; pinning and collation.

See ``loaderkit.policy``.
"""

from __future__ import annotations

from loaderkit import _torch
from loaderkit.errors import ConfigError
from loaderkit.machine.distributed import DistInfo
from loaderkit.machine.platform import PlatformInfo
from loaderkit.plan import UNSET
from loaderkit.policy.argcheck import check_arguments
from loaderkit.policy.methods import resolve_worker_method
from loaderkit.policy.request import (
    DatasetFacts,
    Decision,
    Draft,
    LoaderRequest,
    Resolution,
    asked,
)
from loaderkit.policy.sampling import resolve_sampler, resolve_seeds, resolve_shuffle
from loaderkit.policy.workers import (
    HANDOFF_CHOICES,
    decide_start_method,
    resolve_handoff,
    resolve_main_threads,
    resolve_workers,
)
from loaderkit.workers.collate import collate

__all__ = ["resolve", "resolve_pin_memory"]


def resolve_pin_memory(
    requested: bool | None, platform: PlatformInfo, pin_memory_device: str = ""
) -> Decision[bool]:
    """Decide ``pin_memory``: unset means True exactly when CUDA is usable in this process.

    Usable means available (``platform.cuda_available``) and not in a process forked after its
    parent initialised CUDA (``platform.cuda_bad_fork``): there the first pinned batch would
    raise "Cannot re-initialize CUDA in forked subprocess", so pinning stays off, as in torch.
    A ``pin_memory_device`` given without ``pin_memory`` is torch's explicit "configured, not
    pinning" combination, so it keeps torch's default (False).

    Examples:
        >>> from dataclasses import replace
        >>> from loaderkit.machine.platform import detect_platform
        >>> gpu = replace(detect_platform(), cuda_available=True, cuda_bad_fork=False)
        >>> resolve_pin_memory(None, gpu).value
        True
        >>> resolve_pin_memory(None, replace(gpu, cuda_bad_fork=True)).value
        False
    """
    if requested is not None:
        return Decision(bool(requested), "as given")
    if pin_memory_device:
        return Decision(False, "pin_memory_device given without pin_memory: torch's default")
    if platform.cuda_available and platform.cuda_bad_fork:
        return Decision(
            False,
            "CUDA cannot be initialised in this process (forked after the parent initialised "
            "CUDA): pinning would fail at the first batch",
        )
    if platform.cuda_available:
        return Decision(True, "CUDA is available: pinned batches copy to the GPU asynchronously")
    return Decision(False, "no CUDA device: pinning would only cost time")


def resolve(
    request: LoaderRequest,
    facts: DatasetFacts,
    platform: PlatformInfo,
    dist: DistInfo | None = None,
) -> Resolution:
    """Apply every policy to a request.

    Args:
        request: The caller's arguments.
        facts: What the policies need to know about the dataset.
        platform: The platform to decide for.
        dist: The distributed placement (not distributed when ``None``).

    Returns:
        The ``Resolution``: torch keyword values, plan entries and warning texts.

    Raises:
        ConfigError: For values no policy can make work (``num_workers="many"``,
            ``batch_size="64"``, ``prefetch_factor=0``: see ``loaderkit.policy.argcheck``,
            ``shuffle="block"`` on a plain dataset, ``distributed=True`` without a process
            group, ``sample_seeding`` on an iterable dataset).

    Examples:
        >>> from loaderkit.machine.platform import detect_platform
        >>> res = resolve(LoaderRequest(training=True), DatasetFacts(), detect_platform())
        >>> res.values["shuffle"]
        True
    """
    if request.training not in (None, True, False):
        raise ConfigError(f"training={request.training!r}: expected True, False or None")
    check_arguments(request, iterable=facts.iterable)
    dist = dist or DistInfo(initialized=False)
    passed_through = (
        "batch_size",
        "sampler",
        "batch_sampler",
        "collate_fn",
        "drop_last",
        "worker_init_fn",
        "generator",
        "pin_memory_device",
        "in_order",
    )
    res = Draft(values={name: getattr(request, name) for name in passed_through}, dist=dist)

    resolve_workers(request, platform, dist, res)
    decide_start_method(platform, res)
    workers = res.values.get("num_workers")
    method = resolve_worker_method(
        request.worker_method,
        platform,
        facts,
        num_workers=workers if isinstance(workers, int) else 0,
        start_method=res.start_method,
        force_zero_workers_on_windows=request.force_zero_workers_on_windows,
        thread_problem=_torch.thread_info_probe() if workers else None,
    )
    res.worker_method = method.value
    if method.value == "thread":  # no processes start: no start method
        res.entries = [e for e in res.entries if e.name != "start_method"]
    res.record("worker_method", asked(request.worker_method), method.value, method.reason)

    shuffle = resolve_shuffle(
        request.shuffle,
        training=request.training,
        iterable=facts.iterable,
        has_sampler=request.sampler is not None,
        has_batch_sampler=request.batch_sampler is not None,
    )
    res.values["shuffle"] = shuffle.value
    res.record("shuffle", asked(request.shuffle), shuffle.value, shuffle.reason)
    resolve_sampler(request, facts, dist, shuffle.value, res)

    resolve_seeds(request, facts, res)
    if request.sample_seeding and dist.accelerate:
        res.warnings.append(
            "sample_seeding=True in an Accelerate job: accelerator.prepare(loader) rebuilds it "
            "as a plain torch DataLoader, which has no per-sample seeding. Iterate this loader "
            "directly (distributed=True shards it between processes) to keep it."
        )

    pin = resolve_pin_memory(request.pin_memory, platform, request.pin_memory_device)
    res.values["pin_memory"] = pin.value
    res.record("pin_memory", asked(request.pin_memory), pin.value, pin.reason)
    if facts.has_getitems and not facts.iterable:
        res.record(
            "batched_reads",
            UNSET,
            True,
            f"{facts.type_name} defines __getitems__: each batch is read with one call",
        )
    _resolve_collate(request, facts, platform, res)
    workers = res.values.get("num_workers")
    if request.handoff not in HANDOFF_CHOICES:
        resolve_handoff(platform, None, requested=request.handoff)  # raises, naming the choices
    if isinstance(workers, int) and workers > 0 and res.worker_method == "thread":
        res.record(
            "handoff",
            asked_handoff(request.handoff),
            "in memory",
            "worker threads: batches "
            "are Python objects of this process, handed over on a queue (nothing is copied)",
        )
    elif isinstance(workers, int) and workers > 0:
        handoff = resolve_handoff(
            platform,
            res.values.get("prefetch_factor"),
            pin_memory=bool(pin.value),
            requested=request.handoff,
        )
        res.handoff_slots = handoff.value
        path = f"slot pool ({handoff.value} per worker)" if handoff.value else "torch"
        asked_for = UNSET if request.handoff == "auto" else request.handoff
        res.record("handoff", asked_for, path, handoff.reason)
        threads = resolve_main_threads(platform, workers)
        res.main_threads = threads.value
        kept = "kept" if platform.torch_threads is None else platform.torch_threads
        res.record("main_threads", UNSET, threads.value or kept, threads.reason)
    return res.freeze()


def asked_handoff(handoff: str) -> object:
    """The ``requested`` of the ``handoff`` row."""
    return UNSET if handoff == "auto" else handoff


def _resolve_collate(
    request: LoaderRequest, facts: DatasetFacts, platform: PlatformInfo, res: Draft
) -> None:
    """Record the dataset's read path; keep a batch read natively as it is (no re-stack).

    Sparse samples (``DatasetFacts.sparse_samples``) and samples that may hold ``None``
    (``DatasetFacts.missing_values``) need loaderkit's ``collate`` too.
    loaderkit's HDF5 datasets give numpy scalars for scalar rows and record fields; where
    this torch's ``default_collate`` refuses numpy bools (``PlatformInfo.numpy_bools_collate``),
    their batches go through ``loaderkit.workers.collate``, which stacks them as newer torch does.
    """
    if facts.read_path is None or facts.iterable:
        return
    path, reason = facts.read_path
    batching = request.batch_size is not None or request.batch_sampler is not None
    if request.sample_seeding and path == "per-sample":
        reason += "; sample_seeding reads each index alone"
    res.record("read_path", UNSET, path, reason)
    if not batching or request.collate_fn is not None:
        return
    if path == "batch-native":
        why = (
            "batches read natively are already one tensor: returned as is (no split and "
            "re-stack); anything else goes to default_collate"
        )
    elif facts.sparse_samples:
        why = (
            "samples hold sparse tensors (rows of a sparse matrix), which default_collate "
            "refuses: loaderkit.workers.collate.collate stacks 1-D sparse rows into one "
            "sparse CSR batch"
        )
    elif facts.missing_values:
        why = (
            "samples may hold None (a string column's missing values), which default_collate "
            "refuses: loaderkit.workers.collate.collate lists strings and None as they come"
        )
    elif not platform.numpy_bools_collate:
        why = (
            f"torch {platform.torch_version}'s default_collate refuses numpy bool scalars "
            "under this numpy (or warns it soon will): loaderkit.workers.collate.collate is "
            "default_collate that stacks them as newer torch does"
        )
    else:
        return
    res.values["collate_fn"] = collate
    res.record("collate_fn", None, "loaderkit.workers.collate.collate", why)
