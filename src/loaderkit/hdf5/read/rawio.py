"""Low-level reads into caller buffers: memory maps, ``os.preadv`` and direct ``H5Dread``.

Contiguous, unfiltered numeric data sits on disk as the C-order array, so rows can be read
skipping HDF5 entirely; ``raw_location`` decides when that is safe. ``map_rows`` maps the
rows read-only (a copy out of the map is a plain memory copy from the page cache, with no
system call); ``pread`` reads them with one ``os.preadv`` on HDF5's own file descriptor.
``read_direct`` reads a hyperslab straight into a destination array.

Unfiltered *column chunks* (chunks one element wide on every row axis, such as NSD's
``(750, 1)``: each chunk one voxel's trials) are stored as the C-order array of each chunk:
``chunk_map`` records where every chunk lies (one pass of ``H5Dchunk_iter``), so rows can be
read with a few large ``os.preadv`` calls and transposed in numpy, instead of HDF5's
bookkeeping of some microseconds per chunk (``loaderkit.hdf5.read.widerows``).
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import threading
from array import array
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np
from h5py import h5d, h5s, h5t

from loaderkit.hdf5.read import uring
from loaderkit.hdf5.read.pieceio import NOWAIT, refused_nowait, refuses_nowait

__all__ = [
    "RING_MIN_READS",
    "TURN_MAX_BYTES",
    "ChunkMap",
    "chunk_map",
    "map_rows",
    "pread",
    "pread_cached",
    "pread_many",
    "preadv_possible",
    "raw_location",
    "read_direct",
    "ring_reads",
    "ring_worth",
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
    the default ``sec2`` driver, with ``H5Dchunk_iter`` available (h5py >= 3.8).

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
        if count == 0 or dset.id.get_num_chunks() != count:
            return None  # unwritten chunks: HDF5 fills them
        chunk_bytes = rows * dtype.itemsize
        # machine integers appended (~2 us a chunk, 32 bytes), converted once afterwards
        offsets, corners, sizes = array("q"), array("q"), array("q")

        def visit(info: Any) -> None:
            offsets.append(info.byte_offset)
            corners.extend(info.chunk_offset)
            sizes.append(info.size | (info.filter_mask << 40))

        iterate(visit)
    except Exception:  # any doubt: let HDF5 read it
        logger.debug("no chunk map for %s", f.filename, exc_info=True)
        return None
    if len(offsets) != count or set(sizes) != {chunk_bytes}:
        return None  # a chunk of another size, or one a filter was skipped on
    where = np.frombuffer(offsets, np.int64)
    origins = np.frombuffer(corners, np.int64).reshape(count, len(shape))
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


def pread(
    raw: tuple[int, int], offset: int, out: np.ndarray | list[np.ndarray], nbytes: int
) -> None:
    """Read ``nbytes`` from ``offset`` bytes into the dataset's raw data into ``out``.

    ``out`` is one C-contiguous array or a list of them (filled in order, one system call).

    Args:
        raw: ``(fd, data_offset)`` from ``raw_location``.
        offset: Byte offset inside the dataset's data.
        out: Destination array(s), ``nbytes`` in all.
        nbytes: Bytes to read.

    Raises:
        OSError: The file ends before ``nbytes`` could be read.

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
    buffers = out if isinstance(out, list) else [out]
    base = raw[1] + offset
    got = os.preadv(raw[0], [buffer.data for buffer in buffers], base)
    if got >= nbytes:
        return
    # Short reads are legal: finish buffer by buffer; 0 bytes means the file ended.
    start = 0
    for buffer in buffers:
        view = buffer.data.cast("B")
        done = min(max(got - start, 0), view.nbytes)
        while done < view.nbytes:
            more = os.preadv(raw[0], [view[done:]], base + start + done)
            if more == 0:
                raise OSError(
                    f"file ends {nbytes - start - done} bytes short of the row data "
                    "(truncated while open?)"
                )
            done += more
        start += view.nbytes


