"""Low-level reads into caller buffers: memory maps, ``os.preadv`` and direct ``H5Dread``.

Contiguous, unfiltered numeric data sits on disk as the C-order array, so rows can be read
skipping HDF5 entirely; ``raw_location`` decides when that is safe. ``map_rows`` maps the
rows read-only (a copy out of the map is a plain memory copy from the page cache, with no
system call); ``pread`` reads them with one ``os.preadv`` on HDF5's own file descriptor.
``read_direct`` reads a hyperslab straight into a destination array.
"""

from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Mapping
from typing import Any

import h5py
import numpy as np
from h5py import h5d, h5s, h5t

__all__ = ["map_rows", "pread", "preadv_possible", "raw_location", "read_direct"]

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
    dset.id.read(mspace, fspace, out, dxpl=dset._dxpl)
