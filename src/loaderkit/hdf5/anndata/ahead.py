"""The CSR reader's reads asked for ahead: coming rows' spans planned, never read here.

``CSRAhead`` is what a ``CSRMatrix`` reads ahead with (``readahead`` says why and how). Given
the packed keys of rows the sampler drew, it plans their ``data`` and ``indices`` pieces
from the reader's ``SpanCatalog`` (the table a read reads, ``csrplan.piece_table``), widens
them to the read-around windows where the files fit in memory (each window asked once per process,
``Windows``) or to their pages where they do not, and hands them to the background
``Advisor``. Rows whose spans are not held yet, or whose file is not open in this process,
are left: the watcher asks for them again later, and the read reads them as any.

Example:
    >>> CSRAhead.advise.__name__
    'advise'
"""

from __future__ import annotations

import os
from typing import Protocol

import numpy as np

from loaderkit.hdf5.anndata.csrplan import SpanCatalog, batch_sessions, piece_table
from loaderkit.hdf5.meta.index import ROW_BITS, ROW_MASK
from loaderkit.hdf5.read.handles import Handle
from loaderkit.hdf5.read.readahead import Advisor, AheadPlan, SamplerReadAhead, Windows
from loaderkit.hdf5.read.sessionfiles import SessionFiles

__all__ = ["AheadSource", "CSRAhead"]


class AheadSource(Protocol):
    """What ``CSRAhead`` reads of its reader (``CSRMatrix`` has it)."""

    catalog: SpanCatalog
    #: Its files: the open ones (``cache``) and the keys' row types (``types``, as stored).
    files: SessionFiles

    @property
    def canonical_positions(self) -> np.ndarray:
        """Per session, the position whose file holds it."""

    def raw_fd(self, handle: Handle, k: int) -> int:
        """The descriptor key ``k`` is read from raw in ``handle`` (-1: not read raw)."""

    def reads_warm(self) -> bool:
        """Whether its reads come from the page cache alone lately (nothing to ask ahead)."""


#: Bytes of a page: where the files do not fit in memory, a read is asked for by its pages.
PAGE = 4096


class CSRAhead:
    """Reads of a CSR reader's coming rows, asked for in the background.

    Args:
        reader: The reader (its catalog, open files, canonical sessions, dtypes).
        plan: How far ahead (``readahead.ahead_plan``).
        around: The read-around window where the files fit in memory; 0 where not.
    """

    def __init__(self, reader: AheadSource, plan: AheadPlan, around: int) -> None:
        self.reader = reader
        self.plan = plan
        self.advisor = Advisor(plan.max_bytes)
        #: Windows asked for so far (``None``: the files do not fit; every read's pages).
        self.windows = Windows(around) if around else None

    def watcher(self, index: np.ndarray) -> SamplerReadAhead | None:
        """A watcher for a pass over ``index`` (``None``: every window was asked for)."""
        windows = self.windows
        if windows is not None and windows.done:
            return None
        return SamplerReadAhead(
            self.advise,
            lambda: windows is not None and windows.done,
            index,
            self.plan.samples,
            self.plan.group,
        )

    def advise(self, keys: np.ndarray) -> np.ndarray:
        """Ask the kernel, in the background, for the ``data``/``indices`` bytes of rows ``keys``.

        Nothing is asked while the reader's reads come from the page cache alone (its
        whole-file maps are warm): the files are in, and a read that misses later ends that.

        Returns:
            Per key, whether it was not asked for (its spans not held, or its file not open
            in this process); none: all were, or need not be.
        """
        reader, windows = self.reader, self.windows
        left = np.zeros(keys.size, bool)
        if reader.reads_warm():  # the files are in the page cache: the rows are asked for
            return left
        catalog, canon = reader.catalog, reader.canonical_positions
        cpos = canon[keys >> ROW_BITS]
        held = (catalog.ptr_base[cpos] >= 0) & (catalog.table_base[:, cpos] >= 0).all(axis=0)
        if not held.all():
            left, keys, cpos = ~held, keys[held], cpos[held]
        if not keys.size:
            return left
        sessions, slot = batch_sessions(cpos, canon.size)
        leased = reader.files.file_pool.lease_open(sessions.tolist())
        if leased is None:
            return np.ones(left.size, bool)
        try:
            begin, end = catalog.spans(cpos, keys & ROW_MASK)
            keep = end > begin
            begin, lengths, cpos, slot = begin[keep], (end - begin)[keep], cpos[keep], slot[keep]
            for k in (0, 1):
                fds = np.array([reader.raw_fd(h, k) for h in leased], np.int64)
                item = reader.files.types[k].read_dtype.itemsize
                table, run = piece_table(catalog, k, fds, slot, cpos, begin, lengths, begin, item)
                fd, where, nbytes, file = table[:, 0], table[:, 1], table[:, 3], sessions[slot[run]]
                good = (where >= 0) & (fd >= 0)
                if not good.all():
                    where, nbytes, fd, file = where[good], nbytes[good], fd[good], file[good]
                if windows is None:  # the rows' own pages
                    first = where - where % PAGE
                    self.advisor.ask(fd, first, where + nbytes - first)
                    continue
                ask = np.zeros(where.size, bool)
                for f in np.unique(file).tolist():
                    mine = file == f
                    if not windows.known(f):
                        self._know_file(int(fd[mine][0]), f)
                    ask[mine] = windows.new(f, where[mine], nbytes[mine])
                where, nbytes, fd = where[ask], nbytes[ask], fd[ask]
                first = where - where % windows.around
                last = -(-(where + nbytes) // windows.around) * windows.around
                self.advisor.ask(fd, first, last - first)
        finally:
            reader.files.file_pool.release_all(leased)
        return left

    def _know_file(self, fd: int, pos: int) -> None:
        """Tell the windows where canonical session ``pos``'s ``data`` and ``indices`` lie."""
        assert self.windows is not None
        try:
            size = os.fstat(fd).st_size
        except OSError:
            size = 0
        catalog, reader = self.reader.catalog, self.reader
        held = catalog.indptr(pos)
        nnz = 0 if held is None else int(held[-1])
        starts, stops = [], []
        for k in (0, 1):
            elems, base, tables = catalog.table(k, np.array([pos]))
            chunk = min(int(elems[0]), max(nnz, 1))
            count = -(-nnz // chunk) if nnz else 0
            offsets = tables[int(base[0]) : int(base[0]) + count]
            offsets = offsets[offsets >= 0]
            starts.append(offsets)
            stops.append(offsets + chunk * reader.files.types[k].read_dtype.itemsize)
        self.windows.add(pos, size, np.concatenate(starts), np.concatenate(stops))

    def close(self) -> None:
        """Stop the background thread."""
        self.advisor.close()