#: Taken while a thread copies rows with ``os.preadv`` from the page cache (``pread_cached``).
_COPY_TURN = threading.Lock()
#: Reads at least this large are left to ``pread`` (in parallel): their copy outlasts a GIL
#: hand-over, so taking turns would only serialise them.
TURN_MAX_BYTES = 64 << 10


def _after_fork_in_child() -> None:
    """A forked child starts with a free lock: the thread that held it is not in the child."""
    global _COPY_TURN
    _COPY_TURN = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def pread_cached(
    raw: tuple[int, int],
    buffer: np.ndarray,
    reads: list[tuple[int, int, int]],
) -> list[int]:
    """Copy what the page cache already holds of each read, taking turns with other threads.

    Each read is one ``os.preadv`` with ``RWF_NOWAIT``: the kernel copies from the page cache
    and returns at once where a page would have to come from the disk. The copies of one call
    run under one process-wide lock. Every ``os.preadv`` releases the GIL, and while another
    thread wants the GIL, every release hands it over and every return waits to get it back:
    two threads each issuing one per row, a few microseconds of Python apart, read rows about
    half as fast as one. Under the lock, another thread that would issue its own copies waits
    on the lock, not on the GIL. Nothing that waits for the disk runs under it: what is not
    copied here (not in the page cache, or any error) is left to ``pread``, which reads it
    outside every lock and reports errors with their context. So is every read of at least
    ``TURN_MAX_BYTES``: its copy takes longer than a hand-over, and threads copy it in
    parallel.

    Args:
        raw: ``(fd, data_offset)`` from ``raw_location``.
        buffer: The C-contiguous destination of every read.
        reads: ``(offset inside the dataset's data, byte offset in buffer, bytes)`` triples.

    Returns:
        The bytes copied for each read (0 where nothing was, and everywhere where the
        platform or the file's filesystem has no ``RWF_NOWAIT``).

    Example:
        >>> import numpy as np, os, tempfile
        >>> fd, path = tempfile.mkstemp()
        >>> _ = os.write(fd, np.arange(4, dtype="i4").tobytes())
        >>> out = np.zeros(2, "i4")
        >>> done = pread_cached((fd, 0), out, [(8, 0, 8)])
        >>> done[0] in (0, 8) and (done[0] == 0 or out.tolist() == [2, 3])
        True
        >>> os.close(fd)
    """
    fd, base = raw
    done = [0] * len(reads)
    if NOWAIT is None or not reads or refuses_nowait(fd):
        return done
    flat = buffer.reshape(-1).view(np.uint8)
    with _COPY_TURN:
        for i, (offset, start, nbytes) in enumerate(reads):
            if nbytes >= TURN_MAX_BYTES:
                continue  # a long copy: pread reads it, in parallel with other threads
            try:
                done[i] = os.preadv(fd, [flat[start : start + nbytes].data], base + offset, NOWAIT)
            except BlockingIOError:
                pass  # not in the page cache: pread reads it, outside the lock
            except OSError as exc:
                if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):
                    refused_nowait(fd)
                    break
                # any other error: pread reads it again and reports it with its context
    return done


def pread_many(
    raw: tuple[int, int],
    buffer: np.ndarray,
    reads: list[tuple[int, int, int]],
    ring: uring.Ring | None,
) -> list[int]:
    """Read what can be read at once of each read; the caller reads the rest with ``pread``.

    With a ring (``uring.thread_ring``), the reads go to the kernel in one system call that
    releases the GIL once (``ring_reads`` says which). Without one, what the page cache holds
    is copied with ``pread_cached``.

    Args:
        raw: ``(fd, data_offset)`` from ``raw_location``.
        buffer: The C-contiguous destination of every read.
        reads: ``(offset inside the dataset's data, byte offset in buffer, bytes)`` triples.
        ring: The calling thread's ring, or ``None``.

    Returns:
        The bytes read for each read (fewer than asked, down to 0, where the caller must read
        the rest: a failure, the end of the file, a read the ring leaves, or a page only the
        disk has without a ring).

    Example:
        >>> import numpy as np, os, tempfile
        >>> fd, path = tempfile.mkstemp()
        >>> _ = os.write(fd, np.arange(4, dtype="i4").tobytes())
        >>> out = np.zeros(2, "i4")
        >>> done = pread_many((fd, 4), out, [(8, 0, 4)], uring.thread_ring())
        >>> done[0] in (0, 4) and (done[0] == 0 or out.tolist() == [3, 0])
        True
        >>> os.close(fd)
    """
    flat = buffer.reshape(-1).view(np.uint8)
    if ring is None:
        return pread_cached(raw, flat, reads)
    fd, base = raw
    table = np.array([(fd, base + at, to, n) for at, to, n in reads], np.int64).reshape(-1, 4)
    return ring_reads(ring, flat, table).tolist()


