"""From a loader request to torch arguments: detect, resolve, check, build the parts.

``plan_loader`` is the pipeline behind both ``create_dataloader`` and
``loaderkit.DataLoader``:

1. **detect** the platform (unless one is injected) and the distributed placement;
2. **resolve** every setting with the pure policies of ``loaderkit.policy``;
3. **check** what would otherwise fail later and obscurely: a main script or dataset that
   spawn/forkserver workers cannot run with (``fork`` where the default allows it),
   picklability, Python containers forked workers would copy as they read them
   (copy-on-read), the open-file budget, the size of ``/dev/shm``;
4. **build** the samplers, generator and worker initializer the plan calls for.

Warnings are emitted here (as ``LoaderkitWarning``, advice about speed and memory as
``PerformanceHint``), errors raised as ``ConfigError``; nothing starts a process.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DistributedSampler, IterableDataset, TensorDataset

from loaderkit.checks import (
    LARGE_PICKLE_BYTES,
    Findings,
    check_picklable,
    counted_processes,
    fit_start_method_to,
    pickle_checks,
    worker_processes,
    worker_threads,
)
from loaderkit.errors import ConfigError, PerformanceHint, warn
from loaderkit.hdf5 import BlockShuffleSampler
from loaderkit.machine.distributed import DistInfo, dist_info
from loaderkit.machine.platform import PlatformInfo, detect_platform
from loaderkit.machine.versions import fit_torch_arguments, torch_decision, torch_fallback_warning
from loaderkit.memory.containers import survey_containers
from loaderkit.order.mixing import batch_mix, shuffle_mix
from loaderkit.order.samplers import ElasticSampler, ShardedBatchSampler, ShardSampler
from loaderkit.order.seeding import SampleSeeder, WorkerInit, make_generator, validate_seed
from loaderkit.plan import UNSET, Plan, PlanEntry, counted, short_repr
from loaderkit.policy import (
    DatasetFacts,
    LoaderRequest,
    Resolution,
    SamplerChoice,
    resolve,
    torch_arguments,
)
from loaderkit.policy.argcheck import check_dataset
from loaderkit.policy.budgets import (
    check_open_file_budget,
    check_session_memory,
    check_shared_memory,
    memory_words,
)
from loaderkit.policy.memory import advise_copy_on_read, resolve_gc_freeze
from loaderkit.support import LoaderShape, LoaderSupport, answers, support_of
from loaderkit.workers.collate import collate

__all__ = ["LARGE_PICKLE_BYTES", "LoaderSetup", "dataset_facts", "plan_loader"]

logger = logging.getLogger("loaderkit")

#: torch fallbacks already warned about in this process (once each).
_WARNED_FALLBACKS: set[tuple[str, tuple[str, ...]]] = set()


@dataclass
class LoaderSetup:
    """Everything a loader needs from the pipeline.

    Attributes:
        torch_kwargs: Keyword arguments for ``torch.utils.data.DataLoader.__init__`` (all but
            ``dataset``).
        plan: The resolved plan (value and reason per setting).
        platform: The platform the plan was made for.
        seed: The validated ``seed`` argument (``None`` when not given).
        owns_generator: True when loaderkit created the generator from ``seed`` (it is
            reseeded from ``(seed, epoch)`` at every pass).
        sample_seeder: Set when ``sample_seeding=True``.
        defers_sharding: ``distributed="auto"`` left sharding to ``accelerator.prepare``.
        handoff_slots: Batch slots per worker of loaderkit's hand-off (0: torch's path).
        main_threads: torch's threads in this process during a pass (``None``: untouched).
        worker_method: ``"process"`` or ``"thread"``: what carries the workers.
    """

    torch_kwargs: dict[str, Any]
    plan: Plan
    platform: PlatformInfo
    seed: int | None
    owns_generator: bool
    sample_seeder: SampleSeeder | None
    defers_sharding: bool = False
    handoff_slots: int = 0
    main_threads: int | None = None
    worker_method: str = "process"


def dataset_facts(dataset: Any, support: LoaderSupport | None = None) -> DatasetFacts:
    """Gather what the policies need to know about ``dataset`` (without reading samples).

    Args:
        dataset: The loader's dataset.
        support: Its ``LoaderSupport`` (default: ``support_of(dataset)``).

    Examples:
        >>> dataset_facts([1, 2, 3]).iterable
        False
    """
    support = support_of(dataset) if support is None else support
    return DatasetFacts(
        iterable=isinstance(dataset, IterableDataset),
        has_getitems=callable(getattr(dataset, "__getitems__", None)),
        supports_block_shuffle=answers(support, "session_index"),
        max_open_files=support.resources().open_files,
        type_name=type(dataset).__name__,
        read_path=support.read_path(),
        thread_safe=support.thread_safe,
        sparse_samples=support.sparse_samples,
        missing_values=support.missing_values,
    )


def _sample_nbytes(dataset: Any, support: LoaderSupport) -> int | None:
    """Bytes of one sample when known without reading data."""
    known = support.sample_nbytes()
    if known is not None:
        return known
    if isinstance(dataset, TensorDataset) and dataset.tensors and len(dataset.tensors[0]):
        return int(sum(t[0].numel() * t.element_size() for t in dataset.tensors if t.dim()))
    return None


#: Sampler choices loaderkit builds itself (the caller's and torch's defaults are left as is).
_BUILT_SAMPLERS = (
    SamplerChoice.BLOCK,
    SamplerChoice.DISTRIBUTED,
    SamplerChoice.ELASTIC,
    SamplerChoice.EXACT_SHARD,
)


def _dataset_size(dataset: Any) -> int | None:
    """``len(dataset)`` for a map-style dataset, ``None`` when it has no length."""
    if isinstance(dataset, IterableDataset):
        return None
    try:
        return len(dataset)
    except TypeError:
        return None


def _check_not_empty(dataset: Any, request: LoaderRequest, res: Resolution) -> None:
    """Refuse a dataset with no samples when loaderkit builds or fills its shuffling sampler.

    torch's ``RandomSampler`` refuses an empty dataset with a ``ValueError``; the samplers
    loaderkit builds (``shuffle="block"``, distributed shards) would silently give 0 batches a
    pass. ``shuffle=False``/``None`` with no sampler stays torch's (0 batches, no error).
    """
    choice = res.sampler_choice
    shuffled = (
        choice == SamplerChoice.DEFAULT
        and res.values.get("shuffle") is True
        and request.sampler is None
        and request.batch_sampler is None
    )
    if choice not in _BUILT_SAMPLERS and not shuffled:
        return
    if _dataset_size(dataset) != 0:
        return
    name = type(dataset).__name__
    files = getattr(dataset, "files", None)
    said = support_of(dataset).empty_reason()
    if said is not None:
        why = said
    elif isinstance(files, Mapping) and files:
        paths = [str(path) for path in list(files.values())[:3]]
        more = f" and {len(files) - 3} more" if len(files) > 3 else ""
        why = (
            f"every one of its {len(files)} session file(s) has 0 rows (or build_index() "
            f"returned no entries): {', '.join(paths)}{more}"
        )
    else:
        why = "len(dataset) is 0"
    sampler = {
        SamplerChoice.BLOCK: "shuffle='block' (BlockShuffleSampler)",
        SamplerChoice.DISTRIBUTED: "a DistributedSampler (distributed training)",
        SamplerChoice.ELASTIC: "an ElasticSampler (distributed training with a seed)",
        SamplerChoice.EXACT_SHARD: "a ShardSampler (distributed evaluation)",
    }.get(choice, "shuffle=True (RandomSampler)")
    raise ConfigError(
        f"the dataset {name} has no samples: {why}. A loader with {sampler} would yield 0 "
        "batches every epoch (torch's RandomSampler refuses it: num_samples should be a "
        "positive integer value, but got num_samples=0). Fix: check the files and the key, "
        "or that a filter did not drop every row."
    )


def _build_sampler(dataset: Any, request: LoaderRequest, res: Resolution) -> dict[str, Any]:
    """Instantiate the sampler the resolution chose: ``{"sampler": ...}``, or ``{}``."""
    dist = res.dist
    choice = res.sampler_choice
    batch_size = res.values.get("batch_size") or 1  # None (no batching): one sample a step
    if choice == SamplerChoice.BLOCK:
        kwargs: dict[str, Any] = {"seed": res.sampler_seed}
        if not res.defers_sharding and (dist.is_distributed or request.distributed is True):
            kwargs.update(num_replicas=dist.world_size, rank=dist.rank, drop_last=request.drop_last)
        else:
            kwargs.update(num_replicas=1, rank=0)
        if request.seed is not None:  # elastic: global batches independent of the world size
            kwargs["batch_size"] = batch_size
        return {"sampler": BlockShuffleSampler(dataset, **kwargs)}
    if choice == SamplerChoice.ELASTIC:
        return {
            "sampler": ElasticSampler(
                dataset,
                batch_size=batch_size,
                num_replicas=dist.world_size,
                rank=dist.rank,
                shuffle=res.sampler_shuffle,
                seed=res.sampler_seed or 0,
                drop_last=request.drop_last,
            )
        }
    if choice == SamplerChoice.DISTRIBUTED:
        sampler: Any = DistributedSampler(
            dataset,
            num_replicas=dist.world_size,
            rank=dist.rank,
            shuffle=res.sampler_shuffle,
            seed=res.sampler_seed or 0,
            drop_last=request.drop_last,
        )
        return {"sampler": sampler}
    if choice == SamplerChoice.EXACT_SHARD:
        sampler = ShardSampler(
            dataset,
            num_replicas=dist.world_size,
            rank=dist.rank,
            shuffle=res.sampler_shuffle,
            seed=res.sampler_seed or 0,
        )
        return {"sampler": sampler}
    if choice == SamplerChoice.SHARD_BATCHES:
        batch_sampler = ShardedBatchSampler(
            request.batch_sampler,
            num_replicas=dist.world_size,
            rank=dist.rank,
            even=request.training is not False,
        )
        return {"batch_sampler": batch_sampler}
    return {}


def _bind_sampler(
    dataset: Any, request: LoaderRequest, res: Resolution, seed: int | None
) -> PlanEntry | None:
    """Give a caller's sampler with ``bind_loader`` (``WeightedSampler``) what it left unset.

    The loader's ``seed``, ``batch_size`` and ``drop_last``, its place among the ranks where
    loaderkit shards (else one replica) and the dataset's length. Returns the plan row that
    says so, or ``None``.
    """
    sampler = request.sampler
    bind = getattr(sampler, "bind_loader", None)
    if res.sampler_choice != SamplerChoice.USER or not callable(bind):
        return None
    dist = res.dist
    shards = not res.defers_sharding and request.distributed is not False and dist.is_distributed
    reason = bind(
        seed=seed,
        batch_size=res.values.get("batch_size"),
        drop_last=request.drop_last,
        num_replicas=dist.world_size if shards else 1,
        rank=dist.rank if shards else 0,
        dataset_length=_dataset_size(dataset),
    )
    return PlanEntry("sampler", sampler, sampler, f"your {type(sampler).__name__}: {reason}")


def _check_copy_on_read(dataset: Any, res: Resolution, found: Findings) -> None:
    """Name the dataset's large Python containers that forked workers would each copy."""
    num_workers = worker_processes(res)
    if not num_workers:
        return
    try:
        survey = survey_containers(dataset)
    except Exception as exc:  # an exotic object in the dataset: the survey is only advice
        logger.debug("loaderkit: copy-on-read survey failed", exc_info=True)
        reason = f"not checked: the survey failed ({type(exc).__name__}: {exc})"
        found.entries.append(PlanEntry("copy_on_read", UNSET, "unknown", reason))
        return
    advice = advise_copy_on_read(survey, res.start_method, num_workers)
    found.entries.append(PlanEntry("copy_on_read", UNSET, advice.value, advice.reason))
    if advice.hint is not None:
        found.hints.append(advice.hint)


