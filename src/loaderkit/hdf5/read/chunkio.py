"""Rows of chunked datasets read from the chunks' raw bytes, outside h5py: the read paths.

h5py runs every HDF5 call under one global lock, decompression included, so threads that read
through it take turns. ``ChunkReader`` reads a chunked dataset's rows itself: the chunk index
(one pass of ``H5Dchunk_iter`` per open file, under h5py's lock, built on the first read) says
where every chunk lies, a table of reads (``readtable.read_table``) reads its bytes (the GIL
released), the filters are undone in the reading thread (``loaderkit.hdf5.read.codecs``), and
the rows wanted are copied out. Uncompressed chunks that span whole rows are read straight into
the destination (one table for a run of rows). Edge chunks are stored whole (padded): only what
the dataset's shape allows is copied. Chunks never written read as the dataset's fill value; a
filter whose bit is set in a chunk's filter mask was skipped for that chunk and is not undone.

``ReadPath(kind, reason)`` says how one key of one file is read and why; ``chunk_reader``
decides it for a chunked dataset. Anything not read here falls back to h5py (correct, serial
under h5py's lock), and the reason names what made it fall back.

Example:
    >>> ReadPath("h5py", "variable-length rows").kind
    'h5py'
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from array import array
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import h5py
import numpy as np
from h5py import h5d, h5t

from loaderkit.hdf5.read import uring
from loaderkit.hdf5.read.codecs import Decoder, decoder
from loaderkit.hdf5.read.readtable import read_table

__all__ = ["ChunkReader", "ReadPath", "choose_path", "chunk_reader"]

logger = logging.getLogger(__name__)

#: Per thread: the last chunk decoded, ``(reader, flat index, rows)``.
_LAST = threading.local()

#: Most chunks an index holds (its arrays take 24 bytes a chunk); more: h5py reads.
_MAX_CHUNKS = 1 << 22


class ReadPath(NamedTuple):
    """How the rows of one key are read, and why.

    Attributes:
        kind: ``"memory map"`` / ``"preadv"`` (contiguous rows), ``"raw chunks"``
            (uncompressed chunks read with ``os.preadv``), ``"decoded chunks"`` (compressed
            chunks read raw and decoded in the reading thread), ``"column chunks"`` (rows
            spanning many uncompressed chunks, ``widerows``) -- all outside every
            lock -- or ``"h5py"`` (HDF5 reads it, serially under h5py's global lock).
        reason: Why this path (for ``"h5py"``: what made the fast paths decline).

    Example:
        >>> ReadPath("preadv", "contiguous numbers").kind
        'preadv'
    """

    kind: str
    reason: str

    @property
    def parallel(self) -> bool:
        """Whether threads read through this path at the same time."""
        return self.kind != "h5py"


class ChunkReader:
    """Reads rows (along axis 0) of one chunked dataset from its raw chunks.

    Built by ``chunk_reader`` (which checks that the dataset qualifies); the chunk index is
    built by ``index`` under a lock the caller holds (``Handle.guard``), once per open file.

    Args:
        fd: HDF5's file descriptor (sec2 driver).
        shape: The dataset's shape.
        chunks: Its chunk shape.
        dtype: The file's element type (either byte order).
        filters: ``(filter id, decoder)`` in pipeline order.
        fill: One element of the fill value, as stored.
        buffer_bytes: Decoded chunks kept for later reads (least recently used dropped
            first): the size of the dataset's HDF5 chunk buffer (``rdcc_nbytes``), which these
            reads take the place of; 0 keeps only each thread's last chunk.

    Example:
        >>> ChunkReader.read.__name__
        'read'
    """

    def __init__(
        self,
        fd: int,
        shape: tuple[int, ...],
        chunks: tuple[int, ...],
        dtype: np.dtype,
        filters: Sequence[tuple[int, Decoder]],
        fill: np.ndarray,
        buffer_bytes: int = 0,
    ) -> None:
        self.fd = fd
        self.shape = shape
        self.chunks = chunks
        self.dtype = dtype
        self.filters = tuple(filters)
        self.fill = fill
        self.grid = tuple(-(-n // c) for n, c in zip(shape, chunks, strict=True))
        self.chunk_nbytes = int(np.prod(chunks, dtype=np.int64)) * dtype.itemsize
        self.row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        #: Chunks span whole rows: one chunk per band of rows.
        self.whole_rows = tuple(chunks[1:]) == tuple(shape[1:])
        self.offsets: np.ndarray | None = None
        self.sizes: np.ndarray | None = None
        self.masks: np.ndarray | None = None
        #: Decoded chunks (read-only arrays, shared by every reading thread), by flat index.
        self.decoded: OrderedDict[int, np.ndarray] = OrderedDict()
        self.buffer_bytes = max(0, int(buffer_bytes)) if filters else 0
        self._lock = threading.Lock()  # held only to look up, add or drop a decoded chunk

    def index(self, dset: h5py.Dataset) -> None:
        """Build the chunk index (one pass of ``H5Dchunk_iter``); the caller holds the guard."""
        if self.offsets is not None:
            return
        count = int(np.prod(self.grid, dtype=np.int64))
        where, corners, sizes = array("q"), array("q"), array("q")

        def visit(info: Any) -> None:
            where.append(info.byte_offset)
            corners.extend(info.chunk_offset)
            sizes.append(info.size | (info.filter_mask << 40))

        dset.id.chunk_iter(visit)
        offsets = np.full(count, -1, np.int64)
        size = np.zeros(count, np.int64)
        mask = np.zeros(count, np.int64)
        if len(where):
            origins = np.frombuffer(corners, np.int64).reshape(len(where), len(self.shape))
            flat = np.ravel_multi_index(tuple((origins // self.chunks).T), self.grid)
            packed = np.frombuffer(sizes, np.int64)
            offsets[flat] = np.frombuffer(where, np.int64)
            size[flat] = packed & ((1 << 40) - 1)
            mask[flat] = packed >> 40
        self.sizes, self.masks = size, mask
        self.offsets = offsets  # last: ``offsets`` set means the index is complete

    def read(self, start: int, length: int, out: np.ndarray) -> None:
        """Rows ``start..start+length-1`` into ``out`` (C-contiguous, ``dtype``, as stored).

        Raises:
            OSError: The file ends inside a chunk, or a chunk fails its checksum or decoding.
        """
        offsets, sizes, masks = self.offsets, self.sizes, self.masks
        assert offsets is not None and sizes is not None and masks is not None
        c0 = self.chunks[0]
        stop = start + length
        columns = list(itertools.product(*(range(g) for g in self.grid[1:])))
        reads: list[tuple[int, int, int, int]] = []  # whole rows of raw chunks: one table
        for band in range(start // c0, (stop - 1) // c0 + 1):
            r0, r1 = max(start, band * c0), min(stop, (band + 1) * c0)
            rows = out[r0 - start : r1 - start]
            for col in columns:
                flat = int(np.ravel_multi_index((band, *col), self.grid))
                within = (slice(None), *self._within(col))
                dst = rows[within]
                where = int(offsets[flat])
                if where < 0:  # never written: the fill value
                    dst[...] = self.fill
                    continue
                active = [
                    (j, decode)
                    for j, (_, decode) in enumerate(self.filters)
                    if not (int(masks[flat]) >> j) & 1
                ]
                if not active and self.whole_rows:
                    skip = (r0 - band * c0) * self.row_bytes
                    nbytes = (r1 - r0) * self.row_bytes
                    reads.append((self.fd, where + skip, (r0 - start) * self.row_bytes, nbytes))
                    continue
                chunk = self._chunk(flat, where, int(sizes[flat]), active)
                local = (slice(r0 - band * c0, r1 - band * c0), *self._local(col))
                part = chunk[local]
                dst[...] = part
        if reads:
            read_table(out, reads, what="a chunk")

    def _chunk(
        self, flat: int, where: int, size: int, active: list[tuple[int, Decoder]]
    ) -> np.ndarray:
        """Chunk ``flat`` decoded: the thread's last, a kept one, or read and decoded now.

        The thread's last chunk serves sorted runs that share a chunk; a chunk decoded before
        stays within ``buffer_bytes``; a new one is read and decoded outside every lock.
        """
        last = getattr(_LAST, "chunk", None)
        if last is not None and last[0] is self and last[1] == flat:
            return last[2]
        if self.buffer_bytes:
            with self._lock:
                kept = self.decoded.get(flat)
                if kept is not None:
                    self.decoded.move_to_end(flat)
            if kept is not None:
                _LAST.chunk = (self, flat, kept)
                return kept
        data: Any = np.empty(size, np.uint8)
        read_table(data, [(self.fd, where, 0, size)], what="a chunk")
        for _, decode in reversed(active):
            data = decode(data)
        chunk = np.frombuffer(data, self.dtype)
        if chunk.size * self.dtype.itemsize != self.chunk_nbytes:
            raise OSError(
                f"a chunk decoded to {chunk.size * self.dtype.itemsize} bytes, "
                f"expected {self.chunk_nbytes}"
            )
        chunk = chunk.reshape(self.chunks)
        _LAST.chunk = (self, flat, chunk)
        if self.chunk_nbytes <= self.buffer_bytes:
            self._keep(flat, chunk)
        return chunk

    def _keep(self, flat: int, chunk: np.ndarray) -> None:
        """Keep a decoded chunk; drop the least recently used beyond ``buffer_bytes``."""
        chunk.setflags(write=False)
        with self._lock:
            self.decoded[flat] = chunk
            self.decoded.move_to_end(flat)
            while len(self.decoded) * self.chunk_nbytes > self.buffer_bytes:
                self.decoded.popitem(last=False)

    def forget(self) -> None:
        """Drop the decoded chunks: every kept one, and the thread's last if it is one."""
        with self._lock:
            self.decoded.clear()
        last = getattr(_LAST, "chunk", None)
        if last is not None and last[0] is self:
            _LAST.chunk = None

    def _within(self, col: tuple[int, ...]) -> tuple[slice, ...]:
        """The slices of a row that chunk column ``col`` covers."""
        return tuple(
            slice(i * c, min((i + 1) * c, n))
            for i, c, n in zip(col, self.chunks[1:], self.shape[1:], strict=True)
        )

    def _local(self, col: tuple[int, ...]) -> tuple[slice, ...]:
        """The part of a chunk's row axes inside the dataset (edge chunks are padded)."""
        return tuple(
            slice(0, min(c, n - i * c))
            for i, c, n in zip(col, self.chunks[1:], self.shape[1:], strict=True)
        )


def chunk_reader(f: h5py.File, dset: h5py.Dataset) -> tuple[ChunkReader | None, ReadPath]:
    """A ``ChunkReader`` for ``dset`` when its rows can be read outside h5py, and the path.

    That is the case for a chunked dataset of numbers whose file type is exactly a numpy dtype
    (either byte order), in a plain file opened with the default ``sec2`` driver, with every
    filter decoded by ``loaderkit.hdf5.read.codecs`` (its codec importable), no external storage,
    a defined fill value, and ``H5Dchunk_iter`` (h5py >= 3.8).

    Args:
        f: The open file.
        dset: A chunked dataset of ``f``.

    Returns:
        ``(reader, ReadPath("raw chunks" | "decoded chunks", ...))``, or
        ``(None, ReadPath("h5py", why))``.

    Example:
        >>> import h5py, numpy as np, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "c.h5")
        >>> with h5py.File(path, "w") as f:
        ...     _ = f.create_dataset("x", data=np.arange(12.0).reshape(6, 2), chunks=(4, 2),
        ...                          compression="gzip", shuffle=True)
        >>> with h5py.File(path, "r") as f:
        ...     reader, path_ = chunk_reader(f, f["x"])
        ...     reader.index(f["x"]); out = np.empty((3, 2)); reader.read(3, 3, out)
        >>> path_.kind, out[:, 0].tolist()
        ('decoded chunks', [6.0, 8.0, 10.0])
    """

    def fallback(why: str) -> tuple[None, ReadPath]:
        return None, ReadPath("h5py", why)

    f = dset.file  # the file that holds it (an external link leads to another one)

    if not hasattr(os, "preadv"):
        return fallback("os.preadv is not available on this platform")
    if f.driver != "sec2":
        return fallback(f"the file is opened with the {f.driver!r} driver (only sec2 is read raw)")
    if getattr(dset.id, "chunk_iter", None) is None:
        return fallback("this h5py has no H5Dchunk_iter (h5py >= 3.8 reads chunks raw)")
    try:
        dcpl = dset.id.get_create_plist()
        if dcpl.get_layout() != h5d.CHUNKED:
            return fallback("not chunked")
        if dcpl.get_external_count():
            return fallback("external storage")
        dtype = dset.dtype
        if dtype.kind not in "biufc" or dtype.subdtype is not None or dtype.fields is not None:
            return fallback(f"element type {dtype} is not plain numbers")
        if dset.id.get_type() != h5t.py_create(dtype):
            return fallback(f"the file's element type differs from numpy's {dtype}")
        if dcpl.fill_value_defined() == h5d.FILL_VALUE_UNDEFINED:
            return fallback("no fill value defined")
        fill = np.zeros((), dtype)
        dcpl.get_fill_value(fill)
        filters: list[tuple[int, Decoder]] = []
        names = []
        for j in range(dcpl.get_nfilters()):
            code, _flags, values, _name = dcpl.get_filter(j)
            nbytes = int(np.prod(dset.chunks, dtype=np.int64)) * dtype.itemsize
            decode, why = decoder(int(code), tuple(values), dtype.itemsize, nbytes)
            if decode is None:
                return fallback(why)
            filters.append((int(code), decode))
            names.append(_NAMES.get(int(code), str(code)))
        fd = f.id.get_vfd_handle()
        if not isinstance(fd, int) or fd < 0:
            return fallback("no file descriptor")
        chunks = tuple(int(c) for c in dset.chunks)
        shape = tuple(int(n) for n in dset.shape)
    except Exception as exc:  # any doubt: let HDF5 read it
        logger.debug("no raw chunk reads for %s", f.filename, exc_info=True)
        return fallback(f"the dataset could not be examined ({exc})")
    if not shape or int(np.prod([-(-n // c) for n, c in zip(shape, chunks, strict=True)])) > (
        _MAX_CHUNKS
    ):
        return fallback(f"more than {_MAX_CHUNKS} chunks")
    reader = ChunkReader(fd, shape, chunks, dtype, filters, fill, _chunk_buffer_bytes(dset))
    if filters:
        path = ReadPath(
            "decoded chunks",
            f"chunks {chunks} read with os.pread and decoded ({' + '.join(names)}) in the "
            "reading thread, outside every lock",
        )
    else:
        path = ReadPath("raw chunks", f"uncompressed chunks {chunks} read with os.preadv")
    return reader, path


def _chunk_buffer_bytes(dset: h5py.Dataset) -> int:
    """The size of the dataset's HDF5 chunk buffer (``rdcc_nbytes``: the file's, or its own)."""
    try:
        return int(dset.id.get_access_plist().get_chunk_cache()[1])
    except Exception:  # an h5py without it: only the thread's last chunk is kept
        logger.debug("no chunk buffer size for %s", dset.name, exc_info=True)
        return 0


def choose_path(
    f: h5py.File,
    dset: Any,
    *,
    raw: Any,
    mapped: bool,
    members: bool,
    hooks: bool,
    axis: int,
    kind: str | None,
    swmr: bool,
    options: Mapping[str, Any],
    wide: bool,
) -> tuple[ChunkReader | None, ReadPath]:
    """How one key of an open file is read (and its ``ChunkReader``), from what the reader knows.

    Args:
        f: The open file.
        dset: The key's object in it.
        raw: ``rawio.raw_location`` of it (``None``: not contiguous raw numbers).
        mapped: Its rows are memory-mapped.
        members: The key names a group of per-sample datasets.
        hooks: The subclass reads rows itself (no default reads, or rows of no known type).
        axis: The sample axis.
        kind: What a row holds (``Kind.value``), ``None`` when unknown.
        swmr: Files are opened for SWMR.
        options: The ``h5py.File`` options.
        wide: Rows span many chunks shared with other rows (``loaderkit.hdf5.read.widerows``).

    Returns:
        ``(reader or None, ReadPath)``.
    """
    if raw is not None:
        if mapped:
            return None, ReadPath(
                "memory map", "contiguous numbers read outside h5py, no lock held"
            )
        calls = (
            "one os.preadv per run of rows (a batch's rows in one io_uring call while "
            "threads read at once)"
            if uring.thread_ring() is not None
            else "one os.preadv per run of rows (no io_uring in this process)"
        )
        return None, ReadPath(
            "preadv", f"contiguous numbers read outside h5py, no lock held: {calls}"
        )
    if members:
        why = "a group of per-sample datasets"
    elif hooks:
        why = "rows read by the subclass's own read hooks"
    elif axis:
        why = f"samples lie along axis {axis}"
    elif kind != "number":
        why = f"{kind} rows (HDF5 converts them)"
    elif swmr:
        why = "files opened for SWMR (HDF5 follows the writer)"
    elif not hasattr(os, "preadv") or options.get("driver") not in (None, "sec2"):
        why = f"h5py_options driver {options.get('driver')!r} (only sec2 is read raw)"
    elif wide:
        if dset.id.get_create_plist().get_nfilters():
            why = "rows span many compressed chunks (column blocks read by HDF5)"
        else:
            return None, ReadPath(
                "column chunks", "rows span many uncompressed chunks: read with os.preadv"
            )
    elif dset.chunks is not None:
        return chunk_reader(f, dset)
    else:
        why = _not_raw(dset)
    return None, ReadPath("h5py", why)


def _not_raw(dset: Any) -> str:
    """Why a dataset that is not chunked is not read raw (``raw_location`` declined)."""
    try:
        dcpl = dset.id.get_create_plist()
        layout = dcpl.get_layout()
        if layout == h5d.VIRTUAL:
            return "a virtual dataset (HDF5 maps its sources)"
        if layout == h5d.COMPACT:
            return "compact storage (rows kept in the object header)"
        if dcpl.get_external_count():
            return "external storage"
        if dset.id.get_offset() is None:
            return "no data written yet (fill value)"
    except Exception:  # a damaged or unusual dataset: HDF5 reads it
        return "HDF5 reads it (its storage could not be examined)"
    return "the file's element type differs from the rows' type"


_NAMES = {1: "gzip", 2: "shuffle", 3: "fletcher32", 32001: "blosc", 32004: "lz4", 32015: "zstd"}
