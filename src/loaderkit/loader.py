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
  batch the caller received, exactly, with any number of workers (``loaderkit.resume``);
* ``DataLoader.plan`` / ``DataLoader.describe``: what was asked, what is used, and why.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import fields
from typing import Any, ClassVar, Literal, TypeVar

import torch.utils.data
from torch._utils import ExceptionWrapper
from torch.utils.data import Dataset, IterableDataset, Sampler
from torch.utils.data.dataloader import (
    _BaseDataLoaderIter,
    _MultiProcessingDataLoaderIter,
    _SingleProcessDataLoaderIter,
)

from loaderkit.deaths import (
    WorkerDeath,
    death_message,
    deaths_in_message,
    is_worker_death_error,
)
from loaderkit.errors import ConfigError, check_int, warn
from loaderkit.handoff import HandoffCounts, HandoffStats, PinBackend, Received, Receiver
from loaderkit.hooks import call_hook
from loaderkit.plan import Plan
from loaderkit.planning import plan_loader
from loaderkit.platform import PlatformInfo
from loaderkit.policy import LoaderRequest
from loaderkit.queues import DirectContext, DirectQueue, direct_writes_possible
from loaderkit.resume import (
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
from loaderkit.seeding import SampleSeeder, WorkerInit, epoch_seed
from loaderkit.threads import ThreadLimit
from loaderkit.worker import HandoffCollate, HandoffConfig

__all__ = ["DataLoader", "loaders_built_since"]

logger = logging.getLogger("loaderkit")

#: Seconds to wait for a worker after asking it to stop, then after terminating it.
_KILL_GRACE_S = 1.0
#: Seconds to wait for a dead worker to be seen dead after its queue failed.
_DEATH_GRACE_S = 2.0


_T_co = TypeVar("_T_co", covariant=True)

#: Generators loaderkit created from ``seed`` (a loader rebuilt with one keeps owning it).
_OWNED_GENERATORS: weakref.WeakSet[torch.Generator] = weakref.WeakSet()

#: Live loaders by construction number (``loaders_built_since``).
_REGISTRY: weakref.WeakValueDictionary[int, DataLoader[Any]] = weakref.WeakValueDictionary()


def loaders_built_since(mark: int) -> list[DataLoader[Any]]:
    """The live loaders of this process built after ``DataLoader._built`` was ``mark``.

    Oldest first. Integrations use it to find the loaders a stage built, which a framework may
    have replaced by rebuilt copies.

    Examples:
        >>> mark = DataLoader._built
        >>> loader = DataLoader([1, 2])
        >>> loaders_built_since(mark) == [loader]
        True
    """
    return [_REGISTRY[n] for n in sorted(_REGISTRY.keys()) if n > mark and n in _REGISTRY]


class DataLoader(torch.utils.data.DataLoader[_T_co]):
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
            (CPU-affinity aware, per local rank, capped at 8). *Windows policy*: on Windows,
            while ``force_zero_workers_on_windows`` is True, any value becomes 0 with a
            warning.
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
        force_zero_workers_on_windows: The Windows zero-worker policy (default on).
        distributed: ``"auto"``: under an initialized ``torch.distributed`` group with world
            size > 1 and no user sampler, shard the data (training with a ``seed``: an
            ``ElasticSampler``, whose global batches do not depend on the world size; without
            one: ``DistributedSampler``; ``training=False``: an exact shard with no padded
            duplicates). ``True`` requires a process group; ``False`` never shards.
        platform: A ``PlatformInfo`` to plan for instead of detecting this
            machine (tests; "what would happen on Windows?").

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
        force_zero_workers_on_windows: bool = True,
        distributed: bool | str = "auto",
        platform: PlatformInfo | None = None,
    ) -> None:
        if isinstance(worker_init_fn, WorkerInit):
            # Rebuilt from this loader's own attributes (Lightning's attribute path): take the
            # caller's function back, so seeding is installed once, for this process's rank.
            worker_init_fn = worker_init_fn.user_fn
        if generator is not None and generator in _OWNED_GENERATORS:
            # The generator another loaderkit loader created from ``seed``: still owned, so
            # this loader reseeds it from (seed, epoch) as the original did.
            generator = None
        sample_seeding = bool(sample_seeding)
        arguments = locals()  # the signature above is the one place the arguments are listed
        request = LoaderRequest(**{f.name: arguments[f.name] for f in fields(LoaderRequest)})
        setup = plan_loader(dataset, request, platform)
        super().__init__(dataset, **setup.torch_kwargs)  # type: ignore[arg-type]
        if setup.owns_generator and self.generator is not None:
            _OWNED_GENERATORS.add(self.generator)
        self.plan: Plan = setup.plan
        # loaderkit's own arguments, as passed, under their parameter names: frameworks rebuild
        # a loader from attributes named like its __init__ parameters.
        self.training = training
        self.seed = setup.seed
        self.sample_seeding = bool(sample_seeding)
        self.force_zero_workers_on_windows = force_zero_workers_on_windows
        self.distributed = distributed
        self.platform = platform
        self._defer_sharding = setup.defers_sharding
        self._owns_generator = setup.owns_generator
        self._sample_seeder: SampleSeeder | None = setup.sample_seeder
        self._handoff_slots = setup.handoff_slots
        self._main_threads = setup.main_threads
        self._handoff_counts = HandoffCounts()
        self._next_epoch = 0
        self._epoch: int | None = None
        self._epoch_requested = False  # loader.set_epoch() called since the last pass
        self._epochs_set: dict[int, Any] = {}  # id(target) -> the epoch it was last left at
        for target in self._epoch_targets():  # as built: any later change is the caller's
            self._epochs_set[id(target)] = getattr(target, "epoch", None)
        self._live_iterators: weakref.WeakSet[_BaseDataLoaderIter] = weakref.WeakSet()
        self._pass: PassRecord | None = None  # the current or most recent pass
        self._resume: ResumePoint | None = None  # a loaded state the next pass starts from
        self._closed = False
        DataLoader._built += 1
        _REGISTRY[DataLoader._built] = self

    # ------------------------------------------------------------------ epochs

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

    def _epoch_targets(self) -> list[Any]:
        targets: list[Any] = []
        seen: set[int] = set()
        for obj in (
            self.sampler,
            self.batch_sampler,
            getattr(self.batch_sampler, "sampler", None),
            self.dataset,
        ):
            if obj is not None and id(obj) not in seen:
                seen.add(id(obj))
                targets.append(obj)
        return targets

    def _external_epoch(self, targets: list[Any]) -> int | None:
        """An epoch the caller set directly on a sampler (classic ``sampler.set_epoch(e)``)."""
        for target in targets:
            current = getattr(target, "epoch", None)
            is_int = isinstance(current, int) and not isinstance(current, bool)
            if is_int and current != self._epochs_set.get(id(target)):
                return current
        return None

    def _begin_pass(self) -> int:
        targets = self._epoch_targets()
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
        if self._owns_generator and self.seed is not None and self.generator is not None:
            self.generator.manual_seed(epoch_seed(self.seed, epoch))
            if self.persistent_workers and self.num_workers > 0 and self._iterator is not None:
                # A new iterator draws the workers' base seed from the generator before the
                # sampler does; a persistent one is only reset and draws nothing. Draw the same
                # number so the order of pass n is the same persistent or not.
                torch.empty((), dtype=torch.int64).random_(generator=self.generator)
        for target in targets:
            if call_hook(target, "set_epoch", epoch):
                self._epochs_set[id(target)] = getattr(target, "epoch", epoch)
        self._pass = PassRecord(epoch=epoch, total=self._batches_per_pass())
        if resume is not None:
            self._pass.skip, self._pass.start, self._pass.resumed = resume.skip, resume.start, True
        return epoch

    def __iter__(self) -> _BaseDataLoaderIter:
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
        if isinstance(iterator, _CountingIterator):
            iterator._record = self._pass
        self._live_iterators.add(iterator)
        return iterator

    def _get_iterator(self) -> _BaseDataLoaderIter:
        source: Any = self
        if self._sample_seeder is not None:
            source = _SampleSeedingView(self, self._sample_seeder)
        if self.num_workers == 0:
            return _SingleProcessIter(source)
        self.check_worker_number_rationality()
        return _MultiProcessingIter(source)

    @property
    def _index_sampler(self) -> Any:
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

        return PassIndices(super()._index_sampler, record, sources)

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
        point = check_state(state, fingerprint(self))
        if point.skip > 0 and state["loader"].get("in_order") is False:
            raise ConfigError(
                f"cannot resume at batch {point.skip} of epoch {point.epoch}: the loader that "
                "saved this state had in_order=False, so the batches its caller received were "
                "not the first ones of the pass. Resume from a state taken between epochs, or "
                "train with in_order=True (torch's default) where resuming mid-epoch matters."
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

    def _batches_per_pass(self) -> int | None:
        if self._is_iterable():
            return None
        try:
            return len(super()._index_sampler)
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
        if self._iterator is not None and self._iterator not in iterators:
            iterators.append(self._iterator)
        for iterator in iterators:
            _shutdown_iterator(iterator)
        self._iterator = None
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
        slots = self._handoff_slots if self.num_workers > 0 else 0
        return self._handoff_counts.snapshot("slots" if slots else "torch", slots)

    def describe(self) -> str:
        """The resolved plan as text: setting, requested, used, reason.

        Examples:
            >>> print(DataLoader(list(range(4)), training=False).describe())  # doctest: +SKIP
        """
        return self.plan.describe()


def _shutdown_iterator(iterator: _BaseDataLoaderIter) -> None:
    """Stop an iterator's workers; escalate to terminate/kill; never raise."""
    if not isinstance(iterator, _MultiProcessingDataLoaderIter):
        return
    try:
        iterator._shutdown_workers()
    except Exception:  # a worker that died mid-shutdown: fall through to the hard stop
        logger.debug("loaderkit: orderly worker shutdown failed", exc_info=True)
    for worker in getattr(iterator, "_workers", ()):
        try:
            if worker.is_alive():
                worker.terminate()
                worker.join(_KILL_GRACE_S)
            if worker.is_alive():
                worker.kill()
                worker.join(_KILL_GRACE_S)
        except Exception:  # pragma: no cover - process already reaped
            logger.debug("loaderkit: could not stop worker %s", worker, exc_info=True)
    _release_iterator(iterator)


def _release_iterator(iterator: _MultiProcessingDataLoaderIter) -> None:
    """Close every descriptor a stopped iterator still owns in this process; never raise.

    torch leaves them to garbage collection of the iterator, which may never come while
    something still refers to it: older torch releases register every worker of a persistent
    pinned iterator with ``atexit`` (2 pipe ends per worker held until the interpreter exits),
    and a caller, a framework or a traceback may hold the iterator itself. What is released:

    * the pin-memory thread (joined first: it reads the result queue);
    * the result queue and the index queues (multiprocessing queues: one pipe, two ends, each);
      torch closes the result queue only when pinning, and ``Queue.close()`` closes nothing
      in a process that never put on the queue, so the ends are closed here;
    * each reaped worker's ``Popen`` pipe ends (its sentinel): ``Process`` objects stay
      usable (``join``/``is_alive``/``exitcode`` answer from the recorded exit code);
    * batches received but not yet handed out (pinned memory, shared-memory descriptors).
    """
    import queue

    queues = list(getattr(iterator, "_index_queues", ()))
    thread = getattr(iterator, "_pin_memory_thread", None)
    if thread is not None and thread.is_alive():
        done = getattr(iterator, "_pin_memory_thread_done_event", None)
        if done is not None:
            done.set()
        thread.join(_KILL_GRACE_S)
    if thread is None or not thread.is_alive():
        queues.append(getattr(iterator, "_worker_result_queue", None))
    else:  # pragma: no cover - stuck pinning a batch: it still reads the result queue
        logger.debug("loaderkit: pin-memory thread did not stop; the result queue stays open")
    for mp_queue in queues:
        if mp_queue is not None:
            _close_mp_queue(mp_queue)
    data_queue = getattr(iterator, "_data_queue", None)
    if isinstance(data_queue, queue.Queue):  # pinned batches the pin thread had queued
        with data_queue.mutex:
            data_queue.queue.clear()
    task_info = getattr(iterator, "_task_info", None)
    if isinstance(task_info, dict):  # out-of-order batches held for later
        task_info.clear()
    receiver = getattr(iterator, "_receiver", None)
    if isinstance(receiver, Receiver):  # slots: batches the caller holds keep their memory
        receiver.close()
    for worker in getattr(iterator, "_workers", ()):
        _release_process(worker)


def _close_mp_queue(mp_queue: Any) -> None:
    """Close both pipe ends of a multiprocessing queue in this process."""
    if isinstance(mp_queue, DirectQueue):
        mp_queue.release()
        return
    try:
        mp_queue.cancel_join_thread()
        mp_queue.close()  # with a feeder thread: it flushes, then closes both ends itself
    except Exception:  # pragma: no cover - already closed or half built
        logger.debug("loaderkit: closing a queue failed", exc_info=True)
    feeder = getattr(mp_queue, "_thread", None)
    if feeder is not None:
        feeder.join(_KILL_GRACE_S)
        if feeder.is_alive():  # pragma: no cover - still writing into a full pipe
            return  # closing the ends now would make it fail loudly; it closes them when done
    for end in (getattr(mp_queue, "_reader", None), getattr(mp_queue, "_writer", None)):
        try:
            if end is not None:
                end.close()
        except OSError:  # pragma: no cover - already closed
            pass


def _release_process(worker: Any) -> None:
    """Close the pipe ends multiprocessing keeps for a worker that has been reaped."""
    try:
        if worker.exitcode is None:  # running, or never started: nothing to release safely
            return
        popen = getattr(worker, "_popen", None)
        close = getattr(popen, "close", None)
        if callable(close):
            close()
    except Exception:  # pragma: no cover - a Process already closed by someone else
        logger.debug("loaderkit: could not release worker %s", worker, exc_info=True)


# --------------------------------------------------------------------------- iterators


class CollateWithContext:
    """The caller's ``collate_fn`` as loaderkit's iterators run it: failures say where.

    An exception raised by ``collate_fn`` (the caller's, torch's ``default_collate`` or
    loaderkit's) keeps its type and gains a note naming the batch's size, the process and the
    worker. Installed on the iterator, before its workers start, never on the loader:
    ``loader.collate_fn`` stays the object the caller passed (frameworks rebuild loaders from
    it). Picklable when the wrapped function is (spawn sends it to each worker).

    Attributes:
        fn: The wrapped collate function.
    """

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def __call__(self, batch: Any) -> Any:
        try:
            return self.fn(batch)
        except Exception as exc:
            _note_collate_failure(exc, self.fn, batch)
            raise

    def __reduce__(self) -> tuple[Any, ...]:
        return (CollateWithContext, (self.fn,))


def _note_collate_failure(exc: BaseException, fn: Any, batch: Any) -> None:
    """Add loaderkit's note to an exception raised by ``collate_fn`` (Python 3.11+)."""
    if not hasattr(exc, "add_note"):  # pragma: no cover - Python 3.10
        return
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    module = getattr(fn, "__module__", None)
    size = f"a batch of {len(batch)} samples" if hasattr(batch, "__len__") else "a sample"
    info = torch.utils.data.get_worker_info()
    where = (
        f"worker {info.id} of {info.num_workers} (pid {os.getpid()})"
        if info is not None
        else f"the main process (pid {os.getpid()}, num_workers=0)"
    )
    exc.add_note(
        f"loaderkit: collate_fn {module + '.' if module else ''}{name} failed on {size} in "
        f"{where}; rerun with num_workers=0 to debug it in the main process"
    )


class _CollateContext(_BaseDataLoaderIter):
    """Runs ``collate_fn`` inside ``CollateWithContext``, set before any worker starts.

    Placed right above torch's base iterator in the method order, so torch's worker-process
    iterator hands the wrapped function to the workers it starts in its ``__init__``.
    """

    def __init__(self, loader: Any) -> None:
        super().__init__(loader)
        if self._collate_fn is not None and not isinstance(self._collate_fn, CollateWithContext):
            self._collate_fn = CollateWithContext(self._collate_fn)


class _HandoffSetup(_BaseDataLoaderIter):
    """Installs loaderkit's slot hand-off (``loaderkit.worker``) before the workers start.

    Placed between torch's worker-process iterator and ``_CollateContext`` in the method
    order: the workers receive ``HandoffCollate(CollateWithContext(collate_fn))``, and this
    process a ``Receiver`` that maps their slots.
    """

    _receiver: Receiver | None = None

    def __init__(self, loader: Any) -> None:
        super().__init__(loader)
        slots = getattr(loader, "_handoff_slots", 0)
        counts = getattr(loader, "_handoff_counts", None)
        self._handoff_counts = counts
        if slots and isinstance(counts, HandoffCounts) and self._num_workers > 0:
            pin = PinBackend if self._pin_memory and PinBackend.available() else None
            self._receiver = Receiver(counts, pin)
            self._collate_fn = HandoffCollate(
                self._collate_fn, HandoffConfig(self._receiver.token, slots)
            )


class _CountingIterator(_BaseDataLoaderIter):
    """Counts the batches handed to the caller into the loader's current ``PassRecord``."""

    _record: PassRecord | None = None

    def __next__(self) -> Any:
        record = self._record
        try:
            data = super().__next__()
        except StopIteration:
            if record is not None:
                record.finished = True
            raise
        if record is not None:
            record.yielded += 1
        return data


class _SingleProcessIter(_CountingIterator, _SingleProcessDataLoaderIter, _CollateContext):
    """torch's single-process iterator, counting what the caller received."""


class _MultiProcessingIter(
    _CountingIterator, _MultiProcessingDataLoaderIter, _HandoffSetup, _CollateContext
):
    """torch's worker-process iterator, counting what the caller received.

    A worker that dies always surfaces as one ``RuntimeError`` naming its pid and signal
    (``loaderkit.deaths``), whichever of torch's channels noticed first: the ``SIGCHLD``
    handler, the liveness check, or a result-queue read that fails half-way
    (``ConnectionResetError``, ``EOFError``), which names no pid at all.
    """

    def __init__(self, loader: Any) -> None:
        # torch's threads here, lowered for each pass where the workers need the CPUs
        self._threads = ThreadLimit(getattr(loader, "_main_threads", None))
        if getattr(loader, "_handoff_slots", 0) and direct_writes_possible():
            loader = _DirectQueuesView(loader)  # slot messages skip the feeder threads
        super().__init__(loader)
        for worker in self._workers:
            if worker.pid is not None:
                _LIVE_WORKERS[worker.pid] = self
        _wrap_sigchld_handler()

    def _process_data(self, data: Any, worker_idx: int) -> Any:
        if isinstance(data, Received):  # a batch in a slot (pinned ones arrive as tensors)
            data = data.materialize()
        counts = self._handoff_counts
        if counts is not None and not isinstance(data, ExceptionWrapper):
            counts.batches += 1
        return super()._process_data(data, worker_idx)

    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        receiver = self._receiver
        if receiver is not None:
            receiver.poll()  # before the workers get the new pass's first indices
        self._threads.lower()
        super()._reset(loader, first_iter)

    def _shutdown_workers(self) -> None:
        try:
            super()._shutdown_workers()
        finally:
            self._threads.restore()
            receiver = self._receiver
            if receiver is not None:
                receiver.close()

    def _next_data(self) -> Any:
        receiver = self._receiver
        if receiver is not None:
            receiver.poll()  # slots of batches the loop has let go of
        try:
            return super()._next_data()
        except StopIteration:
            self._threads.restore()  # the pass is over
            raise
        except (ConnectionError, EOFError, OSError, RuntimeError) as error:
            translated = self._death_error(error, _DEATH_GRACE_S)
            if translated is None:
                raise
            raise translated from error

    def _death_error(self, error: BaseException, wait: float) -> RuntimeError | None:
        """The error naming the dead workers, when ``error`` is how a death was noticed."""
        if not is_worker_death_error(error):
            return None
        deaths = self._dead_workers(wait)
        if not deaths:
            return None
        return RuntimeError(death_message(deaths, self._dataset))

    def _dead_workers(self, wait: float, *, mark: bool = True) -> list[WorkerDeath]:
        """Workers that have ended, waiting up to ``wait`` seconds for the kernel to say so.

        A killed worker's pipes close a moment before it can be reaped, so the queue's error
        may come first. ``mark``: tell torch they are gone (not from a signal handler, which
        may have interrupted a queue operation).
        """
        deadline = time.monotonic() + wait
        while True:
            deaths = [
                WorkerDeath(worker_id, worker.pid, worker.exitcode)
                for worker_id, worker in enumerate(self._workers)
                if worker.exitcode is not None
                and (worker.exitcode != 0 or self._workers_status[worker_id])
            ]
            if deaths or time.monotonic() >= deadline:
                break
            time.sleep(0.01)
        for death in deaths if mark else ():
            if death.worker_id is not None and self._workers_status[death.worker_id]:
                self._mark_worker_as_unavailable(death.worker_id)
        return deaths


#: Live worker-process iterators by worker pid (for errors raised by the SIGCHLD handler).
_LIVE_WORKERS: weakref.WeakValueDictionary[int, _MultiProcessingIter] = (
    weakref.WeakValueDictionary()
)


def _translate_death(error: RuntimeError) -> RuntimeError | None:
    """The error for torch's SIGCHLD report: the signal's name, the cause, the files."""
    if not is_worker_death_error(error):
        return None
    named = deaths_in_message(str(error))
    for death in named:
        iterator = _LIVE_WORKERS.get(death.pid) if death.pid is not None else None
        if iterator is not None:
            translated = iterator._death_error(error, 0.0)
            if translated is not None:
                return translated
    return None  # another loader's worker (torch's own DataLoader): torch's error as it is


def _wrap_sigchld_handler() -> None:
    """Wrap torch's SIGCHLD handler so its error names the signal like every other path.

    torch installs one handler per process that raises "DataLoader worker (pid N) is killed
    by signal: Killed." wherever the main thread is; the wrapper re-raises it as loaderkit's
    error (same type, chained). Main thread only, as signal handlers must be.
    """
    if not hasattr(signal, "SIGCHLD") or threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signal.SIGCHLD)
    if not callable(current) or getattr(current, "_loaderkit_wrapper", False):
        return

    def handler(signum: int, frame: Any) -> None:
        try:
            current(signum, frame)
        except RuntimeError as error:
            translated = _translate_death(error)
            if translated is None:
                raise
            raise translated from error

    handler._loaderkit_wrapper = True  # type: ignore[attr-defined]
    signal.signal(signal.SIGCHLD, handler)


