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
* ``order_sources``, ``next_pass_start`` and ``fingerprint``: what a state records about a
  loader (read from its attributes).

The state itself is plain data (ints, strings, bools, ``None``, lists, dicts and ``uint8``
tensors) that ``torch.load(..., weights_only=True)`` reads back. ``check_state`` refuses a
state that does not fit the loader with a ``ConfigError`` naming each mismatch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DistributedSampler, IterableDataset, RandomSampler, SequentialSampler

from loaderkit.errors import ConfigError

__all__ = [
    "STATE_FORMAT",
    "STATE_VERSION",
    "OrderSources",
    "PassIndices",
    "PassRecord",
    "ResumePoint",
    "check_state",
    "fingerprint",
    "next_pass_start",
    "order_is_seeded",
    "order_sources",
]

#: Identifies a loaderkit loader state (a checkpoint may hold many kinds of state).
STATE_FORMAT = "loaderkit.DataLoader"
#: Version of the state's layout; a newer one is refused with a ConfigError.
STATE_VERSION = 1

#: Fingerprint keys that must match between the saved state and the loader, with their names
#: in error messages.
_MUST_MATCH = {
    "dataset_length": "dataset length",
    "batch_size": "batch_size",
    "drop_last": "drop_last",
    "seed": "seed",
    "sample_seeding": "sample_seeding",
    "sampler": "sampler",
    "batch_sampler": "batch_sampler",
    "num_replicas": "world size (num_replicas of the distributed sampler)",
    "batches_per_pass": "batches per pass",
}


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
class ResumePoint:
    """Where a loaded state makes the next pass start.

    Attributes:
        epoch: The epoch of that pass.
        skip: Batches of it to skip at the index level.
        start: The order-defining state to restore when the sampler starts.
    """

    epoch: int
    skip: int
    start: dict[str, Any]


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

    Examples:
        >>> record = PassRecord(epoch=0, skip=2, resumed=True)
        >>> no_sources = OrderSources(generators=(), global_rng=False, stateful=())
        >>> list(PassIndices([[0, 1], [2, 3], [4, 5]], lambda: record, lambda: no_sources))
        [[4, 5]]
    """

    def __init__(self, sampler: Any, record: Any, sources: Any) -> None:
        self.sampler = sampler
        self._record = record
        self._sources = sources

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
    owned = loader._owns_generator and loader.seed is not None
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
        loader.persistent_workers and loader.num_workers > 0 and loader._iterator is not None
    )
    for name, generator in sources.generators:
        if generator is loader.generator and not reuses_iterator:
            generator = torch.Generator().set_state(generator.get_state())
            torch.empty((), dtype=torch.int64).random_(generator=generator)
        start[name] = generator.get_state()
    return start


def fingerprint(loader: Any) -> dict[str, Any]:
    """What a state must share with ``loader`` to resume it (and a few facts for the reader).

    Args:
        loader: A ``loaderkit.DataLoader``.

    Returns:
        Plain data: dataset length, batch size, ``drop_last``, seed, ``sample_seeding``, the
        sampler classes, the world size and rank of a distributed sampler, the batches per
        pass and ``in_order``.

    Examples:
        >>> from loaderkit import DataLoader
        >>> fingerprint(DataLoader(list(range(10)), batch_size=4))["batches_per_pass"]
        3
    """
    dataset_length: int | None = None
    if not isinstance(loader.dataset, IterableDataset):
        try:
            dataset_length = len(loader.dataset)
        except TypeError:
            dataset_length = None
    sharding = next(
        (
            obj
            for obj in (loader.sampler, loader.batch_sampler)
            if isinstance(getattr(obj, "num_replicas", None), int)
        ),
        None,
    )
    user_batches = loader.batch_sampler is not None and loader.batch_size is None
    return {
        "dataset_length": dataset_length,
        "batch_size": loader.batch_size,
        "drop_last": loader.drop_last,
        "seed": loader.seed,
        "sample_seeding": loader.sample_seeding,
        "sampler": _qualname(loader.sampler),
        "batch_sampler": _qualname(loader.batch_sampler) if user_batches else None,
        "num_replicas": getattr(sharding, "num_replicas", None),
        "rank": getattr(sharding, "rank", None),
        "batches_per_pass": loader._batches_per_pass(),
        "in_order": loader.in_order,
    }


def _qualname(obj: Any) -> str | None:
    if obj is None:
        return None
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}"


# --------------------------------------------------------------------------- the state


def check_state(state: Any, fingerprint: Mapping[str, Any]) -> ResumePoint:
    """Validate a saved loader state against a loader's fingerprint; return where to resume.

    Args:
        state: What ``DataLoader.state_dict()`` returned (possibly through ``torch.save`` /
            ``torch.load``).
        fingerprint: The loader's own fingerprint (``DataLoader.state_dict()["loader"]``).

    Returns:
        The epoch, the batches to skip and the order-defining state to restore.

    Raises:
        ConfigError: Not a loaderkit loader state, a newer version, or one taken from a loader
            that differs (each mismatch named, with the saved and current values).

    Examples:
        >>> fp = {"dataset_length": 10, "batch_size": 2}
        >>> state = {"format": STATE_FORMAT, "version": 1, "epoch": 1, "batches_yielded": 3,
        ...          "start": {}, "loader": fp}
        >>> check_state(state, fp)
        ResumePoint(epoch=1, skip=3, start={})
        >>> check_state(state, {"dataset_length": 12, "batch_size": 2})
        Traceback (most recent call last):
        ...
        loaderkit.errors.ConfigError: the loader state does not fit this loader: dataset length is 10 in the state and 12 here. ...
    """  # noqa: E501
    if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
        raise ConfigError(
            "load_state_dict expects the dict a loaderkit DataLoader's state_dict() returned "
            f"(with format={STATE_FORMAT!r}); got {_describe(state)}"
        )
    version = state.get("version")
    if not isinstance(version, int) or not 1 <= version <= STATE_VERSION:
        raise ConfigError(
            f"this loader state has version {version!r}; this loaderkit reads versions 1 to "
            f"{STATE_VERSION}: upgrade loaderkit to resume from it"
        )
    saved = state.get("loader", {})
    problems = [
        f"{label} is {saved.get(key)!r} in the state and {fingerprint.get(key)!r} here"
        for key, label in _MUST_MATCH.items()
        if key in saved and key in fingerprint and saved[key] != fingerprint[key]
    ]
    if problems:
        raise ConfigError(
            "the loader state does not fit this loader: "
            + "; ".join(problems)
            + ". A state resumes the loader it was taken from: build the loader with the same "
            "dataset, batch_size, drop_last, seed, sample_seeding, sampler and world size "
            "(num_workers may differ)."
        )
    epoch, position = state.get("epoch"), state.get("batches_yielded")
    for name, value in (("epoch", epoch), ("batches_yielded", position)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"the loader state's {name} must be an int >= 0, got {value!r}")
    assert isinstance(epoch, int) and isinstance(position, int)
    total = fingerprint.get("batches_per_pass")
    if isinstance(total, int) and position > total:
        raise ConfigError(
            f"the loader state is at batch {position} of epoch {epoch}, but a pass of this "
            f"loader has {total} batches"
        )
    start = state.get("start") or {}
    return ResumePoint(epoch=epoch, skip=position, start=dict(start))


def _describe(value: Any) -> str:
    if isinstance(value, Mapping):
        return f"a dict with keys {sorted(map(str, value))[:8]}"
    return f"a {type(value).__name__}"