def _plan_gc_freeze(res: Resolution, found: Findings) -> bool:
    """Whether workers freeze what they inherited from the garbage collector (plan row)."""
    num_workers = worker_processes(res)
    if not num_workers:
        return False
    decision = resolve_gc_freeze(res.start_method, num_workers)
    found.entries.append(PlanEntry("gc_freeze", UNSET, decision.value, decision.reason))
    return decision.value


def _check_resources(
    dataset: Any,
    support: LoaderSupport,
    res: Resolution,
    platform: PlatformInfo,
    found: Findings,
) -> None:
    """Open-file budget (per process) and ``/dev/shm`` size for the resolved worker count."""
    num_workers = counted_processes(res)
    if not isinstance(num_workers, int) or num_workers < 0:
        return
    held = support.resources()
    files = held.open_files
    budget = check_open_file_budget(
        num_workers,
        files,
        platform.open_files_soft,
        binding=files is not None,
        fds_per_file=held.fds_per_file,
        main_fds=platform.open_fds,
        start_method=res.start_method,
        hard_limit=platform.open_files_hard,
        fitted=held.fitted,
    )
    if budget.level == "error":
        raise ConfigError(budget.message)
    if budget.level != "ok":
        found.warnings.append(budget.message)
    batch_size = res.values.get("batch_size") or 1
    sample = _sample_nbytes(dataset, support)
    shm = check_shared_memory(
        num_workers,
        res.values.get("prefetch_factor"),
        sample * batch_size if sample else None,
        platform.shm_bytes,
        pool_slots=res.handoff_slots,
        memory_bytes=platform.memory_bytes,
        memory_source=platform.memory_source,
    )
    if shm.level == "warn":
        found.warnings.append(shm.message)
    if held.held_bytes:
        memory = check_session_memory(
            num_workers, held.held_bytes, platform.memory_bytes, platform.memory_source
        )
        if memory.level == "warn":
            found.warnings.append(memory.message)


