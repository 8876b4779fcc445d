"""Samplers loaderkit builds for ``torch.distributed``: elastic training order, exact shards.

Training under ``distributed="auto"`` uses torch's own ``DistributedSampler`` when no ``seed``
is given. Three cases need something torch does not have:

* training with a ``seed``: ``ElasticSampler`` computes one order of the whole dataset from
  ``(seed, epoch)`` and gives rank ``r`` the slice ``[r * B, (r + 1) * B)`` of every global
  batch of ``num_replicas * B`` samples, so the global batches do not depend on the world size
  (``global_batch_positions`` is that rule, shared with ``BlockShuffleSampler``);
* evaluation (``training=False``): ``ShardSampler`` gives every rank a contiguous slice,
  so every sample is seen exactly once across ranks (``DistributedSampler`` pads with
  duplicates, which biases metrics);
* a user ``batch_sampler``: ``ShardedBatchSampler`` deals its batches to ranks.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any, cast

import numpy as np
import torch
from torch.utils.data import Dataset, DistributedSampler, Sampler

from loaderkit import _torch
from loaderkit.errors import ConfigError, check_int
from loaderkit.order.hooks import call_hook
from loaderkit.order.seeding import epoch_seed, validate_seed

__all__ = [
    "ElasticSampler",
    "ShardSampler",
    "ShardedBatchSampler",
    "global_batch_count",
    "global_batch_positions",
]


def _check_rank(num_replicas: int, rank: int) -> None:
    if num_replicas < 1:
        raise ConfigError(f"num_replicas must be >= 1, got {num_replicas}")
    if not 0 <= rank < num_replicas:
        raise ConfigError(f"rank must be in [0, {num_replicas - 1}], got {rank}")


def _tail_bounds(rest: int, num_replicas: int, rank: int) -> tuple[int, int]:
    """This rank's part ``[lo, hi)`` of a last global batch of ``rest`` samples."""
    return rank * rest // num_replicas, (rank + 1) * rest // num_replicas


def global_batch_count(
    n: int, batch_size: int, num_replicas: int, rank: int, drop_last: bool
) -> int:
    """How many positions ``global_batch_positions`` gives ``rank`` (without building them).

    Examples:
        >>> [global_batch_count(10, 2, 2, r, False) for r in range(2)]
        [5, 5]
        >>> [global_batch_count(10, 2, 2, r, True) for r in range(2)]
        [4, 4]
    """
    size = batch_size * num_replicas
    full, rest = divmod(n, size)
    if drop_last or rest == 0:
        return full * batch_size
    lo, hi = _tail_bounds(rest, num_replicas, rank)
    return full * batch_size + max(1, hi - lo)


def global_batch_positions(
    n: int, batch_size: int, num_replicas: int, rank: int, drop_last: bool
) -> np.ndarray:
    """Positions in one epoch's global order (``n`` samples) that ``rank`` reads, in order.

    The order is cut into global batches of ``G = num_replicas * batch_size`` positions; rank
    ``r`` reads ``[r * batch_size, (r + 1) * batch_size)`` of each, so global batch ``k`` (what
    all ranks read at step ``k``, concatenated in rank order) is positions ``[k * G,
    (k + 1) * G)`` whatever the world size. The last, partial global batch of ``n % G``
    positions:

    * ``drop_last=True``: dropped, on every rank (every world size drops the same samples);
    * ``drop_last=False``: split between the ranks in contiguous parts as even as possible
      (sizes differ by at most one), so every rank takes the same number of steps and the
      parts, in rank order, are that global batch. When it has fewer positions than there
      are ranks, a rank left without one repeats one of them (position ``r % (n % G)`` of
      the tail), as ``DistributedSampler`` pads, because DDP hangs when ranks disagree on
      the number of steps.

    Args:
        n: Samples in the epoch's order.
        batch_size: Samples per rank per step.
        num_replicas: Number of ranks.
        rank: This rank.
        drop_last: Drop the last, partial global batch.

    Returns:
        An ``int64`` array of positions.

    Examples:
        >>> [global_batch_positions(10, 2, 2, r, False).tolist() for r in range(2)]
        [[0, 1, 4, 5, 8], [2, 3, 6, 7, 9]]
        >>> global_batch_positions(10, 4, 1, 0, False).tolist()
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    """
    size = batch_size * num_replicas
    full, rest = divmod(n, size)
    steps = np.arange(full, dtype=np.int64)[:, None] * size
    body = (steps + rank * batch_size + np.arange(batch_size, dtype=np.int64)).ravel()
    if drop_last or rest == 0:
        return body
    lo, hi = _tail_bounds(rest, num_replicas, rank)
    tail = np.arange(lo, hi, dtype=np.int64) if hi > lo else np.array([rank % rest], np.int64)
    return np.concatenate((body, full * size + tail))


