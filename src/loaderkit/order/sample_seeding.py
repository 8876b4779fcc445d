"""``sample_seeding=True`` in workers: batches tagged with their epoch, samples seeded one by one.

With per-sample seeding, each sample's random streams come from ``(seed, epoch, index)``
(``loaderkit.order.seeding.SampleSeeder``), so a batch does not depend on which worker made it. The
loader's iterators then read a view of the loader (``sample_seeding_view``) whose index sampler
tags every batch of indices with the loader's epoch (``EpochTagger``) and whose dataset seeds
the RNGs around each sample (``SampleSeededDataset``), in whatever process reads it.

Examples:
    >>> tagged = Tagged(3, [0, 1])
    >>> tagged.epoch, tagged.indices
    (3, [0, 1])
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

from torch.utils.data import Dataset

from loaderkit import _torch
from loaderkit.order.hooks import call_hook
from loaderkit.order.seeding import SampleSeeder
from loaderkit.support import LoaderSupport, support_of

__all__ = ["EpochTagger", "SampleSeededDataset", "Tagged", "sample_seeding_view"]


class Tagged:
    """A batch of indices (or one index) with the epoch it belongs to."""

    __slots__ = ("epoch", "indices")

    def __init__(self, epoch: int, indices: Any) -> None:
        self.epoch = epoch
        self.indices = indices

    def __reduce__(self) -> tuple[Any, ...]:
        return (Tagged, (self.epoch, self.indices))


class EpochTagger:
    """Wraps an index sampler so each batch carries the loader's epoch to the workers.

    Args:
        index_sampler: What the loader's iterators would draw indices from.
        loader: The loader (held weakly; its ``epoch`` is read at every pass).
    """

    def __init__(self, index_sampler: Any, loader: Any) -> None:
        self.index_sampler = index_sampler
        self._loader = weakref.ref(loader)

    def __iter__(self) -> Iterator[Tagged]:
        loader = self._loader()
        epoch = loader.epoch if loader is not None else 0
        for indices in self.index_sampler:
            yield Tagged(epoch, indices)

    def __len__(self) -> int:
        return len(self.index_sampler)


class SampleSeededDataset(Dataset[Any]):
    """Worker-side wrapper for ``sample_seeding=True``: seeds the RNGs around each sample.

    It receives batches tagged with their epoch, produces each sample inside
    ``SampleSeeder.seeded(epoch, index)`` and forwards ``set_epoch`` to the wrapped dataset's
    copy (which persistent workers would otherwise never see). Attribute reads fall through to
    the wrapped dataset, so ``get_worker_info().dataset.attr`` keeps working.

    A dataset whose ``loader_support()`` answers ``read_seeded(indices, seed_sample)``
    (``HDF5SessionDataset``) reads the batch at once and calls ``seed_sample(index)`` right
    before each sample's random step, so per-sample seeding keeps batched reads; any other
    dataset is read one index at a time.
    """

    def __init__(self, dataset: Any, seeder: SampleSeeder) -> None:
        self.__dict__["dataset"] = dataset
        self.__dict__["seeder"] = seeder
        self.__dict__["_epoch"] = None

    def __getattr__(self, name: str) -> Any:
        dataset = self.__dict__.get("dataset")
        if dataset is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(dataset, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.dataset, name, value)

    def __len__(self) -> int:
        return len(self.dataset)

    def _support(self) -> LoaderSupport:
        """The wrapped dataset's ``LoaderSupport``, asked once per process (never pickled)."""
        support = self.__dict__.get("_loader_support")
        if support is None:
            support = self.__dict__["_loader_support"] = support_of(self.dataset)
        return support

    def _enter_epoch(self, epoch: int) -> None:
        if epoch != self._epoch:
            self.__dict__["_epoch"] = epoch
            call_hook(self.dataset, "set_epoch", epoch)

    def __getitem__(self, tagged: Tagged) -> Any:
        self._enter_epoch(tagged.epoch)
        with self.seeder.seeded(tagged.epoch, tagged.indices):
            return self.dataset[tagged.indices]

    def __getitems__(self, tagged: Tagged) -> list[Any]:
        self._enter_epoch(tagged.epoch)
        dataset, seed_sample, epoch = self.dataset, self.seeder.seed_sample, tagged.epoch
        with self.seeder.batch():
            # a dataset may read the batch at once and seed each sample's random step
            batch = self._support().read_seeded(tagged.indices, lambda i: seed_sample(epoch, i))
            if batch is not None:
                return batch
            samples = []
            for index in tagged.indices:
                seed_sample(epoch, index)
                samples.append(dataset[index])
        return samples

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_loader_support", None)  # asked again in the process that unpickles
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


def sample_seeding_view(loader: Any, seeder: SampleSeeder) -> _torch.LoaderView:
    """What the iterators of a sample-seeding ``loader`` read: tagged indices, wrapped dataset."""
    return _torch.LoaderView(
        loader,
        dataset=SampleSeededDataset(loader.dataset, seeder),
        index_sampler=EpochTagger(_torch.index_sampler(loader), loader),
    )
