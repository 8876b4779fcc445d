"""What thread workers need of torch: per-thread worker info, the fetcher, the pass iterator.

Checked on torch 2.4.1 (``WorkerInfo`` a plain class taking keyword arguments; no
``thread_safe_generator``), 2.13.0 and 2.14.1 (``WorkerInfo`` a frozen slotted dataclass with
``rng`` and ``worker_method``; ``torch.thread_safe_generator``): their sources read, 2.13.0 and
2.15.0 (Python 3.14) run.
The members used are the same in 2.6.0, 2.9.1 and 2.12.0, which lie between (not re-read for
this module): ``get_worker_info`` returning its module global, the base iterator's attributes.

* ``get_worker_info()`` per thread: torch's reads one module global (``_worker_info``), set in
  each worker *process*. ``install_thread_info`` makes it answer per thread as torch's main
  branch does: a ``threading.local`` named ``_thread_local_worker_info`` in torch's worker
  module, read first. Where torch already has it, it is used as it is; elsewhere the function's
  code is replaced by that two-line lookup (the same function object, so every name already
  imported from torch sees it). In a worker process, and in any thread that is not a loaderkit
  worker thread, the local is empty and torch's global answers, as before.
* ``make_worker_info``: torch's ``WorkerInfo``, built with the fields this torch has (never
  changed afterwards: torch's is frozen); ``make_thread_rng``: torch's per-thread RNG record
  (``_RNG``) where it exists, which ``torch.thread_safe_generator()`` reads.
* ``create_fetcher``: torch's map/iterable fetcher (the same code a worker process runs).
* ``thread_iterator``: torch's base iterator with the pass logic of its worker-process iterator
  (round-robin dispatch, ``prefetch_factor`` per worker, ``in_order``, iterable-dataset ends,
  persistent reset), over a ``ThreadCarrier`` given from above
  (``loaderkit.workers.threadworkers``).

Examples:
    >>> info = make_worker_info(id=0, num_workers=2, seed=5, dataset=[1])
    >>> (info.id, info.num_workers, info.seed)
    (0, 2, 5)
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import threading
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.utils.data

from loaderkit._torch.iterators import PassHooks
from loaderkit._torch.loader import LoaderView

__all__ = [
    "CarrierFactory",
    "ThreadCarrier",
    "ThreadSetup",
    "create_fetcher",
    "install_thread_info",
    "make_thread_rng",
    "make_worker_info",
    "set_thread_info",
    "thread_info_probe",
    "thread_iterator",
    "thread_safe_generator_exists",
]

_LOCAL_NAME = "_thread_local_worker_info"


def _worker_module() -> Any:
    from torch.utils.data._utils import worker

    return worker


def _per_thread_lookup() -> Any:  # pragma: no cover - runs as torch's get_worker_info
    info = getattr(_thread_local_worker_info, "worker_info", None)  # type: ignore[name-defined]  # noqa: F821
    if info is not None:
        return info
    return _worker_info  # type: ignore[name-defined]  # noqa: F821


def thread_info_probe() -> str | None:
    """``None`` when ``get_worker_info()`` can answer per thread on this torch."""
    try:
        worker = _worker_module()
        function = worker.get_worker_info
        code = function.__code__
    except Exception as exc:
        return f"torch's get_worker_info cannot be read ({type(exc).__name__}: {exc})"
    if isinstance(getattr(worker, _LOCAL_NAME, None), threading.local) and (
        _LOCAL_NAME in code.co_names
    ):
        return None  # torch reads its own per-thread record
    if code.co_names != ("_worker_info",) or code.co_freevars or code.co_argcount:
        return "torch's get_worker_info does more than return its module global"
    return None


_INSTALL_LOCK = threading.Lock()


def install_thread_info() -> None:
    """Make ``torch.utils.data.get_worker_info()`` answer per thread (idempotent).

    Raises:
        RuntimeError: This torch's ``get_worker_info`` is not the one ``thread_info_probe``
            knows.
    """
    with _INSTALL_LOCK:
        worker = _worker_module()
        function = worker.get_worker_info
        if _LOCAL_NAME in function.__code__.co_names:
            if not isinstance(getattr(worker, _LOCAL_NAME, None), threading.local):
                setattr(worker, _LOCAL_NAME, threading.local())
            return
        problem = thread_info_probe()
        if problem is not None:
            raise RuntimeError(problem)
        setattr(worker, _LOCAL_NAME, threading.local())
        function.__code__ = _per_thread_lookup.__code__


def set_thread_info(info: Any) -> None:
    """Make ``get_worker_info()`` return ``info`` in the calling thread (``None``: torch's)."""
    local = getattr(_worker_module(), _LOCAL_NAME)
    local.worker_info = info


@functools.lru_cache(maxsize=1)
def _info_fields() -> tuple[str, ...]:
    cls = _worker_module().WorkerInfo
    if dataclasses.is_dataclass(cls):
        return tuple(f.name for f in dataclasses.fields(cls))
    return ("id", "num_workers", "seed", "dataset")  # torch's plain class, as its loop builds it


def make_worker_info(**values: Any) -> Any:
    """Torch's ``WorkerInfo`` from ``values``, keeping only the fields this torch has."""
    fields = _info_fields()
    return _worker_module().WorkerInfo(**{k: v for k, v in values.items() if k in fields})


def make_thread_rng(random_generator: Any, torch_generator: Any, numpy_generator: Any) -> Any:
    """Torch's per-thread RNG record (``WorkerInfo.rng``), or ``None`` where torch has none."""
    cls = getattr(_worker_module(), "_RNG", None)
    if cls is None:
        return None
    return cls(
        random_generator=random_generator,
        torch_generator=torch_generator,
        numpy_generator=numpy_generator,
    )


def thread_safe_generator_exists() -> bool:
    """Whether this torch has ``torch.thread_safe_generator`` (per-thread torch draws)."""
    return callable(getattr(torch, "thread_safe_generator", None))


def create_fetcher(
    iterable: bool, dataset: Any, auto_collation: bool, collate_fn: Any, drop_last: bool
) -> Any:
    """Torch's fetcher for a map-style (``iterable=False``) or iterable dataset."""
    from torch.utils.data.dataloader import _DatasetKind

    kind = _DatasetKind.Iterable if iterable else _DatasetKind.Map
    return _DatasetKind.create_fetcher(kind, dataset, auto_collation, collate_fn, drop_last)


@dataclasses.dataclass(frozen=True)
class ThreadSetup:
    """What the worker threads of one iterator run, as torch's iterator resolved it.

    Attributes:
        dataset: The dataset the workers read (the caller's object, or loaderkit's view of it).
        info_dataset: What ``get_worker_info().dataset`` is: the loader's own dataset object.
        iterable: An ``IterableDataset`` (workers report its end).
        auto_collation: Indices come in batches.
        collate_fn: The collate function (loaderkit's, with its error context).
        drop_last: As the loader's.
        base_seed: This iterator's base seed (worker ``i`` is seeded ``base_seed + i``).
        num_workers: How many worker threads.
        init_fn: The loader's ``worker_init_fn`` (loaderkit's ``WorkerInit``), or ``None``.
        pin: Pin batches in the worker thread.
        pin_device: The device to pin them for (``None``: torch's current accelerator).
    """

    dataset: Any
    info_dataset: Any
    iterable: bool
    auto_collation: bool
    collate_fn: Any
    drop_last: bool
    base_seed: int
    num_workers: int
    init_fn: Any
    pin: bool
    pin_device: str | None


class ThreadCarrier(Protocol):
    """The worker threads of one iterator (``loaderkit.workers.threadworkers.WorkerThreads``)."""

    def put(self, worker_id: int, message: Any) -> None:
        """Send ``(task, indices)`` to worker ``worker_id``."""

    def get(self, timeout: float) -> tuple[Any, Any]:
        """The next ``(task, payload)`` a worker sent (``RuntimeError`` after ``timeout`` > 0)."""
        ...

    def resume(self) -> None:
        """Restart every worker's pass (persistent workers) and wait until each has."""

    def ended(self, payload: Any) -> int | None:
        """The worker id when ``payload`` says its iterable dataset ended, else ``None``."""
        ...

    def finish(self, payload: Any) -> Any:
        """The batch to hand out for ``payload`` (raises a worker's error)."""
        ...

    def stop(self) -> None:
        """Stop every worker thread within bounded time (idempotent)."""


#: Builds and starts the worker threads of an iterator from its ``ThreadSetup``.
CarrierFactory = Callable[[ThreadSetup], ThreadCarrier]


def _profiling() -> bool:
    """Whether a torch profiler (autograd, Kineto, NVTX or ITT) is recording now."""
    return bool(torch._C._autograd._profiler_enabled())


@functools.lru_cache(maxsize=1)
def _thread_class() -> type:
    from loaderkit._torch.iterators import pass_bases

    bases = pass_bases()
    if bases is None:  # pragma: no cover - checked by the iterator probe
        raise RuntimeError("torch's iterator classes cannot be built")
    counting, setup = bases

    class Unrecorded(setup):  # type: ignore[misc, valid-type]
        """torch's ``__next__`` without ``record_function`` while no profiler records it.

        Its two operator calls release the GIL each batch, each a hand-over to a worker thread.
        Below the pass hooks (``counting``), which still count every batch.
        """

        def __next__(self) -> Any:
            if self._IterableDataset_len_called is not None or _profiling():
                return super().__next__()
            if self._sampler_iter is None:
                self._reset()
            data = self._next_data()
            self._num_yielded += 1
            return data

    class ThreadIter(counting, Unrecorded):  # type: ignore[misc, valid-type]
        """torch's pass logic over worker threads: the order of worker processes, exactly."""

        def __init__(self, loader: Any, hooks: PassHooks, carrier: CarrierFactory) -> None:
            self.loaderkit_hooks = hooks
            super().__init__(loader)
            self._prefetch_factor = loader.prefetch_factor
            self._in_order = getattr(loader, "in_order", True)
            self._iterable = isinstance(self._dataset, torch.utils.data.IterableDataset)
            self._shutdown = False
            self._carrier = carrier(
                ThreadSetup(
                    dataset=self._dataset,
                    info_dataset=(
                        loader.loader if isinstance(loader, LoaderView) else loader
                    ).dataset,
                    iterable=self._iterable,
                    auto_collation=self._auto_collation,
                    collate_fn=self._collate_fn,
                    drop_last=self._drop_last,
                    base_seed=int(self._base_seed),
                    num_workers=self._num_workers,
                    init_fn=loader.worker_init_fn,
                    pin=bool(self._pin_memory),
                    pin_device=getattr(self, "_pin_memory_device", None) or None,
                )
            )
            self._reset(loader, first_iter=True)

        def _reset(self, loader: Any, first_iter: bool = False) -> None:
            self.loaderkit_hooks.pass_starting()
            super()._reset(loader, first_iter)
            self._send_idx = 0
            self._rcvd_idx = 0
            self._task_info: dict[int, tuple[Any, ...]] = {}
            self._tasks_outstanding = 0
            self._workers_status = [True] * self._num_workers
            self._workers_num_tasks = [0] * self._num_workers
            self._worker_queue_idx_cycle = itertools.cycle(range(self._num_workers))
            if not first_iter:
                self._carrier.resume()
            for _ in range(self._prefetch_factor * self._num_workers):
                self._try_put_index()

        def _try_put_index(self) -> None:
            max_tasks = self._prefetch_factor * self._num_workers
            try:
                index = self._next_index()
            except StopIteration:
                return
            for _ in range(self._num_workers):  # the next active worker, if any
                worker_id = next(self._worker_queue_idx_cycle)
                if self._workers_status[worker_id] and (
                    self._in_order
                    or self._workers_num_tasks[worker_id] < max_tasks // sum(self._workers_status)
                ):
                    break
            else:
                return
            self._carrier.put(worker_id, (self._send_idx, index))
            self._task_info[self._send_idx] = (worker_id,)
            self._workers_num_tasks[worker_id] += 1
            self._tasks_outstanding += 1
            self._send_idx += 1

        def _next_data(self) -> Any:
            hooks = self.loaderkit_hooks
            hooks.fetching()
            while True:
                while self._rcvd_idx < self._send_idx:
                    info = self._task_info.get(self._rcvd_idx)
                    if info:
                        if len(info) == 2 or self._workers_status[info[0]]:
                            break
                        del self._task_info[self._rcvd_idx]
                    self._rcvd_idx += 1
                else:
                    hooks.pass_ended()
                    if not self._persistent_workers:
                        self._shutdown_workers()
                    raise StopIteration
                if len(self._task_info[self._rcvd_idx]) == 2:
                    worker_id, data = self._task_info.pop(self._rcvd_idx)
                    self._rcvd_idx += 1
                    return self._process_data(data, worker_id)
                idx, data = self._carrier.get(self._timeout)
                self._tasks_outstanding -= 1
                ended = self._carrier.ended(data) if self._iterable else None
                if ended is not None:
                    self._workers_status[ended] = False
                    self._try_put_index()
                    continue
                if idx != self._rcvd_idx:
                    if not self._in_order:
                        worker_id = self._task_info.pop(idx)[0]
                        return self._process_data(data, worker_id)
                    self._task_info[idx] += (data,)
                else:
                    worker_id = self._task_info.pop(idx)[0]
                    self._rcvd_idx += 1
                    return self._process_data(data, worker_id)

        def _process_data(self, data: Any, worker_id: int) -> Any:
            self._workers_num_tasks[worker_id] -= 1
            self._try_put_index()
            return self.loaderkit_hooks.received(self._carrier.finish(data))

        def _shutdown_workers(self) -> None:
            if self.__dict__.get("_shutdown", True):
                return
            self._shutdown = True
            try:
                self._carrier.stop()
            finally:
                self.__dict__.get("_task_info", {}).clear()
                self.loaderkit_hooks.shut_down()

        def __del__(self) -> None:
            self._shutdown_workers()

    return ThreadIter


def thread_iterator(loader: Any, hooks: PassHooks, carrier: CarrierFactory) -> Any:
    """The iterator of a pass whose ``loader.num_workers`` workers are threads.

    Args:
        loader: What torch's iterator reads (a loader or a ``LoaderView``).
        hooks: The pass's hooks.
        carrier: Builds and starts the worker threads from the iterator's ``ThreadSetup``.
    """
    return _thread_class()(loader, hooks, carrier)
