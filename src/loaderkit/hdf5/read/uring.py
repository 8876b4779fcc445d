"""Many reads at scattered file offsets in one system call: Linux's ``io_uring``.

A batch of shuffled rows is many small reads at scattered offsets. Read with one ``os.preadv``
each, every read releases and retakes the GIL, and while another thread wants the GIL every
release hands it over: two threads reading rows a few microseconds of Python apart read about
half as fast as one. A ``Ring`` takes the whole list instead: the reads are written into the
submission queue with a few numpy assignments, and one ``io_uring_enter`` (through ``ctypes``,
which releases the GIL for the call) has the kernel perform them all and wait for the last.
Reads the page cache holds are copied inline during that call; the others go to the kernel's
own worker threads and run concurrently, so a cold batch also queues its disk reads at once.

Each thread has its own ring (``thread_ring``); a forked child makes its own too. Where the
kernel has no ``io_uring``, forbids it (a sandbox, ``kernel.io_uring_disabled``) or predates
``IORING_OP_READ`` (Linux 5.6), ``thread_ring`` returns ``None`` and callers read with
``os.preadv``. A ring never reports an error itself: a read that failed or came back short
counts the bytes it did read, and the caller reads the rest the usual way, which reports the
error with its context.

Memory safety: the kernel writes into the caller's buffer until every read has completed.
``Ring.read`` waits for all of them before it returns; if it is interrupted (an exception raised
in the calling thread between two bytecodes), the ring keeps the buffer alive and the next call
on that ring first waits for what is still in flight.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import mmap
import os
import platform
import sys
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["ENTRIES", "MAX_READ", "Ring", "disable", "thread_ring"]

logger = logging.getLogger(__name__)

#: Submission queue entries of a ring (reads per system call; longer lists take several).
ENTRIES = 64
#: Reads longer than this are not given to a ring (the kernel caps one read near 2 GiB).
MAX_READ = 1 << 30

# The same numbers on every Linux architecture (the unified system call table).
_SYS_SETUP, _SYS_ENTER = 425, 426
_ENTER_GETEVENTS = 1
_OP_READ = 22  # IORING_OP_READ, Linux 5.6
_FEAT_SINGLE_MMAP = 1 << 0
_FEAT_RW_CUR_POS = 1 << 3  # announced with 5.6 too: a kernel with IORING_OP_READ
_OFF_CQ_RING, _OFF_SQES = 0x8000000, 0x10000000
_U32 = 0xFFFFFFFF
_MIN, _MAX, _SUM = np.minimum.reduce, np.maximum.reduce, np.add.reduce

#: ``struct io_uring_sqe`` is 8 words of 64 bits; a read sets the first five: opcode (byte 0)
#: and fd (bytes 4-7), file offset, buffer address, length (low half), user data.
_SQE_WORDS, _CQE_WORDS = 8, 2


def _load_syscall() -> Any:
    """The C library's ``syscall`` through ``ctypes`` (it releases the GIL), or ``None``.

    ``None`` off Linux, and on big-endian machines (the entries are written as 64-bit words
    in little-endian order).
    """
    if platform.system() != "Linux" or sys.byteorder != "little":
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.syscall
    except (OSError, AttributeError):
        return None
    call.restype = ctypes.c_long
    call.argtypes = [ctypes.c_long] * 7
    return call


_syscall = _load_syscall()
#: ``(pid, reason)`` once this process found it cannot use a ring; ``thread_ring`` then says None.
_off: tuple[int, str] | None = None
_local = threading.local()


class Ring:
    """One ``io_uring`` instance: reads at scattered offsets in one system call.

    Not shared between threads (``thread_ring`` gives each thread its own).

    Args:
        entries: Submission queue entries (a power of two).

    Raises:
        OSError: The kernel has no ``io_uring``, forbids it, or predates ``IORING_OP_READ``.

    Example:
        >>> import numpy as np, os, tempfile
        >>> fd, path = tempfile.mkstemp()
        >>> _ = os.write(fd, bytes(range(16)))
        >>> ring = thread_ring()
        >>> out = np.zeros(6, np.uint8)
        >>> if ring is not None:
        ...     assert ring.read(out, [(fd, 8, 0, 2), (fd, 0, 2, 4)]) == [2, 4]
        ... else:
        ...     out[:] = [8, 9, 0, 1, 2, 3]
        >>> out.tolist()
        [8, 9, 0, 1, 2, 3]
        >>> os.close(fd)
    """

    def __init__(self, entries: int = ENTRIES) -> None:
        if _syscall is None:
            raise OSError(errno.ENOSYS, "io_uring needs Linux and libc's syscall()")
        params = (ctypes.c_uint32 * 30)()  # struct io_uring_params: 120 bytes
        fd = _syscall(_SYS_SETUP, entries, ctypes.addressof(params), 0, 0, 0, 0)
        if fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, f"io_uring_setup: {os.strerror(code)}")
        self.fd = int(fd)
        self.pid = os.getpid()
        self._keep: np.ndarray | None = None  # the buffer reads may still write into
        self._maps: list[mmap.mmap] = []
        try:
            self._map(list(params))
        except BaseException:
            self.close()
            raise

    def _map(self, p: list[int]) -> None:
        """Map the two queues and the submission entries (``p``: ``io_uring_params`` words)."""
        sq_entries, cq_entries, features = p[0], p[1], p[5]
        if not features & _FEAT_RW_CUR_POS:
            raise OSError(errno.ENOSYS, "io_uring without IORING_OP_READ (Linux < 5.6)")
        sq_off, cq_off = p[10:20], p[20:30]
        sq_size = sq_off[6] + sq_entries * 4
        cq_size = cq_off[5] + cq_entries * _CQE_WORDS * 8

        def mapped(size: int, offset: int) -> mmap.mmap:
            prot = mmap.PROT_READ | mmap.PROT_WRITE
            m = mmap.mmap(self.fd, size, mmap.MAP_SHARED, prot, offset=offset)
            self._maps.append(m)
            return m

        if features & _FEAT_SINGLE_MMAP:
            sq_map = cq_map = mapped(max(sq_size, cq_size), 0)
        else:
            sq_map, cq_map = mapped(sq_size, 0), mapped(cq_size, _OFF_CQ_RING)
        sqe_map = mapped(sq_entries * _SQE_WORDS * 8, _OFF_SQES)
        self.entries = sq_entries
        sq, cq = memoryview(sq_map).cast("I"), memoryview(cq_map).cast("I")
        self._views: list[Any] = [sq, cq]  # released before the maps close
        self._sq_head, self._sq_tail = sq_off[0] // 4, sq_off[1] // 4
        self._sq_mask = sq[sq_off[2] // 4]
        self._cq_head, self._cq_tail = cq_off[0] // 4, cq_off[1] // 4
        self._cq_mask = cq[cq_off[2] // 4]
        self._sq, self._cq = sq, cq
        # entry i of the submission queue is always SQE i: reads go where the queue is
        self._sq_array = np.frombuffer(sq_map, np.uint32, count=sq_entries, offset=sq_off[6])
        self._sq_array[:] = np.arange(sq_entries, dtype=np.uint32)
        # user data (u64 at byte 0) and result (s32 at byte 8) of every completion
        self._cq_data = np.frombuffer(
            cq_map, np.uint64, count=cq_entries * _CQE_WORDS, offset=cq_off[5]
        )[::_CQE_WORDS]
        self._cq_res = np.frombuffer(cq_map, np.int32, count=cq_entries * 4, offset=cq_off[5])[2::4]
        self._sqes = np.frombuffer(sqe_map, np.uint64).reshape(sq_entries, _SQE_WORDS)
        self._sqes[:] = 0
        self._sqes[:, 4] = np.arange(sq_entries)  # user data: the entry's place in the call
        self._sqe_words = self._sqes.view(np.int64)  # written from int64 tables without a cast

    def close(self) -> None:
        """Release the ring, after waiting for any read still in flight.

        Example:
            >>> ring = thread_ring()
            >>> ring is None or ring.read(np.zeros(0, np.uint8), []) == []
            True
        """
        if getattr(self, "fd", -1) < 0:
            return
        if self._maps and self.pid == os.getpid():
            try:
                self._wait_in_flight()
            except OSError:  # the kernel ends the reads when the ring is closed
                logger.debug("io_uring close with reads in flight", exc_info=True)
        for name in ("_sq", "_cq", "_sq_array", "_cq_data", "_cq_res", "_sqes", "_sqe_words"):
            self.__dict__.pop(name, None)  # no view left on the maps
        for view in self.__dict__.pop("_views", ()):
            view.release()
        for m in self._maps:
            try:
                m.close()
            except BufferError:  # a view still exported (a traceback's frame): freed with it
                logger.debug("io_uring map still viewed at close")
        self._maps.clear()
        os.close(self.fd)
        self.fd = -1
        self._keep = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown
            self.close()

    def _enter(self, submit: int, wait: int) -> int:
        """``io_uring_enter``: submit ``submit`` entries, wait for ``wait`` queued completions.

        Returns the entries the kernel took, or ``-errno``.
        """
        got = _syscall(_SYS_ENTER, self.fd, submit, wait, _ENTER_GETEVENTS, 0, 0)
        return int(got) if got >= 0 else -ctypes.get_errno()

    def _wait_in_flight(self) -> None:
        """Wait for every read submitted before and not yet completed, and drop their entries."""
        while True:
            sq, cq = self._sq, self._cq
            queued = (cq[self._cq_tail] - cq[self._cq_head]) & _U32
            flying = (sq[self._sq_head] - cq[self._cq_tail]) & _U32
            if not flying:
                break
            got = self._enter(0, queued + flying)
            if got < 0 and got not in (-errno.EINTR, -errno.EAGAIN, -errno.EBUSY):
                raise OSError(-got, f"io_uring_enter: {os.strerror(-got)}")
        self._cq[self._cq_head] = self._cq[self._cq_tail]
        self._sq[self._sq_tail] = self._sq[self._sq_head]  # entries never submitted: dropped
        self._keep = None

    def read(self, buffer: np.ndarray, reads: Sequence[tuple[int, int, int, int]]) -> list[int]:
        """Perform ``reads`` into ``buffer``; return the bytes each one read.

        Args:
            buffer: A writable, C-contiguous array (its bytes are the destination).
            reads: ``(fd, file offset, byte offset in buffer, bytes)`` for each read; the files
                must stay open until this returns.

        Returns:
            The bytes read by each read: its length, fewer at the end of the file, 0 where it
            failed or was not attempted (the error is not kept: read it again to see it).

        Raises:
            ValueError: The buffer is not writable and C-contiguous, or a read lies outside it.
            OSError: The ring itself failed (not a read); ``disable`` then stops its use.
        """
        if not reads:
            return []
        return self.read_table(buffer, np.array(reads, dtype=np.int64).reshape(-1, 4)).tolist()

    def read_table(self, buffer: np.ndarray, reads: np.ndarray) -> np.ndarray:
        """``read`` with the reads as an ``(n, 4)`` integer array (no Python loop over them).

        Args:
            buffer: A writable, C-contiguous array (its bytes are the destination).
            reads: One row per read: fd, file offset, byte offset in buffer, bytes.

        Returns:
            The bytes read by each read (``int64``), as ``read`` counts them.

        Raises:
            ValueError: The buffer is not writable and C-contiguous, or a read lies outside it.
            OSError: The ring itself failed (not a read); ``disable`` then stops its use.
        """
        count = len(reads)
        if not (buffer.flags.c_contiguous and buffer.flags.writeable):
            raise ValueError("the buffer must be C-contiguous and writable")
        if not count:
            return np.zeros(0, np.int64)
        size = buffer.nbytes
        lengths = reads[:, 3]
        ends = reads[:, 2] + lengths
        # the ufuncs' reduce: ndarray.min/max/sum go through Python wrappers first
        if _MIN(reads, axis=None) < 0 or _MAX(ends) > size:
            bad = int(np.flatnonzero((reads < 0).any(axis=1) | (ends > size))[0])
            fd, offset, start, nbytes = reads[bad].tolist()
            raise ValueError(
                f"read of {nbytes} bytes at {offset} of fd {fd} into byte {start} "
                f"lies outside the buffer of {size} bytes"
            )
        # the first four words of each entry, as int64 (the same bits as the kernel's u64s;
        # every value is non-negative): opcode | fd << 32, file offset, address, length
        table = np.empty((count, 4), np.int64)
        np.left_shift(reads[:, 0], 32, out=table[:, 0])
        table[:, 0] |= _OP_READ
        table[:, 1] = reads[:, 1]
        np.add(reads[:, 2], buffer.ctypes.data, out=table[:, 2])
        table[:, 3] = lengths
        if size > MAX_READ and int(_MAX(lengths)) > MAX_READ:  # no read is longer than size
            table[lengths > MAX_READ, 3] = 0  # not read, 0 counted
        done = np.zeros(count, np.int64)
        self._wait_in_flight()
        self._keep = buffer  # alive until the kernel is done with it
        for first in range(0, count, self.entries):
            self._submit(table[first : first + self.entries], done[first:])
        self._keep = None
        return done

    def _submit(self, table: np.ndarray, done: np.ndarray) -> None:
        """Submit ``table``'s entries (at most ``entries``), wait for them, record into ``done``."""
        n = len(table)
        sq, cq = self._sq, self._cq
        start = sq[self._sq_head]  # == tail: _wait_in_flight emptied the queue
        slot = start & self._sq_mask  # read i goes to entry slot + i (mod entries)
        head_part = min(n, self.entries - slot)
        words = self._sqe_words
        words[slot : slot + head_part, :4] = table[:head_part]
        if head_part < n:
            words[: n - head_part, :4] = table[head_part:]
        sq[self._sq_tail] = (start + n) & _U32
        first = cq[self._cq_head]
        while True:
            head = sq[self._sq_head]
            taken, unsent = (head - start) & _U32, (sq[self._sq_tail] - head) & _U32
            if not unsent and (cq[self._cq_tail] - first) & _U32 >= taken:
                break
            got = self._enter(unsent, taken + unsent)
            if got > 0 or got == -errno.EINTR or (got == 0 and not unsent):
                continue
            if not unsent or got not in (0, -errno.EAGAIN, -errno.EBUSY):
                raise OSError(-got, f"io_uring_enter: {os.strerror(-got)}")
            sq[self._sq_tail] = head  # the kernel took none: the caller reads them elsewhere
        queued = (cq[self._cq_tail] - first) & _U32
        at = first & self._cq_mask
        end = min(at + queued, len(self._cq_res))
        res = self._cq_res[at:end]
        if at + queued > end:  # the completions wrap around the queue
            res = np.concatenate((res, self._cq_res[: at + queued - end]))
        # a read never returns more than it asked: equal sums mean every read is whole
        if queued == n and int(_SUM(res, dtype=np.int64)) == int(_SUM(table[:, 3])):
            cq[self._cq_head] = cq[self._cq_tail]
            done[:n] = table[:, 3]
            return
        data = self._cq_data[at:end].astype(np.intp)
        if at + queued > end:
            data = np.concatenate((data, self._cq_data[: at + queued - end].astype(np.intp)))
        res = res.astype(np.int64)  # ``done``'s type: a cast in the assignment releases the GIL
        cq[self._cq_head] = cq[self._cq_tail]
        ok = res > 0
        done[(data[ok] - slot) % self.entries] = res[ok]


def disable(reason: str) -> None:
    """Stop using rings in this process (``thread_ring`` then returns ``None``).

    Args:
        reason: Why, for the log.

    Example:
        >>> import loaderkit.hdf5.read.uring as uring
        >>> saved = uring._off
        >>> disable("an example")
        >>> thread_ring() is None
        True
        >>> uring._off = saved
    """
    global _off
    _off = (os.getpid(), reason)
    logger.info("reading rows without io_uring: %s", reason)


def thread_ring() -> Ring | None:
    """This thread's ring, made at its first use; ``None`` where this process cannot have one.

    Returns:
        The calling thread's ``Ring`` (a forked child gets a new one), or ``None``.

    Example:
        >>> ring = thread_ring()
        >>> ring is None or ring is thread_ring()
        True
    """
    if _off is not None and _off[0] == os.getpid():
        return None
    ring: Ring | None = getattr(_local, "ring", None)
    if ring is not None and ring.pid == os.getpid():
        return ring
    if ring is not None:  # inherited through fork: unmapped and closed here, not waited for
        ring.close()
    try:
        ring = Ring()
    except OSError as exc:
        disable(str(exc))
        return None
    _local.ring = ring
    return ring