def _note_torch(platform: PlatformInfo, found: Findings) -> None:
    """The plan's first row (``torch``), and the fallback warning once per torch and fallbacks."""
    torch_row = torch_decision(platform)
    found.entries.insert(0, PlanEntry("torch", UNSET, torch_row.value, torch_row.reason))
    fallback = torch_fallback_warning(platform)
    key = (platform.torch_version, platform.torch_fallbacks)
    if fallback is not None and key not in _WARNED_FALLBACKS:
        _WARNED_FALLBACKS.add(key)
        found.warnings.append(fallback)


def _note_limits(platform: PlatformInfo, found: Findings) -> None:
    """The plan's rows ``memory`` and ``cpus``, with where each figure came from.

    Every fitted budget starts from the one, every worker and thread count from the other:
    a cgroup limit on the process's path, physical memory, the CPU affinity.
    """
    if platform.memory_bytes is not None:
        reason = (
            f"{platform.memory_source}: held sessions, open files' chunk buffers, reads around "
            "a miss and ahead, and the slot pool are fitted to it"
        )
        found.entries.insert(
            1, PlanEntry("memory", UNSET, memory_words(platform.memory_bytes), reason)
        )
    found.entries.insert(
        2 if platform.memory_bytes is not None else 1,
        PlanEntry("cpus", UNSET, platform.usable_cpus, platform.cpus_source),
    )


