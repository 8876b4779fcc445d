"""What loaderkit does during a pass: ``LoaderPass``, the hooks its iterators call.

One ``LoaderPass`` per iterator (a persistent iterator keeps it for every pass). It

* runs ``collate_fn`` with error context (``loaderkit.workers.collate_context``) and, with workers
and
  the slot pool, hands batches over in slots (``loaderkit.workers.worker`` in the workers, a
  ``loaderkit.workers.handoff.Receiver`` here) through queues whose small messages skip the feeder
  thread (``loaderkit.workers.queues``);
* lowers torch's threads in this process while workers run (``loaderkit.machine.intraop_threads``);
* counts the batches handed to the caller into the loader's current ``PassRecord`` (resume);
* turns every way torch notices a dead worker into one error naming its pid, signal and cause
  (``loaderkit.workers.deaths``), its ``SIGCHLD`` report included.

torch's side (where the hooks are called from) is ``loaderkit._torch.iterators``.

Examples:
    >>> hooks = LoaderPass(dataset=None)
    >>> hooks.collate(None, workers=0, pin_memory=False) is None
    True
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any

from loaderkit import _torch
from loaderkit.machine.intraop_threads import ThreadLimit
from loaderkit.order.resume import PassRecord
from loaderkit.policy import HANDOFF_HELD
from loaderkit.workers import wire
from loaderkit.workers.collate_context import CollateWithContext
from loaderkit.workers.deaths import (
    WorkerDeath,
    death_message,
    deaths_in_message,
    is_worker_death_error,
)
from loaderkit.workers.handoff import HandoffCounts, PinBackend, Received, Receiver
from loaderkit.workers.queues import DirectContext, direct_writes_possible
from loaderkit.workers.threadworkers import WorkerThreads
from loaderkit.workers.worker import HandoffCollate, HandoffConfig

__all__ = ["LoaderPass", "dead_workers", "pass_iterator"]

#: Seconds to wait for a dead worker to be seen dead after its queue failed.
DEATH_GRACE_S = 2.0


class LoaderPass(_torch.PassHooks):
    """loaderkit's hooks for one iterator of a loader.

    Args:
        dataset: The loader's dataset (named in worker-death messages).
        slots: Batch slots per worker (0: torch's hand-off).
        counts: The loader's ``HandoffCounts``.
        main_threads: torch's threads here while workers run (``None``: untouched).
        direct_queues: Queues whose small messages skip the feeder thread (with slots only).

    Attributes:
        record: The pass being counted (set by the loader at every pass).
        receiver: Maps the workers' slots (with slots and workers only).
    """

    def __init__(
        self,
        *,
        dataset: Any,
        slots: int = 0,
        counts: HandoffCounts | None = None,
        main_threads: int | None = None,
        direct_queues: bool = False,
    ) -> None:
        self.dataset = dataset
        self.slots = slots
        self.counts = counts
        self.direct_queues = direct_queues
        self.threads = ThreadLimit(main_threads)
        self.record: PassRecord | None = None
        self.receiver: Receiver | None = None

    # ------------------------------------------------------------------ set-up

    def collate(self, fn: Callable[[Any], Any], *, workers: int, pin_memory: bool) -> Any:
        """``fn`` with error context; with workers and slots, packing batches into slots."""
        if fn is not None and not isinstance(fn, CollateWithContext):
            fn = CollateWithContext(fn)
        if self.slots and self.counts is not None and workers > 0:
            pin = PinBackend if pin_memory and PinBackend.available() else None
            self.receiver = Receiver(self.counts, pin, hold=HANDOFF_HELD)
            fn = HandoffCollate(fn, HandoffConfig(self.receiver.token, self.slots))
        return fn

    def lend_pinned_slots(self, enabled: bool) -> None:
        """Lend slots registered with CUDA as they are (``DevicePrefetcher``: it orders reuse).

        Only a consumer that issues the copies itself and keeps each source batch until its
        copy has completed may turn this on; anywhere else pinned batches are copied into
        torch's caching pinned memory, whose allocator orders reuse after the copies.
        """
        if self.receiver is not None:
            self.receiver.lend_pinned = enabled

    def queue_context(self, context: Any) -> Any:
        """A ``DirectContext`` over ``context`` for slot loaders where pipes allow it."""
        if self.slots and self.direct_queues and direct_writes_possible():
            return DirectContext(context)
        return context

    def started(self, iterator: Any) -> None:
        """Register the workers, so torch's ``SIGCHLD`` report can be explained."""
        for worker in _torch.parts(iterator).workers:
            if worker.pid is not None:
                _LIVE_WORKERS[worker.pid] = iterator
        _torch.wrap_worker_signal_handler(_translate_death)

    # ------------------------------------------------------------------ batches

    def received(self, data: Any) -> Any:
        """A batch from a worker: a slot's batch becomes tensors; counted."""
        # a batch in a slot (pinned ones arrive as tensors), or one whose iterator ended
        if isinstance(data, (Received, wire.Orphan)):
            data = data.materialize()
        if self.counts is not None:
            self.counts.batches += 1
        return data

    def pass_starting(self) -> None:
        """Free the slots the loop let go of, lower torch's threads for the pass."""
        if self.receiver is not None:
            self.receiver.poll()  # before the workers get the new pass's first indices
        self.threads.lower()

    def fetching(self) -> None:
        """Free the slots of batches the loop has let go of."""
        if self.receiver is not None:
            self.receiver.poll()

    def pass_ended(self) -> None:
        """The pass is over: torch's threads back."""
        self.threads.restore()

    def yielded(self) -> None:
        """Count a batch the caller received."""
        if self.record is not None:
            self.record.yielded += 1

    def exhausted(self) -> None:
        """The caller saw the end of the pass."""
        if self.record is not None:
            self.record.finished = True

    def shut_down(self) -> None:
        """Workers stopped: torch's threads back, slots released (held ones when let go)."""
        self.threads.restore()
        if self.receiver is not None:
            self.receiver.close()

    # ------------------------------------------------------------------ worker deaths

    def failed(self, iterator: Any, error: BaseException) -> BaseException | None:
        """The error naming the dead workers when ``error`` is how a death was noticed."""
        return self.death_error(iterator, error, DEATH_GRACE_S)

    def death_error(self, iterator: Any, error: BaseException, wait: float) -> Exception | None:
        """``RuntimeError`` naming the dead workers of ``iterator``, or ``None`` (no death)."""
        if not is_worker_death_error(error):
            return None
        deaths = dead_workers(iterator, wait)
        if not deaths:
            return None
        return RuntimeError(death_message(deaths, self.dataset))


def pass_iterator(
    source: Any,
    dataset: Any,
    counts: HandoffCounts,
    *,
    slots: int,
    main_threads: int | None,
    workers: bool,
    threads: bool,
    fallbacks: tuple[str, ...] = (),
) -> Any:
    """The iterator of one pass over ``source`` (a loader or a view of it), with its hooks.

    Worker threads (``threads``) are carried by ``loaderkit.workers.threadworkers.WorkerThreads``
    (nothing crosses processes: no slots, torch's threads untouched); worker processes and no
    workers by torch's iterators with loaderkit's hooks (torch's own where a probe failed:
    ``fallbacks``); ``slots`` and ``main_threads`` apply with workers only.
    """
    if threads:
        hooks = LoaderPass(dataset=dataset, counts=counts)
        return _torch.thread_iterator(source, hooks, WorkerThreads)
    hooks = LoaderPass(
        dataset=dataset,
        slots=slots if workers else 0,
        counts=counts,
        main_threads=main_threads if workers else None,
        direct_queues="direct queues" not in fallbacks,
    )
    fallback = bool({"loader hooks", "iterators"} & set(fallbacks))
    return _torch.make_iterator(source, hooks, workers=workers, fallback=fallback)


def dead_workers(iterator: Any, wait: float, *, mark: bool = True) -> list[WorkerDeath]:
    """Workers of ``iterator`` that have ended, waiting up to ``wait`` s for the kernel to say so.

    A killed worker's pipes close a moment before it can be reaped, so the queue's error may
    come first. ``mark``: tell torch they are gone (not from a signal handler, which may have
    interrupted a queue operation).
    """
    parts = _torch.parts(iterator)
    deadline = time.monotonic() + wait
    while True:
        deaths = [
            WorkerDeath(worker_id, worker.pid, worker.exitcode)
            for worker_id, worker in enumerate(parts.workers)
            if worker.exitcode is not None
            and (worker.exitcode != 0 or parts.worker_active[worker_id])
        ]
        if deaths or time.monotonic() >= deadline:
            break
        time.sleep(0.01)
    for death in deaths if mark else ():
        if death.worker_id is not None and parts.worker_active[death.worker_id]:
            _torch.mark_worker_gone(iterator, death.worker_id)
    return deaths


#: Live worker-process iterators by worker pid (for errors raised by the SIGCHLD handler).
_LIVE_WORKERS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def _translate_death(error: RuntimeError) -> RuntimeError | None:
    """The error for torch's SIGCHLD report: the signal's name, the cause, the files."""
    if not is_worker_death_error(error):
        return None
    for death in deaths_in_message(str(error)):
        iterator = _LIVE_WORKERS.get(death.pid) if death.pid is not None else None
        hooks = _torch.hooks_of(iterator) if iterator is not None else None
        if isinstance(hooks, LoaderPass):
            translated = hooks.death_error(iterator, error, 0.0)
            if isinstance(translated, RuntimeError):
                return translated
    return None  # another loader's worker (torch's own DataLoader): torch's error as it is