#: Fewer short reads than this are left to ``pread``: a ring call costs some 30 µs of Python
#: (the table, the queues), a ``pread`` of a page-cache row a few.
RING_MIN_READS = 4


def ring_worth(starts: np.ndarray, n: int, row_bytes: int) -> bool:
    """Whether a batch's runs are worth one ring call rather than a ``pread`` each.

    Decided before anything is leased or tabled: a batch the ring would leave whole to
    ``pread`` (too few short reads: block order's few long runs) goes straight to ``pread``.

    Args:
        starts: Where each run begins among the batch's ``n`` rows (``plan_runs``).
        n: Rows in the batch.
        row_bytes: Bytes of one row as stored.

    Returns:
        ``True`` where at least ``RING_MIN_READS`` runs are shorter than ``TURN_MAX_BYTES``.

    Example:
        >>> ring_worth(np.arange(64), 64, 1024)  # 64 runs of one 1 KiB row
        True
        >>> ring_worth(np.array([0, 16, 32, 48]), 64, 16384)  # 4 runs of 256 KiB
        False
    """
    runs = starts.size
    if runs < RING_MIN_READS:
        return False
    if n * row_bytes < TURN_MAX_BYTES:  # the whole batch is short: every run is
        return True
    lengths = np.empty(runs, np.int64)
    np.subtract(starts[1:], starts[:-1], out=lengths[:-1])
    lengths[-1] = n - starts[-1]
    return int(np.count_nonzero(lengths < -(-TURN_MAX_BYTES // row_bytes))) >= RING_MIN_READS


def ring_reads(ring: uring.Ring, flat: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Read the short reads of ``table`` through ``ring``; 0 bytes counted for the others.

    Reads of at least ``TURN_MAX_BYTES`` and batches of fewer than ``RING_MIN_READS`` short
    reads are left to the caller's ``pread``: a long copy gains nothing from the ring (the
    kernel may hand it to a worker thread), and a ring call costs more than a few ``pread``.

    Args:
        ring: The calling thread's ring.
        flat: The destination buffer as C-contiguous bytes.
        table: ``(fd, file offset, byte offset in flat, bytes)`` rows (``int64``).

    Returns:
        Bytes read by each read (``int64``; 0 where the caller must read it).

    Example:
        >>> import numpy as np, os, tempfile
        >>> fd, path = tempfile.mkstemp()
        >>> _ = os.write(fd, bytes(range(64)))
        >>> ring, out = uring.thread_ring(), np.zeros(8, np.uint8)
        >>> reads = np.array([(fd, 2 * i, i, 1) for i in range(8)], np.int64)
        >>> ring is None or (ring_reads(ring, out, reads[:2]).tolist() == [0, 0]  # too few
        ...                  and ring_reads(ring, out, reads).tolist() == [1] * 8)
        True
        >>> ring is None or out.tolist() == [0, 2, 4, 6, 8, 10, 12, 14]
        True
        >>> os.close(fd)
    """
    short = table[:, 3] < TURN_MAX_BYTES
    count = int(np.count_nonzero(short))
    done = np.zeros(len(table), np.int64)
    if count < RING_MIN_READS:
        return done
    try:
        if count == len(table):  # the usual batch: no selection (a 2-D one releases the GIL)
            return ring.read_table(flat, table)
        done[short] = ring.read_table(flat, table.compress(short, axis=0))
    except OSError as exc:  # the ring, not a read: stop using rings in this process
        uring.disable(f"io_uring failed: {exc}")
    return done


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
