"""Samplers loaderkit builds for ``torch.distributed``: exact evaluation shards, sharded batches.

Training under ``distributed="auto"`` uses torch's own ``DistributedSampler``. Two cases need
something torch does not have:

* evaluation (``training=False``): ``ShardSampler`` gives every rank a contiguous slice,
  so every sample is seen exactly once across ranks (``DistributedSampler`` pads with
  duplicates, which biases metrics);
* a user ``batch_sampler``: ``ShardedBatchSampler`` deals its batches to ranks.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any, cast

import torch
from torch.utils.data import Dataset, DistributedSampler, Sampler

from loaderkit.errors import ConfigError
from loaderkit.hooks import call_hook

__all__ = ["ShardSampler", "ShardedBatchSampler"]


def _check_rank(num_replicas: int, rank: int) -> None:
    if num_replicas < 1:
        raise ConfigError(f"num_replicas must be >= 1, got {num_replicas}")
    if not 0 <= rank < num_replicas:
        raise ConfigError(f"rank must be in [0, {num_replicas - 1}], got {rank}")


class ShardSampler(DistributedSampler[int]):
    """Exact shard for evaluation: rank ``r`` gets a contiguous slice; no index is repeated.

    A ``torch.utils.data.DistributedSampler`` subclass with that class's public attributes
    (``dataset``, ``num_replicas``, ``rank``, ``epoch``, ``shuffle``, ``seed``,
    ``drop_last``, ``num_samples``, ``total_size``): Lightning and Fabric keep a
    ``DistributedSampler`` as is instead of re-sharding it with their padded one.

    Shard sizes differ by at most one sample; concatenating the shards of all ranks in rank
    order gives every index exactly once (in dataset order when ``shuffle=False``). Contiguous
    slices keep file reads sequential (HDF5 sessions, memory maps).

    Args:
        data_source: The dataset (only its length is used).
        num_replicas: Number of ranks.
        rank: This rank.
        shuffle: Permute the indices (the same permutation on every rank) before slicing.
        seed: Seed of the permutation; it changes with ``set_epoch``.

    Examples:
        >>> [list(ShardSampler(range(5), num_replicas=2, rank=r)) for r in range(2)]
        [[0, 1], [2, 3, 4]]
    """

    def __init__(
        self,
        data_source: Sized,
        *,
        num_replicas: int,
        rank: int,
        shuffle: bool = False,
        seed: int = 0,
    ) -> None:
        _check_rank(num_replicas, rank)
        self.data_source = data_source
        self.dataset = cast("Dataset[Any]", data_source)  # only its length is used
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.drop_last = False

    def _bounds(self) -> tuple[int, int]:
        n = len(self.data_source)
        return self.rank * n // self.num_replicas, (self.rank + 1) * n // self.num_replicas

    def __iter__(self) -> Iterator[int]:
        start, stop = self._bounds()
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            order = torch.randperm(len(self.data_source), generator=generator)
            yield from order[start:stop].tolist()
        else:
            yield from range(start, stop)

    def __len__(self) -> int:
        start, stop = self._bounds()
        return stop - start

    @property
    def num_samples(self) -> int:  # type: ignore[override]
        """Samples this rank yields (``DistributedSampler``'s attribute)."""
        return len(self)

    @property
    def total_size(self) -> int:  # type: ignore[override]
        """Samples all ranks yield together: the dataset length (nothing is padded)."""
        return len(self.data_source)

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` for the next pass (changes the permutation when shuffling)."""
        self.epoch = epoch


class ShardedBatchSampler(Sampler[list[int]]):
    """Deal the batches of a batch sampler round-robin to ranks.

    Rank ``r`` takes batches ``r, r + n, r + 2n, ...`` of the wrapped sampler. With
    ``even=True`` (training) every rank yields the same number of batches, padding with the
    first batches again (DDP hangs when ranks disagree on the number of steps); with
    ``even=False`` (evaluation) no batch is repeated and counts may differ by one.

    Args:
        batch_sampler: Any iterable of index lists with ``len()``.
        num_replicas: Number of ranks.
        rank: This rank.
        even: Pad so all ranks get the same count.

    Examples:
        >>> batches = [[0, 1], [2, 3], [4, 5]]
        >>> list(ShardedBatchSampler(batches, num_replicas=2, rank=1))
        [[2, 3], [0, 1]]
    """

    def __init__(self, batch_sampler: Any, *, num_replicas: int, rank: int, even: bool = True):
        _check_rank(num_replicas, rank)
        self.batch_sampler = batch_sampler
        self.num_replicas = num_replicas
        self.rank = rank
        self.even = even

    @property
    def sampler(self) -> Any:
        """The wrapped batch sampler's own ``sampler`` (torch code reads this attribute)."""
        return getattr(self.batch_sampler, "sampler", None)

    def __iter__(self) -> Iterator[list[int]]:
        total = len(self.batch_sampler)
        wanted = len(self)
        padding = self.num_replicas * wanted - total if self.even else 0
        head: list[list[int]] = []  # the batches padding repeats (cycled when fewer)
        for i, batch in enumerate(self.batch_sampler):
            if i < padding:
                head.append(batch)
            if i % self.num_replicas == self.rank:
                yield batch
        # Padding continues the round-robin past the end, over the first batches again.
        for j in range(padding if head else 0):
            if (total + j) % self.num_replicas == self.rank:
                yield head[j % len(head)]

    def __len__(self) -> int:
        total = len(self.batch_sampler)
        if self.even:
            return -(-total // self.num_replicas)
        return max(0, -(-(total - self.rank) // self.num_replicas))

    def set_epoch(self, epoch: int) -> None:
        """Forward the epoch to the wrapped batch sampler and its sampler."""
        for target in (self.batch_sampler, self.sampler):
            call_hook(target, "set_epoch", epoch)
