"""Worker threads: the carrier that runs a loader's worker contract in threads of this process.

What a worker does is the same whichever carries it: seed its streams and run the caller's
``worker_init_fn`` (the loader's ``WorkerInit``, once per worker), fetch each batch of indices
with torch's fetcher and the loader's collate function (``CollateWithContext``), and report an
error with where it happened. A worker process runs that in torch's worker loop; a worker
thread runs it in ``WorkerThreads`` below, and adds only what a thread needs:

* ``get_worker_info()`` answers per thread (``loaderkit._torch.install_thread_info``): the
  thread's id, ``num_workers``, seed (``base_seed + id``, as a process's) and the dataset
  object itself (shared, not a copy); ``None`` in every other thread;
* its own random streams (``ThreadWorker``): a ``random.Random``, a ``torch.Generator`` (what
  ``torch.thread_safe_generator()`` returns in the thread, where torch has it) and a numpy
  ``Generator``, all from the thread's seed; ``loaderkit.worker_rng()`` is per thread too;
* batches pinned in the worker thread when the loader pins;
* an error raised in the caller as the same exception object, with a note naming the worker
  thread and the indices it was loading.

There is no shared-memory hand-off, no signal handler and nothing is pickled: batches are
Python objects handed over a ``queue.Queue``, and ``default_collate`` stacks them in ordinary
memory (``_stack_in_thread``; torch's rule everywhere else).

Shared state and locks:

* each worker's index queue and the one result queue are ``queue.Queue`` objects (their own
  lock each; a ``get`` waits in slices of ``POLL_S`` so a stop is seen);
* ``WorkerThreads.stopping`` (a ``threading.Event``) tells every thread to end; no loaderkit
  lock is held while a thread reads its dataset, collates or pins;
* ``SharedDraws`` (a set under its own lock, held only to add or copy a name) records which of
  the process-wide RNGs changed while a worker thread loaded a batch, while
  ``watch_shared_rngs`` is open (``_watches``, under ``_watches_lock``, held only to add or
  remove a watch);
* ``_running`` (a ``threading.local``) holds the ``ThreadWorker`` of the current thread.

A thread stuck in a read that never returns cannot be interrupted: ``stop`` waits up to
``JOIN_S`` in all for the threads, then leaves a stuck one as a daemon thread (it ends when its
read returns, or with the process), logs it, and returns.

Examples:
    >>> current_worker() is None   # the caller's thread is no worker
    True
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from loaderkit import _torch
from loaderkit.errors import add_note

__all__ = [
    "JOIN_S",
    "POLL_S",
    "SharedDraws",
    "ThreadWorker",
    "WorkerThreads",
    "current_worker",
    "watch_shared_rngs",
]

logger = logging.getLogger("loaderkit")

#: Seconds a waiting worker thread or caller sleeps at most before checking for a stop.
POLL_S = 0.1
#: Seconds ``WorkerThreads.stop`` waits for its threads to end (all of them together).
JOIN_S = 2.0


@dataclass
class ThreadWorker:
    """What one worker thread holds of its own (read through ``current_worker``).

    Attributes:
        id: The worker id.
        num_workers: How many worker threads the iterator has.
        seed: ``base_seed + id``, as a worker process is seeded.
        random: The thread's ``random.Random``.
        torch_generator: The thread's ``torch.Generator``.
        numpy_generator: The thread's ``numpy.random.Generator``.
        streams: Per-thread state of ``loaderkit.order.seeding`` (``worker_rng``).
    """

    id: int
    num_workers: int
    seed: int
    random: random.Random
    torch_generator: torch.Generator
    numpy_generator: np.random.Generator
    streams: Any = None


_running = threading.local()


def current_worker() -> ThreadWorker | None:
    """The ``ThreadWorker`` of the calling thread, or ``None`` outside a worker thread."""
    return getattr(_running, "worker", None)


@dataclass
class SharedDraws:
    """Which process-wide RNGs changed while a worker thread loaded a batch (names, sorted)."""

    _names: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, names: Sequence[str]) -> None:
        """Record ``names``."""
        if names:
            with self._lock:
                self._names.update(names)

    def names(self) -> list[str]:
        """The names recorded so far, sorted."""
        with self._lock:
            return sorted(self._names)


_watches: list[SharedDraws] = []
_watches_lock = threading.Lock()


@contextmanager
def watch_shared_rngs() -> Iterator[SharedDraws]:
    """While open, record the shared RNGs that change while any worker thread loads a batch.

    Each worker thread then compares Python's ``random``, numpy's legacy global RNG and torch's
    default generator before and after each batch (about 0.25 ms a batch, so only while
    watched: ``check_determinism`` watches). A change means the dataset drew from one, or
    another thread did meanwhile.

    Examples:
        >>> with watch_shared_rngs() as draws:
        ...     pass
        >>> draws.names()
        []
    """
    draws = SharedDraws()
    with _watches_lock:
        _watches.append(draws)
    try:
        yield draws
    finally:
        with _watches_lock:
            _watches.remove(draws)


#: The RNGs every thread of a process shares, by the name ``check_determinism`` gives them.
SHARED_RNGS = (
    "Python's random module",
    "numpy's legacy global RNG (np.random.*)",
    "torch's default generator",
)


def _fingerprint() -> tuple[Any, ...]:
    """Where each shared RNG stands (compared before and after a batch)."""
    numpy_state = np.random.get_state(legacy=False)
    mt = numpy_state["state"]
    return (
        random.getstate(),
        (mt["pos"], int(mt["key"][0]), numpy_state["has_gauss"], numpy_state["gauss"]),
        bytes(torch.default_generator.get_state().numpy()),
    )


def _stack_in_thread(batch: Sequence[torch.Tensor], *, collate_fn_map: Any = None) -> Any:
    """``default_collate``'s tensor rule: a plain ``torch.stack`` in a worker thread.

    torch's rule stacks into new shared memory whenever ``get_worker_info()`` is set, for the
    trip to another process; a worker thread's batch makes no such trip.
    """
    rule = _torch.tensor_rule()
    assert rule is not None  # installed only where torch has a rule map
    elem = batch[0]
    if current_worker() is None or elem.is_nested or elem.layout != torch.strided:
        return rule(batch, collate_fn_map=collate_fn_map)
    return torch.stack(list(batch), 0)


class _Stop:
    """The message that ends a worker thread."""


class _Resume:
    """The message that restarts a worker's pass (persistent workers)."""


