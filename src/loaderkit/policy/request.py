"""The types the policies exchange: the caller's request, facts, decisions, the resolution.

``LoaderRequest`` is what the caller passed, ``DatasetFacts`` what the policies need to know
about the dataset, ``Decision`` one policy's answer (defined in ``loaderkit.plan``, re-exported
here), ``Draft`` the resolution while ``resolve`` fills it in and ``Resolution`` the frozen
result; ``TorchArguments`` are the keyword arguments for torch's ``DataLoader`` built from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Literal

from loaderkit.machine.distributed import DistInfo
from loaderkit.plan import UNSET, Decision, PlanEntry

__all__ = [
    "DatasetFacts",
    "Decision",
    "Draft",
    "LoaderRequest",
    "Resolution",
    "SamplerChoice",
    "ShuffleValue",
    "TorchArguments",
    "asked",
    "torch_arguments",
]

ShuffleValue = bool | None | Literal["block"]


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
    force_zero_workers_on_windows: bool | None = None
    distributed: bool | str = "auto"
    handoff: str = "auto"
    worker_method: str | None = None


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
        thread_safe: The dataset says it can be read by several threads at once.
        sparse_samples: The dataset's samples hold sparse tensors.
        missing_values: The dataset's samples may hold ``None`` (missing strings).
    """

    iterable: bool = False
    has_getitems: bool = False
    supports_block_shuffle: bool = False
    max_open_files: int | None = None
    type_name: str = "Dataset"
    read_path: tuple[str, str] | None = None
    thread_safe: bool = False
    sparse_samples: bool = False
    missing_values: bool = False


class SamplerChoice:
    """Which sampler loaderkit builds (string constants; ``Resolution.sampler_choice``)."""

    USER = "user"  # the caller's sampler / batch_sampler, untouched
    DEFAULT = "default"  # torch's own Sequential/RandomSampler (from `shuffle`)
    DISTRIBUTED = "distributed"  # torch DistributedSampler (training without a seed)
    ELASTIC = "elastic"  # loaderkit.order.samplers.ElasticSampler (training with a seed)
    EXACT_SHARD = "exact_shard"  # every sample exactly once across ranks (evaluation)
    SHARD_BATCHES = "shard_batches"  # a user batch_sampler split between ranks
    BLOCK = "block"  # loaderkit.BlockShuffleSampler (shuffle="block")


@dataclass(frozen=True)
class TorchArguments:
    """The keyword arguments loaderkit passes to ``torch.utils.data.DataLoader.__init__``.

    Typed and frozen: built once, by ``torch_arguments``, from a ``Resolution`` and the parts
    built for it (samplers, generator, worker initializer).

    Examples:
        >>> from loaderkit.machine.platform import detect_platform
        >>> from loaderkit.policy import resolve
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
        handoff_slots: Batch slots per worker of loaderkit's hand-off
        (``loaderkit.workers.worker``);
            0 when batches take torch's path.
        main_threads: torch's intra-op threads in this process during a pass
            (``loaderkit.machine.intraop_threads``); ``None`` leaves them alone.
        worker_method: ``"process"`` or ``"thread"`` (``loaderkit.policy.methods``).
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
    worker_method: str = "process"


@dataclass
class Draft:
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
    worker_method: str = "process"

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


def asked(value: Any) -> Any:
    """The ``requested`` of a plan entry: ``UNSET`` for a loaderkit default left as None."""
    return UNSET if value is None else value
