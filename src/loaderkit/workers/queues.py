"""Queues between a loader's processes whose small messages skip the feeder thread.

``multiprocessing.Queue.put`` hands every message to a feeder thread, which pickles it and
writes it to the pipe. For a batch that crosses as a slot number (``loaderkit.workers.worker``)
that is two thread hand-offs per message, in the worker and in the main process, each a wake-up
and a GIL switch: on a machine with few CPUs they slow the loop the worker feeds
(``docs/handoff.md`` has the measurements, from ``benchmarks/handoff.py``).

``DirectQueue.put`` pickles in the calling thread and writes the message itself when that
cannot wait on a reader: the message fits in one atomic pipe write (``select.PIPE_BUF``, 4 KiB
on Linux), nothing of this process is waiting to be written before it (order is kept), the
queue's write lock comes free within ``_WAIT_S``, and the kernel takes it at once (the write
goes through a non-blocking descriptor of the same pipe: all of it or, when the pipe is full,
nothing). Anything else (a batch sent by value, a full pipe, another writer busy) goes through a
feeder thread as with ``multiprocessing.Queue``, so a writer never blocks on a reader, and the
messages of one process arrive in the order they were put. ``get``, ``close``,
``cancel_join_thread`` and pickling for spawned processes behave as ``multiprocessing.Queue``'s
do (torch's worker loop and pin-memory thread use only those).

``DirectContext`` wraps a multiprocessing context (or module) so that its ``Queue()`` is a
``DirectQueue``; everything else is the context's own.

Examples:
    >>> import multiprocessing
    >>> q = DirectQueue(multiprocessing.get_context("fork"))
    >>> q.put({"slot": 3}); q.get(timeout=5)
    {'slot': 3}
    >>> q.close()
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import queue
import select
import struct
import sys
import threading
import time
import weakref
from multiprocessing import connection, context
from multiprocessing.reduction import ForkingPickler
from multiprocessing.util import register_after_fork
from typing import Any

__all__ = ["DirectContext", "DirectQueue", "direct_writes_possible"]

logger = logging.getLogger("loaderkit")

#: Writes of at most this many bytes are atomic: all of the message or nothing.
_ATOMIC = getattr(select, "PIPE_BUF", 512)
#: Bytes ``Connection.send_bytes`` puts before a message (its length, ``"!i"``).
_FRAME_HEADER = 4
#: How long a put waits for another process's write before leaving the message to the feeder.
_WAIT_S = 0.1
#: How long ``close`` waits for the feeder to write what is pending.
CLOSE_WAIT_S = 5.0


def direct_writes_possible() -> bool:
    """Whether a pipe can be reopened non-blocking through ``/proc/self/fd`` (Linux).

    Example:
        >>> isinstance(direct_writes_possible(), bool)
        True
    """
    return sys.platform.startswith("linux") and os.path.isdir("/proc/self/fd")


class DirectQueue:
    """A ``multiprocessing.Queue`` whose small messages are written by the putting thread.

    Args:
        ctx: The multiprocessing context the locks come from (that of the processes using it).
    """

    def __init__(self, ctx: Any) -> None:
        self._reader, self._writer = connection.Pipe(duplex=False)
        self._rlock = ctx.Lock()  # readers, across processes
        self._wlock = ctx.Lock()  # writers, across processes: whole messages
        self._nonblocking: _Descriptor | None = None
        self._clear_local_state()
        register_after_fork(self, DirectQueue._clear_local_state)

    def __getstate__(self) -> tuple[Any, ...]:
        context.assert_spawning(self)
        return (self._reader, self._writer, self._rlock, self._wlock)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self._reader, self._writer, self._rlock, self._wlock = state
        self._nonblocking = None  # a new process: its own descriptor, opened when first needed
        self._clear_local_state()

    def _clear_local_state(self) -> None:
        """This process's own state (new after a fork: the parent's threads are not here).

        A non-blocking descriptor inherited through fork stays valid and is kept.
        """
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._pending: collections.deque[Any] = collections.deque()
        self._feeder: threading.Thread | None = None
        self._closed = False

    # ------------------------------------------------------------------ writing

    def _direct_fd(self) -> int:
        """A non-blocking descriptor of the pipe's writing end (``_NONE``, ``_CLOSED``)."""
        descriptor = self._nonblocking
        if descriptor is None:
            try:
                path = f"/proc/self/fd/{self._writer.fileno()}"
                descriptor = _Descriptor(os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC))
            except OSError:
                descriptor = _Descriptor(_NONE)
            else:  # closed with the queue, or when it is collected: once either way
                closer = weakref.finalize(self, descriptor.close)
                # not at interpreter exit while the queue lives: torch's iterators may still
                # put on it then (their __del__), and the number must stay this pipe's
                closer.atexit = False
            self._nonblocking = descriptor
        return descriptor.fd

    def put(self, obj: Any, block: bool = True, timeout: float | None = None) -> None:
        """Send ``obj`` (never blocks: what cannot be written at once goes to the feeder)."""
        if self._closed:
            raise ValueError("put on a closed queue")
        data = ForkingPickler.dumps(obj)
        with self._lock:
            if len(data) + _FRAME_HEADER <= _ATOMIC and not self._pending:
                fd = self._direct_fd()
                if fd == _CLOSED:
                    # the collector closed it with the queue's garbage (its callbacks run before
                    # the __del__ of an iterator in the same cycle, which puts): undeliverable
                    logger.debug("loaderkit: put on a queue being collected is dropped")
                    return
                # another process holds the lock for a direct write (microseconds) or while
                # its feeder writes a large message: wait a little, then leave it to the feeder
                if fd >= 0 and self._wlock.acquire(True, _WAIT_S):
                    try:  # framed as Connection.send_bytes frames it; the reader unframes it
                        frame = struct.pack("!i", len(data)) + bytes(data)
                        os.write(fd, frame)  # atomic: the whole frame, or BlockingIOError
                        return
                    except BlockingIOError:  # the pipe is full: the feeder waits for room
                        pass
                    except BrokenPipeError:  # no reader left (the feeder drops it too)
                        logger.debug("loaderkit: queue has no reader", exc_info=True)
                        return
                    finally:
                        self._wlock.release()
            self._pending.append(data)
            if self._feeder is None:
                self._feeder = threading.Thread(
                    target=self._feed, name="loaderkit-queue-feeder", daemon=True
                )
                self._feeder.start()
            self._wake.notify()

    def put_nowait(self, obj: Any) -> None:
        """``put(obj)``."""
        self.put(obj)

    def _feed(self) -> None:
        """Write pending messages in order; each leaves ``_pending`` only once written."""
        while True:
            with self._wake:
                while not self._pending:
                    if self._closed:
                        self._feeder = None
                        return
                    self._wake.wait()
                data = self._pending[0]  # still pending: later puts queue behind it
            try:
                with self._wlock:
                    self._writer.send_bytes(data)
            except OSError:  # the reading end is gone (shutdown): nothing can be delivered
                logger.debug("loaderkit: queue feeder could not write", exc_info=True)
                with self._lock:
                    self._pending.clear()
                    self._feeder = None  # a later put starts a new one
                return
            with self._lock:
                self._pending.popleft()

    # ------------------------------------------------------------------ reading

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """The next message; ``queue.Empty`` when none came within ``timeout``."""
        if block and timeout is None:
            with self._rlock:
                data = self._reader.recv_bytes()
            return ForkingPickler.loads(data)
        deadline = time.monotonic() + (timeout or 0.0)
        if not self._rlock.acquire(block, timeout):
            raise queue.Empty
        try:
            left = max(0.0, deadline - time.monotonic()) if block else 0.0
            if not self._reader.poll(left):
                raise queue.Empty
            data = self._reader.recv_bytes()
        finally:
            self._rlock.release()
        return ForkingPickler.loads(data)

    def get_nowait(self) -> Any:
        """``get(block=False)``."""
        return self.get(False)

    def empty(self) -> bool:
        """Nothing to read right now."""
        return not self._reader.poll()

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """No more puts from this process; the feeder writes what is pending, then ends.

        Waits (at most ``CLOSE_WAIT_S``) for the feeder: torch's worker exits right after
        ``close``, and a process that exits while its feeder holds the write lock (which it
        releases only once it gets the GIL back after writing) would leave the lock taken
        for every other writer of the queue.
        """
        with self._wake:
            self._closed = True
            self._wake.notify()
        feeder = self._feeder
        if feeder is not None and feeder is not threading.current_thread():
            feeder.join(CLOSE_WAIT_S)
        if self._nonblocking is not None:
            # never write to the number again: the kernel may give it to another file
            self._nonblocking.close()
        self._reader.close()

    def release(self) -> None:
        """``close``, then close this process's ends of the pipe (a closed iterator's queues).

        Left open while the feeder still writes (a full pipe nobody reads): it fails and drops
        what it holds once the ends are closed by the collector.
        """
        self.close()
        feeder = self._feeder
        if feeder is not None and feeder.is_alive():
            return
        for end in (self._reader, self._writer):
            end.close()

    def cancel_join_thread(self) -> None:
        """Exiting never waits for the feeder (a daemon thread): as torch asks of its queues."""

    def join_thread(self) -> None:
        """Wait for the feeder to write what is pending (after ``close``)."""
        feeder = self._feeder
        if feeder is not None and feeder is not threading.current_thread():
            feeder.join()


