"""Reading rows that span many chunks: every chunk once, however many rows are wanted.

NSD stores its betas as ``(750, V)`` int16 with chunks ``(750, 1)``: one chunk per voxel,
holding all 750 trials, so one trial (row) touches every chunk. Reading rows one by one reads
the whole file per row; HDF5's own read of several rows (a union of row hyperslabs) reads each
chunk once but spends time per chunk and per row piece (``benchmarks/nsd_layout.py`` measures
the ways of reading such files). The two readers here fill a buffer with any sorted set of
rows of one session and touch every chunk they need exactly once:

* ``read_rows_raw``: unfiltered column chunks (``rawio.ChunkMap``): the chunks are read in
  file order with a few large reads (a table a piece) into a bounded staging buffer, the wanted
  rows transposed out of it in numpy;
* ``read_rows_hdf5``: anything else (filters, other chunk shapes): HDF5 reads boxes of whole
  chunks, every row of a band of chunks at a time
  (``loaderkit.hdf5.meta.columnblocks.column_blocks``), straight into the destination when
  every row is wanted, else into a bounded scratch buffer from which the wanted rows are copied.

Both keep the rows of one chunk band (a chunk's extent along the sample axis) together, so a
batch whose rows fall in few bands reads only those bands.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import h5py
import numpy as np

from loaderkit.hdf5.meta.columnblocks import column_blocks
from loaderkit.hdf5.read.rawio import ChunkMap
from loaderkit.hdf5.read.readtable import read_table

__all__ = ["BLOCK_BYTES", "BLOCK_CHUNKS", "read_rows_hdf5", "read_rows_raw"]

#: Most bytes staged (raw reads) or read per HDF5 call: bounded memory beside the destination.
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
        stage_bytes: Most bytes staged at once.
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
    c0 = cmap.chunk_rows
    chunk_bytes = cmap.chunk_bytes
    budget = max(1, stage_bytes // chunk_bytes)
    total = 0
    stage: np.ndarray | None = None
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
        if stage is None:
            stage = np.empty((min(budget, int(lengths.sum())) or 1, c0), cmap.dtype)
        for piece in _pieces(runs, budget, chunk_bytes):
            staged = stage[: sum(length for _, _, length in piece)]
            table = [
                (cmap.fd, offset, first * chunk_bytes, nbytes)
                for offset, nbytes, first in _io_groups(piece, chunk_bytes)
            ]
            read_table(staged, table, what="the row data")
            total += sum(nbytes for *_, nbytes in table)
            picked = staged[:, :band_rows] if local is None else staged[:, local]
            _scatter(flat[s:e], picked, piece)
    return total


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
