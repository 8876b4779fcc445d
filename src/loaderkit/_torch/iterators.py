"""loaderkit's pass iterators: torch's iterator classes, calling plain hooks.

Checked on torch 2.4.1, 2.6.0, 2.9.1, 2.12.0, 2.13.0, 2.14.1 and 2.15.0.

torch's DataLoader runs each pass with a ``_SingleProcessDataLoaderIter`` or a
``_MultiProcessingDataLoaderIter`` (kept between passes with persistent workers). loaderkit
subclasses both and calls a ``PassHooks`` object at the points it needs, so the rest of
loaderkit never names torch's private members:

* ``collate`` — once, before any worker starts: the collate function the pass runs with;
* ``queue_context`` — the multiprocessing context torch makes its queues from;
* ``started`` — the workers are running;
* ``received`` — every batch a worker sent, in the main process (exceptions excluded);
* ``pass_starting`` / ``fetching`` / ``pass_ended`` — a pass (re)starts, a batch is about to be
  fetched, the sampler is exhausted;
* ``yielded`` / ``exhausted`` — a batch was handed to the caller, the pass ended;
* ``failed`` — fetching raised a connection, EOF, OS or runtime error (the error to raise
  instead, or ``None``);
* ``shut_down`` — the workers were stopped.

``make_iterator`` builds the iterator for a pass; where the subclasses cannot be built on this
torch (``iterator_probe``), it returns torch's own iterator in a ``PublicIterator`` that still
counts what the caller received. ``parts`` reads the private members teardown and worker-death
handling need into a plain ``IteratorParts``; ``shutdown_workers`` and ``mark_worker_gone``
call torch's own.

Changes across the releases checked: ``_process_data`` takes the worker index from 2.7 on
(``(data)`` before); 2.13 registers persistent iterators for shutdown at exit.

While it waits for data, the worker-process iterator looks for dead workers every
``DEATH_POLL_S`` rather than once per ``timeout``: under ``forkserver`` (Python 3.14's Linux
default) workers are the server's children, and no ``SIGCHLD`` reaches the loader.

Examples:
    >>> import torch.utils.data
    >>> loader = torch.utils.data.DataLoader([1, 2, 3])
    >>> it = make_iterator(loader, PassHooks(), workers=False)
    >>> [int(batch) for batch in it]
    [1, 2, 3]
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from loaderkit._torch.collate import is_exception_wrapper
from loaderkit._torch.loader import LoaderView, torch_iterator

#: torch's interval between its checks of the workers while it waits for data
#: (``torch.utils.data._utils.MP_STATUS_CHECK_INTERVAL``, 5 s in every release checked).
STATUS_CHECK_S = 5.0

#: How often a pass waiting for data looks whether a worker died (torch: only after a whole
#: ``timeout`` or ``STATUS_CHECK_S``; a dead forkserver worker sends no SIGCHLD).
DEATH_POLL_S = 0.25

__all__ = [
    "DEATH_POLL_S",
    "STATUS_CHECK_S",
    "IteratorParts",
    "PassHooks",
    "PublicIterator",
    "direct_queues_probe",
    "hooks_of",
    "iterator_probe",
    "make_iterator",
    "mark_worker_gone",
    "parts",
    "pass_bases",
    "shutdown_workers",
]


class PassHooks:
    """What loaderkit does at the points of a pass; every hook here does nothing.

    One object per iterator (a persistent iterator keeps it for every pass).
    """

    def collate(self, fn: Callable[[Any], Any], *, workers: int, pin_memory: bool) -> Any:
        """The collate function the pass runs (called once, before any worker starts)."""
        return fn

    def queue_context(self, context: Any) -> Any:
        """The multiprocessing context torch makes its queues with (``context``: unchanged)."""
        return context

    def started(self, iterator: Any) -> None:
        """The iterator's workers have started."""

    def received(self, data: Any) -> Any:
        """A batch a worker sent, as the main process reads it (not exceptions)."""
        return data

    def pass_starting(self) -> None:
        """A pass (re)starts: before its first indices go to the workers."""

    def fetching(self) -> None:
        """A batch is about to be fetched."""

    def pass_ended(self) -> None:
        """The pass has no more batches."""

    def yielded(self) -> None:
        """A batch was handed to the caller."""

    def exhausted(self) -> None:
        """The caller was told the pass is over (``StopIteration``)."""

    def failed(self, iterator: Any, error: BaseException) -> BaseException | None:
        """The error to raise instead of ``error`` (raised while fetching), or ``None``."""
        return None

    def shut_down(self) -> None:
        """The workers were stopped (may be called more than once)."""


