"""``create_dataloader()``: the function form of ``loaderkit.DataLoader``.

Written as a class whose ``__new__`` returns a ``loaderkit.DataLoader``: calling it is
calling a function, and ``create_dataloader[T]`` works in annotations exactly where code
written for torch says ``DataLoader[T]`` (PEP 560), so swapping the name is always drop-in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils.data import Dataset, Sampler

from loaderkit.loader import DataLoader
from loaderkit.platform import PlatformInfo

__all__ = ["create_dataloader"]


class create_dataloader:
    """Build a ``loaderkit.DataLoader``: torch's DataLoader with the unset parts made safe.

    Every ``torch.utils.data.DataLoader`` argument keeps its name, position, default and
    meaning; passing torch's own values reproduces torch's behaviour (except the Windows
    policy). loaderkit only fills what you leave unset, and records each decision in
    ``loader.plan`` (``print(loader.describe())``).

    Args:
        dataset: Map-style or iterable dataset, as in torch.
        batch_size: As in torch (``None`` disables automatic batching).
        shuffle: As in torch. ``None`` (unset): ``training=True`` → True, ``training=False`` →
            False, else torch's default (False). ``"block"``: locality-aware shuffling of an
            ``HDF5SessionDataset`` with a
            ``BlockShuffleSampler`` (sequential reads, batches still mix
            sessions).
        sampler: As in torch. Under ``torch.distributed`` a sampler that does not shard is kept
            with a ``LoaderkitWarning``.
        batch_sampler: As in torch. Under ``torch.distributed`` its batches are dealt to ranks
            unless it already shards.
        num_workers: As in torch, or ``"auto"`` → ``recommended_num_workers``
            (CPU-affinity aware, per local rank, capped at 8). *Windows policy*: on Windows,
            while ``force_zero_workers_on_windows`` is True, any value becomes 0 with a
            warning.
        collate_fn: As in torch. Checked for picklability under spawn/forkserver.
        pin_memory: ``None`` (unset) → True exactly when CUDA is available (*pin-memory
            policy*); explicit values are kept.
        drop_last: As in torch (also passed to a ``DistributedSampler`` loaderkit builds).
        timeout: As in torch (dropped to 0 when the Windows policy removes the workers).
        worker_init_fn: As in torch. loaderkit's ``seed_worker`` always runs
            first (distinct, reproducible streams per worker and rank), then this function.
        multiprocessing_context: As in torch; decides the start method (then the global start
            method, then the interpreter's default). Under ``spawn``/``forkserver`` the
            dataset, ``collate_fn`` and ``worker_init_fn`` are pickled up front and an
            unpicklable part raises ``ConfigError`` naming its attribute
            path (*picklability preflight*).
        generator: As in torch. When unset and ``seed`` is given, a seeded generator is created
            and reseeded from ``(seed, epoch)`` at every pass.
        prefetch_factor: As in torch (dropped when the Windows policy removes the workers).
        persistent_workers: ``None`` (unset): ``training=True`` with workers → True (*persistent
            policy*), otherwise False (torch's default). Explicit values are kept.
        pin_memory_device: As in torch.
        in_order: As in torch.
        training: ``True`` (training defaults), ``False`` (evaluation: no shuffle, no persistent
            workers, exact distributed shards) or ``None`` (torch's defaults).
        seed: An int in ``[0, 2**64 - 1]``. Makes the sampler order and every worker's random
            streams reproducible; also seeds the distributed and block samplers.
        sample_seeding: Seed python/numpy/torch RNGs and ``worker_rng`` from
            ``(seed, epoch, index)`` while each sample is produced, so batches do not depend on
            ``num_workers`` (map-style datasets; samples are then read one by one).
        force_zero_workers_on_windows: The Windows zero-worker policy (default on).
        distributed: ``"auto"``: under an initialized ``torch.distributed`` group with world
            size > 1 and no user sampler, shard the data (training: ``DistributedSampler``;
            ``training=False``: an exact shard with no padded duplicates). ``True`` requires a
            process group; ``False`` never shards.
        platform: A ``PlatformInfo`` to plan for instead of detecting this
            machine (tests; "what would happen on Windows?").

    Returns:
        A ``loaderkit.DataLoader`` (an instance of ``torch.utils.data.DataLoader``) with
        ``close()``, context-manager support, ``epoch``/``set_epoch()``, ``plan`` and
        ``describe()``.

    Raises:
        ConfigError: A setting that cannot work (named, with the fix). Also a ``ValueError``.
        ValueError, TypeError: torch's own argument errors, unchanged; an invalid ``seed``.

    Examples:
        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> from loaderkit import create_dataloader
        >>> ds = TensorDataset(torch.arange(10.0))
        >>> with create_dataloader(ds, batch_size=4, training=True, seed=0) as loader:
        ...     batches = [b for (b,) in loader]
        >>> [len(b) for b in batches]
        [4, 4, 2]
        >>> loader.plan["shuffle"].value
        True
    """

    def __class_getitem__(cls, item: Any) -> Any:
        return DataLoader[item]

    def __new__(
        cls,
        dataset: Dataset[Any] | Iterable[Any],
        batch_size: int | None = 1,
        shuffle: bool | str | None = None,
        sampler: Sampler[Any] | Iterable[Any] | None = None,
        batch_sampler: Sampler[list[Any]] | Iterable[list[Any]] | None = None,
        num_workers: int | str = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool | None = None,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool | None = None,
        pin_memory_device: str = "",
        in_order: bool = True,
        training: bool | None = None,
        seed: int | None = None,
        sample_seeding: bool = False,
        force_zero_workers_on_windows: bool = True,
        distributed: bool | str = "auto",
        platform: PlatformInfo | None = None,
    ) -> DataLoader:
        """Build the loader (see the class docstring for every argument)."""
        return DataLoader(
            dataset,
            batch_size,
            shuffle,
            sampler,
            batch_sampler,
            num_workers,
            collate_fn,
            pin_memory,
            drop_last,
            timeout,
            worker_init_fn,
            multiprocessing_context,
            generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            in_order=in_order,
            training=training,
            seed=seed,
            sample_seeding=sample_seeding,
            force_zero_workers_on_windows=force_zero_workers_on_windows,
            distributed=distributed,
            platform=platform,
        )
