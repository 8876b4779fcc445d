"""Writing and checking a ``rechunk`` copy: objects copied, keys' values in bounded blocks.

``write_copy`` writes one file's copy: every object and attribute copied as stored
(``h5copy.copy_tree``), then each key's values block by block in one reused buffer (whole
source chunks, or blocks of columns for column-chunked sources staged through a contiguous
scratch copy); a CSR group's values through ``csrcopy``. ``verify_copy`` compares the copy
with its source in the same blocks, two reused buffers ``COMPARE_BYTES`` at a time.
``choose_layout`` decides a key's new chunks. ``rechunk`` (``convert.rechunk``) plans the
targets, names what fails and renames a verified copy into place.

Example:
    >>> choose_layout.__name__, write_copy.__name__, verify_copy.__name__
    ('choose_layout', 'write_copy', 'verify_copy')
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from loaderkit.errors import ConfigError, HDF5FileError
from loaderkit.hdf5.convert import csrcopy
from loaderkit.hdf5.convert.h5copy import (
    copy_tree,
    create_like,
    reading,
    row_blocks,
    same_attrs,
    same_bits,
)
from loaderkit.hdf5.meta.columnblocks import column_blocks
from loaderkit.hdf5.read.rawio import chunk_map
from loaderkit.hdf5.read.widerows import BLOCK_CHUNKS, read_rows_raw

__all__ = [
    "STAGE_BYTES",
    "choose_layout",
    "chunks_of",
    "nbytes_of",
    "remove_quietly",
    "verify_copy",
    "write_copy",
]

logger = logging.getLogger(__name__)

#: Most bytes of one piece raw reads of unfiltered column chunks stage beside a block (two
#: pieces are staged at once: one read while the other is copied out).
STAGE_BYTES = 2 << 20


def chunks_of(
    obj: h5py.Dataset | h5py.Group, layout: str, chunk_bytes: int
) -> tuple[int, ...] | None:
    """``choose_layout`` for a dataset; a CSR group's ``data`` chunks (``None``: contiguous)."""
    if isinstance(obj, h5py.Group):
        return csrcopy.value_chunks(obj["data"], layout, chunk_bytes)
    return choose_layout(obj, layout, chunk_bytes)


def nbytes_of(obj: h5py.Dataset | h5py.Group) -> int:
    """Bytes of the values stored anew (a CSR group's ``data`` and ``indices``)."""
    if isinstance(obj, h5py.Group):
        return csrcopy.values_nbytes(obj)
    return int(obj.size or 0) * obj.dtype.itemsize