def _plan_header(platform: PlatformInfo, dist: DistInfo) -> str:
    """The plan's first line: the platform it was made for."""
    return (
        f"loaderkit plan: {platform.os_name}, Python "
        f"{'.'.join(map(str, platform.python_version))}, torch {platform.torch_version}, "
        f"{counted(platform.usable_cpus, 'usable CPU')}, "
        f"CUDA {'yes' if platform.cuda_available else 'no'}"
        + (f", rank {dist.rank}/{dist.world_size}" if dist.initialized else "")
    )


#: blocks up to which the plan computes a block order's mix from the order itself (its
#: session window is a Python loop over the blocks: ~1 s a million)
MIX_BLOCKS = 200_000


def _note_mix(
    dataset: Any, support: LoaderSupport, request: LoaderRequest, res: Resolution, sampler: Any
) -> PlanEntry | None:
    """The plan row ``mix``: how well the epoch's order mixes the dataset's files.

    ``loaderkit.order_mix``'s figure (a batch's file entropy over the corpus's), for a dataset
    of two sessions or more and a batch size: from the order itself for a block order
    (``BlockShuffleSampler``, loaderkit's or the caller's; up to ``MIX_BLOCKS`` blocks), from
    the files' sizes for a uniform shuffle (``shuffle_mix``, its expected value: nothing random
    is drawn), exactly for file order. ``None`` (no row) for any other order.
    """
    batch = res.values.get("batch_size")
    index = support.session_index() if answers(support, "session_index") else None
    if not batch or index is None or index.sessions < 2:
        return None
    positions = np.asarray(index.positions, np.int64)
    if isinstance(sampler, BlockShuffleSampler):
        size = sampler.global_batch_size or batch
        fetch = f", fetch {sampler.fetch_factor}" if sampler.fetch_factor else ""
        what = f"block {sampler.block_size}{fetch}"
        if sampler.num_blocks > MIX_BLOCKS:
            why = (
                f"not computed for {counted(sampler.num_blocks, 'block')} ({what}); "
                "loaderkit.order_mix(dataset, sampler.global_indices(), batch_size) computes it"
            )
            return PlanEntry("mix", UNSET, "not computed", why)
        value = batch_mix(positions[sampler.global_indices()], size)  # order_mix, index held
        why = f"epoch {sampler.epoch} of the block order ({what})"
    elif _shuffles_uniformly(res):
        value = shuffle_mix(np.bincount(positions, minlength=index.sessions), batch)
        why = "a uniform shuffle, expected from the files' sizes"
    elif res.sampler_choice == SamplerChoice.DEFAULT and request.sampler is None:
        value = batch_mix(positions, batch)
        why = "file order (shuffle=False)"
    else:
        return None
    return PlanEntry("mix", UNSET, round(value, 2), why)


