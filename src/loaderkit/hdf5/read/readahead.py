"""Reading ahead in the sampler's order: the bytes of the next batches asked for early.

A shuffled batch read cold is a few hundred scattered reads; read when the batch is asked
for, the disk serves them while the process waits, and the process computes while the disk
waits. The loader knows the coming batches before torch asks for them (``order.lookahead``
draws the sampler's indices ahead and tells the dataset's watcher). ``SamplerReadAhead`` is
that watcher for a reader that can plan a batch's reads without reading them
(``ahead.CSRAhead.advise``): the reads of every batch drawn go to the kernel as
``posix_fadvise(WILLNEED)`` on a background thread (``Advisor``), so the disk fetches them
while the current batches are read and computed. The pages land in the page cache (shared,
reclaimable: not the process's memory); what is asked ahead at once is bounded (``ahead_plan``).

Where the files fit in memory, each read is widened to the aligned window around it (what
a memory map's fault reads) and each window is asked for once per process (``Windows``):
the neighbours fill the page cache for later batches, every page of the files is fetched
about once, at close to the disk's sequential rate, and an epoch whose files are all in the
page cache asks nothing. Where they do not fit, only each read's own pages are asked for.

``posix_fadvise(WILLNEED)`` waits while the disk's queue is full (it submits the reads): on
the background thread that wait costs the reader nothing. Advice is only advice: a failed
call is ignored, and a read that comes before its advice is served as any.

Example:
    >>> plan = ahead_plan(file_bytes=512 << 20, around=128 << 10, row_bytes=6400)
    >>> plan.samples, plan.max_bytes >> 20
    (4096, 512)
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "AHEAD_BYTES",
    "Advisor",
    "AheadPlan",
    "SamplerReadAhead",
    "Windows",
    "ahead_plan",
    "merge_reads",
]

logger = logging.getLogger(__name__)

_WILLNEED: int | None = getattr(os, "POSIX_FADV_WILLNEED", None)

#: Bytes of reads asked ahead at most where the files do not fit in memory: some hundreds of
#: milliseconds of a disk's sequential rate, a small part of any machine's page cache.
AHEAD_BYTES = 64 << 20
#: Batches handed on before a watcher that could plan nothing goes quiet for its pass: the
#: files are read in other processes (worker processes open them, not the main process).
QUIET_AFTER = 8
#: Samples drawn ahead at least and at most.
MIN_SAMPLES, MAX_SAMPLES = 256, 16384


class AheadPlan(NamedTuple):
    """How far ahead the reads go: samples drawn ahead, the bytes that may ask, and why.

    ``group``: the samples asked for at once at least (``SamplerReadAhead``'s ``group``), so
    that reads which touch in a file (a block order's consecutive rows, spread over batches)
    are asked as one.
    """

    samples: int
    max_bytes: int
    reason: str
    group: int


def ahead_plan(
    file_bytes: int, around: int, row_bytes: float, memory: int | None = None
) -> AheadPlan:
    """How many samples to draw ahead, and the page cache that may take at once.

    The reads are asked a quarter of the depth at a time: enough samples together that a
    block order's reads of one block, drawn into many batches, are asked as one read.

    Where the files fit in memory (``around`` > 0), every window of the files is asked for
    at most once per process: at most the files themselves are asked, whatever the depth;
    4,096 samples keep the disk busy through a cold epoch's first batches. Else each
    sample asks its own bytes (``row_bytes``, rounded up to pages): as many samples as fit
    ``AHEAD_BYTES``, or a sixteenth of ``memory`` where that is less (the page cache asked
    ahead is charged to the process's memory cgroup: a job's limit bounds it too).

    Args:
        file_bytes: Bytes of the files read.
        around: The window a read is widened to (``csrplan.read_around``); 0: none.
        row_bytes: Mean bytes a row as stored.
        memory: Memory this process may use (``PlatformInfo.memory_bytes``; ``None``:
            unknown).

    Example:
        >>> ahead_plan(512 << 30, 0, 6400)[:2], ahead_plan(512 << 30, 0, 6400).group
        ((8192, 67108864), 2048)
        >>> ahead_plan(512 << 30, 0, 6400, memory=256 << 20).samples  # 16 MiB: a sixteenth
        2048
    """
    if around:
        samples = 4096
        group = samples // 4
        why = (
            f"{samples:,} samples drawn ahead, asked {group:,} at a time; each "
            f"{around >> 10} KiB window of the files asked once: at most the files' "
            f"{file_bytes / 2**20:,.0f} MiB of page cache"
        )
        return AheadPlan(samples, file_bytes, why, group)
    per = -(-max(int(row_bytes), 1) // 4096) * 4096
    room = AHEAD_BYTES if memory is None else min(AHEAD_BYTES, memory // 16)
    samples = int(min(max(room // per, MIN_SAMPLES), MAX_SAMPLES))
    group = samples // 4
    why = (
        f"{samples:,} samples drawn ahead, asked {group:,} at a time (the reads that touch "
        f"in a file as one): at most {samples * per / 2**20:,.0f} MiB of page cache at once"
    )
    return AheadPlan(samples, samples * per, why, group)


class Windows:
    """Which aligned windows of each file's data were asked for already in this process.

    A file is known by ``add``: the windows outside its data's extents count as asked.

    Example:
        >>> seen = Windows(1 << 10)
        >>> seen.add("a", 4096, np.array([0]), np.array([2048]))  # data: the first 2 KiB
        >>> seen.new("a", np.array([0, 10, 1500]), np.array([10, 20, 100])).tolist()
        [True, False, True]
        >>> seen.done, seen.new("a", np.array([5]), np.array([1])).tolist()
        (True, [False])
    """

    def __init__(self, around: int) -> None:
        self.around = around
        self._seen: dict[Any, np.ndarray] = {}
        self._left = 0

    def known(self, file: Any) -> bool:
        """Whether ``file`` was added."""
        return file in self._seen

    def add(self, file: Any, size: int, starts: np.ndarray, stops: np.ndarray) -> None:
        """Know ``file`` (``size`` bytes) whose data lies in ``[starts[i], stops[i])``."""
        seen = np.ones(-(-max(size, 1) // self.around) + 1, bool)
        first = np.clip(starts // self.around, 0, seen.size - 1)
        last = np.clip(-(-stops // self.around), 0, seen.size)
        wanted = np.zeros(seen.size + 1, np.int64)
        np.add.at(wanted, first, 1)
        np.add.at(wanted, last, -1)
        seen[np.cumsum(wanted[:-1]) > 0] = False
        self._seen[file] = seen
        self._left += int(np.count_nonzero(~seen))

    def new(self, file: Any, offsets: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        """Mark the windows that reads ``(offsets, nbytes)`` of ``file`` lie in.

        Returns:
            Per read, whether one of its windows was not asked for before (ask for its
            windows: each window once, with the first read that lies in it).
        """
        seen, around = self._seen[file], self.around
        first = np.minimum(offsets // around, seen.size - 1)
        last = np.minimum((offsets + np.maximum(nbytes, 1) - 1) // around, seen.size - 1)
        fresh = ~seen[first] | ~seen[last]
        if not fresh.any():
            return fresh
        out = np.zeros(offsets.size, bool)
        at = np.flatnonzero(fresh)
        first, last = first[at], last[at]
        _, keep = np.unique(first * seen.size + last, return_index=True)
        out[at[keep]] = True
        first, last = first[keep], last[keep]
        marks = [first, last]
        wide = np.flatnonzero(last > first + 1)  # reads over more than two windows (wide rows)
        ends = zip(first[wide].tolist(), last[wide].tolist(), strict=True)
        marks += [np.arange(a + 1, b) for a, b in ends]
        windows = np.unique(np.concatenate(marks))
        windows = windows[~seen[windows]]
        seen[windows] = True
        self._left -= windows.size
        return out

    @property
    def done(self) -> bool:
        """Whether every window of every file's data was asked for (some file known)."""
        return bool(self._seen) and self._left <= 0


class Advisor:
    """A background thread that passes reads to the kernel as ``posix_fadvise(WILLNEED)``.

    ``ask`` queues a table of reads and returns; the thread starts on the first ask (in
    the process asking: a forked child starts its own). What is queued and not yet asked
    is bounded by ``max_bytes``: beyond it, the oldest advice is dropped (it would come
    too late). ``close`` stops the thread.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryFile() as f:
        ...     _ = f.write(bytes(8192)); f.flush()
        ...     advisor = Advisor(1 << 20)
        ...     advisor.ask(np.array([f.fileno()]), np.array([0]), np.array([4096]))
        ...     advisor.close()
        4096
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._queue: collections.deque[tuple[np.ndarray, np.ndarray, np.ndarray, int]] = (
            collections.deque()
        )
        self._queued = 0
        self._ready = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._closed = False
        #: Bytes asked for so far, and advice dropped for coming too late.
        self.asked = 0
        self.dropped = 0

    def ask(self, fds: np.ndarray, offsets: np.ndarray, nbytes: np.ndarray) -> int:
        """Queue reads ``(fd, offset, nbytes)``; returns the bytes queued (0: none).

        Reads of one file that touch or overlap are asked as one (``merge_reads``).

        Args:
            fds: Per read, the open file's descriptor.
            offsets: Per read, its file offset.
            nbytes: Per read, its length.
        """
        if _WILLNEED is None or not fds.size or self._closed:
            return 0
        fds, offsets, nbytes = merge_reads(fds, offsets, nbytes)
        total = int(nbytes.sum())
        with self._ready:
            if self._pid != os.getpid():  # a forked child: the parent's thread is not here
                self._pid, self._thread = os.getpid(), None
                self._queue.clear()
                self._queued = 0
            self._queue.append((fds, offsets, nbytes, total))
            self._queued += total
            while self._queued > self.max_bytes and len(self._queue) > 1:
                *_, old = self._queue.popleft()
                self._queued -= old
                self.dropped += old
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="loaderkit-read-ahead", daemon=True
                )
                self._thread.start()
            self._ready.notify()
        return total

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._closed:
                    self._ready.wait()
                if self._closed:
                    return
                fds, offsets, nbytes, total = self._queue.popleft()
                self._queued -= total
            _advise(fds.tolist(), offsets.tolist(), nbytes.tolist())
            self.asked += total

    def close(self) -> None:
        """Stop the thread (queued advice is dropped); a later ``ask`` queues nothing."""
        with self._ready:
            self._closed = True
            self._queue.clear()
            self._queued = 0
            self._ready.notify()
            thread = self._thread if self._pid == os.getpid() else None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)


def merge_reads(
    fds: np.ndarray, offsets: np.ndarray, nbytes: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Reads ``(fd, offset, nbytes)`` with those of one file that touch or overlap made one.

    The merged reads come in the order their first read was asked: what is needed soonest
    is asked first. ``O(n log n)``, one pass of numpy per file.

    Args:
        fds: Per read, the file's descriptor.
        offsets: Per read, its offset.
        nbytes: Per read, its length (at least 0).

    Returns:
        ``(fds, offsets, nbytes)`` of the merged reads.

    Example:
        >>> fds, at, size = merge_reads(np.array([3, 4, 3, 3]),
        ...     np.array([8192, 0, 4096, 0]), np.array([4096, 10, 4096, 100]))
        >>> fds.tolist(), at.tolist(), size.tolist()
        ([3, 4, 3], [4096, 0, 0], [8192, 10, 100])
    """
    if fds.size < 2:
        return fds, offsets, nbytes
    order = np.lexsort((offsets, fds))
    f, first = fds[order], offsets[order]
    end = first + nbytes[order]
    cuts = np.flatnonzero(f[1:] != f[:-1]) + 1  # where the next file's reads begin
    reach = np.empty_like(end)  # per read, the furthest end of its file's reads so far
    for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), f.size], strict=True):
        reach[a:b] = np.maximum.accumulate(end[a:b])
    fresh = np.ones(f.size, bool)
    fresh[1:] = first[1:] > reach[:-1]
    fresh[cuts] = True
    starts = np.flatnonzero(fresh)
    if starts.size == f.size:
        return fds, offsets, nbytes
    stop = np.maximum.reduceat(end, starts)
    soonest = np.argsort(np.minimum.reduceat(order, starts), kind="stable")
    at = starts[soonest]
    return f[at], first[at], (stop[soonest] - first[at])


