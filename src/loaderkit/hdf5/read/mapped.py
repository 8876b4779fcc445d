"""Copies out of whole-file memory maps: a table of reads served without a system call each.

A warm shuffled batch of CSR rows is a few hundred reads of some kilobytes, all in the page
cache. ``os.preadv`` costs about a microsecond and a half a read, most of it entering and
leaving the kernel; a slice copied out of a read-only map of the file costs a fraction of
that: the pages are the page cache's own (clean file pages, shared, reclaimable: not the
process's private memory). ``FileMaps`` keeps one map per open file and serves a table of
reads (``readtable.Table``: ``fd, file offset, destination byte, bytes``) by copying.

A copy out of a map faults (``SIGBUS``) where the file was truncated under it. Before every
table, each file's size is checked (``fstat``: one system call a file, not a read): a table
that would read past the end is refused (``copy`` returns ``False``) and read by the caller's
``read_table``, whose short read names the file. A file replaced (renamed over) stays
readable through the open descriptor and its map alike: the reader's identity checks see it.
A map follows its descriptor: when the number names another file (the old one closed and the
number reused), the map is made again.

A copy whose page is not in the page cache waits for the disk inside the copy, one page at a
time. Maps serve tables only while the reads are warm (``serve``): once ``WARM_READS`` reads
in a row came from the page cache alone (``missed``, told by ``read_table``: four batches of 64
rows, or one large batch), until a copy runs slower than ``SLOW`` seconds a MiB (a page came
from the disk); meanwhile reads go page cache first, and their misses are asked for together.

Example:
    >>> import numpy as np, os, tempfile
    >>> fd, path = tempfile.mkstemp()
    >>> _ = os.write(fd, bytes(range(32)))
    >>> maps, out = FileMaps(4), np.zeros(6, np.uint8)
    >>> table = np.array([[fd, 4, 0, 3], [fd, 20, 3, 3]], np.int64)
    >>> maps.serve(out, table)  # not warm yet: read_table reads it
    False
    >>> maps.missed(0, FileMaps.WARM_READS)  # that many reads from the page cache alone
    >>> maps.serve(out, table)
    True
    >>> out.tolist()
    [4, 5, 6, 20, 21, 22]
    >>> maps.close(); os.close(fd); os.unlink(path)
"""

from __future__ import annotations

import collections
import logging
import mmap
import os
import sys
import threading
import time

import numpy as np

__all__ = ["DUPLICATES_FD", "FileMaps"]

logger = logging.getLogger(__name__)

#: Whether a map keeps a duplicate of its file's descriptor while open (Python < 3.13, whose
#: ``mmap`` has no ``trackfd=False``): each mapped file then holds two descriptors.
DUPLICATES_FD = sys.version_info < (3, 13)


class _Map:
    __slots__ = ("file", "map", "size", "view")

    def __init__(self, fd: int, file: tuple[int, int], size: int) -> None:
        if DUPLICATES_FD:
            self.map = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        else:  # Python >= 3.13: the map does not keep a descriptor of its own
            self.map = mmap.mmap(fd, 0, access=mmap.ACCESS_READ, trackfd=False)  # type: ignore[call-arg,unused-ignore]
        self.view: memoryview | None = memoryview(self.map)
        self.file = file
        self.size = size

    def close(self) -> None:
        view, self.view = self.view, None
        try:
            if view is not None:
                view.release()
            self.map.close()
        except BufferError:  # a copy still holds a slice: unmapped when it is done
            logger.debug("a file map is still referenced; left to garbage collection")