def _shuffles_uniformly(res: Resolution) -> bool:
    """Whether loaderkit's sampler shuffles every index uniformly (torch's or a sharded one)."""
    if res.sampler_choice == SamplerChoice.DEFAULT:
        return res.values.get("shuffle") is True
    return res.sampler_shuffle and res.sampler_choice in (
        SamplerChoice.DISTRIBUTED,
        SamplerChoice.ELASTIC,
        SamplerChoice.EXACT_SHARD,
    )


def plan_loader(
    dataset: Any, request: LoaderRequest, platform: PlatformInfo | None = None
) -> LoaderSetup:
    """Run detect → resolve → check → build for one loader.

    Args:
        dataset: The dataset the loader will read.
        request: The caller's arguments.
        platform: A platform to plan for instead of detecting this machine.

    Returns:
        The ``LoaderSetup``.

    Raises:
        ConfigError: For settings that cannot work (see ``loaderkit.policy.resolve``), an
            object that spawn/forkserver workers cannot receive, or an open-file budget over
            the limit.
        TypeError, ValueError: For an invalid ``seed``.

    Examples:
        >>> setup = plan_loader(list(range(4)), LoaderRequest(training=True))
        >>> setup.torch_kwargs["shuffle"]
        True
    """
    seed = validate_seed(request.seed) if request.seed is not None else None
    if platform is None:
        # The multiprocessing_context argument is applied by the policy (an invalid one is
        # left for torch to reject with its own error).
        platform = detect_platform()
    elif not isinstance(platform, PlatformInfo):
        raise ConfigError(f"platform must be a loaderkit.PlatformInfo, got {type(platform)!r}")
    dist = dist_info()
    check_dataset(dataset)
    support = support_of(dataset)
    facts = dataset_facts(dataset, support)
    res = resolve(request, facts, platform, dist)
    _check_not_empty(dataset, request, res)

    found = Findings(warnings=list(res.warnings), entries=list(res.entries))
    _note_torch(platform, found)
    _note_limits(platform, found)
    fit_torch_arguments(torch_arguments(res).kwargs(), platform)  # refused before any side effect
    checks = pickle_checks(dataset, request, res)
    res = fit_start_method_to(res, platform, checks, found)
    if isinstance(counted_processes(res), int):
        # the dataset's own budgets fitted to this loader's readers (applied where unset),
        # before the checks and the block sampler (its window) read them
        fitted = support.fit(
            LoaderShape(
                processes=max(0, counted_processes(res)),
                threads=worker_threads(res),
                start_method=res.start_method,
                open_files_soft=platform.open_files_soft,
                memory_bytes=platform.memory_bytes,
                open_fds=platform.open_fds,
                uniform_shuffle=_shuffles_uniformly(res),
                memory_source=platform.memory_source,
                block_order=res.sampler_choice == SamplerChoice.BLOCK,
            )
        )
        found.entries.extend(fitted.entries)
        found.hints.extend(fitted.hints)  # e.g. a uniform shuffle through a small node cache
    check_picklable(checks, res, found)
    _check_copy_on_read(dataset, res, found)
    freeze_gc = _plan_gc_freeze(res, found)
    _check_resources(dataset, support, res, platform, found)
    for message in found.warnings:
        warn(message)
    for message in found.hints:
        warn(message, PerformanceHint)

    built = _build_sampler(dataset, request, res)
    bound = _bind_sampler(dataset, request, res, seed)
    if bound is not None:
        found.entries.append(bound)
    mix = _note_mix(dataset, support, request, res, built.get("sampler", request.sampler))
    if mix is not None:
        found.entries.append(mix)
    if res.make_generator:
        assert seed is not None
        built["generator"] = make_generator(seed)
    built["worker_init_fn"] = WorkerInit(
        rank=dist.rank,
        world_size=dist.world_size,
        user_fn=request.worker_init_fn,
        shared_batches=res.values.get("collate_fn") is collate,
        freeze_gc=freeze_gc,
    )
    seeder = None
    if request.sample_seeding:
        seeder = SampleSeeder(seed if seed is not None else torch.initial_seed())

    plan = Plan(found.entries, header=_plan_header(platform, dist))
    logger.debug("%s", plan.describe())
    if plan.changes():
        logger.info(
            "loaderkit filled in: %s",
            ", ".join(f"{e.name}={short_repr(e.value)}" for e in plan.changes()),
        )
    return LoaderSetup(
        torch_kwargs=fit_torch_arguments(torch_arguments(res, built).kwargs(), platform),
        plan=plan,
        platform=platform,
        seed=seed,
        owns_generator=res.make_generator,
        sample_seeder=seeder,
        defers_sharding=res.defers_sharding,
        handoff_slots=res.handoff_slots,
        main_threads=res.main_threads,
        worker_method=res.worker_method,
    )
