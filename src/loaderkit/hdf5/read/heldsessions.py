"""Sessions held in memory: the rows of whole sessions read once and served from there.

When one row spans many chunks (NSD betas: ``(750, V)``, chunks ``(750, 1)``), any read of a
session's rows touches every chunk of it, so reading the session whole once costs about the
same as reading one batch of it. ``HeldSessions`` keeps such sessions' rows in memory, per
process, within ``max_bytes`` (the dataset's ``max_session_bytes``), least recently used
dropped first; a dropped session's buffer is reused for the next one of the same size (no
fresh allocation, no page faults). In block order a session's rows are served while it is
held, so each session is read at most once per pass in each process.

A held copy is only served while the file is what it was when read: its size and
modification time are compared (one ``os.stat``) every time rows are served.

One ``HeldSessions`` belongs to one dataset object in one process and is shared by its
threads: one copy per process, never one per thread. Its mutex guards the dict of held
sessions, the spare buffers and the statistics (dictionary work only); a per-session
``building`` lock is held while one thread reads a session whole, so the others wanting it wait
for that copy instead of reading their own; rows are served from a held session without any
lock (``acquire`` counts its readers, ``release`` gives it back). A session dropped while
read is never reused as a buffer until its readers are done: the thread reading the next
session waits for them (copies of one batch) and reuses its buffer, so threads at a session
boundary never hold two copies where the budget holds one. A session is read whole only
when its bytes fit beside what is held and being read (``reserve``): a thread that still
wants a session another thread is replacing reads its batch's rows without holding them.
A forked child starts empty (``get`` notices the new process), and nothing held is ever
pickled.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

__all__ = ["DRAIN_WAIT", "HeldInfo", "HeldSession", "HeldSessions"]

#: Seconds a thread about to read a session waits for the readers of the one it replaces
#: (each copies one batch out) before it allocates a second buffer instead.
DRAIN_WAIT = 30.0


@dataclass
class HeldSession:
    """The rows of one session, per key that is held (``None`` for the others).

    Attributes:
        arrays: Per key, ``(rows, *row_shape)`` in the native dtype, or ``None``.
        size: The file's size when it was read.
        mtime_ns: Its modification time then.
        readers: Threads copying rows out of it now (``HeldSessions.acquire``).

    Example:
        >>> HeldSession([np.zeros((750, 10), "i2"), None], size=1, mtime_ns=0).nbytes
        15000
    """

    arrays: list[np.ndarray | None]
    size: int
    mtime_ns: int
    readers: int = field(default=0, compare=False)

    @property
    def nbytes(self) -> int:
        """Bytes held."""
        return sum(a.nbytes for a in self.arrays if a is not None)


class HeldInfo(NamedTuple):
    """Statistics of one process's held sessions (reset in every new process).

    Attributes:
        loads: Sessions read whole into memory.
        hits: Reads served from a held session.
        evictions: Sessions dropped to make room.
        held: Sessions held now.
        held_bytes: Bytes held now.
        max_bytes: The budget (``max_session_bytes``).

    Example:
        >>> HeldInfo(1, 5, 0, 1, 100, 1000).hits
        5
    """

    loads: int
    hits: int
    evictions: int
    held: int
    held_bytes: int
    max_bytes: int


class HeldSessions:
    """Whole sessions' rows held in memory, within ``max_bytes``, least recently used first out.

    Args:
        max_bytes: Most bytes held at once (0: nothing is held).

    Example:
        >>> held = HeldSessions(1 << 20)
        >>> held.fits(1 << 21), held.get(0) is None
        (False, True)
        >>> held.reserve(1 << 19), held.reserve(1 << 19), held.reserve(1)  # a third: no room
        (True, True, False)
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max(0, int(max_bytes))
        self._pid = os.getpid()
        self._mutex = threading.Condition(threading.Lock())
        self._builders: dict[int, threading.Lock] = {}
        self._entries: OrderedDict[int, HeldSession] = OrderedDict()
        self._spare: list[np.ndarray] = []
        self._draining: list[HeldSession] = []  # dropped while read: buffers once unread
        self._reserved = 0  # bytes of sessions being read whole now
        self.loads = self.hits = self.evictions = 0

    def _own(self) -> None:
        """Drop what a parent process held (this object was inherited by fork)."""
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._mutex = threading.Condition(threading.Lock())
            self._builders = {}
            self._entries = OrderedDict()
            self._spare = []
            self._draining = []
            self._reserved = 0
            self.loads = self.hits = self.evictions = 0

    def fits(self, nbytes: int) -> bool:
        """Whether a session of ``nbytes`` may be held at all."""
        return 0 < nbytes <= self.max_bytes

    def get(self, pos: int, *, touch: bool = True) -> HeldSession | None:
        """The held session at position ``pos``, or ``None``.

        With ``touch`` it becomes the most recently used (and counts as a hit).
        """
        self._own()
        with self._mutex:
            entry = self._entries.get(pos)
            if entry is not None and touch:
                self._entries.move_to_end(pos)
                self.hits += 1
        return entry

    def acquire(self, pos: int) -> HeldSession | None:
        """``get(pos)`` with one more reader: its arrays stay as they are until ``release``."""
        self._own()
        with self._mutex:
            entry = self._entries.get(pos)
            if entry is not None:
                self._entries.move_to_end(pos)
                self.hits += 1
                entry.readers += 1
        return entry

    def release(self, entry: HeldSession) -> None:
        """Give back what ``acquire`` (or a session read for this call) counted."""
        with self._mutex:
            entry.readers -= 1
            if not entry.readers and any(e is entry for e in self._draining):
                self._draining = [e for e in self._draining if e is not entry]
                self._spare += [a for a in entry.arrays if a is not None]
                self._mutex.notify_all()  # its buffer may be reused now

    def building(self, pos: int) -> threading.Lock:
        """The lock held while session ``pos`` is read whole (one thread reads it)."""
        self._own()
        with self._mutex:
            return self._builders.setdefault(pos, threading.Lock())

    def reading(self, pos: int) -> bool:
        """Whether a thread is reading session ``pos`` whole now (its ``building`` lock is held)."""
        self._own()
        with self._mutex:
            lock = self._builders.get(pos)
        return lock is not None and lock.locked()

    def reserve(self, nbytes: int) -> bool:
        """Make room for a session of ``nbytes`` to be read whole, or say there is none.

        Least recently used sessions are dropped until ``nbytes`` fit within ``max_bytes``
        beside what is held and what other threads are reading whole now. ``False``: the
        sessions being read leave no room (read the rows without holding them). After
        ``True``, ``put`` the session or ``unreserve`` it.
        """
        self._own()
        with self._mutex:
            if self._reserved + nbytes > self.max_bytes:
                return False
            self._drop_until(self._reserved + nbytes)
            self._reserved += nbytes
            return True

    def unreserve(self, nbytes: int) -> None:
        """Give back a ``reserve`` whose session is not held (its read failed)."""
        with self._mutex:
            self._reserved = max(0, self._reserved - nbytes)

    def make_room(self, nbytes: int) -> None:
        """Drop least recently used sessions until ``nbytes`` more fit within ``max_bytes``."""
        self._own()
        with self._mutex:
            self._drop_until(nbytes)

    def _drop_until(self, nbytes: int) -> None:
        """Drop sessions until ``nbytes`` more fit (the mutex held)."""
        held = sum(e.nbytes for e in self._entries.values())
        while self._entries and held + nbytes > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            held -= old.nbytes
            self.evictions += 1
            if old.readers:  # one being read is never overwritten: its buffer once unread
                self._draining.append(old)
            else:
                self._spare = [a for a in old.arrays if a is not None][:4]

    def buffer(
        self, shape: Sequence[int], dtype: np.dtype, *, wait: float = DRAIN_WAIT
    ) -> np.ndarray:
        """An array to read a session into: a dropped session's buffer when one fits exactly.

        A dropped session still being read is waited for (at most ``wait`` seconds: its
        readers copy one batch each) and its buffer reused, rather than a second allocated.
        """
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        deadline = time.monotonic() + wait
        with self._mutex:
            while True:
                for k, spare in enumerate(self._spare):
                    if spare.nbytes == nbytes:
                        del self._spare[k]
                        return spare.reshape(-1).view(np.uint8).view(dtype).reshape(tuple(shape))
                draining = any(
                    a is not None and a.nbytes == nbytes for e in self._draining for a in e.arrays
                )
                left = deadline - time.monotonic()
                if not draining or left <= 0:
                    break
                self._mutex.wait(left)
        return np.empty(tuple(shape), dtype)

    def put(self, pos: int, entry: HeldSession, reserved: int = 0) -> None:
        """Hold ``entry`` as session ``pos``, its ``reserve`` of ``reserved`` bytes now held."""
        self._own()
        with self._mutex:
            self._entries[pos] = entry
            self._entries.move_to_end(pos)
            self._spare = []
            self._reserved = max(0, self._reserved - reserved)
            self.loads += 1

    def discard(self, pos: int) -> None:
        """Forget session ``pos`` (its file changed or failed)."""
        self._own()
        with self._mutex:
            self._entries.pop(pos, None)

    def set_max_bytes(self, max_bytes: int) -> None:
        """Change the budget; sessions over it are dropped now."""
        self.max_bytes = max(0, int(max_bytes))
        self.make_room(0)

    def clear(self) -> None:
        """Drop every held session of this process."""
        with self._mutex:
            self._entries = OrderedDict()
            self._spare = []
            self._draining = []

    def info(self) -> HeldInfo:
        """The statistics of this process."""
        self._own()
        with self._mutex:
            return HeldInfo(
                self.loads,
                self.hits,
                self.evictions,
                len(self._entries),
                sum(e.nbytes for e in self._entries.values()),
                self.max_bytes,
            )

    def __len__(self) -> int:
        self._own()
        return len(self._entries)
