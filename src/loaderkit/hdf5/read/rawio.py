"""Low-level reads into caller buffers: memory maps, ``os.preadv`` and direct ``H5Dread``.

Contiguous, unfiltered numeric data sits on disk as the C-order array, so rows can be read
skipping HDF5 entirely; ``raw_location`` decides when that is safe. ``map_rows`` maps the
rows read-only (a copy out of the map is a plain memory copy from the page cache, with no
system call); ``pread`` reads them on HDF5's own file descriptor (a table of one read for
``readtable.read_table``, the one function that reads files).
``read_direct`` reads a hyperslab straight into a destination array.

Unfiltered *column chunks* (chunks one element wide on every row axis, such as NSD's
``(750, 1)``: each chunk one voxel's trials) are stored as the C-order array of each chunk:
``chunk_map`` records where every chunk lies (the file's own chunk index read in numpy where
``hdf5.meta.btree1`` can, else one pass of ``H5Dchunk_iter``), so rows can be read with a few
large reads and transposed in numpy, instead of HDF5's bookkeeping of some microseconds per
chunk (``loaderkit.hdf5.read.widerows``).
"""

from __future__ import annotations

import logging
import mmap
import os
from array import array
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np
from h5py import h5d, h5s, h5t

from loaderkit.hdf5.meta.btree1 import chunk_records
from loaderkit.hdf5.read.readtable import read_table

__all__ = [
    "ChunkMap",
    "chunk_map",
    "map_rows",
    "pread",
    "preadv_possible",
    "raw_location",
    "read_direct",
]

logger = logging.getLogger(__name__)


def preadv_possible(h5py_options: Mapping[str, Any]) -> bool:
    """Whether files opened with these ``h5py.File`` options may be read with ``os.preadv``.

    Args:
        h5py_options: The keyword arguments passed to ``h5py.File``.

    Returns:
        ``True`` when the platform has ``os.preadv`` and the driver is the default ``sec2``.

    Example:
        >>> preadv_possible({"driver": "core"})
        False
    """
    return hasattr(os, "preadv") and h5py_options.get("driver") in (None, "sec2")


def raw_location(f: h5py.File, dset: h5py.Dataset) -> tuple[int, int] | None:
    """``(fd, offset)`` when rows of ``dset`` can be read with ``os.preadv``, else ``None``.

    That is the case for data stored contiguously (not chunked, compact or external), without
    filters, fully allocated, in a plain file opened with the default ``sec2`` driver, whose file
    type is exactly the numpy dtype h5py returns (numbers of either byte order, or compound
    records of fixed-size fields): the bytes on disk are then the C-order array.

    Args:
        f: The open file.
        dset: A dataset of ``f``.

    Returns:
        HDF5's file descriptor and the byte offset of the dataset's data, or ``None``.

    Example:
        >>> import h5py, numpy as np, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "r.h5")
        >>> with h5py.File(path, "w") as f:
        ...     _ = f.create_dataset("x", data=np.zeros((4, 2), "f4"), chunks=(2, 2))
        >>> with h5py.File(path, "r") as f:
        ...     raw_location(f, f["x"]) is None  # chunked: HDF5 reads it
        True
    """
    if not hasattr(os, "preadv") or f.driver != "sec2":
        return None
    try:
        dcpl = dset.id.get_create_plist()
        if dcpl.get_layout() != h5d.CONTIGUOUS or dcpl.get_nfilters() or dcpl.get_external_count():
            return None
        dtype = dset.dtype
        record = dtype.fields is not None and not dtype.hasobject  # compound of fixed fields
        if (dtype.kind not in "biufc" and not record) or dtype.subdtype is not None:
            return None
        if dset.id.get_type() != h5t.py_create(dtype):
            return None
        nbytes = int(np.prod(dset.shape, dtype=np.int64)) * dtype.itemsize
        offset = dset.id.get_offset()
        if offset is None or dset.id.get_storage_size() != nbytes:
            return None
        fd = f.id.get_vfd_handle()
    except Exception:  # any doubt: let HDF5 read it
        logger.debug("no raw access to %s", f.filename, exc_info=True)
        return None
    if not isinstance(fd, int) or fd < 0:
        return None
    return fd, int(offset)


def _raw_dtype(dset: h5py.Dataset) -> np.dtype | None:
    """The numpy dtype whose bytes are exactly the file type of ``dset``'s numbers, or ``None``."""
    dtype = dset.dtype
    if dtype.kind not in "biufc" or dtype.subdtype is not None or dtype.fields is not None:
        return None
    if dset.id.get_type() != h5t.py_create(dtype):
        return None
    return dtype


