"""Reading rows that span many chunks: every chunk once, however many rows are wanted.

NSD stores its betas as ``(750, V)`` int16 with chunks ``(750, 1)``: one chunk per voxel,
holding all 750 trials, so one trial (row) touches every chunk. Reading rows one by one reads
the whole file per row; HDF5's own read of several rows (a union of row hyperslabs) reads each
chunk once but spends time per chunk and per row piece (``benchmarks/nsd_layout.py`` measures
the ways of reading such files). The two readers here fill a buffer with any sorted set of
rows of one session and touch every chunk they need exactly once:

* ``read_rows_raw``: unfiltered column chunks (``rawio.ChunkMap``): the chunks are read in
  file order with a few large reads (a table a piece) into two bounded staging buffers, a
  reading thread one piece ahead while the wanted rows of the last are transposed out in
  numpy (the disk and the transpose each busy one core: 0.9-1.0k -> 1.2-1.4k NSD trials/s
  in a 1.5 GiB job);
* ``read_rows_hdf5``: anything else (filters, other chunk shapes): HDF5 reads boxes of whole
  chunks, every row of a band of chunks at a time
  (``loaderkit.hdf5.meta.columnblocks.column_blocks``), straight into the destination when
  every row is wanted, else into a bounded scratch buffer from which the wanted rows are copied.

Both keep the rows of one chunk band (a chunk's extent along the sample axis) together, so a
batch whose rows fall in few bands reads only those bands.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from typing import NamedTuple

import h5py
import numpy as np

from loaderkit.hdf5.meta.columnblocks import column_blocks
from loaderkit.hdf5.read.rawio import ChunkMap
from loaderkit.hdf5.read.readtable import read_table

__all__ = ["BLOCK_BYTES", "BLOCK_CHUNKS", "read_rows_hdf5", "read_rows_raw"]

#: Most bytes of a staged piece (raw reads: two at once) or read per HDF5 call: bounded memory
#: beside the destination.
BLOCK_BYTES = 16 << 20
#: Most chunks one HDF5 read touches: HDF5 keeps a few KiB of state per chunk of a read
#: (6.6 KiB measured), so 4,096 chunks cost about 27 MiB however small they are.
BLOCK_CHUNKS = 4096
#: Runs shorter than this (in chunks) on average are copied out with one fancy-indexed
#: assignment per staged piece rather than one slice assignment per run.
_SHORT_RUNS = 8
#: Staged columns transposed at a time: 256 chunks of 750 int16 rows (375 KiB) stay in the
#: cache while their rows are written out, twice as fast as one transpose of 16 MiB.
_TILE_COLUMNS = 256


def _bands(rows: np.ndarray, chunk_rows: int) -> Iterator[tuple[int, int, int]]:
    """``(band, start, stop)`` of the stretches of sorted ``rows`` that fall in one band."""
    bands = rows // chunk_rows
    cuts = np.flatnonzero(np.diff(bands)) + 1
    bounds = [0, *cuts.tolist(), int(rows.shape[0])]
    for s, e in itertools.pairwise(bounds):
        yield int(bands[s]), s, e


def _local(rows: np.ndarray, first: int, band_rows: int) -> np.ndarray | None:
    """Rows relative to their band, or ``None`` when they are every row of it in order."""
    local = rows - first
    if local.shape[0] == band_rows and bool(np.all(local == np.arange(band_rows))):
        return None
    return local


def read_rows_raw(
    cmap: ChunkMap,
    rows: np.ndarray,
    out: np.ndarray,
    *,
    stage_bytes: int = BLOCK_BYTES,
    columns: tuple[int, int] | None = None,
) -> int:
    """Fill ``out`` with ``rows`` (sorted, repeats allowed) from column chunks' raw bytes.

    Args:
        cmap: Where the chunks lie (``chunk_map``); its file must be open.
        rows: Rows of the dataset, ascending.
        out: ``(len(rows), *row_shape)``, or ``(len(rows), hi - lo)`` with ``columns``;
            C-contiguous, any numeric dtype (converted while copied, e.g. from big-endian).
        stage_bytes: Most bytes of one staged piece (two are staged at once).
        columns: Only the flat columns ``lo..hi-1`` of each row (elements in C order).

    Returns:
        The bytes read from the file.

    Raises:
        OSError: The file ends before a chunk (truncated while open).

    Example:
        >>> import h5py, numpy as np, tempfile, os
        >>> from loaderkit.hdf5.read.rawio import chunk_map
        >>> path = os.path.join(tempfile.mkdtemp(), "w.h5")
        >>> data = np.arange(24, dtype=">i2").reshape(6, 4)
        >>> with h5py.File(path, "w") as f:
        ...     _ = f.create_dataset("x", data=data, chunks=(6, 1))
        >>> out = np.empty((2, 4), "i2")
        >>> with h5py.File(path, "r") as f:
        ...     nbytes = read_rows_raw(chunk_map(f, f["x"]), np.array([1, 4]), out)
        >>> out.tolist() == data[[1, 4]].tolist(), nbytes
        (True, 48)
    """
    n = rows.shape[0]
    flat = out.reshape(n, -1)
    budget = max(1, stage_bytes // cmap.chunk_bytes)
    jobs = list(_jobs(cmap, rows, budget, columns))
    if not jobs:
        return 0
    longest = max(job.chunks for job in jobs)
    stages = [np.empty((longest, cmap.chunk_rows), cmap.dtype) for _ in jobs[:2]]

    def read(i: int) -> None:
        read_table(stages[i % 2][: jobs[i].chunks], jobs[i].table, what="the row data")

    def scatter(i: int) -> None:
        job = jobs[i]
        staged = stages[i % 2][: job.chunks]
        picked = staged[:, : job.band_rows] if job.local is None else staged[:, job.local]
        _scatter(flat[job.start : job.stop], picked, job.piece)

    if len(jobs) == 1:
        read(0)
        scatter(0)
    else:
        _overlapped(len(jobs), read, scatter)
    return sum(nbytes for job in jobs for *_, nbytes in job.table)


class _Job(NamedTuple):
    """One staged piece: its reads, and where its rows go."""

    start: int  # the rows of ``rows`` (and ``out``) it fills: ``start:stop``
    stop: int
    band_rows: int
    local: np.ndarray | None  # the wanted rows within the band (``None``: all)
    piece: list[tuple[int, int, int]]  # (offset, column, length) runs
    table: list[tuple[int, int, int, int]]  # its reads (fd, offset, byte in stage, bytes)
    chunks: int  # chunks staged


def _jobs(
    cmap: ChunkMap, rows: np.ndarray, budget: int, columns: tuple[int, int] | None
) -> Iterator[_Job]:
    """The staged pieces of a read of ``rows``: every band's runs, ``budget`` chunks a piece."""
    c0, chunk_bytes = cmap.chunk_rows, cmap.chunk_bytes
    for band, s, e in _bands(rows, c0):
        r0, r1 = int(cmap.band_runs[band]), int(cmap.band_runs[band + 1])
        band_rows = min(c0, cmap.rows - band * c0)
        local = _local(rows[s:e], band * c0, band_rows)
        offsets, starts, lengths = cmap.offsets[r0:r1], cmap.columns[r0:r1], cmap.lengths[r0:r1]
        if columns is not None:  # the runs' parts inside [lo, hi), columns relative to lo
            lo, hi = columns
            first = np.maximum(starts, lo)
            last = np.minimum(starts + lengths, hi)
            keep = last > first
            offsets = offsets[keep] + (first[keep] - starts[keep]) * chunk_bytes
            starts, lengths = first[keep] - lo, (last - first)[keep]
        runs = zip(offsets.tolist(), starts.tolist(), lengths.tolist(), strict=True)
        for piece in _pieces(runs, budget, chunk_bytes):
            table = [
                (cmap.fd, offset, first * chunk_bytes, nbytes)
                for offset, nbytes, first in _io_groups(piece, chunk_bytes)
            ]
            chunks = sum(length for _, _, length in piece)
            yield _Job(s, e, band_rows, local, piece, table, chunks)