def _advise(fds: Sequence[int], offsets: Sequence[int], nbytes: Sequence[int]) -> None:
    """``posix_fadvise(WILLNEED)`` each read; errors ignored (only advice: a closed file)."""
    assert _WILLNEED is not None
    for fd, offset, size in zip(fds, offsets, nbytes, strict=True):
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, offset, size, _WILLNEED)


class SamplerReadAhead:
    """The loader's watcher of coming indices (``order.lookahead``) that reads them ahead.

    Batches are asked for in the order they were drawn, in groups: the batches drawn and
    not yet asked wait until they hold ``group`` samples, as long as those asked before them
    still cover ``group`` samples of the reads to come; then they are asked for at once (the
    reads that touch in a file as one: ``Advisor.ask``). A group whose rows the reader
    cannot all plan yet (their files not opened or their spans not read: the first batches
    of a process) is asked again with the next draws, until it is handed on. Where nothing
    could be planned by the ``QUIET_AFTER``-th try, the files are read by worker processes
    and the watcher stays quiet for the pass (each worker reads its own batch's misses
    together).

    Args:
        advise: Asks for the reads of packed row keys (``ahead.CSRAhead.advise``); returns,
            per key, whether it could not be planned yet (none: all asked for).
        done: Whether nothing is left to ask (every window of the files was).
        index: The dataset's packed index (dataset index -> row key).
        samples: Samples drawn ahead (``AheadPlan.samples``).
        group: Samples asked for at once at least, while the reads asked before cover as
            many (``AheadPlan.group``; 1: every batch as it is drawn).

    Example:
        >>> asked = []
        >>> def advise(keys):
        ...     asked.append(keys.tolist())
        ...     return np.zeros(keys.size, bool)  # every key planned
        >>> watcher = SamplerReadAhead(advise, lambda: False, np.array([10, 11, 12]), 8)
        >>> watcher.drawn([[0, 2], [1]]); watcher.reading(); asked
        [[10, 12, 11]]
    """

    def __init__(
        self,
        advise: Callable[[np.ndarray], np.ndarray],
        done: Callable[[], bool],
        index: np.ndarray,
        samples: int,
        group: int = 1,
    ) -> None:
        self._advise = advise
        self._done = done
        self._index = index
        self.horizon = samples
        self.group = max(1, group)
        #: Drawn, not handed on yet: ``[keys, asked]`` in order.
        self._pending: collections.deque[list[Any]] = collections.deque()
        self._asked = False
        self._idle = 0

    def drawn(self, items: Sequence[Any]) -> None:
        """Ask for the reads of the batches (or indices) just drawn, and of earlier ones."""
        n = len(self._index)
        for item in items:
            idx = np.asarray(item, np.int64).reshape(-1)
            good = (idx >= -n) & (idx < n)  # a bad index fails in the reader, named
            self._pending.append([np.asarray(self._index[idx[good]], np.int64), False])
        self._ask()

    def reading(self) -> None:
        """The oldest batch drawn is handed on (read now); ask for those not asked yet.

        The batch before may have opened their files.
        """
        if self._pending:
            self._pending.popleft()
        self._ask()

    def _ask(self) -> None:
        if self._done() or self._idle > QUIET_AFTER:
            self._pending.clear()  # nothing left to ask, or nothing read in this process
            return
        covered, fresh = 0, []
        for entry in self._pending:
            if not entry[1]:
                fresh.append(entry)
            elif not fresh:
                covered += entry[0].size
        count = sum(entry[0].size for entry in fresh)
        if not count or (count < self.group and covered >= self.group):
            return  # nothing new, or the reads asked still cover the next ones: gather more
        keys = fresh[0][0] if len(fresh) == 1 else np.concatenate([e[0] for e in fresh])
        left = np.asarray(self._advise(keys), bool)
        if left.all():
            self._idle += not self._asked
            return  # none of their files open here yet
        self._asked = True
        at = 0
        for entry in fresh:  # what was asked is not asked again
            size = entry[0].size
            mine = left[at : at + size]
            at += size
            if mine.any():
                entry[0] = entry[0][mine]
            else:
                entry[1] = True