@dataclass(frozen=True, eq=False)
class ChunkMap:
    """Where the column chunks of one dataset lie in its file (see ``chunk_map``).

    The chunks are listed band by band (a *band* is one chunk's extent along the sample
    axis), in file order inside a band, and grouped into *runs*: chunks back to back in the
    file whose columns follow each other too. Run ``r`` holds ``lengths[r]`` chunks from byte
    ``offsets[r]``, for columns ``columns[r] ..`` (flat element indices inside a row).

    Attributes:
        fd: HDF5's file descriptor (valid while the file is open).
        rows: Rows of the dataset (the last band may hold fewer).
        chunk_rows: Rows per chunk (the chunk's extent along the sample axis).
        dtype: The file's element type (either byte order).
        band_runs: ``band_runs[b]:band_runs[b + 1]`` are the runs of band ``b``.
        offsets: File offset of every run's first chunk.
        columns: Column of every run's first chunk.
        lengths: Chunks in every run.

    Example:
        >>> ChunkMap.__dataclass_fields__["chunk_rows"].type
        'int'
    """

    fd: int
    rows: int
    chunk_rows: int
    dtype: np.dtype
    band_runs: np.ndarray
    offsets: np.ndarray
    columns: np.ndarray
    lengths: np.ndarray

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one chunk."""
        return self.chunk_rows * self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        """Memory the map itself holds."""
        return int(self.offsets.nbytes + self.columns.nbytes + self.lengths.nbytes)


def chunk_map(f: h5py.File, dset: h5py.Dataset) -> ChunkMap | None:
    """A ``ChunkMap`` of ``dset`` when its rows can be read from the chunks' raw bytes.

    That is the case for chunks one element wide on every row axis (``(c, 1, ..., 1)``)
    without filters, every chunk written (unwritten chunks read as the fill value), numbers
    whose file type is exactly a numpy dtype (either byte order), in a plain file opened with
    the default ``sec2`` driver, with ``H5Dchunk_iter`` available (h5py >= 3.8). Where the
    file keeps the index in a version-1 B-tree (HDF5's earliest format, h5py's default) it
    is read from the file in numpy (``btree1``: 0.1 s for NSD's 300,000 chunks, against 0.6 s
    of callbacks) and checked: every chunk once, and 16 chunks spread over it holding the
    bytes HDF5 reads for them; else, or where any check fails, HDF5 iterates over the chunks.

    Args:
        f: The open file.
        dset: A dataset of ``f``.

    Returns:
        The map, or ``None`` (HDF5 then reads the rows).

    Example:
        >>> import h5py, numpy as np, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "c.h5")
        >>> with h5py.File(path, "w") as f:
        ...     _ = f.create_dataset("x", data=np.arange(12, dtype="i2").reshape(3, 4),
        ...                          chunks=(3, 1))
        >>> with h5py.File(path, "r") as f:
        ...     m = chunk_map(f, f["x"])
        ...     m.chunk_rows, int(m.lengths.sum())
        (3, 4)
    """
    if not hasattr(os, "preadv") or f.driver != "sec2":
        return None
    chunks, shape = dset.chunks, dset.shape
    if chunks is None or len(shape) < 2 or any(c != 1 for c in chunks[1:]):
        return None
    try:
        dcpl = dset.id.get_create_plist()
        if dcpl.get_nfilters() or dcpl.get_external_count():
            return None
        dtype = _raw_dtype(dset)
        fd = f.id.get_vfd_handle()
        iterate = getattr(dset.id, "chunk_iter", None)
        if dtype is None or not isinstance(fd, int) or fd < 0 or iterate is None:
            return None
        rows = int(chunks[0])
        bands = -(-int(shape[0]) // rows)
        width = int(np.prod(shape[1:], dtype=np.int64))
        count = bands * width
        if count == 0:
            return None
        chunk_bytes = rows * dtype.itemsize
        found = _indexed(f, dset, count, chunk_bytes)
        if found is _UNWRITTEN:
            return None  # HDF5 fills the chunks never written: no map (iterating agrees)
        if found is None:
            found = _iterated(iterate, len(shape))
    except Exception:  # any doubt: let HDF5 read it
        logger.debug("no chunk map for %s", f.filename, exc_info=True)
        return None
    where, origins, sizes = found
    if where.shape[0] != count or bool(np.any(sizes != chunk_bytes)):
        return None  # unwritten chunks (HDF5 fills them), or one of another size or filtered
    strides = np.array([*np.cumprod(shape[:0:-1])[::-1][1:], 1], np.int64)
    band = origins[:, 0] // rows
    column = origins[:, 1:] @ strides
    order = np.lexsort((where, band))  # band by band, file order inside a band
    where, band, column = where[order], band[order], column[order]
    brk = np.flatnonzero(
        (np.diff(where) != chunk_bytes) | (np.diff(column) != 1) | (np.diff(band) != 0)
    )
    starts = np.concatenate(([0], brk + 1))
    lengths = np.diff(np.append(starts, count))
    band_runs = np.searchsorted(band[starts], np.arange(bands + 1), side="left")
    return ChunkMap(
        fd=fd,
        rows=int(shape[0]),
        chunk_rows=rows,
        dtype=dtype,
        band_runs=band_runs.astype(np.int64),
        offsets=where[starts].copy(),
        columns=column[starts].copy(),
        lengths=lengths.astype(np.int64),
    )


#: Chunks of a chunk index read from the file checked against HDF5's own lookup.
_CHECKED_CHUNKS = 16
#: ``_indexed``'s answer for an index that lists fewer chunks than the grid holds, each of
#: them once: some chunks were never written, so no map is made (HDF5 fills those).
_UNWRITTEN: Any = ("unwritten",)


def _indexed(
    f: h5py.File, dset: h5py.Dataset, count: int, chunk_bytes: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``(addresses, corners, sizes)`` from the file's own B-tree (``btree1``), checked.

    ``_UNWRITTEN`` where it lists fewer chunks than the grid, each once (chunks never
    written: no map, without HDF5's 0.6 s iteration to say so). ``None`` where ``btree1``
    cannot read the index, finds more chunks than the grid, a chunk twice, a chunk of
    another size or with filters skipped, or where any of
    ``_CHECKED_CHUNKS`` chunks spread over the index (the first and the last among them)
    holds other bytes at its address than HDF5 reads for it (``H5Dread_chunk``, which looks
    the chunk up in the tree: ``H5Dget_chunk_info_by_coord`` walks the index to it, 0.15 s
    to the last of 300,000).
    """
    records = chunk_records(f, dset, _read_index)
    if records is None or records.addresses.shape[0] > count:
        return None
    if bool(np.any(records.filter_masks)) or bool(np.any(records.sizes != chunk_bytes)):
        return None
    chunks = np.array(dset.chunks, np.int64)
    grid = tuple(-(-int(n) // int(c)) for n, c in zip(dset.shape, chunks, strict=True))
    cells = records.corners // chunks
    if bool(np.any(records.corners % chunks)) or not bool(np.all((cells >= 0) & (cells < grid))):
        return None
    seen = np.zeros(count, np.int64)  # count is every chunk of the grid
    np.add.at(seen, np.ravel_multi_index(tuple(cells.T), grid), 1)
    if bool(np.any(seen > 1)):
        return None  # a chunk twice: not an index HDF5 wrote
    if records.addresses.shape[0] < count:
        return _UNWRITTEN
    fd = f.id.get_vfd_handle()
    for i in np.unique(np.linspace(0, count - 1, _CHECKED_CHUNKS).astype(np.int64)).tolist():
        mask, stored = dset.id.read_direct_chunk(tuple(int(x) for x in records.corners[i]))
        at = np.empty(chunk_bytes, np.uint8)
        _read_index(at, [(fd, int(records.addresses[i]), 0, chunk_bytes)])
        if mask or bytes(stored) != at.tobytes():
            logger.debug("chunk index of %s read from the file disagrees at %d", f.filename, i)
            return None
    return records.addresses, records.corners, records.sizes


def _read_index(out: np.ndarray, table: Any) -> None:
    """``read_table`` for the chunk index and the chunks that check it."""
    read_table(out, table, what="the chunk index")


def _iterated(iterate: Any, rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(addresses, corners, sizes)`` from HDF5's ``H5Dchunk_iter`` (filtered: size < 0)."""
    # machine integers appended (~2 us a chunk, 32 bytes), converted once afterwards
    offsets, corners, sizes = array("q"), array("q"), array("q")

    def visit(info: Any) -> None:
        offsets.append(info.byte_offset)
        corners.extend(info.chunk_offset)
        sizes.append(-1 if info.filter_mask else info.size)

    iterate(visit)
    where = np.frombuffer(offsets, np.int64)
    origins = np.frombuffer(corners, np.int64).reshape(where.shape[0], rank)
    return where, origins, np.frombuffer(sizes, np.int64)


def pread(raw: tuple[int, int], offset: int, out: np.ndarray, nbytes: int) -> None:
    """Read ``nbytes`` from ``offset`` bytes into the dataset's raw data into ``out``.

    A table of one read, served by ``readtable.read_table``.

    Args:
        raw: ``(fd, data_offset)`` from ``raw_location``.
        offset: Byte offset inside the dataset's data.
        out: The C-contiguous destination, ``nbytes`` long.
        nbytes: Bytes to read.

    Raises:
        ShortRead: The file ends before ``nbytes`` could be read, or the read failed (an
            ``OSError``; callers name the file, key and rows).

    Example:
        >>> import numpy as np, os, tempfile
        >>> fd, path = tempfile.mkstemp()
        >>> _ = os.write(fd, np.arange(4, dtype="i4").tobytes())
        >>> out = np.empty(2, "i4")
        >>> pread((fd, 0), 8, out, 8)
        >>> out.tolist()
        [2, 3]
        >>> os.close(fd)
    """
    read_table(out, [(raw[0], raw[1] + offset, 0, nbytes)], what="the row data")


def map_rows(
    raw: tuple[int, int], shape: tuple[int, ...], dtype: np.dtype
) -> tuple[mmap.mmap, np.ndarray] | None:
    """Map a dataset's raw rows read-only: ``(map, rows)``, or ``None`` when it cannot be mapped.

    ``rows`` is a read-only array of ``shape`` over the file's bytes. Copy out of it, never
    hand out views: closing the map (``map.close()``) needs every view gone. The map holds a
    duplicate of the file descriptor until it is closed (Python's ``mmap`` keeps one).

    Args:
        raw: ``(fd, data_offset)`` from ``raw_location``.
        shape: The dataset's shape.
        dtype: Its dtype (the file's byte layout, see ``raw_location``).

    Returns:
        The map and the rows, or ``None`` (empty data, a file shorter than the data, or a
        file system that cannot map).

    Example:
        >>> import h5py, numpy as np, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "m.h5")
        >>> with h5py.File(path, "w") as f:
        ...     _ = f.create_dataset("x", data=np.arange(6, dtype="f4").reshape(3, 2))
        >>> with h5py.File(path, "r") as f:
        ...     mapped, rows = map_rows(raw_location(f, f["x"]), (3, 2), np.dtype("f4"))
        ...     copy = rows[1:].copy(); del rows; mapped.close()
        >>> copy.tolist()
        [[2.0, 3.0], [4.0, 5.0]]
    """
    fd, offset = raw
    count = int(np.prod(shape, dtype=np.int64))
    nbytes = count * dtype.itemsize
    if nbytes == 0:
        return None
    try:
        if os.fstat(fd).st_size < offset + nbytes:
            return None  # truncated: pread reports it as an error when a row is read
        base = offset // mmap.ALLOCATIONGRANULARITY * mmap.ALLOCATIONGRANULARITY
        mapped = mmap.mmap(fd, offset - base + nbytes, offset=base, access=mmap.ACCESS_READ)
    except (OSError, ValueError, OverflowError):
        logger.debug("cannot map fd %s at %s", fd, offset, exc_info=True)
        return None
    rows = np.frombuffer(mapped, dtype=dtype, count=count, offset=offset - base).reshape(shape)
    return mapped, rows


def read_direct(dset: h5py.Dataset, start: int, length: int, out: np.ndarray) -> None:
    """Read rows ``start..start+length-1`` of ``dset`` straight into ``out`` (C-contiguous).

    Args:
        dset: The dataset.
        start: First row.
        length: Number of rows.
        out: Destination of shape ``(length, *row_shape)`` and the dataset's dtype.

    Example:
        >>> import h5py, numpy as np, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "d.h5")
        >>> with h5py.File(path, "w") as f:
        ...     _ = f.create_dataset("x", data=np.arange(8, dtype="f4").reshape(4, 2))
        ...     out = np.empty((2, 2), "f4")
        ...     read_direct(f["x"], 1, 2, out)
        >>> out.tolist()
        [[2.0, 3.0], [4.0, 5.0]]
    """
    fspace = dset.id.get_space()
    count = (length, *out.shape[1:])
    fspace.select_hyperslab((start,) + (0,) * (len(count) - 1), count)
    mspace = h5s.create_simple(count)
    dset.id.read(mspace, fspace, out)  # HDF5's default transfer properties
