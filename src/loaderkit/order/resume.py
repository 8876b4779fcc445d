"""Mid-epoch resume: a loader's state, the check that it fits, and the index-level fast-forward.

``loaderkit.DataLoader.state_dict()`` describes where the caller is: the epoch of the current
pass and how many batches of it were *yielded to the caller* (batches that workers prefetched
but the caller never received do not count). ``load_state_dict`` makes the next pass of a
freshly built loader start at that batch. Three pieces live here:

* ``PassRecord``: one pass of a loader (its epoch, where it started, how far the caller got);
* ``OrderSources``: what, besides ``(seed, epoch)``, decides a pass's order (a generator
  loaderkit does not reseed, torch's global RNG, a sampler with its own ``state_dict``); it is
  captured when the sampler starts and restored around the resumed sampler's start;
* ``PassIndices``: the index sampler torch's iterators read; on a resumed pass it skips the
  batches the caller already had *at the index level* (no read, decode or transform);
* ``order_sources``, ``next_pass_start``, ``elastic_order`` and ``fingerprint``: what a state
  records about a loader (read from its attributes); ``check_state`` (``statecheck``) is the
  check that a saved state fits a loader, re-exported here with the state's format.

An *elastic* order (``loaderkit.order.samplers.ElasticSampler``, an elastic ``BlockShuffleSampler``,
or the single-process loader they equal: a seeded shuffle or sequential order) depends only on
``(seed, epoch, dataset)`` and is cut into global batches of ``world size x batch_size``; a
state from one resumes another world size with the same global batch, and one with another
global batch where the samples already read fill whole global batches of the new size.

The state itself is plain data (ints, strings, bools, ``None``, lists, dicts and ``uint8``
tensors) that ``torch.load(..., weights_only=True)`` reads back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DistributedSampler, IterableDataset, RandomSampler, SequentialSampler

from loaderkit import _torch
from loaderkit.order.lookahead import look_ahead
from loaderkit.order.statecheck import STATE_FORMAT, STATE_VERSION, ResumePoint, check_state
from loaderkit.support import support_of

__all__ = [
    "STATE_FORMAT",
    "STATE_VERSION",
    "ElasticOrder",
    "OrderSources",
    "PassIndices",
    "PassRecord",
    "ResumePoint",
    "check_state",
    "elastic_order",
    "fingerprint",
    "next_pass_start",
    "order_is_seeded",
    "order_sources",
]


@dataclass
class PassRecord:
    """One pass over a loader: its epoch, where it started and how far the caller got.

    Attributes:
        epoch: The pass's epoch.
        skip: Batches skipped at the index level (a resumed pass starts after them).
        total: Batches in the whole pass, when the index sampler has a length.
        yielded: Batches this pass's iterator handed to the caller.
        finished: The iterator raised ``StopIteration``.
        start: The order-defining state captured when the sampler started (``OrderSources``).
        resumed: The pass continues a loaded state (``start`` is restored, not captured).

    Examples:
        >>> record = PassRecord(epoch=2, skip=3, total=5)
        >>> record.yielded = 2
        >>> record.position, record.complete
        (5, True)
    """

    epoch: int
    skip: int = 0
    total: int | None = None
    yielded: int = 0
    finished: bool = False
    start: dict[str, Any] = field(default_factory=dict)
    resumed: bool = False

    @property
    def position(self) -> int:
        """Batches of this pass the caller has had (skipped ones included)."""
        return self.skip + self.yielded

    @property
    def complete(self) -> bool:
        """The caller has had every batch of the pass."""
        return self.finished or (self.total is not None and self.position >= self.total)


@dataclass(frozen=True)
class OrderSources:
    """What decides a pass's order besides ``(seed, epoch)``, captured and restored as a whole.

    Attributes:
        generators: ``(name, generator)`` pairs the loader does not reseed every pass: the
            loader's own when the user gave it (``"generator"``), the order sampler's
            (``"sampler_generator"``, e.g. a ``RandomSampler`` inside a user batch sampler).
        global_rng: The sampler may draw from torch's global CPU generator (a shuffle without
            a generator, a user sampler).
        stateful: ``(name, object)`` pairs with their own ``state_dict``/``load_state_dict``.

    Examples:
        >>> import torch
        >>> g = torch.Generator().manual_seed(3)
        >>> sources = OrderSources(generators=(("generator", g),), global_rng=False, stateful=())
        >>> start = sources.snapshot()
        >>> first = torch.randperm(5, generator=g).tolist()
        >>> with sources.restored(start):
        ...     again = torch.randperm(5, generator=g).tolist()
        >>> first == again
        True
    """

    generators: tuple[tuple[str, torch.Generator], ...]
    global_rng: bool
    stateful: tuple[tuple[str, Any], ...]

    def snapshot(self) -> dict[str, Any]:
        """The current order-defining state (plain data)."""
        start: dict[str, Any] = {}
        for name, generator in self.generators:
            start[name] = generator.get_state()
        if self.global_rng:
            start["torch_rng"] = torch.get_rng_state()
        for name, obj in self.stateful:
            start[name] = obj.state_dict()
        return start

    @contextlib.contextmanager
    def restored(self, start: Mapping[str, Any]) -> Iterator[None]:
        """Restore ``start`` for the block; torch's global RNG is put back afterwards.

        The generators and stateful samplers keep the restored state (the pass continues from
        it); torch's global generator only lends it to the sampler's start, so the caller's
        own random stream is not changed by resuming.
        """
        for name, generator in self.generators:
            if name in start:
                generator.set_state(start[name])
        for name, obj in self.stateful:
            if name in start:
                obj.load_state_dict(start[name])
        saved = start.get("torch_rng")
        if saved is None:
            yield
            return
        current = torch.get_rng_state()
        torch.set_rng_state(saved)
        try:
            yield
        finally:
            torch.set_rng_state(current)


def order_is_seeded(sampler: Any) -> bool:
    """Whether ``sampler``'s order is decided without torch's global RNG.

    Sequential samplers, ``DistributedSampler`` (and loaderkit's subclasses: seed and epoch)
    and a ``RandomSampler`` with its own generator are; anything else may draw from it.

    Examples:
        >>> from torch.utils.data import RandomSampler, SequentialSampler
        >>> order_is_seeded(SequentialSampler(range(3))), order_is_seeded(RandomSampler(range(3)))
        (True, False)
    """
    if isinstance(sampler, SequentialSampler | DistributedSampler):
        return True
    return isinstance(sampler, RandomSampler) and sampler.generator is not None


_END = object()


class PassIndices:
    """The index sampler torch's iterators read: records or fast-forwards each pass.

    ``sampler`` is the loader's own index sampler (batch sampler, or sampler without
    automatic batching). Each iteration starts the loader's current ``PassRecord``: a fresh
    pass captures its ``OrderSources`` snapshot right before the sampler's first draw; a
    resumed pass restores it and discards ``skip`` batches of indices before the first one it
    yields, so the skipped samples are never fetched.

    Args:
        sampler: The index sampler.
        record: Returns the loader's current pass record (None: pass through).
        sources: Returns the loader's ``OrderSources``.
        watcher: Returns the dataset's prefetch watcher for a pass, or ``None``
            (``loaderkit.order.lookahead``: indices drawn a little ahead, same order).

    Examples:
        >>> record = PassRecord(epoch=0, skip=2, resumed=True)
        >>> no_sources = OrderSources(generators=(), global_rng=False, stateful=())
        >>> list(PassIndices([[0, 1], [2, 3], [4, 5]], lambda: record, lambda: no_sources))
        [[4, 5]]
    """

    def __init__(self, sampler: Any, record: Any, sources: Any, watcher: Any = None) -> None:
        self.sampler = sampler
        self._record = record
        self._sources = sources
        self._watcher = watcher

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[Any]:
        record: PassRecord | None = self._record()
        if record is None:
            yield from self.sampler
            return
        sources: OrderSources = self._sources()
        if record.resumed:
            with sources.restored(record.start):
                iterator = iter(self.sampler)
                for _ in range(record.skip):
                    if next(iterator, _END) is _END:
                        return
                first = next(iterator, _END)
        else:
            record.start = sources.snapshot()
            iterator = iter(self.sampler)
            first = next(iterator, _END)
        if first is _END:
            return
        watcher = None if self._watcher is None else self._watcher()
        if watcher is not None:  # a dataset that fetches what comes next: draw a little ahead
            yield from look_ahead(first, iterator, watcher)
            return
        yield first
        # next(), not ``yield from``: that calls iter() again, and some iterators reset there
        # (Lightning's _IndexBatchSamplerWrapper, whose __iter__ restarts and returns itself)
        while (item := next(iterator, _END)) is not _END:
            yield item


# --------------------------------------------------------------------------- a loader's parts


def order_sources(loader: Any) -> OrderSources:
    """What decides the order of ``loader``'s passes besides ``(seed, epoch)``.

    A generator the loader does not reseed (the user's own), the generator of the sampler that
    orders the indices (a ``RandomSampler`` inside a user batch sampler), torch's global RNG
    unless that sampler is seeded (``order_is_seeded``), and samplers with their own
    ``state_dict``/``load_state_dict``.

    Args:
        loader: A ``loaderkit.DataLoader``.

    Returns:
        The ``OrderSources``.

    Examples:
        >>> from loaderkit import DataLoader
        >>> order_sources(DataLoader(list(range(4)), shuffle=True, seed=0)).generators
        ()
    """
    batch_sampler = loader.batch_sampler
    order_sampler = getattr(batch_sampler, "sampler", None)
    if order_sampler is None:  # a user batch sampler with no ``sampler``, or no batching
        order_sampler = loader.sampler if batch_sampler is None else batch_sampler
    generators: list[tuple[str, torch.Generator]] = []
    owned = loader.owns_generator and loader.seed is not None
    if loader.generator is not None and not owned:
        generators.append(("generator", loader.generator))
    sampler_generator = getattr(order_sampler, "generator", None)
    if isinstance(sampler_generator, torch.Generator) and sampler_generator is not (
        loader.generator
    ):
        generators.append(("sampler_generator", sampler_generator))
    stateful = tuple(
        (name, obj)
        for name, obj in (("sampler", loader.sampler), ("batch_sampler", batch_sampler))
        if callable(getattr(obj, "state_dict", None))
        and callable(getattr(obj, "load_state_dict", None))
    )
    iterable = isinstance(loader.dataset, IterableDataset)
    return OrderSources(
        generators=tuple(generators),
        global_rng=not iterable and not order_is_seeded(order_sampler),
        stateful=stateful,
    )


def next_pass_start(loader: Any, sources: OrderSources) -> dict[str, Any]:
    """The order-defining state the sampler of ``loader``'s next pass will start from.

    The loader's own generator is advanced on a copy by the draw a new iterator makes for the
    workers' base seed before the sampler starts (a reused persistent iterator makes none).

    Args:
        loader: A ``loaderkit.DataLoader`` between passes.
        sources: Its ``order_sources``.

    Returns:
        The ``start`` part of a state that begins the next pass.
    """
    start: dict[str, Any] = {name: obj.state_dict() for name, obj in sources.stateful}
    reuses_iterator = (
        loader.persistent_workers
        and loader.num_workers > 0
        and _torch.kept_iterator(loader) is not None
    )
    replays_draw = _torch.support().ok("base seed draw")
    for name, generator in sources.generators:
        if generator is loader.generator and not reuses_iterator and replays_draw:
            generator = torch.Generator().set_state(generator.get_state())
            _torch.consume_base_seed_draw(generator)
        start[name] = generator.get_state()
    return start


@dataclass(frozen=True)
class ElasticOrder:
    """A loader's order when it is one global order cut into global batches.

    Attributes:
        key: What decides the order besides ``seed`` and the dataset (plain data, e.g.
            ``{"kind": "shuffle"}``).
        global_batch_size: Samples all ranks read together per step.
    """

    key: dict[str, Any]
    global_batch_size: int


def elastic_order(loader: Any) -> ElasticOrder | None:
    """The elastic order of ``loader``, or ``None`` when its order depends on the world size.

    Elastic: a sampler with ``order_key()`` and an int ``global_batch_size``
    (``ElasticSampler``, ``BlockShuffleSampler(batch_size=...)``), or, in a single process,
    the order they reproduce: a ``RandomSampler`` over the generator loaderkit created from
    ``seed``, or a ``SequentialSampler`` of a training loader with a ``seed``, batched by
    torch's own ``BatchSampler`` (a user batch sampler is not elastic).

    Args:
        loader: A ``loaderkit.DataLoader``.

    Returns:
        The ``ElasticOrder`` or ``None``.

    Examples:
        >>> from loaderkit import DataLoader
        >>> elastic_order(DataLoader(list(range(8)), batch_size=4, training=True, seed=1))
        ElasticOrder(key={'kind': 'shuffle'}, global_batch_size=4)
        >>> elastic_order(DataLoader(list(range(8)), batch_size=4, shuffle=True)) is None
        True
    """
    if loader.seed is None or isinstance(loader.dataset, IterableDataset):
        return None
    if loader.batch_size is None and loader.batch_sampler is not None:
        return None  # a user batch sampler decides the batches
    sampler = loader.sampler
    size = getattr(sampler, "global_batch_size", None)
    order_key = getattr(sampler, "order_key", None)
    if callable(order_key) and isinstance(size, int) and not isinstance(size, bool):
        return ElasticOrder(dict(order_key()), size)
    batch = loader.batch_size or 1
    if isinstance(sampler, RandomSampler):
        owned = loader.owns_generator and sampler.generator is loader.generator
        if owned and not sampler.replacement and sampler.num_samples == len(sampler.data_source):
            return ElasticOrder({"kind": "shuffle"}, batch)
        return None
    if isinstance(sampler, SequentialSampler) and loader.training is not False:
        return ElasticOrder({"kind": "sequential"}, batch)
    return None


def fingerprint(loader: Any) -> dict[str, Any]:
    """What a state must share with ``loader`` to resume it (and a few facts for the reader).

    Args:
        loader: A ``loaderkit.DataLoader``.

    Returns:
        Plain data: dataset length and ``samples_key`` (``LoaderSupport.samples_key()``),
        batch size, ``drop_last``, seed, ``sample_seeding``, the sampler classes, the world
        size and rank of a distributed sampler, the batches per pass, ``in_order``, and for an
        elastic order its key and global batch size (``None`` otherwise).

    Examples:
        >>> from loaderkit import DataLoader
        >>> fingerprint(DataLoader(list(range(10)), batch_size=4))["batches_per_pass"]
        3
    """
    dataset_length: int | None = None
    samples_key: str | None = None
    if not isinstance(loader.dataset, IterableDataset):
        try:
            dataset_length = len(loader.dataset)
        except TypeError:
            dataset_length = None
        samples_key = support_of(loader.dataset).samples_key()
    sharding = next(
        (
            obj
            for obj in (loader.sampler, loader.batch_sampler)
            if isinstance(getattr(obj, "num_replicas", None), int)
        ),
        None,
    )
    user_batches = loader.batch_sampler is not None and loader.batch_size is None
    elastic = elastic_order(loader)
    return {
        "dataset_length": dataset_length,
        "samples_key": samples_key,
        "batch_size": loader.batch_size,
        "drop_last": loader.drop_last,
        "seed": loader.seed,
        "sample_seeding": loader.sample_seeding,
        "sampler": _qualname(loader.sampler),
        "batch_sampler": _qualname(loader.batch_sampler) if user_batches else None,
        "num_replicas": getattr(sharding, "num_replicas", None),
        "rank": getattr(sharding, "rank", None),
        "batches_per_pass": loader.batches_per_pass(),
        "in_order": loader.in_order,
        "order": None if elastic is None else elastic.key,
        "global_batch_size": None if elastic is None else elastic.global_batch_size,
    }


def _qualname(obj: Any) -> str | None:
    if obj is None:
        return None
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}"