@dataclass(frozen=True)
class _Ended:
    """A worker's iterable dataset has no more samples."""

    worker_id: int


@dataclass
class _Failure:
    """An exception a worker raised, with where."""

    error: BaseException


def _where(worker_id: int, num_workers: int, indices: Any = None) -> str:
    if indices is None:
        return (
            f"loaderkit: raised by worker_init_fn in DataLoader worker thread {worker_id} of "
            f"{num_workers}"
        )
    shown = getattr(indices, "indices", indices)  # a batch tagged with its epoch: its indices
    if isinstance(shown, (list, tuple)) and len(shown) > 16:
        shown = f"{list(shown[:16])} ... ({len(shown)} indices)"
    return (
        f"loaderkit: raised in DataLoader worker thread {worker_id} of {num_workers} "
        f"while loading dataset index(es) {shown}; rerun with num_workers=0 to debug it in "
        "the caller's thread"
    )


class WorkerThreads:
    """The worker threads of one iterator, started at construction.

    Args:
        setup: What the threads run (``loaderkit._torch.ThreadSetup``).
    """

    def __init__(self, setup: _torch.ThreadSetup) -> None:
        _torch.install_thread_info()
        _torch.install_tensor_collate(_stack_in_thread)  # torch's rule outside worker threads
        self.setup = setup
        self.stopping = threading.Event()
        # SimpleQueue: C code that takes no Python lock (queue.Queue's Python conditions cost
        # microseconds of GIL time per batch on both sides)
        self.results: queue.SimpleQueue[tuple[Any, Any]] = queue.SimpleQueue()
        self.inboxes: list[queue.SimpleQueue[Any]] = [
            queue.SimpleQueue() for _ in range(setup.num_workers)
        ]
        self.threads: list[threading.Thread] = []
        try:
            for worker_id in range(setup.num_workers):
                thread = threading.Thread(
                    target=self._run,
                    args=(worker_id,),
                    name=f"loaderkit-worker-{worker_id}",
                    daemon=True,
                )
                thread.start()
                self.threads.append(thread)
        except BaseException:
            self.stop()
            raise

    # ------------------------------------------------------------------ the caller's side

    def put(self, worker_id: int, message: Any) -> None:
        """Send ``(task, indices)`` to worker ``worker_id``."""
        self.inboxes[worker_id].put(message)

    def get(self, timeout: float) -> tuple[Any, Any]:
        """The next ``(task, payload)``; ``RuntimeError`` after ``timeout`` s (0: no limit)."""
        deadline = time.monotonic() + timeout if timeout > 0 else None
        while True:
            wait = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
            try:
                return self.results.get(timeout=max(wait, 0.0))
            except queue.Empty:
                pass
            if deadline is not None and time.monotonic() >= deadline:
                raise RuntimeError(f"DataLoader timed out after {timeout} seconds")
            dead = [t.name for t in self.threads if not t.is_alive()]
            if dead and not self.stopping.is_set():
                raise RuntimeError(f"DataLoader worker thread(s) {', '.join(dead)} ended")

    def resume(self) -> None:
        """Restart every worker's pass and wait for each to acknowledge."""
        for inbox in self.inboxes:
            inbox.put(_Resume())
        waiting = len(self.inboxes)
        while waiting:
            task, _ = self.get(0)
            if isinstance(task, _Resume):
                waiting -= 1

    def ended(self, payload: Any) -> int | None:
        """The worker id when ``payload`` says its iterable dataset ended."""
        return payload.worker_id if isinstance(payload, _Ended) else None

    def finish(self, payload: Any) -> Any:
        """The batch for ``payload``; a worker's error is raised here, as itself."""
        if isinstance(payload, _Failure):
            error = payload.error
            payload.error = None  # type: ignore[assignment]  # no cycle through the frame
            raise error
        return payload

    def stop(self) -> None:
        """Ask every thread to end; wait up to ``JOIN_S`` in all; never raise."""
        self.stopping.set()
        for inbox in self.inboxes:
            inbox.put(_Stop())
        stuck = []
        deadline = time.monotonic() + JOIN_S
        for thread in self.threads:
            if thread is threading.current_thread():
                continue
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                stuck.append(thread.name)
        if stuck:
            logger.warning(
                "loaderkit: worker thread(s) %s did not end within %.0f s of close() (a read "
                "that does not return); left as daemon threads, they end when the read "
                "returns or with the process",
                ", ".join(stuck),
                JOIN_S,
            )
        with suppress(queue.Empty):
            while True:  # batches nobody will take: freed now
                self.results.get_nowait()

    # ------------------------------------------------------------------ the worker's side

    def _run(self, worker_id: int) -> None:
        setup = self.setup
        seed = setup.base_seed + worker_id
        worker = ThreadWorker(
            id=worker_id,
            num_workers=setup.num_workers,
            seed=seed,
            random=random.Random(seed),
            torch_generator=torch.Generator().manual_seed(seed),
            numpy_generator=np.random.default_rng(
                np.random.SeedSequence(entropy=setup.base_seed, spawn_key=(worker_id,))
            ),
        )
        _running.worker = worker
        _torch.set_thread_info(
            _torch.make_worker_info(
                id=worker_id,
                num_workers=setup.num_workers,
                seed=seed,
                dataset=setup.info_dataset,
                rng=_torch.make_thread_rng(
                    worker.random, worker.torch_generator, worker.numpy_generator
                ),
                worker_method="thread",
            )
        )
        try:
            self._serve(worker)
        except BaseException:  # pragma: no cover - the loop itself failed: the caller sees it dead
            logger.debug("loaderkit: worker thread %d failed", worker_id, exc_info=True)
        finally:
            _torch.set_thread_info(None)
            _running.worker = None

    def _fetcher(self) -> Any:
        s = self.setup
        return _torch.create_fetcher(
            s.iterable, s.dataset, s.auto_collation, s.collate_fn, s.drop_last
        )

    def _serve(self, worker: ThreadWorker) -> None:
        setup, inbox = self.setup, self.inboxes[worker.id]
        init_error: BaseException | None = None
        fetcher = None
        try:
            if setup.init_fn is not None:
                setup.init_fn(worker.id)
            fetcher = self._fetcher()
        except Exception as exc:
            add_note(exc, _where(worker.id, setup.num_workers))
            init_error = exc
        iteration_end = False
        while not self.stopping.is_set():
            try:
                message = inbox.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if isinstance(message, _Stop):
                return
            if isinstance(message, _Resume):
                iteration_end = False
                if init_error is None:
                    fetcher = self._fetcher()
                self.results.put((message, None))
                continue
            if iteration_end:
                continue
            task, indices = message
            if init_error is not None:
                payload: Any = _Failure(init_error)
                init_error = None
            else:
                payload, iteration_end = self._fetch(worker, fetcher, indices)
            if not self.stopping.is_set():
                self.results.put((task, payload))
            del payload, message

    def _fetch(self, worker: ThreadWorker, fetcher: Any, indices: Any) -> tuple[Any, bool]:
        setup = self.setup
        watches = list(_watches)
        before = _fingerprint() if watches else None
        try:
            data = fetcher.fetch(indices)
            if setup.pin:
                data = _torch.pin_memory(data, setup.pin_device)
        except StopIteration:
            if setup.iterable:
                return _Ended(worker.id), True
            error: BaseException = RuntimeError("the dataset raised StopIteration")
            add_note(error, _where(worker.id, setup.num_workers, indices))
            return _Failure(error), False
        except Exception as exc:
            add_note(exc, _where(worker.id, setup.num_workers, indices))
            return _Failure(exc), False
        finally:
            if before is not None:
                changed = zip(SHARED_RNGS, before, _fingerprint(), strict=True)
                names = [name for name, was, now in changed if was != now]
                for draws in watches:
                    draws.add(names)
        return data, False