class _Buffers:
    """Reusable buffers for blocks: each grown to the largest block it has held, never more.

    Example:
        >>> bufs = _Buffers(2)
        >>> bufs.view(0, (2, 3), np.dtype("f4")).shape, bufs.view(1, (4,), np.dtype("i2")).nbytes
        ((2, 3), 8)
    """

    def __init__(self, count: int) -> None:
        self._bufs = [np.empty(0, np.uint8) for _ in range(count)]

    def view(self, index: int, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        """Buffer ``index`` as a C-contiguous array of ``shape`` and ``dtype``."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if self._bufs[index].nbytes < nbytes:
            self._bufs[index] = np.empty(0, np.uint8)  # the old one freed before the new
            self._bufs[index] = np.empty(nbytes, np.uint8)
        return self._bufs[index][:nbytes].view(dtype).reshape(shape)


RawReader = Callable[[tuple[slice, ...], np.ndarray], None]


def _read_box(
    dset: h5py.Dataset,
    box: tuple[slice, ...],
    buffers: _Buffers,
    index: int,
    raw: RawReader | None = None,
) -> np.ndarray:
    """The values of ``box`` in buffer ``index`` (variable-length values: h5py's own array)."""
    if dset.dtype.hasobject:
        return np.asarray(dset[box])
    out = buffers.view(index, tuple(b.stop - b.start for b in box), dset.dtype)
    if raw is not None:
        raw(box, out)
    else:
        dset.read_direct(out, source_sel=box)
    return out


def _put(dset: h5py.Dataset, box: tuple[slice, ...], data: np.ndarray) -> None:
    if data.dtype.hasobject:
        dset[box] = data
    else:
        dset.write_direct(data, dest_sel=box)


def _row_bytes(dset: h5py.Dataset) -> int:
    return max(1, int(np.prod(dset.shape[1:], dtype=np.int64)) * dset.dtype.itemsize)


def choose_layout(dset: h5py.Dataset, layout: str, chunk_bytes: int) -> tuple[int, ...] | None:
    """The chunk shape a copy of ``dset`` gets for ``layout`` (``None``: contiguous).

    ``ConfigError`` for ``"contiguous"`` where the source has filters or can grow. Example:
        >>> f = h5py.File("x.h5", "w", driver="core", backing_store=False)
        >>> choose_layout(f.create_dataset("x", (10, 4), "f4", maxshape=(None, 4)), "auto", 32)
        (2, 4)
    """
    filtered = dset.id.get_create_plist().get_nfilters() > 0
    growable = dset.maxshape != dset.shape
    if layout == "contiguous" and (filtered or growable):
        why = "has filters (compression)" if filtered else f"can grow (maxshape {dset.maxshape})"
        raise ConfigError(
            f"rechunk: layout='contiguous' but {dset.name!r} in {dset.file.filename} {why}, "
            "which needs chunks. Use layout='chunked' (or 'auto')."
        )
    if layout == "contiguous" or (layout == "auto" and not filtered and not growable):
        return None
    rows = max(1, min(dset.shape[0] or 1, chunk_bytes // _row_bytes(dset)))
    return (rows, *(max(1, n) for n in dset.shape[1:]))


def _source_blocks(dset: h5py.Dataset, block_bytes: int) -> Iterator[tuple[slice, ...]]:
    """Selections covering ``dset`` so that every source chunk is read once, within a budget.

    Rows of whole chunks when a chunk spans whole rows (or the data is contiguous); boxes of
    whole chunks with every row (blocks of columns) otherwise.
    """
    shape = tuple(int(n) for n in dset.shape)
    rest = tuple(slice(0, n) for n in shape[1:])
    chunks = dset.chunks
    if chunks is None or tuple(chunks[1:]) == shape[1:] or len(shape) == 1:
        unit = chunks[0] if chunks is not None else 1
        per_block = max(1, block_bytes // (_row_bytes(dset) * unit)) * unit
        for rows in row_blocks(shape[0], per_block):
            yield (rows, *rest)
        return
    yield from column_blocks(
        shape, tuple(chunks), dset.dtype.itemsize, max_bytes=block_bytes, max_chunks=BLOCK_CHUNKS
    )


def _box_reader(src_file: h5py.File, src: h5py.Dataset) -> RawReader | None:
    """Reads a box of ``_source_blocks`` from ``src``'s raw chunk bytes, where it can.

    Unfiltered column chunks (NSD's ``(750, 1)``) are read with ``os.preadv`` in file order
    (``loaderkit.hdf5.read.widerows.read_rows_raw``, staging two pieces of ``STAGE_BYTES``),
    several times faster than HDF5's per-chunk bookkeeping; the boxes of ``column_blocks``
    over such chunks are flat ranges of columns. ``None``: HDF5 reads the boxes.
    """
    cmap = chunk_map(src_file, src) if src.ndim > 1 else None
    if cmap is None:
        return None
    row_shape = tuple(int(n) for n in src.shape[1:])

    def read(box: tuple[slice, ...], out: np.ndarray) -> None:
        lo = int(np.ravel_multi_index(tuple(b.start for b in box[1:]), row_shape))
        rows = np.arange(box[0].start, box[0].stop)
        width = int(np.prod(out.shape[1:], dtype=np.int64))
        flat = out.reshape(rows.shape[0], width)
        read_rows_raw(cmap, rows, flat, columns=(lo, lo + width), stage_bytes=STAGE_BYTES)

    return read


def write_copy(
    src_file: h5py.File,
    keys: dict[str, h5py.Dataset | h5py.Group],
    tmp: Path,
    scratch: Path,
    layout: tuple[str, int],
    block_bytes: int,
    report: Callable[[str, int], None],
    source: Path,
) -> None:
    """Write the copy to ``tmp``: the objects copied, then each key's values in blocks.

    ``layout`` is ``(layout, chunk_bytes)`` as ``rechunk`` takes them.
    """
    userblock = src_file.userblock_size  # e.g. MATLAB v7.3 files: kept, byte for byte
    with h5py.File(tmp, "w", libver=src_file.libver, userblock_size=userblock) as out:
        made: dict[str, h5py.Dataset | h5py.Group] = {}

        def make_key(group: h5py.Group, name: str) -> None:
            path = f"{group.name.rstrip('/')}/{name}".lstrip("/")
            src = keys[path]
            if isinstance(src, h5py.Group):
                made[path] = csrcopy.create_csr(src, group, name, *layout)
            else:
                made[path] = create_like(src, group, name, chunks_of(src, *layout))

        with reading(source, "the objects and attributes"):
            copy_tree(src_file, out, list(keys), make_key)
        buffer = _Buffers(1)  # one block at a time, every key
        done = 0
        for path, src in keys.items():

            def step(phase: str, n: int, before: int = done) -> None:
                report(phase, before + n)

            target = made[path]
            if isinstance(src, h5py.Group):
                csrcopy.copy_values(src, target, block_bytes, step, source)
            else:
                _write_dataset(src_file, src, target, scratch, block_bytes, step, source, buffer)
            done += nbytes_of(src)


def _write_dataset(
    src_file: h5py.File,
    src: h5py.Dataset,
    target: h5py.Dataset,
    scratch: Path,
    block_bytes: int,
    report: Callable[[str, int], None],
    source: Path,
    buffer: _Buffers,
) -> None:
    """``src``'s values into ``target`` (created), one block at a time in one buffer."""
    if src.size == 0:
        return
    raw = _box_reader(src_file, src)
    key = src.name.lstrip("/")

    def read(box: tuple[slice, ...]) -> np.ndarray:
        with reading(source, f"the rows {box} of {key!r}"):
            return _read_box(src, box, buffer, 0, raw)

    chunks = target.chunks
    column_chunked = src.chunks is not None and tuple(src.chunks[1:]) != tuple(src.shape[1:])
    if chunks is None or not column_chunked or src.ndim == 1:
        done = 0
        for box in _source_blocks(src, block_bytes):  # every source chunk read once
            data = read(box)
            _put(target, box, data)
            done += data.nbytes
            report("writing", done)
        return
    # chunked output from column chunks: blocks of columns into a contiguous scratch
    # copy, then blocks of whole target chunks (each written once, whole)
    with h5py.File(scratch, "w") as side:
        staged = side.create_dataset("x", shape=src.shape, dtype=src.dtype)
        done = 0
        for box in _source_blocks(src, block_bytes):
            data = read(box)
            _put(staged, box, data)
            done += data.nbytes // 2
            report("writing", done)
        rows = max(1, block_bytes // (_row_bytes(src) * chunks[0])) * chunks[0]
        rest = tuple(slice(0, int(n)) for n in src.shape[1:])
        for block in row_blocks(src.shape[0], rows):
            data = _read_box(staged, (block, *rest), buffer, 0)
            _put(target, (block, *rest), data)
            done += data.nbytes - data.nbytes // 2
            report("writing", done)
    remove_quietly(scratch)


def verify_copy(
    src_file: h5py.File,
    out: h5py.File,
    keys: str | Sequence[str],
    block_bytes: int,
    report: Callable[[str, int], None],
) -> None:
    """Raise ``HDF5FileError`` unless ``out`` holds what ``src_file`` holds.

    Every dataset is compared block by block: the source's block and the copy's read into two
    buffers reused throughout, compared ``COMPARE_BYTES`` at a time.
    """
    problems: list[str] = []
    names: list[str] = []
    src_file.visit(names.append)
    copied: list[str] = []
    out.visit(copied.append)
    if sorted(names) != sorted(copied):
        missing = sorted(set(names) - set(copied))
        extra = sorted(set(copied) - set(names))
        problems.append(f"objects differ (missing {missing[:5]}, extra {extra[:5]})")
    raw: dict[str, RawReader | None] = {}
    rewritten: set[str] = set()
    for key in [keys] if isinstance(keys, str) else keys:
        stored = src_file[key]
        key_name = stored.name.lstrip("/")
        if isinstance(stored, h5py.Dataset):
            raw[key_name] = _box_reader(src_file, stored)
            rewritten.add(key_name)
        else:  # a CSR group: its values are read through HDF5, as any dataset
            rewritten |= {f"{key_name}/{n}" for n in csrcopy.VALUES}
    buffers = _Buffers(2)
    done = 0
    for name in [""] + [n for n in names if n in out]:
        a, b = (src_file, out) if not name else (src_file[name], out[name])
        if not same_attrs(a, b):
            problems.append(f"attributes of {name or '/'!r}")
        if not isinstance(a, h5py.Dataset):
            continue
        if not isinstance(b, h5py.Dataset) or a.shape != b.shape or a.dtype != b.dtype:
            problems.append(f"{name!r} is not the same dataset (shape/type)")
            continue
        if a.shape is None or a.size == 0:
            continue
        if a.ndim == 0:  # a scalar (anndata's uns values, strings)
            if not same_bits(np.asarray(a[()]), np.asarray(b[()])):
                problems.append(f"values of {name!r}")
            continue
        for box in _source_blocks(a, block_bytes):
            x = _read_box(a, box, buffers, 0, raw.get(name))
            y = _read_box(b, box, buffers, 1)
            if not same_bits(x, y):
                problems.append(f"values of {name!r} in {box}")
                break
            if name in rewritten:
                done += x.nbytes
                report("verifying", done)
    if problems:
        raise HDF5FileError(
            f"verification failed: {'; '.join(problems[:5])}"
            + (f" (+{len(problems) - 5} more)" if len(problems) > 5 else "")
        )


def remove_quietly(path: Path) -> None:
    """Remove ``path`` if it exists; a failure is logged (the caller reports its own error)."""
    try:
        path.unlink()
    except FileNotFoundError:
        return
    except OSError:  # pragma: no cover - reported by the caller's own error
        logger.warning("could not remove %s", path, exc_info=True)
