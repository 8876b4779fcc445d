"""The one read primitive: a table of reads served into one buffer, by the best safe path.

Every raw read of loaderkit's readers (contiguous rows, column chunks, raw or compressed
chunks, CSR pieces) is planned as a *table*: an ``int64`` array of shape ``(n, 4)``, one row
per read, ``(fd, file offset, byte offset in the destination, bytes)``. ``read_table`` serves
it, and it is the only code that calls ``os.preadv``. Readers plan tables; they do not loop
over reads, and they keep short reads out of their code: a read that comes back short (legal)
is finished here, and one that cannot be finished (the file ended, an I/O error) raises
``loaderkit.errors.ShortRead`` with the table row, which the reader turns into an
``HDF5FileError`` naming the file, key and rows.

The paths, in order:

* **whole-file maps** (``mapped.FileMaps``), where the reader passes its maps and its tables
  are warm (read from the page cache alone lately): each read is a slice copied out of a
  read-only map of the file, no system call a read. Each file's size is checked before the
  table (a table reaching past a file's end is read below, and its short read names it), so a
  file truncated between tables is never a ``SIGBUS``.
* **the ring** (``uring.thread_ring``), where other threads read now (``shared``), the calling
  thread has a ring and at least ``RING_MIN_READS`` reads are shorter than ``TURN_MAX_BYTES``:
  the short reads go to the kernel in one system call that releases the GIL once; long reads
  and what the ring left are read as below. Alone, a thread hands the GIL to nobody, and a
  ``preadv`` a read costs less than a ring call.
* **page cache first**: each read is one ``os.preadv`` with ``RWF_NOWAIT``, which copies what
  the page cache holds and returns at once where a page would have to come from the disk;
  every read the page cache missed is asked for at once (``posix_fadvise`` ``WILLNEED``: the kernel
  queues them and returns, so the disk serves them together rather than at queue depth 1),
  then read. Where other threads read now, the copies shorter than ``TURN_MAX_BYTES`` run
  under one process-wide lock (*the copy turn*, below); longer ones are read outside it.
* **plain reads**: one ``os.preadv`` a read, where the platform or the file's filesystem has
  no ``RWF_NOWAIT`` (remembered per open file: ``refuses_nowait``), and for a table of one read.

A copy out of a map still faults (``SIGBUS``) where the file is truncated *during* the copy
(microseconds a table), as ``memory_map=True``'s reads of whole rows do (``rawio.map_rows``,
``SessionFiles.verify``); the loader's error then names memory-mapped reads.

The copy turn: every ``os.preadv`` releases the GIL, and while another thread wants the GIL,
every release hands it over and every return waits to get it back: two threads each issuing
one per row, a few microseconds of Python apart, read rows about half as fast as one. Under
the lock, another thread that would issue its own copies waits on the lock, not on the GIL.
Nothing that waits for the disk runs under it.

Example:
    >>> import numpy as np, os, tempfile
    >>> fd, path = tempfile.mkstemp()
    >>> _ = os.write(fd, bytes(range(32)))
    >>> out = np.zeros(6, np.uint8)
    >>> read_table(out, np.array([[fd, 4, 0, 3], [fd, 20, 3, 3]], np.int64))  # or a list
    >>> out.tolist()
    [4, 5, 6, 20, 21, 22]
    >>> os.close(fd); os.unlink(path)
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np

from loaderkit.errors import ShortRead
from loaderkit.hdf5.read import uring
from loaderkit.hdf5.read.mapped import FileMaps

__all__ = [
    "NOWAIT",
    "RING_MIN_READS",
    "TURN_MAX_BYTES",
    "Columns",
    "ShortRead",
    "Table",
    "read_table",
    "refused_nowait",
    "refuses_nowait",
]

#: ``os.preadv`` with ``RWF_NOWAIT`` where this platform has it (Linux).
NOWAIT: int | None = getattr(os, "RWF_NOWAIT", None)
_WILLNEED: int | None = getattr(os, "POSIX_FADV_WILLNEED", None)
#: Files whose filesystem refused ``RWF_NOWAIT``: their descriptor -> ``(st_dev, st_ino)``,
#: so that a later file given the same number is asked again.
_NO_NOWAIT: dict[int, tuple[int, int]] = {}
#: Reads at least this long are read outside the copy turn (their copy outlasts a GIL
#: hand-over, so taking turns would only serialise them), and are never given to a ring.
TURN_MAX_BYTES = 64 << 10
#: A ring call costs some 30 µs of Python (the table, the queues), a page-cache ``preadv`` a
#: few: a table with fewer short reads than this is not given to a ring.
RING_MIN_READS = 4
#: Taken while a thread copies short reads from the page cache with other threads reading.
_COPY_TURN = threading.Lock()
#: A table of reads: an ``int64`` array of shape ``(n, 4)``, or a list of 4-tuples, each
#: ``(fd, file offset, byte offset in the destination, bytes)``.
Table = np.ndarray | Sequence[Sequence[int]]


class Columns(Sequence[tuple[int, int, int, int]]):
    """A table of reads as rows of Python ints, held as one list per column.

    ``table.tolist()`` makes a list a read: thousands of small lists a batch, each counted
    by the cyclic garbage collector, whose passes then walk every object of the process
    (torch's, numpy's: some 10 ms a 10,000-read table under Python 3.11 instead of 1, and a
    warm epoch at batch 4,096 at half its rate). Four lists of ints are four objects; rows
    are made as they are read (``zip`` reuses its tuple while nothing keeps it).

    Example:
        >>> rows = Columns(np.array([[3, 0, 0, 2], [3, 6, 2, 2]]))
        >>> len(rows), rows[1], [row[1] for row in rows]
        (2, (3, 6, 2, 2), [0, 6])
    """

    def __init__(self, table: np.ndarray) -> None:
        self._columns = tuple(table[:, c].tolist() for c in range(4))

    def __len__(self) -> int:
        return len(self._columns[0])

    @overload
    def __getitem__(self, i: int) -> tuple[int, int, int, int]: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[tuple[int, int, int, int]]: ...

    def __getitem__(self, i: int | slice) -> Any:
        fds, offsets, into, nbytes = self._columns
        if isinstance(i, slice):
            return list(zip(fds[i], offsets[i], into[i], nbytes[i], strict=True))
        return fds[i], offsets[i], into[i], nbytes[i]

    def __iter__(self) -> Iterator[tuple[int, int, int, int]]:
        return zip(*self._columns, strict=True)


def _after_fork_in_child() -> None:
    """A forked child starts with a free lock: the thread that held it is not in the child."""
    global _COPY_TURN
    _COPY_TURN = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _file_of(fd: int) -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` of the file open as ``fd``, or ``None`` if it cannot be read."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def refuses_nowait(fd: int) -> bool:
    """Whether the file open as ``fd`` is one whose filesystem refused ``RWF_NOWAIT``.

    Example:
        >>> refuses_nowait(-1)
        False
    """
    known = _NO_NOWAIT.get(fd)
    if known is None:
        return False
    if _file_of(fd) == known:
        return True
    _NO_NOWAIT.pop(fd, None)  # the number names another file now
    return False


def refused_nowait(fd: int) -> None:
    """Remember that the file open as ``fd`` refused ``RWF_NOWAIT`` (``EOPNOTSUPP``/``EINVAL``).

    Example:
        >>> refused_nowait(-1)  # a descriptor that names no file is not remembered
    """
    file = _file_of(fd)
    if file is not None:
        _NO_NOWAIT[fd] = file


def read_table(
    out: np.ndarray,
    table: Table,
    *,
    shared: bool = False,
    around: int = 0,
    what: str = "the read",
    maps: FileMaps | None = None,
) -> None:
    """Perform every read of ``table`` into ``out``, completely, or raise ``ShortRead``.

    Args:
        out: The destination: a writable, C-contiguous array (its bytes).
        table: One row per read, ``(fd, file offset, byte offset in out, bytes)``: an
            ``int64`` array of shape ``(n, 4)`` (a batch's table built in numpy), or a list of
            4-tuples (a few reads: no numpy call). The files must stay open until this
            returns.
        shared: Other threads read now: a ring call where it is worth one, else short
            page-cache copies take turns (see the module's docstring).
        around: Where the page cache misses a read, ask for the aligned ``around`` bytes that
            hold it (and its neighbours: what a memory map's fault reads) rather than its
            bytes alone; 0: its bytes alone.
        what: What the reads hold, for ``ShortRead``'s message (``"the row data"``).
        maps: The reader's whole-file maps (``mapped.FileMaps``): while its tables are warm,
            an ``int64`` table is copied out of them (no system call a read); every table
            read page cache first tells them how many reads missed.

    Raises:
        ShortRead: A read the file could not complete (it ended, or the call failed): its
            table row, fd, offset, bytes wanted and got, and ``errno``. Reads of other rows
            may or may not have been performed.
        ValueError: ``out`` is not writable and C-contiguous, or a read lies outside it.

    Example:
        >>> import numpy as np, os, tempfile
        >>> fd, path = tempfile.mkstemp()
        >>> _ = os.write(fd, bytes(range(8)))
        >>> out = np.zeros(8, np.uint8)
        >>> read_table(out, [(fd, 0, 0, 2), (fd, 6, 2, 2)])
        >>> out[:4].tolist()
        [0, 1, 6, 7]
        >>> try:
        ...     read_table(out, [(fd, 0, 0, 2), (fd, 7, 4, 4)])  # the file ends at byte 8
        ... except ShortRead as exc:
        ...     print(exc.row, exc.wanted, exc.got)
        1 4 1
        >>> os.close(fd); os.unlink(path)
    """
    count = len(table)
    if not count:
        return
    if not (out.flags.c_contiguous and out.flags.writeable):
        raise ValueError("the destination of a table of reads must be C-contiguous and writable")
    if maps is not None and isinstance(table, np.ndarray) and maps.serve(out, table):
        return
    flat = out.reshape(-1).view(np.uint8)
    done: list[int] | None = None
    left: list[int] | None = None  # rows still to read (None: every row)
    if shared and count >= RING_MIN_READS:
        ring = uring.thread_ring()
        if ring is not None:
            array = np.asarray(table, np.int64).reshape(-1, 4)
            got = _ring_reads(ring, flat, array)  # the ring checks every read's bounds
            if got is not None:
                left = np.flatnonzero(got < array[:, 3]).tolist()
                done = got.tolist()
    rows: Sequence[Sequence[int]] = Columns(table) if isinstance(table, np.ndarray) else table
    size = flat.size
    with flat.data as view:
        nowait = NOWAIT
        if left is None and count > 1 and nowait is not None and not _refused(rows):
            done = [0] * count
            if shared:
                with _COPY_TURN:
                    left, missed = _cached(view, rows, done, nowait, TURN_MAX_BYTES)
            else:
                left, missed = _cached(view, rows, done, nowait, 0)
            if maps is not None:
                maps.missed(len(missed), count)
            if _WILLNEED is not None and (len(missed) > 1 or (around and missed)):
                _advise(rows, missed, around, _WILLNEED)
        for i in range(count) if left is None else left:
            fd, offset, into, nbytes = rows[i]
            if into < 0 or offset < 0 or nbytes < 0 or into + nbytes > size:
                raise _outside(i, rows[i], size)
            got_i = 0 if done is None else done[i]
            while got_i < nbytes:
                try:
                    more = os.preadv(fd, [view[into + got_i : into + nbytes]], offset + got_i)
                except OSError as exc:
                    raise ShortRead(i, fd, offset, nbytes, got_i, exc.errno, what) from exc
                if more == 0:
                    raise ShortRead(i, fd, offset, nbytes, got_i, None, what)
                got_i += more


def _outside(i: int, row: Sequence[int], size: int) -> ValueError:
    fd, offset, into, nbytes = row
    return ValueError(
        f"read {i} of the table ({nbytes} bytes at {offset} of fd {fd} into byte {into}) "
        f"lies outside the destination of {size} bytes"
    )


def _refused(rows: Sequence[Sequence[int]]) -> bool:
    """Whether a file of ``rows`` refused ``RWF_NOWAIT`` (no look-up while none did)."""
    return bool(_NO_NOWAIT) and any(refuses_nowait(fd) for fd in {row[0] for row in rows})


def _cached(
    view: memoryview, rows: Sequence[Sequence[int]], done: list[int], nowait: int, longest: int
) -> tuple[list[int], list[int]]:
    """Copy what the page cache holds of each read (``RWF_NOWAIT``), into ``done``.

    Reads of at least ``longest`` bytes (0: none) are left whole to the plain reads. Returns
    the rows left to read, and among them those the page cache missed (to ask for at once).
    """
    left: list[int] = []
    missed: list[int] = []
    for i, (fd, offset, into, nbytes) in enumerate(rows):
        # a long copy is read outside the turn; a negative start or length (a slice would
        # wrap) is refused by the plain read; one past the end copies short: refused there too
        if (into | nbytes) < 0 or (longest and nbytes >= longest):
            left.append(i)
            continue
        try:
            got = os.preadv(fd, [view[into : into + nbytes]], offset, nowait)
        except BlockingIOError:
            left.append(i)
            missed.append(i)  # not in the page cache: asked for with the others
            continue
        except OSError as exc:
            left.append(i)  # any other error: read again, and reported, by the plain read
            if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):
                refused_nowait(fd)
                left.extend(range(i + 1, len(rows)))
                break
            continue
        if got < nbytes:  # part of it not in the page cache, or the file's end
            done[i] = got
            left.append(i)
            missed.append(i)
    return left, missed


def _advise(rows: Sequence[Sequence[int]], missed: list[int], around: int, willneed: int) -> None:
    """Ask the kernel for every missed read at once (``WILLNEED``); only advice."""
    asked: set[tuple[int, int]] = set()
    for i in missed:
        fd, offset, _, nbytes = rows[i]
        if around:
            first = offset - offset % around
            nbytes = -(-(offset + nbytes) // around) * around - first
            offset = first
        if (fd, offset) in asked:
            continue
        asked.add((fd, offset))
        try:
            os.posix_fadvise(fd, offset, nbytes, willneed)
        except OSError:
            return  # only advice: the reads wait for each


def _ring_reads(ring: uring.Ring, flat: np.ndarray, table: np.ndarray) -> np.ndarray | None:
    """The short reads of ``table`` through ``ring``: bytes read per row (0 for the long).

    ``None`` where fewer than ``RING_MIN_READS`` reads are short (the ring is not worth a
    call) or the ring itself failed (rings are then off in this process).
    """
    short = table[:, 3] < TURN_MAX_BYTES
    count = int(np.count_nonzero(short))
    if count < RING_MIN_READS:
        return None
    try:
        if count == len(table):  # the usual batch: no selection
            return ring.read_table(flat, table)
        done = np.zeros(len(table), np.int64)
        done[short] = ring.read_table(flat, table.compress(short, axis=0))
    except OSError as exc:  # the ring, not a read: stop using rings in this process
        uring.disable(f"io_uring failed: {exc}")
        return None
    return done