class ElasticSampler(DistributedSampler[int]):
    """One order of the whole dataset per epoch, cut into global batches shared by the ranks.

    The order depends only on ``(seed, epoch)`` and the dataset length; rank ``r`` reads the
    slice ``[r * batch_size, (r + 1) * batch_size)`` of every global batch of
    ``num_replicas * batch_size`` samples (``global_batch_positions`` defines the last,
    partial one). So with a fixed global batch the sequence of global batches is the same on
    1, 2 or 4 ranks, and a run can resume on another number of ranks. With ``shuffle=True``
    the order is the one a single-process ``loaderkit.DataLoader`` with the same ``seed`` has
    (a ``RandomSampler`` over its generator reseeded from ``(seed, epoch)``); with
    ``shuffle=False`` it is the dataset order.

    A ``torch.utils.data.DistributedSampler`` subclass with that class's public attributes
    (``dataset``, ``num_replicas``, ``rank``, ``epoch``, ``shuffle``, ``seed``,
    ``drop_last``, ``num_samples``, ``total_size``): Lightning and Fabric keep it as is.
    Every rank computes the whole epoch's order (one ``randperm`` of the dataset length).

    Args:
        data_source: The dataset (only its length is used).
        batch_size: Samples per rank per step (the loader's ``batch_size``).
        num_replicas: Number of ranks.
        rank: This rank.
        shuffle: Shuffle the order (from ``(seed, epoch)``).
        seed: Seed of the order (``0 <= seed < 2**64``); the same on every rank.
        drop_last: Drop the last, partial global batch (else split it between the ranks).

    Examples:
        >>> def global_batches(world):
        ...     ranks = [list(ElasticSampler(range(12), batch_size=4 // world,
        ...                   num_replicas=world, rank=r, seed=3)) for r in range(world)]
        ...     per = 4 // world
        ...     return [sum((s[k * per:(k + 1) * per] for s in ranks), []) for k in range(3)]
        >>> global_batches(1) == global_batches(2) == global_batches(4)
        True
    """

    def __init__(
        self,
        data_source: Sized,
        *,
        batch_size: int,
        num_replicas: int,
        rank: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        _check_rank(num_replicas, rank)
        self.data_source = data_source
        self.dataset = cast("Dataset[Any]", data_source)  # only its length is used
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = bool(shuffle)
        self.seed = validate_seed(seed)
        self.drop_last = bool(drop_last)
        self.epoch = 0

    @property
    def global_batch_size(self) -> int:
        """Samples all ranks read together per step: ``num_replicas * batch_size``."""
        return self.num_replicas * self.batch_size

    def global_order(self) -> torch.Tensor:
        """The whole epoch's order (the same on every rank and every world size).

        With ``shuffle``: ``randperm`` from a generator seeded with
        ``loaderkit.order.seeding.epoch_seed(seed, epoch)`` after one 64-bit draw, exactly what a
        single-process loader's ``RandomSampler`` yields (its iterator draws the workers' base
        seed from the generator first).
        """
        n = len(self.data_source)
        if not self.shuffle:
            return torch.arange(n)
        generator = torch.Generator()
        generator.manual_seed(epoch_seed(self.seed, self.epoch))
        _torch.consume_base_seed_draw(generator)  # as the iterator of a single process does
        return torch.randperm(n, generator=generator)

    def __iter__(self) -> Iterator[int]:
        positions = global_batch_positions(
            len(self.data_source), self.batch_size, self.num_replicas, self.rank, self.drop_last
        )
        yield from self.global_order()[torch.from_numpy(positions)].tolist()

    def __len__(self) -> int:
        return global_batch_count(
            len(self.data_source), self.batch_size, self.num_replicas, self.rank, self.drop_last
        )

    @property
    def num_samples(self) -> int:  # type: ignore[override]
        """Samples this rank yields per epoch (``DistributedSampler``'s attribute)."""
        return len(self)

    @property
    def total_size(self) -> int:  # type: ignore[override]
        """Samples all ranks yield per epoch, padding included (``DistributedSampler``'s)."""
        n = len(self.data_source)
        return sum(
            global_batch_count(n, self.batch_size, self.num_replicas, r, self.drop_last)
            for r in range(self.num_replicas)
        )

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s order for the next pass."""
        self.epoch = epoch

    def order_key(self) -> dict[str, Any]:
        """What, besides ``seed`` and the dataset, decides the global order (resume checks it).

        Examples:
            >>> ElasticSampler(range(4), batch_size=2, num_replicas=2, rank=0).order_key()
            {'kind': 'shuffle'}
        """
        return {"kind": "shuffle" if self.shuffle else "sequential"}


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