def hooks_of(iterator: Any) -> PassHooks | None:
    """The hooks an iterator ``make_iterator`` built calls (``None`` for any other iterator)."""
    hooks = getattr(iterator, "loaderkit_hooks", None)
    return hooks if isinstance(hooks, PassHooks) else None


@dataclass
class IteratorParts:
    """The parts of a torch iterator that teardown and worker-death handling need.

    Attributes:
        workers: The worker processes (``multiprocessing.Process``), in worker-id order.
        worker_active: Whether torch still counts on each worker (a live view: torch's list).
        index_queues: The queues indices are sent on, one per worker.
        result_queue: The queue workers send batches on.
        pin_thread: The pin-memory thread, if any.
        pin_done: The event that stops it.
        data_queue: Where the pin-memory thread puts pinned batches (``queue.Queue``), or the
            result queue without pinning.
        pending: Batches received ahead of their turn (torch's ``_task_info``).
    """

    workers: list[Any] = field(default_factory=list)
    worker_active: list[bool] = field(default_factory=list)
    index_queues: list[Any] = field(default_factory=list)
    result_queue: Any = None
    pin_thread: Any = None
    pin_done: Any = None
    data_queue: Any = None
    pending: Any = None


def _inner(iterator: Any) -> Any:
    return iterator.inner if isinstance(iterator, PublicIterator) else iterator


def parts(iterator: Any) -> IteratorParts:
    """What ``iterator`` holds of its workers and queues (empty for a single-process one)."""
    it = _inner(iterator)
    found = it.__dict__ if hasattr(it, "__dict__") else {}
    return IteratorParts(
        workers=list(found.get("_workers", ())),
        worker_active=found.get("_workers_status", []),
        index_queues=list(found.get("_index_queues", ())),
        result_queue=found.get("_worker_result_queue"),
        pin_thread=found.get("_pin_memory_thread"),
        pin_done=found.get("_pin_memory_thread_done_event"),
        data_queue=found.get("_data_queue"),
        pending=found.get("_task_info"),
    )


def shutdown_workers(iterator: Any) -> None:
    """Ask torch to stop the iterator's workers (its orderly shutdown; may raise)."""
    stop = getattr(_inner(iterator), "_shutdown_workers", None)
    if callable(stop):
        stop()


def mark_worker_gone(iterator: Any, worker_id: int) -> None:
    """Tell torch a worker is gone, so it stops waiting for it."""
    _inner(iterator)._mark_worker_as_unavailable(worker_id)


class PublicIterator:
    """torch's own iterator, where loaderkit's cannot be built: it only counts for the caller.

    Args:
        inner: torch's iterator.
        hooks: The pass's hooks (``yielded`` and ``exhausted`` are called).
    """

    def __init__(self, inner: Any, hooks: PassHooks) -> None:
        self.inner = inner
        self.loaderkit_hooks = hooks

    def __iter__(self) -> PublicIterator:
        return self

    def __next__(self) -> Any:
        try:
            data = next(self.inner)
        except StopIteration:
            self.loaderkit_hooks.exhausted()
            raise
        self.loaderkit_hooks.yielded()
        return data

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["inner"], name)


@functools.lru_cache(maxsize=1)
def pass_bases() -> tuple[type, type] | None:
    """The two mixins every loaderkit iterator class is built from, or ``None``.

    ``(counting, setup)``: ``counting`` calls ``yielded``/``exhausted`` around torch's
    ``__next__``; ``setup`` sits right above torch's base iterator and sets the collate
    function (``PassHooks.collate``) before any worker starts.
    """
    try:
        from torch.utils.data.dataloader import _BaseDataLoaderIter
    except ImportError:
        return None

    class _Setup(_BaseDataLoaderIter):
        """Right above torch's base: the collate function is set before workers start."""

        loaderkit_hooks: PassHooks

        def __init__(self, loader: Any) -> None:
            super().__init__(loader)
            self._collate_fn = self.loaderkit_hooks.collate(
                self._collate_fn, workers=self._num_workers, pin_memory=self._pin_memory
            )

    class _Counting(_BaseDataLoaderIter):
        loaderkit_hooks: PassHooks

        def __next__(self) -> Any:
            try:
                data = super().__next__()
            except StopIteration:
                self.loaderkit_hooks.exhausted()
                raise
            self.loaderkit_hooks.yielded()
            return data

    return _Counting, _Setup