# --------------------------------------------------------------------------- sample seeding


class _Tagged:
    """A batch of indices (or one index) with the epoch it belongs to."""

    __slots__ = ("epoch", "indices")

    def __init__(self, epoch: int, indices: Any) -> None:
        self.epoch = epoch
        self.indices = indices

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Tagged, (self.epoch, self.indices))


class _EpochTagger:
    """Wraps the index sampler so each batch carries the loader's epoch to the workers."""

    def __init__(self, index_sampler: Any, loader: DataLoader) -> None:
        self.index_sampler = index_sampler
        self._loader = weakref.ref(loader)

    def __iter__(self) -> Iterator[_Tagged]:
        loader = self._loader()
        epoch = loader.epoch if loader is not None else 0
        for indices in self.index_sampler:
            yield _Tagged(epoch, indices)

    def __len__(self) -> int:
        return len(self.index_sampler)


class SampleSeededDataset(Dataset[Any]):
    """Worker-side wrapper for ``sample_seeding=True``: seeds the RNGs around each sample.

    It receives batches tagged with their epoch, produces each sample inside
    ``SampleSeeder.seeded(epoch, index)`` and forwards ``set_epoch`` to the wrapped dataset's
    copy (which persistent workers would otherwise never see). Attribute reads fall through to
    the wrapped dataset, so ``get_worker_info().dataset.attr`` keeps working.

    A dataset with ``getitems_seeded(indices, seed_sample)`` (``HDF5SessionDataset``) reads
    the batch at once and calls ``seed_sample(index)`` right before each sample's random step,
    so per-sample seeding keeps batched reads; any other dataset is read one index at a time.
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

    def _enter_epoch(self, epoch: int) -> None:
        if epoch != self._epoch:
            self.__dict__["_epoch"] = epoch
            call_hook(self.dataset, "set_epoch", epoch)

    def __getitem__(self, tagged: _Tagged) -> Any:
        self._enter_epoch(tagged.epoch)
        with self.seeder.seeded(tagged.epoch, tagged.indices):
            return self.dataset[tagged.indices]

    def __getitems__(self, tagged: _Tagged) -> list[Any]:
        self._enter_epoch(tagged.epoch)
        dataset, seed_sample, epoch = self.dataset, self.seeder.seed_sample, tagged.epoch
        with self.seeder.batch():
            seeded = getattr(dataset, "getitems_seeded", None)
            if callable(seeded):  # reads the batch at once, seeds each sample's random step
                return seeded(tagged.indices, lambda i: seed_sample(epoch, i))
            samples = []
            for index in tagged.indices:
                seed_sample(epoch, index)
                samples.append(dataset[index])
        return samples

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


class _DirectQueuesView:
    """What torch's worker iterator sees of a loader with slots: ``DirectQueue`` queues.

    torch creates its index and result queues with ``loader.multiprocessing_context.Queue()``
    (the ``torch.multiprocessing`` module when unset); this view gives it a ``DirectContext``
    over the same context, so the workers are started exactly as before.
    """

    def __init__(self, loader: Any) -> None:
        self._loader = loader
        base = loader.multiprocessing_context
        self.multiprocessing_context = DirectContext(
            torch.multiprocessing if base is None else base
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _SampleSeedingView:
    """What torch's iterators see of a sample-seeding loader: tagged indices, wrapped dataset."""

    def __init__(self, loader: DataLoader, seeder: SampleSeeder) -> None:
        self._loader = loader
        self.dataset = SampleSeededDataset(loader.dataset, seeder)
        self._index_sampler = _EpochTagger(loader._index_sampler, loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
