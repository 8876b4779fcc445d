"""Where a batch of CSR rows lies in its files: every session's ``indptr`` and chunk tables.

A CSR row is the span ``[indptr[r], indptr[r+1])`` of its group's ``data`` and ``indices``;
where those elements lie in the file follows from the datasets' chunk tables (uncompressed
chunks, anndata's default) or their one raw offset (contiguous). ``SpanCatalog`` holds both
for every session a process has read, in flat arrays, so that a batch drawn from many
sessions is planned in one vectorised pass -- spans, runs of adjacent spans, and the pieces
of each run that lie in one chunk -- whatever the number of sessions in it (``plan_pieces``):
a fixed number of numpy calls a batch, then one ``os.preadv`` a piece.

Memory: ``indptr`` takes 8 bytes a cell of the sessions read (reserved for all at first use,
touched only as sessions are read); a chunk table 8 bytes a chunk (anndata's chunks hold
some 15,000 values).

Example:
    >>> import numpy as np
    >>> catalog = SpanCatalog([2, 1])  # two sessions: 2 rows and 1 row
    >>> _ = catalog.hold_indptr(0, np.array([0, 3, 5]))
    >>> _ = catalog.hold_indptr(1, np.array([0, 4]))
    >>> catalog.hold_tables(0, [(4, np.array([100, 900])), (4, np.array([200, 300]))])
    >>> begin, end = catalog.spans(np.array([0, 0, 1]), np.array([0, 1, 0]))
    >>> begin.tolist(), end.tolist()
    ([0, 3, 0], [3, 5, 4])
    >>> where, into, nbytes, _ = plan_pieces(
    ...     *catalog.table(0, np.array([0])), np.array([2]), np.array([3]), np.array([0]), 4)
    >>> where.tolist(), into.tolist(), nbytes.tolist()  # chunk 0's last two, chunk 1's first
    ([108, 900], [0, 8], [8, 4])
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "AROUND",
    "CONTIGUOUS",
    "SpanCatalog",
    "batch_runs",
    "batch_sessions",
    "piece_table",
    "plan_pieces",
    "raw_chunks",
    "read_around",
]

#: Elements per "chunk" of a contiguous dataset: one chunk, at its raw offset.
CONTIGUOUS = 1 << 62
#: Bytes read around a row the page cache misses, when the files fit in memory: Linux's
#: default readahead, what a memory map's page fault reads around the page.
AROUND = 128 << 10


def read_around(file_bytes: int, memory: int | None, source: str | None = None) -> tuple[int, str]:
    """How much to read where a row's bytes are not in the page cache, and why.

    A shuffled epoch reads every row of the files once, in random order. Where the files
    fit well in memory (a quarter of it), the aligned ``AROUND`` bytes around a row the page
    cache misses are read (what a memory map's fault reads), and read ahead in the
    sampler's order asks for each such window once (``readahead``): the neighbours fill the
    page cache for later batches, and the files are read about once, at close to the disk's
    sequential rate. Where they do not fit, the neighbours would be evicted before they are
    read: only the row's bytes are read (all of a batch's misses together,
    ``readtable.read_table``).

    Args:
        file_bytes: Bytes of the files read.
        memory: Memory this process may use (``PlatformInfo.memory_bytes``: the lowest
            cgroup limit on its path, else physical memory).
        source: Where ``memory`` came from (``PlatformInfo.memory_source``), for the reason.

    Example:
        >>> read_around(512 << 20, 24 << 30)[0], read_around(512 << 30, 24 << 30)[0]
        (131072, 0)
    """
    size = f"{file_bytes / 2**20:,.0f} MiB of files"
    if memory is None:
        return 0, f"{size}, memory unknown: a missed row's bytes alone are read"
    size_of = f"{memory / 2**30:,.2f} GiB" if memory >= 1 << 30 else f"{memory / 2**20:,.0f} MiB"
    limit = f"a quarter of {size_of} of memory" + (f" ({source})" if source else "")
    if file_bytes <= memory // 4:
        return AROUND, (f"{size} within {limit}: {AROUND >> 10} KiB read around a missed row")
    return 0, f"{size} over {limit}: a missed row's bytes alone are read"


class SpanCatalog:
    """Per process: every session's ``indptr`` and both keys' chunk tables, in flat arrays.

    Filled as sessions are first read (``hold_indptr``, ``hold_tables``; both take a lock,
    reads take none: a session's entries are written before it is marked known). Never
    pickled: a worker holds what it reads.

    Args:
        rows: Rows (cells) of every session, by position.

    Example:
        >>> SpanCatalog([3]).indptr(0) is None
        True
    """

    def __init__(self, rows: Sequence[int]) -> None:
        sizes = np.asarray(rows, np.int64) + 1
        #: Where each session's ``indptr`` starts in the flat array; -1: not read yet.
        self.ptr_base = np.full(len(sizes), -1, np.int64)
        self._ptr_at = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
        self._ptr_size = sizes
        self._ptr_total = int(sizes.sum())
        self._ptrs: np.ndarray | None = None  # reserved at the first session read
        #: Per key (0: data, 1: indices) and session: elements a chunk (``CONTIGUOUS``).
        self.chunk_elems = np.ones((2, len(sizes)), np.int64)
        #: Per key and session: where its chunk table starts in ``tables``; -1: none held.
        self.table_base = np.full((2, len(sizes)), -1, np.int64)
        #: Every chunk table back to back: file offsets of chunks (-1: never written).
        self.tables = np.empty(0, np.int64)
        self._tables_used = 0
        #: Sessions whose ``indptr`` or chunk tables are not held yet (0: ``known`` is true).
        self._unknown = len(sizes)
        self._lock = threading.Lock()

    def indptr(self, pos: int) -> np.ndarray | None:
        """Session ``pos``'s ``indptr`` if held (a read-only view), else ``None``."""
        base = int(self.ptr_base[pos])
        if base < 0:
            return None
        assert self._ptrs is not None
        view = self._ptrs[base : base + int(self._ptr_size[pos])]
        view.flags.writeable = False
        return view

    def hold_indptr(self, pos: int, indptr: np.ndarray) -> np.ndarray:
        """Keep session ``pos``'s ``indptr`` (checked by the caller); returns the held view."""
        with self._lock:
            if self.ptr_base[pos] < 0:
                if self._ptrs is None:  # reserved, not touched: pages come as sessions do
                    self._ptrs = np.empty(self._ptr_total, np.int64)
                at = int(self._ptr_at[pos])
                self._ptrs[at : at + indptr.size] = indptr
                self.ptr_base[pos] = at  # last: known only once written
                self._unknown -= bool((self.table_base[:, pos] >= 0).all())
        held = self.indptr(pos)
        assert held is not None
        return held

    def known(self, positions: np.ndarray) -> bool:
        """Whether every session of ``positions`` has its ``indptr`` and chunk tables held."""
        return not self._unknown or bool(
            (self.ptr_base[positions] >= 0).all() and (self.table_base[:, positions] >= 0).all()
        )

    def hold_tables(self, pos: int, parts: Sequence[tuple[int, np.ndarray]]) -> None:
        """Keep session ``pos``'s chunk tables: per key, ``(elements a chunk, offsets)``.

        A contiguous dataset is ``(CONTIGUOUS, [raw offset])``.
        """
        with self._lock:
            if (self.table_base[:, pos] >= 0).all():
                return
            bases = []
            for _, offsets in parts:
                need = self._tables_used + offsets.size
                if need > self.tables.size:
                    grown = np.empty(max(need, 2 * self.tables.size, 1024), np.int64)
                    grown[: self._tables_used] = self.tables[: self._tables_used]
                    self.tables = grown  # readers holding the old array still see their rows
                self.tables[self._tables_used : need] = offsets
                bases.append(self._tables_used)
                self._tables_used = need
            for k, ((elems, _), base) in enumerate(zip(parts, bases, strict=True)):
                self.chunk_elems[k, pos] = elems
                self.table_base[k, pos] = base  # last: known only once written
            self._unknown -= bool(self.ptr_base[pos] >= 0)

    def spans(self, spos: np.ndarray, srows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(begin, end)`` of rows ``srows`` of sessions ``spos`` (every ``indptr`` held)."""
        assert self._ptrs is not None
        at = self.ptr_base[spos] + srows
        return self._ptrs[at], self._ptrs[at + 1]

    def table(self, k: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Key ``k``'s ``(elements a chunk, table start, tables)`` for sessions ``positions``."""
        return self.chunk_elems[k, positions], self.table_base[k, positions], self.tables


def plan_pieces(
    elems: np.ndarray,
    bases: np.ndarray,
    tables: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    at: np.ndarray,
    item: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The reads of runs of elements: one a stretch of the file the run lies in back to back.

    Run ``i`` (elements ``starts[i] .. starts[i] + lengths[i] - 1`` of a session's dataset,
    every length > 0) goes to elements ``at[i]..`` of the destination. Its part in each chunk
    is a piece; pieces of one run whose chunks lie back to back in the file are one read.

    Args:
        elems: Per run, elements a chunk of its session's dataset (``CONTIGUOUS``: one).
        bases: Per run, where its session's chunk table starts in ``tables``.
        tables: The chunk tables (file offsets; -1 for a chunk never written).
        starts: First element of each run.
        lengths: Elements of each run.
        at: Destination element of each run's first element.
        item: Bytes an element.

    Returns:
        ``(file offset, destination byte offset, bytes, run)`` per read; a file offset < 0
        is a chunk never written (its fill value: the caller reads those otherwise).

    Example:
        >>> import numpy as np
        >>> tables = np.array([16, 20, 90])  # chunks 0 and 1 back to back, chunk 2 elsewhere
        >>> one = np.array([0])
        >>> where, into, nbytes, run = plan_pieces(
        ...     np.array([4]), one, tables, np.array([1]), np.array([9]), one, 1)
        >>> where.tolist(), nbytes.tolist()
        ([17, 90], [7, 2])
    """
    first = starts // elems
    last = (starts + lengths - 1) // elems
    located = tables[bases + first]
    cross = np.flatnonzero(last != first)
    if not cross.size or _back_to_back(elems, bases, tables, first, last, located, cross, item):
        # every run inside one chunk, or across chunks that lie back to back: a read a run
        where = located + (starts - first * elems) * item
        where[located < 0] = -1
        return where, at * item, lengths * item, np.arange(starts.size)
    count = last - first + 1
    run = np.repeat(np.arange(starts.size), count)
    ahead = np.cumsum(count) - count  # pieces before each run's first
    chunk = first[run] + np.arange(run.size) - ahead[run]
    size = elems[run]
    lo = np.maximum(starts[run], chunk * size)
    hi = np.minimum((starts + lengths)[run], (chunk + 1) * size)
    located = tables[bases[run] + chunk]
    where = located + (lo - chunk * size) * item
    where[located < 0] = -1
    into = (at[run] + lo - starts[run]) * item
    nbytes = (hi - lo) * item
    # a run's next piece starts where its last ended in the file: one read for both
    joined = np.empty(run.size, bool)
    joined[0] = False
    np.equal(where[1:], where[:-1] + nbytes[:-1], out=joined[1:])
    joined[1:] &= (run[1:] == run[:-1]) & (where[:-1] >= 0)
    if joined.any():
        heads = np.flatnonzero(~joined)
        nbytes = np.add.reduceat(nbytes, heads)
        where, into, run = where[heads], into[heads], run[heads]
    return where, into, nbytes, run


def _back_to_back(
    elems: np.ndarray,
    bases: np.ndarray,
    tables: np.ndarray,
    first: np.ndarray,
    last: np.ndarray,
    located: np.ndarray,
    cross: np.ndarray,
    item: int,
) -> bool:
    """Whether each run of ``cross`` lies in two written chunks, the second right after the first.

    A row crosses a chunk's end now and then (800 values in chunks of 15,625: one row in
    20); where the file holds the two chunks back to back (a dataset written in order), the
    run is one read, planned with the runs inside one chunk.
    """
    if not (last[cross] == first[cross] + 1).all():
        return False  # a run over three chunks or more: the general plan
    here = located[cross]
    after = tables[bases[cross] + last[cross]]
    return bool(((here >= 0) & (after == here + elems[cross] * item)).all())


def raw_chunks(chunked: Any, dtype: np.dtype) -> bool:
    """Whether a key's elements are read raw from its chunks: 1-D, uncompressed, of ``dtype``.

    ``chunked`` is the key's ``ChunkReader`` (``None``: not chunked); its chunk index is
    built by the first ``fill_run``, so a key qualifies once that has run. Such keys' chunk
    tables are what a ``SpanCatalog`` holds.

    Example:
        >>> raw_chunks(None, np.dtype("f4"))
        False
    """
    return (
        chunked is not None
        and not chunked.filters
        and chunked.offsets is not None
        and len(chunked.shape) == 1
        and chunked.dtype == dtype
    )


def batch_runs(
    cpos: np.ndarray, begin: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A batch's runs: rows back to back in both the file and the batch (request order).

    Args:
        cpos: Per row, its canonical session.
        begin: Per row, its span's first element (``SpanCatalog.spans``).
        end: Per row, its span's end.

    Returns:
        ``(first, stop, length)`` per run with elements: its first row, the row after its
        last, and its elements. Rows without elements are in no run.

    Example:
        >>> import numpy as np
        >>> cpos, begin = np.array([0, 0, 0, 1]), np.array([0, 5, 9, 0])
        >>> runs = batch_runs(cpos, begin, np.array([5, 9, 12, 4]))
        >>> [a.tolist() for a in runs]  # rows 0-2 back to back; row 3 another file
        [[0, 3], [3, 4], [12, 4]]
    """
    if not begin.size:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty
    brk = np.flatnonzero((begin[1:] != end[:-1]) | (cpos[1:] != cpos[:-1])) + 1
    first = np.concatenate(([0], brk))
    stop = np.concatenate((brk, [begin.size]))
    length = end[stop - 1] - begin[first]
    keep = length > 0
    return first[keep], stop[keep], length[keep]


def piece_table(
    catalog: SpanCatalog,
    k: int,
    fds: np.ndarray,
    slot: np.ndarray,
    cpos: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    at: np.ndarray,
    item: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The table of reads of key ``k``'s runs: what a batch reads and the read-ahead asks for.

    Run ``i``: elements ``starts[i]..`` (``lengths[i] > 0``) of canonical session ``cpos[i]``'s
    file, open as ``fds[slot[i]]``, to element ``at[i]`` of the key's buffer. Its pieces
    (``plan_pieces``) are the table's rows: ``(fd, file offset, buffer byte offset, bytes)``.

    Returns:
        ``(table, run)``: the table, and each row's run. A row whose file offset is < 0 (a
        chunk never written) or whose fd is < 0 (not read raw) cannot be read as planned.

    Example:
        >>> import numpy as np
        >>> catalog = SpanCatalog([4])
        >>> int(catalog.hold_indptr(0, np.array([0, 2, 3, 3, 6]))[-1])
        6
        >>> catalog.hold_tables(0, [(CONTIGUOUS, np.array([100])), (CONTIGUOUS, np.array([200]))])
        >>> one = np.zeros(1, np.int64)
        >>> table, run = piece_table(
        ...     catalog, 1, np.array([7]), one, one, np.array([2]), np.array([4]), one, 4)
        >>> table.tolist()
        [[7, 208, 0, 16]]
    """
    where, into, nbytes, run = plan_pieces(*catalog.table(k, cpos), starts, lengths, at, item)
    table = np.empty((where.size, 4), np.int64)
    table[:, 0] = fds[slot[run]]
    table[:, 1] = where
    table[:, 2] = into
    table[:, 3] = nbytes
    return table, run


def batch_sessions(cpos: np.ndarray, sessions: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct sessions of a batch's rows (increasing) and each row's place among them.

    A mark per session where the dataset has few (no sort); ``np.unique`` where marking
    would cost more than sorting the batch's rows.

    Example:
        >>> [a.tolist() for a in batch_sessions(np.array([3, 1, 3]), 5)]
        [[1, 3], [1, 0, 1]]
    """
    if sessions > 64 * cpos.size + 1024:
        distinct, slot = np.unique(cpos, return_inverse=True)
        return distinct, slot.reshape(-1)
    seen = np.zeros(sessions, np.int64)
    seen[cpos] = 1
    return np.flatnonzero(seen), (np.cumsum(seen) - 1)[cpos]