@functools.lru_cache(maxsize=1)
def _classes() -> tuple[type, type] | None:
    """Loaderkit's single-process and worker-process iterator classes, or ``None``."""
    bases = pass_bases()
    try:
        from torch.utils.data.dataloader import (
            _MultiProcessingDataLoaderIter,
            _SingleProcessDataLoaderIter,
        )
    except ImportError:
        return None
    if bases is None:
        return None
    _Counting, _Setup = bases

    class SingleProcessIter(_Counting, _SingleProcessDataLoaderIter, _Setup):  # type: ignore[misc, valid-type]
        """torch's single-process iterator with loaderkit's hooks."""

        def __init__(self, loader: Any, hooks: PassHooks) -> None:
            self.loaderkit_hooks = hooks
            super().__init__(loader)

    class MultiProcessingIter(_Counting, _MultiProcessingDataLoaderIter, _Setup):  # type: ignore[misc, valid-type]
        """torch's worker-process iterator with loaderkit's hooks."""

        def __init__(self, loader: Any, hooks: PassHooks) -> None:
            self.loaderkit_hooks = hooks
            super().__init__(loader)
            hooks.started(self)

        def _process_data(self, data: Any, *worker_idx: Any) -> Any:
            if not is_exception_wrapper(data):
                data = self.loaderkit_hooks.received(data)
            return super()._process_data(data, *worker_idx)

        def _reset(self, loader: Any, first_iter: bool = False) -> None:
            self.loaderkit_hooks.pass_starting()
            super()._reset(loader, first_iter)

        def _shutdown_workers(self) -> None:
            try:
                super()._shutdown_workers()
            finally:
                hooks = self.__dict__.get("loaderkit_hooks")
                if hooks is not None:
                    hooks.shut_down()

        def _try_get_data(self, timeout: float = STATUS_CHECK_S) -> tuple[bool, Any]:
            # torch checks its workers' liveness only once a whole ``timeout`` passed with no
            # data. A forkserver's workers are not this process's children, so no SIGCHLD says
            # one died: look every DEATH_POLL_S instead (each look is a poll of a sentinel).
            deadline = time.monotonic() + timeout
            while True:
                step = max(0.0, min(DEATH_POLL_S, deadline - time.monotonic()))
                success, data = super()._try_get_data(step)
                if success or time.monotonic() >= deadline:
                    return success, data

        def _next_data(self) -> Any:
            hooks = self.loaderkit_hooks
            hooks.fetching()
            try:
                return super()._next_data()
            except StopIteration:
                hooks.pass_ended()
                raise
            except (ConnectionError, EOFError, OSError, RuntimeError) as error:
                translated = hooks.failed(self, error)
                if translated is None:
                    raise
                raise translated from error

    return SingleProcessIter, MultiProcessingIter


def make_iterator(loader: Any, hooks: PassHooks, *, workers: bool, fallback: bool = False) -> Any:
    """The iterator of a pass over ``loader`` (or a ``LoaderView`` of it), calling ``hooks``.

    Args:
        loader: What torch's iterator reads (a loader or a ``LoaderView``).
        hooks: The pass's hooks.
        workers: Worker processes (``num_workers > 0``).
        fallback: Use torch's own iterator (a probe failed): only ``collate``, ``yielded`` and
            ``exhausted`` are called.
    """
    classes = None if fallback else _classes()
    if classes is None:
        collate = hooks.collate(
            loader.collate_fn, workers=loader.num_workers, pin_memory=loader.pin_memory
        )
        view = loader if collate is loader.collate_fn else LoaderView(loader, collate_fn=collate)
        return PublicIterator(torch_iterator(view), hooks)
    single, multi = classes
    if not workers:
        return single(loader, hooks)
    base = loader.multiprocessing_context
    context = hooks.queue_context(torch.multiprocessing if base is None else base)
    if context is not None and context is not base and context is not torch.multiprocessing:
        loader = LoaderView(loader, multiprocessing_context=context)
    return multi(loader, hooks)


def _source(function: Any) -> str:
    """The source of one function (a class's whole source is much slower to get)."""
    return inspect.getsource(function)


def _parameters(function: Any) -> list[str]:
    return [name for name in inspect.signature(function).parameters if name != "self"]


