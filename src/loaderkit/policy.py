"""Policies: pure functions from (requested arguments, platform) to the values a loader uses.

Nothing here reads the machine, creates processes or emits warnings. Each policy returns a
``Decision`` (value + one-line reason); ``resolve`` applies them all to a
``LoaderRequest`` and returns a ``Resolution`` holding the plan entries and the
warning texts for the caller to emit. Because every input is explicit, Windows, macOS, Python
3.14 and CUDA behaviour are tested on any machine by passing a different
``PlatformInfo``.

The rule throughout: **explicit wins**. A policy fills a value only when the caller left it
unset (``None`` for loaderkit's own defaults); torch's own values reproduce torch's behaviour.
The one exception is the Windows zero-worker policy (opt out with
``force_zero_workers_on_windows=False``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Generic, Literal, TypeVar

from loaderkit.collate import collate
from loaderkit.distributed import DistInfo
from loaderkit.errors import ConfigError
from loaderkit.plan import UNSET, PlanEntry
from loaderkit.platform import PlatformInfo, resolve_start_method

__all__ = [
    "MAX_AUTO_WORKERS",
    "SENT_TO_WORKERS",
    "DatasetFacts",
    "Decision",
    "LoaderRequest",
    "Resolution",
    "SamplerChoice",
    "TorchArguments",
    "recommended_num_workers",
    "resolve",
    "resolve_num_workers",
    "resolve_persistent_workers",
    "resolve_pin_memory",
    "resolve_shuffle",
    "torch_arguments",
    "unpicklable_is_error",
]

T = TypeVar("T")

#: Upper bound of ``num_workers="auto"`` per local rank. Past ~8 workers a loader rarely gets
#: faster (the main process's collation and the GPU become the bottleneck), while every worker
#: costs memory (its copy of the dataset, its open files, ``prefetch_factor`` batches in shared
#: memory) and start-up time (a full interpreter under spawn/forkserver).
MAX_AUTO_WORKERS = 8


ShuffleValue = bool | None | Literal["block"]


@dataclass(frozen=True)
class Decision(Generic[T]):
    """A policy's answer: the value to use and a one-line reason.

    Examples:
        >>> Decision(0, "Windows: workers disabled").value
        0
    """

    value: T
    reason: str


@dataclass(frozen=True)
class LoaderRequest:
    """The arguments a caller passed to ``create_dataloader`` / ``loaderkit.DataLoader``.

    ``None`` means "unset" for loaderkit's own defaults (``shuffle``, ``pin_memory``,
    ``persistent_workers``, ``prefetch_factor``, ``training``, ``seed``).
    """

    batch_size: int | None = 1
    shuffle: ShuffleValue = None
    sampler: Any = None
    batch_sampler: Any = None
    num_workers: int | str = 0
    collate_fn: Any = None
    pin_memory: bool | None = None
    drop_last: bool = False
    timeout: float = 0
    worker_init_fn: Any = None
    multiprocessing_context: Any = None
    generator: Any = None
    prefetch_factor: int | None = None
    persistent_workers: bool | None = None
    pin_memory_device: str = ""
    in_order: bool = True
    training: bool | None = None
    seed: int | None = None
    sample_seeding: bool = False
    force_zero_workers_on_windows: bool = True
    distributed: bool | str = "auto"


@dataclass(frozen=True)
class DatasetFacts:
    """What the policies need to know about the dataset (gathered by the caller).

    Attributes:
        iterable: True for an ``IterableDataset``.
        has_getitems: The dataset defines ``__getitems__`` (torch's fetcher reads whole batches).
        supports_block_shuffle: The dataset exposes the session index the block sampler needs.
        max_open_files: Files the dataset keeps open per process (``None`` when unknown).
        type_name: The dataset's class name, for messages.
        read_path: How the dataset reads batches and why (``HDF5SessionDataset.read_path``),
            ``None`` when it does not say.
    """

    iterable: bool = False
    has_getitems: bool = False
    supports_block_shuffle: bool = False
    max_open_files: int | None = None
    type_name: str = "Dataset"
    read_path: tuple[str, str] | None = None


class SamplerChoice:
    """Which sampler loaderkit builds (string constants; ``Resolution.sampler_choice``)."""

    USER = "user"  # the caller's sampler / batch_sampler, untouched
    DEFAULT = "default"  # torch's own Sequential/RandomSampler (from `shuffle`)
    DISTRIBUTED = "distributed"  # torch DistributedSampler (training without a seed)
    ELASTIC = "elastic"  # loaderkit.samplers.ElasticSampler (training with a seed)
    EXACT_SHARD = "exact_shard"  # every sample exactly once across ranks (evaluation)
    SHARD_BATCHES = "shard_batches"  # a user batch_sampler split between ranks
    BLOCK = "block"  # loaderkit.BlockShuffleSampler (shuffle="block")


@dataclass(frozen=True)
class TorchArguments:
    """The keyword arguments loaderkit passes to ``torch.utils.data.DataLoader.__init__``.

    Typed and frozen: built once, by ``torch_arguments``, from a ``Resolution`` and the parts
    built for it (samplers, generator, worker initializer).

    Examples:
        >>> from loaderkit.platform import detect_platform
        >>> res = resolve(LoaderRequest(batch_size=4), DatasetFacts(), detect_platform())
        >>> torch_arguments(res).kwargs()["batch_size"]
        4
    """

    batch_size: int | None
    shuffle: bool | None
    sampler: Any
    batch_sampler: Any
    num_workers: int
    collate_fn: Any
    pin_memory: bool
    drop_last: bool
    timeout: float
    worker_init_fn: Any
    multiprocessing_context: Any
    generator: Any
    prefetch_factor: int | None
    persistent_workers: bool
    pin_memory_device: str
    in_order: bool

    def kwargs(self) -> dict[str, Any]:
        """The arguments as a dict (values are not copied: samplers stay the same objects)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class Resolution:
    """Everything ``resolve`` decided (frozen: later stages read it, never change it).

    Attributes:
        values: Torch keyword arguments as resolved (samplers, generator and worker
            initializer still to be built when ``sampler_choice``/``make_generator`` ask).
        entries: Plan entries in order.
        warnings: Texts of ``LoaderkitWarning`` to emit.
        sampler_choice: A ``SamplerChoice`` constant.
        sampler_shuffle: Whether a loaderkit-built sampler shuffles.
        sampler_seed: Seed for a loaderkit-built sampler (identical on every rank).
        make_generator: True when a seeded ``torch.Generator`` must be created from ``seed``.
        dist: The distributed placement used for the decision.
        start_method: The start method workers will use.
        defers_sharding: True when ``distributed="auto"`` leaves sharding to Accelerate's
            ``accelerator.prepare`` (the loader warns if it is iterated unprepared).
        handoff_slots: Batch slots per worker of loaderkit's hand-off (``loaderkit.worker``);
            0 when batches take torch's path.
        main_threads: torch's intra-op threads in this process during a pass
            (``loaderkit.threads``); ``None`` leaves them alone.
    """

    values: Mapping[str, Any]
    entries: tuple[PlanEntry, ...] = ()
    warnings: tuple[str, ...] = ()
    sampler_choice: str = SamplerChoice.DEFAULT
    sampler_shuffle: bool = False
    sampler_seed: int | None = None
    make_generator: bool = False
    dist: DistInfo = field(default_factory=lambda: DistInfo(initialized=False))
    start_method: str = "fork"
    defers_sharding: bool = False
    handoff_slots: int = 0
    main_threads: int | None = None


@dataclass
class _Draft:
    """``Resolution`` while ``resolve`` fills it in, one policy at a time."""

    values: dict[str, Any]
    entries: list[PlanEntry] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    sampler_choice: str = SamplerChoice.DEFAULT
    sampler_shuffle: bool = False
    sampler_seed: int | None = None
    make_generator: bool = False
    dist: DistInfo = field(default_factory=lambda: DistInfo(initialized=False))
    start_method: str = "fork"
    defers_sharding: bool = False
    handoff_slots: int = 0
    main_threads: int | None = None

    def record(self, name: str, requested: Any, value: Any, reason: str) -> None:
        """Append a plan entry."""
        self.entries.append(PlanEntry(name, requested, value, reason))

    def freeze(self) -> Resolution:
        """The finished ``Resolution`` (every one of its fields, copied read-only)."""
        decided = {f.name: getattr(self, f.name) for f in fields(Resolution)}
        decided.update(
            values=MappingProxyType(dict(self.values)),
            entries=tuple(self.entries),
            warnings=tuple(self.warnings),
        )
        return Resolution(**decided)


def torch_arguments(res: Resolution, built: Mapping[str, Any] | None = None) -> TorchArguments:
    """Torch's DataLoader arguments: the resolved values, with the parts built for them.

    Args:
        res: The resolution.
        built: Objects built from it (``sampler``, ``batch_sampler``, ``generator``,
            ``worker_init_fn``) replacing the resolved values of the same names.

    Returns:
        The ``TorchArguments``.
    """
    values = {**res.values, **(built or {})}
    return TorchArguments(**{f.name: values[f.name] for f in fields(TorchArguments)})


# --------------------------------------------------------------------------- workers


def _windows_forbids_workers(platform: PlatformInfo, force_zero_workers_on_windows: bool) -> bool:
    return platform.is_windows and force_zero_workers_on_windows


def recommended_num_workers(
    platform: PlatformInfo | None = None,
    *,
    local_world_size: int | None = None,
    force_zero_workers_on_windows: bool = True,
) -> int:
    """The worker count ``num_workers="auto"`` uses.

    The usable CPUs (CPU affinity, not ``os.cpu_count()``) are shared between the processes of
    this node (``local_world_size``, default ``LOCAL_WORLD_SIZE`` from the launcher, else 1);
    each rank keeps one CPU for its own training loop and gets the rest as workers, at least 1
    and at most ``MAX_AUTO_WORKERS``. The answer is 0 on Windows while the zero-worker
    policy is on.

    Args:
        platform: The platform to decide for (detected when ``None``).
        local_world_size: Processes per node; overrides the platform's value.
        force_zero_workers_on_windows: Whether the Windows zero-worker policy applies.

    Returns:
        The recommended ``num_workers``.

    Examples:
        >>> from dataclasses import replace
        >>> from loaderkit.platform import detect_platform
        >>> p = replace(detect_platform(), usable_cpus=32, is_windows=False)
        >>> recommended_num_workers(p, local_world_size=4)
        7
    """
    if platform is None:
        from loaderkit.platform import detect_platform

        platform = detect_platform()
    if _windows_forbids_workers(platform, force_zero_workers_on_windows):
        return 0
    ranks = local_world_size or platform.local_world_size or 1
    if ranks < 1:
        raise ConfigError(f"local_world_size must be >= 1, got {ranks}")
    per_rank = platform.usable_cpus // ranks
    return max(1, min(MAX_AUTO_WORKERS, per_rank - 1))


def resolve_num_workers(
    requested: int | str,
    platform: PlatformInfo,
    *,
    force_zero_workers_on_windows: bool = True,
    local_world_size: int | None = None,
) -> Decision[int]:
    """Decide ``num_workers``: ``"auto"`` is resolved, Windows may force 0, else as given.

    Negative or non-integer values are passed through for torch to reject with its own
    ``ValueError`` (drop-in behaviour), except strings other than ``"auto"``.

    Examples:
        >>> from dataclasses import replace
        >>> from loaderkit.platform import detect_platform
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
        return Decision(
            value,
            f"'auto': {platform.usable_cpus} usable CPUs / {ranks} local rank(s), one kept for "
            f"the training loop, capped at {MAX_AUTO_WORKERS}",
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


def resolve_shuffle(
    requested: ShuffleValue,
    *,
    training: bool | None,
    iterable: bool,
    has_sampler: bool,
    has_batch_sampler: bool,
) -> Decision[ShuffleValue]:
    """Decide ``shuffle`` from ``training`` when the caller left it unset.

    ``shuffle="block"`` (locality-aware shuffling for HDF5 session data) is kept as is for the
    sampler policy to handle.

    Examples:
        >>> resolve_shuffle(None, training=True, iterable=False, has_sampler=False,
        ...                 has_batch_sampler=False).value
        True
    """
    if requested is not None:
        if isinstance(requested, str) and requested != "block":
            raise ConfigError(f"shuffle={requested!r}: expected True, False, None or 'block'")
        return Decision(requested, "as given")
    if training is None:
        return Decision(None, "torch default")
    if iterable:
        return Decision(None, "iterable dataset: order is the dataset's own (torch requires None)")
    if has_sampler or has_batch_sampler:
        return Decision(None, "a sampler was given: it decides the order")
    if training:
        return Decision(True, "training=True: a new random order every epoch")
    return Decision(False, "training=False: evaluation keeps the dataset order")


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
        >>> from loaderkit.platform import detect_platform
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


# --------------------------------------------------------------------------- samplers


def _is_distributed_aware(sampler: Any) -> bool:
    """Whether a sampler already splits data between ranks (duck-typed)."""
    if sampler is None:
        return False
    if hasattr(sampler, "num_replicas") and hasattr(sampler, "rank"):
        return True
    inner = getattr(sampler, "sampler", None)
    return inner is not None and inner is not sampler and _is_distributed_aware(inner)


def _sharding_mode(request: LoaderRequest, dist: DistInfo, res: _Draft) -> tuple[bool, bool]:
    """``(sharding, defer)``: whether loaderkit shards, or leaves it to ``accelerator.prepare``."""
    mode = request.distributed
    if mode not in ("auto", True, False):
        raise ConfigError(f"distributed={mode!r}: expected 'auto', True or False")
    if mode is True and not dist.initialized:
        raise ConfigError(
            "distributed=True but torch.distributed is not initialized: call "
            "torch.distributed.init_process_group(...) before building the loader, or pass "
            "distributed='auto' to shard only when a process group exists"
        )
    # Accelerate shards every loader given to accelerator.prepare (it wraps the batch sampler
    # and never checks for a sampler that already shards): "auto" leaves it that job.
    defer = mode == "auto" and dist.is_distributed and dist.accelerate
    sharding = mode is True or (mode == "auto" and dist.is_distributed and not defer)
    if mode is True and dist.is_distributed and dist.accelerate:
        res.warnings.append(
            f"distributed=True in a {dist.world_size}-process Accelerate job: loaderkit shards "
            "this loader itself, so iterate it directly and do not pass it to "
            "accelerator.prepare (which shards it again: each process would see only "
            f"1/{dist.world_size} of its shard). For a loader you prepare, leave "
            "distributed='auto'."
        )
    return sharding, defer


def _where(dist: DistInfo) -> str:
    return f"rank {dist.rank} of {dist.world_size}"


def _resolve_block(
    request: LoaderRequest,
    facts: DatasetFacts,
    dist: DistInfo,
    res: _Draft,
    sharding: bool,
    defer: bool,
) -> None:
    """``shuffle="block"``: a ``BlockShuffleSampler``, sharded by loaderkit or by Accelerate."""
    if facts.iterable or not facts.supports_block_shuffle:
        raise ConfigError(
            f"shuffle='block' needs an HDF5SessionDataset (or a subclass); got "
            f"{facts.type_name}. Use shuffle=True for a uniform shuffle."
        )
    if request.sampler is not None or request.batch_sampler is not None:
        raise ConfigError(
            "shuffle='block' is mutually exclusive with sampler and batch_sampler "
            "(it builds a BlockShuffleSampler)"
        )
    res.sampler_choice = SamplerChoice.BLOCK
    res.sampler_shuffle = True
    same_on_all_ranks = sharding or defer
    res.sampler_seed = (
        request.seed if request.seed is not None else (0 if same_on_all_ranks else None)
    )
    res.values["shuffle"] = None
    res.defers_sharding = defer
    reason = "shuffle='block': shuffled blocks of contiguous rows (sequential reads)"
    if sharding and request.seed is not None:
        reason += (
            f"; {_where(dist)}, elastic: one block order of the whole dataset, this rank reads "
            "a contiguous part of each global batch"
        )
    elif sharding:
        reason += f"; {_where(dist)}, disjoint blocks per rank"
    elif defer:
        reason += f"; {_where(dist)}: the same order on every rank, accelerator.prepare shards it"
    res.record("sampler", request.sampler, "BlockShuffleSampler", reason)


def _resolve_unsharded(request: LoaderRequest, dist: DistInfo, res: _Draft, defer: bool) -> None:
    """No sharding by loaderkit: not distributed, ``distributed=False``, or left to Accelerate."""
    if request.sampler is not None or request.batch_sampler is not None:
        res.sampler_choice = SamplerChoice.USER
    if defer:
        res.defers_sharding = True
        reason = (
            f"{_where(dist)} under Accelerate: accelerator.prepare(loader) shards the batches, "
            "as for torch's DataLoader (iterating this loader unprepared reads every sample)"
        )
    elif request.distributed is False:
        reason = "distributed=False"
    else:
        reason = "not running under torch.distributed with world size > 1"
    res.record("distributed", request.distributed, False, reason)


def _resolve_user_sharding(request: LoaderRequest, dist: DistInfo, res: _Draft) -> None:
    """Sharding a user ``batch_sampler`` or ``sampler``: kept when it shards already."""
    mode, where = request.distributed, _where(dist)
    if request.batch_sampler is not None:
        if _is_distributed_aware(request.batch_sampler):
            res.sampler_choice = SamplerChoice.USER
            res.record("distributed", mode, True, f"{where}: the batch_sampler already shards")
            return
        res.sampler_choice = SamplerChoice.SHARD_BATCHES
        res.sampler_shuffle = False
        padding = (
            " (exact: no batch repeated)"
            if request.training is False
            else " (padded by repeating the first batches so every rank gets the same count)"
        )
        res.record(
            "batch_sampler",
            request.batch_sampler,
            "ShardedBatchSampler",
            f"{where}: your batches are dealt round-robin to ranks{padding}",
        )
        return
    res.sampler_choice = SamplerChoice.USER
    if _is_distributed_aware(request.sampler):
        res.record("distributed", mode, True, f"{where}: your sampler already shards")
        return
    res.warnings.append(
        f"{where}: the sampler {type(request.sampler).__name__} does not split data "
        "between ranks, so every rank reads the same samples. Use "
        "torch.utils.data.DistributedSampler, or leave sampler unset and loaderkit "
        "shards for you (distributed='auto')."
    )
    res.record("distributed", mode, False, f"{where}: your sampler is kept as is")


def _resolve_shards(
    request: LoaderRequest, dist: DistInfo, shuffle: ShuffleValue, res: _Draft
) -> None:
    """Shards loaderkit builds: exact for evaluation, elastic or torch's for training.

    Training with a ``seed`` gets ``ElasticSampler`` (global batches independent of the world
    size), without one torch's ``DistributedSampler``.
    """
    where = _where(dist)
    res.sampler_seed = request.seed if request.seed is not None else 0
    res.values["shuffle"] = None
    res.sampler_shuffle = bool(shuffle)
    if request.training is False:
        res.sampler_choice = SamplerChoice.EXACT_SHARD
        res.record(
            "sampler",
            request.sampler,
            "ShardSampler",
            f"training=False, {where}: an exact contiguous shard, every sample seen once across "
            "ranks (no padded duplicates)",
        )
        return
    if request.seed is not None:
        res.sampler_choice = SamplerChoice.ELASTIC
        res.record(
            "sampler",
            request.sampler,
            "ElasticSampler",
            f"{where}, seed: one order of the whole dataset from (seed, epoch), cut into global "
            f"batches of world_size x batch_size; this rank reads part {dist.rank} of each, so "
            "the global batches do not depend on the world size (drop_last="
            f"{request.drop_last}: the last partial global batch is "
            f"{'dropped' if request.drop_last else 'split evenly between the ranks'})",
        )
        return
    res.sampler_choice = SamplerChoice.DISTRIBUTED
    seed_reason = "seed=0 (DistributedSampler's default)"
    res.record(
        "sampler",
        request.sampler,
        "DistributedSampler",
        f"{where}: shuffle={bool(shuffle)}, drop_last={request.drop_last}, {seed_reason}, "
        "identical on every rank; set_epoch is called every pass",
    )


def _resolve_sampler(
    request: LoaderRequest,
    facts: DatasetFacts,
    dist: DistInfo,
    shuffle: ShuffleValue,
    res: _Draft,
) -> None:
    """Choose the sampler (distributed sharding, block shuffling) and record it."""
    sharding, defer = _sharding_mode(request, dist, res)
    if shuffle == "block":
        _resolve_block(request, facts, dist, res, sharding, defer)
    elif not sharding:
        _resolve_unsharded(request, dist, res, defer)
    elif facts.iterable:
        res.record(
            "distributed",
            request.distributed,
            False,
            "iterable dataset: shard inside __iter__ (torch.utils.data.get_worker_info and the "
            "rank); a sampler cannot split it",
        )
    elif request.batch_sampler is not None or request.sampler is not None:
        _resolve_user_sharding(request, dist, res)
    else:
        _resolve_shards(request, dist, shuffle, res)


# --------------------------------------------------------------------------- resolve


def _asked(value: Any) -> Any:
    """The ``requested`` of a plan entry: ``UNSET`` for a loaderkit default left as None."""
    return UNSET if value is None else value


def _resolve_workers(
    request: LoaderRequest, platform: PlatformInfo, dist: DistInfo, res: _Draft
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
        _asked(request.persistent_workers),
        persistent.value,
        persistent.reason,
    )


def _resolve_start_method(platform: PlatformInfo, res: _Draft) -> None:
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
    res.record("start_method", _asked(context), start_method, reason)


def _resolve_seeds(request: LoaderRequest, facts: DatasetFacts, res: _Draft) -> None:
    """Generator from ``seed``, per-sample seeding, and the worker initializer."""
    if request.seed is not None and request.generator is None:
        res.make_generator = True
        res.record(
            "generator",
            None,
            f"torch.Generator(seed={request.seed})",
            "seed: sampler order and worker seeds are reproducible; epoch n uses a seed "
            "derived from (seed, n)",
        )
    elif request.seed is not None:
        res.record(
            "generator",
            request.generator,
            request.generator,
            "as given (explicit generator wins over seed for the sampler order)",
        )
    if request.sample_seeding:
        if facts.iterable:
            raise ConfigError(
                "sample_seeding=True needs a map-style dataset (samples are seeded from their "
                "index); an IterableDataset has no indices"
            )
        res.record(
            "sample_seeding",
            False,
            True,
            "each sample's RNGs are seeded from (seed, epoch, index): batches do not "
            "depend on num_workers",
        )
    user_fn = request.worker_init_fn
    reason = "per-worker, per-rank seeds for random, numpy and torch"
    if user_fn is None:
        res.record("worker_init_fn", None, "seed_worker", reason)
    else:
        name = getattr(user_fn, "__qualname__", "your function")
        res.record(
            "worker_init_fn",
            user_fn,
            f"seed_worker then {name}",
            reason + "; your worker_init_fn runs after",
        )


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
            ``shuffle="block"`` on a plain dataset, ``distributed=True`` without a process
            group, ``sample_seeding`` on an iterable dataset).

    Examples:
        >>> from loaderkit.platform import detect_platform
        >>> res = resolve(LoaderRequest(training=True), DatasetFacts(), detect_platform())
        >>> res.values["shuffle"]
        True
    """
    if request.training not in (None, True, False):
        raise ConfigError(f"training={request.training!r}: expected True, False or None")
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
    res = _Draft(values={name: getattr(request, name) for name in passed_through}, dist=dist)

    _resolve_workers(request, platform, dist, res)
    _resolve_start_method(platform, res)

    shuffle = resolve_shuffle(
        request.shuffle,
        training=request.training,
        iterable=facts.iterable,
        has_sampler=request.sampler is not None,
        has_batch_sampler=request.batch_sampler is not None,
    )
    res.values["shuffle"] = shuffle.value
    res.record("shuffle", _asked(request.shuffle), shuffle.value, shuffle.reason)
    _resolve_sampler(request, facts, dist, shuffle.value, res)

    _resolve_seeds(request, facts, res)
    if request.sample_seeding and dist.accelerate:
        res.warnings.append(
            "sample_seeding=True in an Accelerate job: accelerator.prepare(loader) rebuilds it "
            "as a plain torch DataLoader, which has no per-sample seeding. Iterate this loader "
            "directly (distributed=True shards it between processes) to keep it."
        )

    pin = resolve_pin_memory(request.pin_memory, platform, request.pin_memory_device)
    res.values["pin_memory"] = pin.value
    res.record("pin_memory", _asked(request.pin_memory), pin.value, pin.reason)
    if facts.has_getitems and not facts.iterable:
        res.record(
            "batched_reads",
            UNSET,
            True,
            f"{facts.type_name} defines __getitems__: each batch is read with one call",
        )
    _resolve_collate(request, facts, res)
    workers = res.values.get("num_workers")
    if isinstance(workers, int) and workers > 0:
        handoff = resolve_handoff(
            platform, res.values.get("prefetch_factor"), pin_memory=bool(pin.value)
        )
        res.handoff_slots = handoff.value
        path = f"slot pool ({handoff.value} per worker)" if handoff.value else "torch"
        res.record("handoff", UNSET, path, handoff.reason)
        threads = resolve_main_threads(platform, workers)
        res.main_threads = threads.value
        kept = "kept" if platform.torch_threads is None else platform.torch_threads
        res.record("main_threads", UNSET, threads.value or kept, threads.reason)
    return res.freeze()


#: Batches a loop usually holds while asking for the next one (the current and the previous:
#: ``for batch in loader`` rebinds ``batch`` only after the next one arrived), plus one spare.
HANDOFF_HELD = 3


def resolve_handoff(
    platform: PlatformInfo, prefetch_factor: int | None, *, pin_memory: bool = False
) -> Decision[int]:
    """How batches cross from workers: slots per worker of loaderkit's pool, or 0 (torch's).

    Each worker gets ``prefetch_factor`` slots for the batches in flight plus
    ``HANDOFF_HELD`` for those the loop still holds; a batch that finds no free slot takes
    torch's path (counted in ``loader.handoff_stats()``), so no batch is ever overwritten.

    Examples:
        >>> from dataclasses import replace
        >>> from loaderkit.platform import detect_platform
        >>> linux = replace(detect_platform(), os_name="Linux", is_windows=False)
        >>> resolve_handoff(linux, 2).value
        5
        >>> resolve_handoff(replace(linux, os_name="Darwin"), 2).value
        0
    """
    if platform.os_name != "Linux":
        return Decision(
            0,
            f"{platform.os_name}: anonymous shared memory (memfd) is Linux-only, so each batch "
            "is a new shared-memory segment (torch's path)",
        )
    slots = (prefetch_factor or 2) + HANDOFF_HELD
    pinned = (
        "; pinned once (cudaHostRegister) so pinning copies nothing"
        if pin_memory and platform.cuda_available
        else ""
    )
    return Decision(
        slots,
        f"each worker fills {slots} long-lived batch slots ({prefetch_factor or 2} in flight + "
        f"{HANDOFF_HELD} held by the loop) in anonymous shared memory, mapped once here: a "
        "batch crosses as a slot number, not a new segment; a slot is reused only once no "
        f"tensor of its batch is alive, else the batch takes torch's path{pinned}",
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
        >>> from loaderkit.platform import detect_platform
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
            None, f"torch's {threads} threads and {num_workers} workers fit in {cpus} CPUs: kept"
        )
    limit = max(1, cpus - num_workers)
    if limit >= threads:
        return Decision(None, f"torch's {threads} thread already leaves the CPUs to the workers")
    return Decision(
        limit,
        f"torch's {threads} intra-op threads here plus {num_workers} workers exceed the {cpus} "
        f"usable CPUs: OpenMP threads spin after every parallel op of the loop and take the CPU "
        f"the workers read with; lowered to {limit} while a pass runs, restored after it (call "
        "torch.set_num_threads or set OMP_NUM_THREADS to keep your own)",
    )


def _resolve_collate(request: LoaderRequest, facts: DatasetFacts, res: _Draft) -> None:
    """Record the dataset's read path; keep a batch read natively as it is (no re-stack)."""
    if facts.read_path is None or facts.iterable:
        return
    path, reason = facts.read_path
    batching = request.batch_size is not None or request.batch_sampler is not None
    if request.sample_seeding and path == "per-sample":
        reason += "; sample_seeding reads each index alone"
    res.record("read_path", UNSET, path, reason)
    if path == "batch-native" and batching and request.collate_fn is None:
        res.values["collate_fn"] = collate
        res.record(
            "collate_fn",
            None,
            "loaderkit.collate",
            "batches read natively are already one tensor: returned as is (no split and "
            "re-stack); anything else goes to default_collate",
        )
