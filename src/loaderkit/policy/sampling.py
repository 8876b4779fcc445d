"""Order policies: shuffling, which sampler (block, distributed, elastic, shards), the seeds.

Pure functions of the request, the dataset's facts and the distributed placement; see
``loaderkit.policy``.
"""

from __future__ import annotations

from typing import Any

from loaderkit.errors import ConfigError
from loaderkit.machine.distributed import DistInfo
from loaderkit.policy.request import (
    DatasetFacts,
    Decision,
    Draft,
    LoaderRequest,
    SamplerChoice,
    ShuffleValue,
)

__all__ = ["resolve_sampler", "resolve_seeds", "resolve_shuffle"]


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


# --------------------------------------------------------------------------- samplers


def _is_distributed_aware(sampler: Any) -> bool:
    """Whether a sampler already splits data between ranks (duck-typed)."""
    if sampler is None:
        return False
    if hasattr(sampler, "num_replicas") and hasattr(sampler, "rank"):
        return True
    inner = getattr(sampler, "sampler", None)
    return inner is not None and inner is not sampler and _is_distributed_aware(inner)


def _sharding_mode(request: LoaderRequest, dist: DistInfo, res: Draft) -> tuple[bool, bool]:
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
    res: Draft,
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


def _resolve_unsharded(request: LoaderRequest, dist: DistInfo, res: Draft, defer: bool) -> None:
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


def _resolve_user_sharding(request: LoaderRequest, dist: DistInfo, res: Draft) -> None:
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
    request: LoaderRequest, dist: DistInfo, shuffle: ShuffleValue, res: Draft
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


def resolve_sampler(
    request: LoaderRequest,
    facts: DatasetFacts,
    dist: DistInfo,
    shuffle: ShuffleValue,
    res: Draft,
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


def resolve_seeds(request: LoaderRequest, facts: DatasetFacts, res: Draft) -> None:
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