def _overlapped(count: int, read: Callable[[int], None], scatter: Callable[[int], None]) -> None:
    """``read(i)`` then ``scatter(i)`` for every piece, piece ``i + 1`` read while ``i`` is copied.

    One reading thread, two stages: the disk (or the page cache's copy) and the transpose
    each take one core. A failed read is raised here; nothing returns before the reading
    thread is done with the file (the caller closes it after).
    """
    ready = [threading.Event() for _ in range(count)]
    freed = [threading.Event() for _ in range(count)]
    failed: list[BaseException] = []

    def reading() -> None:
        try:
            for i in range(count):
                if i >= 2:
                    freed[i - 2].wait()  # its stage is scattered, or the copy stopped
                if failed:
                    return
                read(i)
                ready[i].set()
        except BaseException as exc:  # raised in the caller's thread below
            failed.append(exc)
        finally:
            for event in ready:
                event.set()

    thread = threading.Thread(target=reading, name="loaderkit-widerows", daemon=True)
    thread.start()
    try:
        for i in range(count):
            ready[i].wait()
            if failed:
                raise failed[0]
            scatter(i)
            freed[i].set()
    except BaseException:
        failed.append(RuntimeError("the copy stopped"))  # the reading thread stops too
        raise
    finally:
        for event in freed:
            event.set()
        thread.join()