def iterator_probe() -> str | None:
    """``None`` when loaderkit's iterator subclasses fit this torch's iterators."""
    try:
        from torch.utils.data.dataloader import (
            _BaseDataLoaderIter,
            _MultiProcessingDataLoaderIter,
            _SingleProcessDataLoaderIter,  # noqa: F401 - imported to check it is there
        )
    except ImportError as exc:
        return f"torch's iterator classes cannot be imported ({exc})"
    needed = {
        _BaseDataLoaderIter: ("__next__", "_next_data", "_reset"),
        _MultiProcessingDataLoaderIter: (
            "_process_data",
            "_shutdown_workers",
            "_mark_worker_as_unavailable",
            "_try_get_data",
        ),
    }
    for cls, names in needed.items():
        missing = [name for name in names if not callable(getattr(cls, name, None))]
        if missing:
            return f"{cls.__name__} has no {', '.join(missing)}"
    if _parameters(_MultiProcessingDataLoaderIter._process_data) not in (
        ["data"],
        ["data", "worker_idx"],
    ):
        return "_MultiProcessingDataLoaderIter._process_data takes other arguments"
    if _parameters(_MultiProcessingDataLoaderIter._reset)[:2] != ["loader", "first_iter"]:
        return "_MultiProcessingDataLoaderIter._reset takes other arguments"
    try:
        source = _source(_MultiProcessingDataLoaderIter.__init__)
        source += _source(_MultiProcessingDataLoaderIter._reset)
    except (OSError, TypeError) as exc:
        return f"torch's worker-process iterator cannot be read ({exc})"
    for name in ("_workers", "_workers_status", "_index_queues", "_worker_result_queue"):
        if f"self.{name} =" not in source:
            return f"_MultiProcessingDataLoaderIter no longer sets {name}"
    if _classes() is None:  # pragma: no cover - imports checked above
        return "loaderkit's iterator classes cannot be built"
    try:  # a real pass of a single-process iterator, hooks and all
        calls: list[str] = []

        class _Probe(PassHooks):
            def collate(self, fn: Any, *, workers: int, pin_memory: bool) -> Any:
                calls.append("collate")
                return fn

            def yielded(self) -> None:
                calls.append("yielded")

        loader = torch.utils.data.DataLoader(cast(Any, [0, 1]))
        got = list(make_iterator(loader, _Probe(), workers=False))
    except Exception as exc:
        return f"a single-process pass failed ({type(exc).__name__}: {exc})"
    if [int(x) for x in got] != [0, 1] or calls != ["collate", "yielded", "yielded"]:
        return "a single-process pass did not call loaderkit's hooks as expected"
    return None


#: Methods of torch's worker-process iterator that use its queues (its ``__init__`` first).
_QUEUE_USERS = (
    "__init__",
    "_reset",
    "_try_get_data",
    "_get_data",
    "_try_put_index",
    "_mark_worker_as_unavailable",
    "_shutdown_workers",
)
#: Methods of a queue torch's workers, iterator and pin-memory thread may call.
_QUEUE_CALLS = frozenset({"get", "put", "close", "cancel_join_thread", "join_thread"})


def direct_queues_probe() -> str | None:
    """``None`` when torch makes its queues with ``context.Queue()`` and calls only known methods.

    ``loaderkit.workers.queues.DirectQueue`` stands in for ``multiprocessing.Queue`` in torch's
    worker iterator: it must be created where torch creates its queues, and offer what torch calls.
    """
    import re

    try:
        from torch.utils.data._utils import pin_memory, worker
        from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

        methods = [
            getattr(_MultiProcessingDataLoaderIter, name)
            for name in _QUEUE_USERS
            if hasattr(_MultiProcessingDataLoaderIter, name)
        ]
        sources = [_source(m) for m in [*methods, worker._worker_loop, pin_memory._pin_memory_loop]]
    except Exception as exc:
        return f"torch's queue users cannot be read ({type(exc).__name__}: {exc})"
    if "multiprocessing_context.Queue()" not in sources[0]:
        return "torch's worker iterator no longer makes its queues with multiprocessing_context"
    calls = {
        method for source in sources for method in re.findall(r"\b(?:\w*_queue|q)\.(\w+)\(", source)
    }
    unknown = sorted(calls - _QUEUE_CALLS)
    if unknown:
        return f"torch calls {', '.join(unknown)} on its queues"
    return None
