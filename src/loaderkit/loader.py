"""``loaderkit.DataLoader``: torch's DataLoader, made closeable, epoch-aware and explained.

It accepts every ``torch.utils.data.DataLoader`` argument (same names, positions, defaults and
meaning) plus loaderkit's keyword-only ones, applies the policies of ``loaderkit.policy``
through ``loaderkit.planning.plan_loader``, and adds:

* ``DataLoader.close`` and the context-manager protocol: worker processes (persistent or
  not, including those of an abandoned iterator) are shut down within bounded time and the
  dataset's own ``close()`` is called;
* ``DataLoader.epoch`` / ``DataLoader.set_epoch``: every pass calls ``set_epoch`` on the
  sampler, the batch sampler (and its sampler) and the dataset when they have one; code that
  calls ``sampler.set_epoch(e)`` itself, as torch requires, is followed, not overridden;
* ``DataLoader.state_dict`` / ``DataLoader.load_state_dict``: resume mid-epoch after the last
  batch the caller received, exactly, with any number of workers (``loaderkit.order.resume``);
* ``DataLoader.plan`` / ``DataLoader.describe``: what was asked, what is used, and why.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields
from typing import Any, ClassVar, Literal, TypeVar

import torch
from torch.utils.data import Dataset, IterableDataset, Sampler

from loaderkit import _torch
from loaderkit.errors import ConfigError, PerformanceHint, check_int, warn
from loaderkit.machine.platform import PlatformInfo
from loaderkit.order.hooks import call_hook, epoch_targets
from loaderkit.order.resume import (
    STATE_FORMAT,
    STATE_VERSION,
    OrderSources,
    PassIndices,
    PassRecord,
    ResumePoint,
    check_state,
    fingerprint,
    next_pass_start,
    order_sources,
)
from loaderkit.order.sample_seeding import sample_seeding_view
from loaderkit.order.seeding import SampleSeeder, WorkerInit, epoch_seed
from loaderkit.passes import LoaderPass, pass_iterator
from loaderkit.plan import Plan
from loaderkit.planning import plan_loader
from loaderkit.policy import LoaderRequest, thread_workers_advice
from loaderkit.support import support_of
from loaderkit.workers.handoff import HandoffCounts, HandoffStats
from loaderkit.workers.teardown import shutdown_iterator

__all__ = ["DataLoader", "loaders_built", "loaders_built_since"]

logger = logging.getLogger("loaderkit")

_T_co = TypeVar("_T_co", covariant=True)

#: Loaders by ``id`` of the generator loaderkit created for them from ``seed``: a loader
#: rebuilt with that generator keeps owning it (generators cannot be weakly referenced before
#: torch 2.13, loaders can).
_GENERATOR_OWNERS: weakref.WeakValueDictionary[int, DataLoader[Any]] = weakref.WeakValueDictionary()


#: Live loaders by construction number (``loaders_built_since``).
_REGISTRY: weakref.WeakValueDictionary[int, DataLoader[Any]] = weakref.WeakValueDictionary()


def loaders_built() -> int:
    """How many loaderkit loaders this process has built: a mark for ``loaders_built_since``."""
    return DataLoader._built


def loaders_built_since(mark: int) -> list[DataLoader[Any]]:
    """The live loaders of this process built after ``loaders_built()`` returned ``mark``.

    Oldest first. Integrations use it to find the loaders a stage built, which a framework may
    have replaced by rebuilt copies.

    Examples:
        >>> mark = loaders_built()
        >>> loader = DataLoader([1, 2])
        >>> loaders_built_since(mark) == [loader]
        True
    """
    return [_REGISTRY[n] for n in sorted(_REGISTRY.keys()) if n > mark and n in _REGISTRY]


class DataLoader(_torch.TorchLoader[_T_co]):
    """torch's DataLoader with the unset parts made safe, ``close()`` and epoch tracking.

    ``create_dataloader`` is this class under its function name: both accept the same
    arguments and build the same object, so swapping the import is the whole migration.

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
            (CPU-affinity aware, per local rank, capped at 8). *Windows policy*: on Windows
            they are threads (``worker_method``, ``force_zero_workers_on_windows``).
        collate_fn: As in torch. Checked for picklability under spawn/forkserver.
        pin_memory: ``None`` (unset) → True exactly when CUDA is available and usable in this
            process (not in a child forked after CUDA was initialised) (*pin-memory policy*);
            explicit values are kept.
        drop_last: As in torch (also passed to the distributed sampler loaderkit builds; with a
            ``seed`` it drops the last, partial global batch on every rank).
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
        force_zero_workers_on_windows: Unset (``None``): the Windows policy (threads). ``True``:
            no workers on Windows (``num_workers`` becomes 0, warned); ``False``: processes.
        distributed: ``"auto"``: under an initialized ``torch.distributed`` group with world
            size > 1 and no user sampler, shard the data (training with a ``seed``: an
            ``ElasticSampler``, whose global batches do not depend on the world size; without
            one: ``DistributedSampler``; ``training=False``: an exact shard with no padded
            duplicates). ``True`` requires a process group; ``False`` never shards.
        handoff: How batches cross from worker processes (docs/handoff.md): ``"auto"``
            (loaderkit's long-lived slots where they work, torch's hand-off elsewhere),
            ``"slots"`` (the slots, or a ``ConfigError`` where they cannot work) or
            ``"torch"`` (torch's own: a new shared-memory segment per batch; rules the slots
            out while debugging). The plan's ``handoff`` row says what is used and why.
        platform: A ``PlatformInfo`` to plan for instead of detecting this
            machine (tests; "what would happen on Windows?").
        worker_method: ``"process"``, ``"thread"`` (threads of this process, the same contract:
            docs/threads.md) or ``"auto"`` (``loaderkit.policy.methods``); unset: processes,
            except under the Windows policy. The plan's ``worker_method`` row says why.

    Beyond torch's DataLoader it has ``close()``, context-manager support,
    ``epoch``/``set_epoch()``, ``plan`` and ``describe()``. Every loaderkit-only argument is
    kept as a public attribute of the same name holding the value you passed, so frameworks
    that rebuild loaders from their attributes (Lightning) get an equivalent loader.

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

    #: How many loaderkit loaders this process has built (see ``loaders_built_since``).
    _built: ClassVar[int] = 0

    def __init__(
        self,
        dataset: Dataset[Any] | Iterable[Any],
        batch_size: int | None = 1,
        shuffle: bool | Literal["block"] | None = None,
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
        force_zero_workers_on_windows: bool | None = None,
        distributed: bool | str = "auto",
        handoff: Literal["auto", "slots", "torch"] = "auto",
        platform: PlatformInfo | None = None,
        worker_method: Literal["process", "thread", "auto"] | None = None,
    ) -> None:
        if isinstance(worker_init_fn, WorkerInit):
            # Rebuilt from this loader's own attributes (Lightning's attribute path): take the
            # caller's function back, so seeding is installed once, for this process's rank.
            worker_init_fn = worker_init_fn.user_fn
        owner = _GENERATOR_OWNERS.get(id(generator))
        if generator is not None and owner is not None and owner.generator is generator:
            # The generator another loaderkit loader created from ``seed``: still owned, so
            # this loader reseeds it from (seed, epoch) as the original did.
            generator = None
        sample_seeding = bool(sample_seeding)
        arguments = locals()  # the signature above is the one place the arguments are listed
        request = LoaderRequest(**{f.name: arguments[f.name] for f in fields(LoaderRequest)})
        setup = plan_loader(dataset, request, platform)
        self._threads = setup.worker_method == "thread"  # torch's __init__ asks for advice
        self._machine = setup.platform
        super().__init__(dataset, **setup.torch_kwargs)  # type: ignore[arg-type]
        if not hasattr(self, "in_order"):  # a torch before 2.6 (it was not passed on)
            self.in_order = in_order
        if setup.owns_generator and self.generator is not None:
            _GENERATOR_OWNERS[id(self.generator)] = self
        self.plan: Plan = setup.plan
        # loaderkit's own arguments, as passed, under their parameter names: frameworks rebuild
        # a loader from attributes named like its __init__ parameters.
        self.training = training
        self.seed = setup.seed
        self.sample_seeding = bool(sample_seeding)
        self.force_zero_workers_on_windows = force_zero_workers_on_windows
        self.distributed = distributed
        self.handoff = handoff
        self.platform = platform
        self.worker_method = worker_method
        self._defer_sharding = setup.defers_sharding
        self._owns_generator = setup.owns_generator
        self._sample_seeder: SampleSeeder | None = setup.sample_seeder
        self._handoff_slots = setup.handoff_slots
        self._main_threads = setup.main_threads
        self._torch_fallbacks = setup.platform.torch_fallbacks
        self._handoff_counts = HandoffCounts()
        self._next_epoch = 0
        self._epoch: int | None = None
        self._epoch_requested = False  # loader.set_epoch() called since the last pass
        self._epochs_set: dict[int, Any] = {}  # id(target) -> the epoch it was last left at
        # as built: any later change is the caller's
        for target in epoch_targets(self.sampler, self.batch_sampler, self.dataset):
            self._epochs_set[id(target)] = getattr(target, "epoch", None)
        self._live_iterators: weakref.WeakSet[Any] = weakref.WeakSet()
        self._pass: PassRecord | None = None  # the current or most recent pass
        self._resume: ResumePoint | None = None  # a loaded state the next pass starts from
        self._closed = False
        DataLoader._built += 1
        _REGISTRY[DataLoader._built] = self

    # ------------------------------------------------------------------ epochs

    @property
    def owns_generator(self) -> bool:
        """Whether ``generator`` is the one this loader made from ``seed`` (reseeded per pass)."""
        return self._owns_generator

    @property
    def epoch(self) -> int:
        """The epoch of the current or most recent pass (before any pass: the next one)."""
        return self._next_epoch if self._epoch is None else self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass use ``epoch`` (then ``epoch + 1``, ...).

        Use it when resuming from a checkpoint: with ``seed`` set, pass ``n`` has the same
        order whether it runs after ``n`` earlier passes or right after ``set_epoch(n)``.
        Calling ``sampler.set_epoch(n)`` on the loader's sampler yourself (torch-style code)
        has the same effect; ``loader.set_epoch`` wins when both are called.

        Args:
            epoch: A non-negative int.

        Examples:
            >>> loader = DataLoader(list(range(4)))
            >>> loader.set_epoch(3)
            >>> _ = list(loader); loader.epoch
            3
        """
        self._next_epoch = check_int("epoch", epoch, minimum=0)
        self._epoch_requested = True

    def _external_epoch(self, targets: list[Any]) -> int | None:
        """An epoch the caller set directly on a sampler (classic ``sampler.set_epoch(e)``)."""
        for target in targets:
            current = getattr(target, "epoch", None)
            is_int = isinstance(current, int) and not isinstance(current, bool)
            if is_int and current != self._epochs_set.get(id(target)):
                return current
        return None

    def _begin_pass(self) -> int:
        targets = epoch_targets(self.sampler, self.batch_sampler, self.dataset)
        epoch = self._next_epoch
        resume, self._resume = self._resume, None
        if resume is not None:
            epoch = resume.epoch
        elif not self._epoch_requested:
            # Code written for torch calls sampler.set_epoch(e) itself (e.g. resuming at e):
            # follow it instead of overriding it with loaderkit's own count.
            external = self._external_epoch(targets)
            if external is not None:
                epoch = external
        self._epoch_requested = False
        self._epoch = epoch
        self._next_epoch = epoch + 1
        if self.owns_generator and self.seed is not None and self.generator is not None:
            self.generator.manual_seed(epoch_seed(self.seed, epoch))
            if (
                self.persistent_workers
                and self.num_workers > 0
                and _torch.kept_iterator(self) is not None
                and "base seed draw" not in self._torch_fallbacks
            ):
                # A new iterator draws the workers' base seed from the generator before the
                # sampler does; a persistent one is only reset and draws nothing. Draw the same
                # number so the order of pass n is the same persistent or not.
                _torch.consume_base_seed_draw(self.generator)
        for target in targets:
            if call_hook(target, "set_epoch", epoch):
                self._epochs_set[id(target)] = getattr(target, "epoch", epoch)
        self._pass = PassRecord(epoch=epoch, total=self.batches_per_pass())
        if resume is not None:
            self._pass.skip, self._pass.start, self._pass.resumed = resume.skip, resume.start, True
        return epoch

    def __iter__(self) -> Any:
        if self._defer_sharding:
            self._defer_sharding = False  # say it once
            warn(
                "this loader was built in a multi-process Accelerate job with "
                "distributed='auto', which leaves sharding to accelerator.prepare(loader), but "
                "it is iterated directly: every process reads every sample. Pass it to "
                "accelerator.prepare, or build it with distributed=True to let loaderkit shard "
                "it (exact shards for training=False)."
            )
        self._begin_pass()
        self._closed = False
        iterator = super().__iter__()
        hooks = _torch.hooks_of(iterator)
        if isinstance(hooks, LoaderPass):
            hooks.record = self._pass
        self._live_iterators.add(iterator)
        return iterator

    def _loaderkit_iterator(self) -> Any:
        source: Any = self
        if self._sample_seeder is not None:
            source = sample_seeding_view(self, self._sample_seeder)
        workers = self.num_workers > 0
        if workers:
            self.check_worker_number_rationality()
        return pass_iterator(
            source, self.dataset, self._handoff_counts, workers=workers,
            threads=self._threads and workers, fallbacks=self._torch_fallbacks,
            slots=self._handoff_slots, main_threads=self._main_threads)  # fmt: skip

    def _loaderkit_check_workers(self) -> None:
        if not self._threads:
            _torch.torch_check_workers(self)  # worker processes: torch's own advice
        elif advice := thread_workers_advice(self.num_workers, self._machine):
            warn(advice, PerformanceHint)  # worker threads: the same advice, for threads

    def _loaderkit_index_sampler(self, base: Any) -> Any:
        # torch's iterators read the index sampler here; PassIndices records each pass's
        # starting state and fast-forwards a resumed one without fetching the skipped batches.
        # Only a weak reference: torch's iterator keeps its index sampler, and the loader keeps
        # a persistent iterator; a strong one would make a cycle that keeps the workers alive
        # after `del loader` until the garbage collector runs.
        loader = weakref.ref(self)

        def record() -> PassRecord | None:
            owner = loader()
            return None if owner is None else owner._pass

        def sources() -> OrderSources:
            owner = loader()
            no_sources = OrderSources(generators=(), global_rng=False, stateful=())
            return no_sources if owner is None else order_sources(owner)

        def watcher() -> Any:
            owner = loader()
            return None if owner is None else support_of(owner.dataset).prefetch_watcher()

        return PassIndices(base, record, sources, watcher)

    # ------------------------------------------------------------------ resume

    def state_dict(self) -> dict[str, Any]:
        """Where the caller is: the current pass and how many of its batches it received.

        Only batches yielded to the caller count (not those workers prefetched). Give the
        result to ``load_state_dict`` of a loader built with the same arguments to continue
        after the last batch received: bit-identical with ``seed`` and
        ``sample_seeding=True`` for any ``num_workers`` before and after; the same indices in
        the same batches otherwise (workers' augmentation streams are not restored). Between
        passes (or before the first) the state points at the start of the next pass.

        The result is plain data (ints, strings, bools, lists, dicts, ``uint8`` tensors) that
        ``torch.save`` writes and ``torch.load(..., weights_only=True)`` reads back, so it fits
        in any checkpoint; Lightning saves and restores it on its own. Taking a state never
        fails (frameworks take one at every checkpoint); ``load_state_dict`` refuses one it
        cannot honour.

        Returns:
            ``{"format", "version", "epoch", "batches_yielded", "start", "loader", ...}``:
            ``start`` is the order-defining state of the pass (a user generator, torch's
            global RNG when the sampler draws from it, a sampler's own ``state_dict``),
            ``loader`` what ``load_state_dict`` checks (dataset length, batch size, seed, ...),
            and ``"dataset"`` the ``state_dict()`` of an ``IterableDataset`` that has one.

        Examples:
            >>> loader = DataLoader(list(range(10)), batch_size=2, shuffle=True, seed=0)
            >>> it = iter(loader); _ = next(it), next(it)
            >>> state = loader.state_dict()
            >>> state["epoch"], state["batches_yielded"]
            (0, 2)
            >>> resumed = DataLoader(list(range(10)), batch_size=2, shuffle=True, seed=0)
            >>> resumed.load_state_dict(state)
            >>> [b.tolist() for b in resumed] == [b.tolist() for b in it]
            True
        """
        epoch, position, start = self._position()
        state: dict[str, Any] = {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "epoch": epoch,
            "batches_yielded": position,
            "start": start,
            "loader": fingerprint(self),
        }
        if self._is_iterable():
            dataset_state = getattr(self.dataset, "state_dict", None)
            state["dataset"] = dataset_state() if callable(dataset_state) else None
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next pass continue where ``state`` (from ``state_dict``) was taken.

        Call it on a loader built with the same arguments (``num_workers`` may differ),
        before iterating it. The batches the caller had already received are skipped at the
        index level: their samples are not read. An ``IterableDataset`` restores itself
        through its own ``load_state_dict``.

        Args:
            state: What ``state_dict()`` returned, possibly through ``torch.save`` /
                ``torch.load(..., weights_only=True)``.

        Raises:
            ConfigError: Not a loaderkit state, a newer version, or taken from a loader that
                differs (dataset length, batch size, seed, sampler, world size, ...: each
                named); a mid-pass state for an ``IterableDataset`` without
                ``state_dict``/``load_state_dict``, or from a loader with ``in_order=False``
                (its caller received batches out of order).

        Examples:
            >>> loader = DataLoader(list(range(6)), batch_size=2)
            >>> loader.load_state_dict({**loader.state_dict(), "epoch": 3, "batches_yielded": 1})
            >>> [b.tolist() for b in loader], loader.epoch
            ([[2, 3], [4, 5]], 3)
        """
        point = check_state(state, fingerprint(self), order_sources(self).stateful)
        if point.skip > 0 and "loader hooks" in self._torch_fallbacks:
            raise ConfigError(
                f"cannot resume at batch {point.skip} of epoch {point.epoch}: torch "
                f"{torch.__version__} changed the DataLoader members loaderkit uses to skip "
                "batches already read (loader.plan['torch'] says which), so this loader starts "
                "passes at their beginning. Resume from a state taken between epochs, or use a "
                f"torch loaderkit is tested on ({_torch.TESTED_FROM[0]}.{_torch.TESTED_FROM[1]} "
                f"to {_torch.TESTED_TO[0]}.{_torch.TESTED_TO[1]})."
            )
        if self._is_iterable():
            load = getattr(self.dataset, "load_state_dict", None)
            if callable(load) and state.get("dataset") is not None:
                load(state["dataset"])
            elif point.skip > 0:
                raise ConfigError(
                    f"cannot resume {type(self.dataset).__name__} mid-epoch (batch "
                    f"{point.skip} of epoch {point.epoch}): an IterableDataset decides its own "
                    "order, so it must save and restore its position itself. Add "
                    "state_dict() -> dict and load_state_dict(state) to the dataset, or resume "
                    "from a state taken between epochs."
                )
            point = ResumePoint(epoch=point.epoch, skip=0, start=point.start)
        self.set_epoch(point.epoch)
        self._resume = point

    def _position(self) -> tuple[int, int, dict[str, Any]]:
        """(epoch, batches the caller received in it, order-defining start state)."""
        if self._resume is not None:  # loaded, not iterated yet: the state is the loaded one
            return self._resume.epoch, self._resume.skip, self._resume.start
        record = self._pass
        if record is not None and not record.complete:
            return record.epoch, record.position, record.start
        return self._next_epoch, 0, next_pass_start(self, order_sources(self))

    def batches_per_pass(self) -> int | None:
        """The batches of one pass (``None``: an iterable dataset, or an unsized sampler).

        Examples:
            >>> DataLoader(list(range(10)), batch_size=4).batches_per_pass()
            3
        """
        if self._is_iterable():
            return None
        try:
            return len(_torch.torch_index_sampler(self))
        except TypeError:
            return None

    def _is_iterable(self) -> bool:
        return isinstance(self.dataset, IterableDataset)

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Shut down every worker process of this loader and close the dataset.

        Persistent workers and the workers of iterators still alive (an abandoned
        ``for ... break``) are asked to stop, then terminated and killed if they do not
        (torch waits up to 5 s per unresponsive worker before terminating it). Afterwards the
        dataset's own ``close()`` runs when it has one. Idempotent; never raises because a
        worker already died; iterating again starts fresh workers.

        Examples:
            >>> loader = DataLoader(list(range(4)), num_workers=0)
            >>> loader.close(); loader.close()
        """
        iterators = list(self._live_iterators)
        kept = _torch.kept_iterator(self)
        if kept is not None and kept not in iterators:
            iterators.append(kept)
        for iterator in iterators:
            shutdown_iterator(iterator)
        _torch.forget_kept_iterator(self)
        self._live_iterators = weakref.WeakSet()
        if not self._closed:
            self._closed = True
            call_hook(self.dataset, "close")

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ plan

    def handoff_stats(self) -> HandoffStats:
        """How this loader's batches crossed from its workers to the loop, counted so far.

        ``path`` is ``"slots"`` when the workers hand batches over in loaderkit's long-lived
        slots (``loader.plan["handoff"]`` says why or why not), and counts say how many
        batches were pooled, copied into a slot, or took torch's path because the loop held
        every slot (``fallback``: such batches are new shared memory, never a reused slot).

        Examples:
            >>> stats = DataLoader(list(range(4)), num_workers=0).handoff_stats()
            >>> stats.path, stats.batches
            ('torch', 0)
        """
        slots = self._handoff_slots if self.num_workers > 0 and not self._threads else 0
        path = "in memory" if self._threads and self.num_workers else "slots" if slots else "torch"
        return self._handoff_counts.snapshot(path, slots)

    def describe(self) -> str:
        """The resolved plan as text: setting, requested, used, reason.

        Examples:
            >>> print(DataLoader(list(range(4)), training=False).describe())  # doctest: +SKIP
        """
        text = self.plan.describe()
        now = support_of(self.dataset).cache_stats()
        if now is not None:  # a dataset read through a session cache: its counters now
            text += (
                "\ncache now (this process, its prefetcher and its workers): "
                f"{now.hits} hits, {now.misses} misses, {now.bytes_fetched} bytes fetched, "
                f"{now.seconds_waiting:.1f} s waiting, {now.evictions} evictions, "
                f"{now.free_bytes} bytes free"
            )
        return text