class FileMaps:
    """Read-only maps of whole open files, one per descriptor, at most ``max_files``.

    Thread-safe: maps are made and dropped under a lock, copied from outside it (a map in
    use is unmapped only when the last copy holding it is done).

    Args:
        max_files: Maps kept at most; the least recently used is dropped beyond it.
    """

    #: Reads in a row from the page cache alone before maps serve tables.
    WARM_READS = 512
    #: Seconds a MiB above which a copy is taken to have waited for the disk (500 MiB/s,
    #: far below any copy from memory).
    SLOW = 2e-3

    def __init__(self, max_files: int) -> None:
        self.max_files = max(1, max_files)
        self._clean = 0
        #: Whether maps serve tables now (``serve``).
        self.warm = False
        self._maps: collections.OrderedDict[int, _Map] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _view(self, fd: int) -> tuple[memoryview, int] | None:
        """The map of the file open as ``fd`` and the file's size now (``fstat``).

        Made, or made again where the number names another file or the file grew; ``None``:
        it cannot be mapped.
        """
        try:
            st = os.fstat(fd)
        except OSError:
            return None
        file = (st.st_dev, st.st_ino)
        with self._lock:
            if self._pid != os.getpid():  # a forked child: its own maps, its own lock
                self._maps, self._lock = collections.OrderedDict(), threading.Lock()
                self._pid = os.getpid()
            held = self._maps.get(fd)
            if held is None or held.file != file or held.size < st.st_size or held.view is None:
                if held is not None:
                    held.close()
                try:
                    held = self._maps[fd] = _Map(fd, file, st.st_size)
                except (OSError, ValueError):
                    self._maps.pop(fd, None)
                    logger.debug("cannot map fd %s", fd, exc_info=True)
                    return None
                while len(self._maps) > self.max_files:
                    self._maps.popitem(last=False)[1].close()
            self._maps.move_to_end(fd)
            view = held.view
        return None if view is None else (view, st.st_size)

    def copy(self, out: np.ndarray, table: np.ndarray) -> bool:
        """Serve ``table``'s reads into ``out`` by copying out of the files' maps.

        Args:
            out: The C-contiguous destination (its bytes).
            table: ``(fd, file offset, byte offset in out, bytes)`` rows (``int64``).

        Returns:
            ``True`` when every read was copied; ``False`` (nothing to trust in ``out``)
            where a file is shorter than its reads or cannot be mapped.
        """
        if not len(table):
            return True
        # a list per column, not one per read: thousands of small lists a batch would set off
        # the cyclic garbage collector's full passes over every object of the process
        # (torch's: 10 ms a 10,000-read table under Python 3.11, not 1)
        fds, where, into, nbytes = (table[:, c].tolist() for c in range(4))
        views: dict[int, memoryview] = {}
        sizes: dict[int, int] = {}
        for fd in set(fds):
            got = self._view(fd)
            if got is None:
                return False
            views[fd], sizes[fd] = got
        # a read past a file's end (truncated: the caller's read names it) is refused before
        # its copy; a negative offset would wrap
        with out.reshape(-1).view(np.uint8).data as flat:
            if len(views) == 1:
                (src,) = views.values()
                (size,) = sizes.values()
                for w, o, b in zip(where, into, nbytes, strict=True):
                    if w < 0 or w + b > size:
                        return False
                    flat[o : o + b] = src[w : w + b]
            else:
                for fd, w, o, b in zip(fds, where, into, nbytes, strict=True):
                    if w < 0 or w + b > sizes[fd]:
                        return False
                    flat[o : o + b] = views[fd][w : w + b]
        return True

    def missed(self, count: int, reads: int) -> None:
        """A table of ``reads`` reads, read page cache first, missed it ``count`` times."""
        self._clean = 0 if count else self._clean + reads
        self.warm = self._clean >= self.WARM_READS

    def serve(self, out: np.ndarray, table: np.ndarray) -> bool:
        """``copy`` where the reads are warm; ``False`` (read it otherwise) where not.

        A copy slower than ``SLOW`` seconds a MiB ends the warm state.
        """
        if not self.warm:
            return False
        start = time.perf_counter()
        if not self.copy(out, table):
            return False
        seconds = time.perf_counter() - start
        if seconds > self.SLOW * max(int(table[:, 3].sum()), 1 << 16) / (1 << 20):
            self._clean, self.warm = 0, False
        return True

    def close(self) -> None:
        """Drop every map."""
        with self._lock:
            while self._maps:
                self._maps.popitem()[1].close()