#: ``_Descriptor.fd`` where none could be opened (messages go through the feeder).
_NONE = -1
#: ``_Descriptor.fd`` once closed (by ``close`` or when the queue was collected).
_CLOSED = -2


class _Descriptor:
    """The queue's non-blocking descriptor, shared with the finalizer that closes it.

    The number is forgotten when it is closed, whoever closes it first: a ``put`` after that
    can never write into another file the kernel gave the number to.
    """

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def close(self) -> None:
        fd, self.fd = self.fd, _CLOSED
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


class DirectContext:
    """A multiprocessing context whose ``Queue()`` is a ``DirectQueue``.

    Args:
        base: A multiprocessing context, or a module with the same API (``multiprocessing``,
            ``torch.multiprocessing``).

    Example:
        >>> import multiprocessing
        >>> ctx = DirectContext(multiprocessing.get_context("fork"))
        >>> type(ctx.Queue()).__name__, ctx.get_start_method()
        ('DirectQueue', 'fork')
    """

    def __init__(self, base: Any) -> None:
        self._base = base
        get_context = getattr(base, "get_context", None)
        # the locks must come from the context the processes are started with
        self._locks = get_context() if base is not None and callable(get_context) else base

    def Queue(self, maxsize: int = 0) -> DirectQueue:
        """A ``DirectQueue`` (``maxsize`` is not supported: torch never bounds its queues)."""
        if maxsize:
            raise ValueError("DirectQueue has no maxsize")
        return DirectQueue(self._locks)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)
