"""``DevicePrefetcher``: batches copied to the device one ahead, on a side stream.

``DevicePrefetcher`` wraps any iterable of batches. On a CUDA device it copies batch ``k+1``
on one side stream while the caller works on batch ``k``, and hands out a batch only after making
the caller's stream wait for its copy. A copy that blocks the host anyway (a batch with CPU
tensors in pageable memory, or ``non_blocking=False``) gains nothing from the side stream and
would only add synchronization to it, so such a batch is copied on the caller's stream when it
is handed out, exactly as a plain loop would. On any other device it is a pass-through that
applies ``loaderkit.device.transfer.to_device``.

Stream protocol of the prefetcher (one side stream ``S`` per prefetcher, consumer stream ``C`` =
the current stream when the caller asks for the next batch):

1. Before copying a batch, ``S`` waits for the work queued on ``C`` so far. Memory that the
   caller released (blocks of earlier batches, which the caching allocator returns to ``S``'s
   pool) is then never overwritten while the caller's queued kernels may still read it.
2. The copy runs under ``torch.cuda.stream(S)`` and an event is recorded on ``S`` after it.
3. Before batch ``k`` is handed out, ``C`` waits on batch ``k``'s event (not on all of ``S``: the
   copy of batch ``k+1``, already queued, keeps running concurrently) and every tensor of the
   batch is marked with ``record_stream(C)``, so the allocator does not reuse its memory before
   the work the caller queues on ``C`` has finished.

Blocking copies (pageable memory, ``non_blocking=False``) skip steps 1-3: the batch is moved with
``to_device`` on ``C`` when it is handed out (``C`` owns the memory, nothing to record).

The side stream is created once, lazily, on the first CUDA iteration, and reused by every later
epoch: a stream per epoch makes the caching allocator keep one pool of cached blocks per stream,
so reserved memory grows epoch after epoch (timm issue #2781).

Examples:
    >>> [b.tolist() for b in DevicePrefetcher([torch.ones(2)], "cpu")]
    [[1.0, 1.0]]
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any, Generic, TypeVar, cast

import torch

from loaderkit import _torch
from loaderkit.device.transfer import (
    DeviceLike,
    as_device,
    check_non_blocking,
    holds_pageable_memory,
    move,
)
from loaderkit.errors import ConfigError, PerformanceHint, warn
from loaderkit.order.hooks import call_hook

__all__ = ["DevicePrefetcher"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class _CudaBackend:
    """The CUDA calls the prefetcher makes, in one place (tests substitute a fake on CPU)."""

    @staticmethod
    def is_available() -> bool:
        return torch.cuda.is_available()

    @staticmethod
    def current_device() -> int:
        return torch.cuda.current_device()

    @staticmethod
    def new_stream(device: torch.device) -> Any:
        return torch.cuda.Stream(device=device)

    @staticmethod
    def current_stream(device: torch.device) -> Any:
        return torch.cuda.current_stream(device)

    @staticmethod
    def use_stream(stream: Any) -> contextlib.AbstractContextManager[Any]:
        return torch.cuda.stream(stream)

    @staticmethod
    def new_event() -> Any:
        return torch.cuda.Event()


class _Staged:
    """A batch staged for hand-out.

    Its copy is queued on the side stream (``event`` set, ``source`` the batch it reads), or it
    is copied on the consumer stream when it is handed out (``event`` is ``None``).
    """

    __slots__ = ("batch", "event", "source", "tensors")

    def __init__(
        self, batch: Any, event: Any, tensors: list[torch.Tensor], source: Any = None
    ) -> None:
        self.batch = batch
        self.event = event
        self.tensors = tensors
        self.source = source


_END = object()


class DevicePrefetcher(Generic[T]):
    """Iterate the batches of ``loader`` already on ``device``, copying one batch ahead on CUDA.

    On a CUDA device, batch ``k+1`` is copied on a side stream while the caller uses batch ``k``;
    the caller's current stream waits for a batch's copy before the batch is handed out, and the
    batch's tensors are marked with ``record_stream`` so their memory is not reused too early.
    The side stream is created once, on the first CUDA iteration, and reused every epoch. Copies
    overlap compute only from pinned memory (``pin_memory=True`` on the loader, loaderkit's
    default when CUDA is usable). A batch whose copy blocks the host anyway (CPU tensors in
    pageable memory, or ``non_blocking=False``) is copied on the caller's stream when it is
    handed out, as a plain ``to_device`` loop would, so the prefetcher is never slower than
    that loop; a ``LoaderkitWarning`` says once when pageable CPU tensors are seen. On any
    other device each batch goes through ``to_device``, with nothing held back.

    Each ``iter()`` starts a new pass over ``loader`` (one epoch), so the prefetcher can be
    iterated every epoch like a DataLoader; ``len()`` is the loader's. If the loader raises while
    the next batch is fetched, the batch already fetched is still handed out and the error is
    raised on the following ``next()``, as without prefetching.

    Notes:
        * The consumer stream is the current CUDA stream of ``device`` at each ``next()`` call;
          use the batch on that stream (or synchronize with it yourself).
        * The loader must not overwrite the host memory of a batch it has already yielded
          (torch's DataLoader never does): that batch's copy may still be running while the
          following batch is fetched.
        * With ``device="cuda"`` (no index) the current CUDA device at the first iteration is
          used for good; call ``torch.cuda.set_device`` before iterating (DDP: one device per
          process).

    Args:
        loader: Any iterable of batches: a DataLoader, a list, a re-iterable object. A generator
            or other iterator gives a single pass.
        device: Target device (``torch.device``, ``"cuda:0"``, ``"cpu"``, or an index on the
            current accelerator).
        non_blocking: Passed to ``to_device``; ``None`` (default) makes copies of pinned
            tensors to CUDA asynchronous and every other copy blocking. ``False`` makes every
            copy blocking, and then nothing overlaps.

    Attributes:
        loader: The wrapped iterable (reach the sampler, dataset, ``set_epoch`` ... through it).
        device: The target device as a ``torch.device``.
        non_blocking: The ``non_blocking`` argument.

    Examples:
        >>> import torch
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> loader = DataLoader(TensorDataset(torch.arange(6.0)), batch_size=2)
        >>> batches = DevicePrefetcher(loader, "cpu")
        >>> len(batches), [b[0].tolist() for b in batches]
        (3, [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]])
    """

    _backend: Any = _CudaBackend

    def __init__(
        self, loader: Iterable[T], device: DeviceLike, *, non_blocking: bool | None = None
    ) -> None:
        if not isinstance(loader, Iterable):
            raise TypeError(f"loader must be iterable, got {type(loader).__name__}")
        check_non_blocking(non_blocking)
        self.loader = loader
        self.device = as_device(device)
        self.non_blocking = non_blocking
        self._lock = threading.Lock()
        self._stream: Any = None
        self._cuda_device: torch.device | None = None
        self._warned_unpinned = False

    @property
    def stream(self) -> Any:
        """The side ``torch.cuda.Stream`` (``None`` before the first CUDA iteration or off CUDA)."""
        return self._stream

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]  # TypeError when it has no len()

    def __iter__(self) -> Iterator[T]:
        if self.device.type == "cuda":
            return self._iter_cuda()
        return self._iter_plain()

    def __repr__(self) -> str:
        # The loader's type, not its repr: a list of batches would print every tensor.
        loader = type(self.loader).__name__
        return f"{type(self).__name__}(loader=<{loader}>, device={str(self.device)!r})"

    def set_epoch(self, epoch: int) -> None:
        """Call ``loader.set_epoch(epoch)``.

        Args:
            epoch: The epoch number the loader's next pass should use.

        Raises:
            AttributeError: The loader has no ``set_epoch`` (for a torch DataLoader with a
                ``DistributedSampler``, call ``prefetcher.loader.sampler.set_epoch``).

        Examples:
            >>> class Loader(list):
            ...     def set_epoch(self, epoch):
            ...         self.epoch = epoch
            >>> prefetcher = DevicePrefetcher(Loader(), "cpu")
            >>> prefetcher.set_epoch(3)
            >>> prefetcher.loader.epoch
            3
        """
        set_epoch = getattr(self.loader, "set_epoch", None)
        if not callable(set_epoch):
            raise AttributeError(
                f"{type(self.loader).__name__} has no set_epoch(); set the epoch on the object "
                "that has one, e.g. prefetcher.loader.sampler.set_epoch(epoch)"
            )
        set_epoch(epoch)

    def close(self) -> None:
        """Call ``loader.close()`` when the loader has one (a loaderkit DataLoader does).

        Examples:
            >>> DevicePrefetcher([1, 2], "cpu").close()  # a list has nothing to close
        """
        call_hook(self.loader, "close")

    def __enter__(self) -> DevicePrefetcher[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- iteration

    def _iter_plain(self) -> Iterator[T]:
        for batch in self.loader:
            yield cast(T, move(batch, self.device, self.non_blocking))

    def _setup_cuda(self) -> tuple[torch.device, Any]:
        with self._lock:
            if self._stream is None:
                backend = self._backend
                if not backend.is_available():
                    raise ConfigError(
                        f"DevicePrefetcher: device {str(self.device)!r} requested but CUDA is "
                        "not available (torch.cuda.is_available() is False); use device='cpu'"
                    )
                index = self.device.index
                if index is None:
                    index = backend.current_device()
                self._cuda_device = torch.device("cuda", index)
                self._stream = backend.new_stream(self._cuda_device)
                logger.debug("DevicePrefetcher: side stream created on %s", self._cuda_device)
            return cast(torch.device, self._cuda_device), self._stream

    def _stage(self, batch: Any, device: torch.device, stream: Any) -> _Staged:
        if self.non_blocking is False:  # every copy blocks the host: nothing to overlap
            return _Staged(batch, None, [])
        if holds_pageable_memory(batch):
            if not self._warned_unpinned:
                self._warned_unpinned = True
                warn(
                    "DevicePrefetcher: batches contain CPU tensors in pageable memory, whose "
                    "copies to the GPU block the host and cannot overlap compute; they are "
                    "copied on your stream as each batch is handed out, as a plain loop "
                    "would. Create the loader with pin_memory=True (loaderkit's default when "
                    "CUDA is usable) for overlap",
                    PerformanceHint,
                )
            return _Staged(batch, None, [])
        backend = self._backend
        stream.wait_stream(backend.current_stream(device))
        produced: list[torch.Tensor] = []
        with backend.use_stream(stream):
            moved = move(batch, device, self.non_blocking, produced=produced)
            event = backend.new_event()
            event.record(stream)
        return _Staged(moved, event, produced, source=batch)

    def _hand_out(self, staged: _Staged, device: torch.device, copying: deque[Any]) -> T:
        if staged.event is None:  # a blocking copy, on the consumer stream, as a plain loop
            return cast(T, move(staged.batch, device, self.non_blocking))
        consumer = self._backend.current_stream(device)
        consumer.wait_event(staged.event)
        # the host memory the copy reads stays referenced until the copy has completed: a
        # loader's slot (docs/handoff.md) is not reused before, whatever the consumer does
        copying.append((staged.event, staged.source))
        staged.source = None
        while copying and copying[0][0].query():
            copying.popleft()
        for tensor in staged.tensors:
            if tensor.device == device:  # the consumer stream belongs to this device only
                _torch.record_stream(tensor, consumer)
        return cast(T, staged.batch)

    def _iter_cuda(self) -> Iterator[T]:
        device, stream = self._setup_cuda()
        iterator = iter(self.loader)
        # A loaderkit loader lends its pinned slots to this prefetcher, which issues the copies
        # from them itself and orders their reuse after those copies (``copying``).
        lend = getattr(_torch.hooks_of(iterator), "lend_pinned_slots", None)
        copying: deque[Any] = collections.deque()  # (event, source) of copies maybe running
        if callable(lend):
            lend(True)
        try:
            yield from self._pass_cuda(iterator, device, stream, copying)
        finally:
            if callable(lend):
                lend(False)
            while copying:  # the pass ends: its sources go once their copies are done
                event, _ = copying.popleft()
                event.synchronize()

    def _pass_cuda(
        self, iterator: Iterator[Any], device: torch.device, stream: Any, copying: deque[Any]
    ) -> Iterator[T]:
        try:
            first = next(iterator)
        except StopIteration:
            return
        staged: _Staged | None = self._stage(first, device, stream)
        del first  # the staged copy holds the source while its copy may run, nothing else
        while staged is not None:
            error: Exception | None = None
            try:
                upcoming: Any = next(iterator)
            except StopIteration:
                upcoming = _END
            except Exception as exc:  # handed out after the batch already staged
                error, upcoming = exc, _END
            ready = staged
            staged = None if upcoming is _END else self._stage(upcoming, device, stream)
            del upcoming
            yield self._hand_out(ready, device, copying)
            del ready
            if error is not None:
                raise error