def _pieces(
    runs: Iterator[tuple[int, int, int]], budget: int, chunk_bytes: int
) -> Iterator[list[tuple[int, int, int]]]:
    """Runs ``(offset, column, length)`` grouped into pieces of at most ``budget`` chunks.

    A run longer than what is left of a piece is split between pieces.
    """
    piece: list[tuple[int, int, int]] = []
    used = 0
    for offset, column, length in runs:
        while length:
            take = min(length, budget - used)
            piece.append((offset, column, take))
            used += take
            offset += take * chunk_bytes
            column += take
            length -= take
            if used == budget:
                yield piece
                piece, used = [], 0
    if piece:
        yield piece


def _io_groups(
    piece: list[tuple[int, int, int]], chunk_bytes: int
) -> Iterator[tuple[int, int, int]]:
    """``(file offset, bytes, first staged chunk)`` of the back-to-back stretches of a piece."""
    first = 0
    start, nbytes, at = -1, 0, 0
    for offset, _, length in piece:
        if start >= 0 and offset == start + nbytes:
            nbytes += length * chunk_bytes
        else:
            if start >= 0:
                yield start, nbytes, first
            start, nbytes, first = offset, length * chunk_bytes, at
        at += length
    if start >= 0:
        yield start, nbytes, first


def _scatter(target: np.ndarray, picked: np.ndarray, piece: list[tuple[int, int, int]]) -> None:
    """Copy staged columns ``picked`` (chunks x rows) transposed into ``target`` (rows x row)."""
    if len(piece) * _SHORT_RUNS > picked.shape[0]:
        columns = np.concatenate(
            [np.arange(column, column + length) for _, column, length in piece]
        )
        target[:, columns] = picked.T
        return
    at = 0
    for column, length in _adjacent(piece):
        for a in range(0, length, _TILE_COLUMNS):
            b = min(length, a + _TILE_COLUMNS)
            target[:, column + a : column + b] = picked[at + a : at + b].T
        at += length


def _adjacent(piece: list[tuple[int, int, int]]) -> Iterator[tuple[int, int]]:
    """``(column, length)`` of a piece's runs, runs of adjacent columns joined.

    Runs split where the file's chunks are not back to back (HDF5 allocates them in
    stretches: 57 chunks in the seeds' files) are staged back to back all the same.
    """
    start, span = -1, 0
    for _, column, length in piece:
        if start >= 0 and column == start + span:
            span += length
            continue
        if start >= 0:
            yield start, span
        start, span = column, length
    if start >= 0:
        yield start, span


def read_rows_hdf5(
    dset: h5py.Dataset,
    rows: np.ndarray,
    out: np.ndarray,
    *,
    block_bytes: int = BLOCK_BYTES,
    block_chunks: int = BLOCK_CHUNKS,
) -> int:
    """Fill ``out`` with ``rows`` (sorted, repeats allowed) through HDF5, each chunk once.

    Every band of chunks holding a wanted row is read in boxes of whole chunks
    (``column_blocks``): straight into ``out`` when all of its rows are wanted, else into a
    scratch buffer of at most ``block_bytes`` from which the wanted rows are copied.

    Args:
        dset: The dataset (chunked; samples along axis 0).
        rows: Rows, ascending.
        out: ``(len(rows), *row_shape)``, C-contiguous; HDF5 converts into its dtype.
        block_bytes: Most bytes of one read into scratch.
        block_chunks: Most chunks one read touches.

    Returns:
        The bytes of data read (the boxes' sizes in ``out``'s dtype).

    Example:
        >>> import h5py, numpy as np, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "h.h5")
        >>> data = np.arange(40, dtype="f4").reshape(8, 5)
        >>> with h5py.File(path, "w") as f:
        ...     _ = f.create_dataset("x", data=data, chunks=(4, 1), compression="gzip")
        >>> out = np.empty((3, 5), "f4")
        >>> with h5py.File(path, "r") as f:
        ...     _ = read_rows_hdf5(f["x"], np.array([0, 3, 6]), out)
        >>> out.tolist() == data[[0, 3, 6]].tolist()
        True
    """
    shape = tuple(int(x) for x in dset.shape)
    chunks = dset.chunks or shape
    c0 = max(1, int(chunks[0]))
    itemsize = out.dtype.itemsize
    total = 0
    for band, s, e in _bands(rows, c0):
        first = band * c0
        band_rows = min(c0, shape[0] - first)
        local = _local(rows[s:e], first, band_rows)
        target = out[s:e]
        for box in column_blocks(
            (band_rows, *shape[1:]),
            tuple(chunks),
            itemsize,
            max_bytes=block_bytes,
            max_chunks=block_chunks,
        ):
            source = (slice(first, first + band_rows), *box[1:])
            columns = (slice(None), *box[1:])
            if local is None:
                dset.read_direct(target, source, columns)
            else:
                scratch = np.empty((band_rows, *(b.stop - b.start for b in box[1:])), out.dtype)
                dset.read_direct(scratch, source)
                target[columns] = scratch[local]
            total += band_rows * int(np.prod([b.stop - b.start for b in box[1:]])) * itemsize
    return total
