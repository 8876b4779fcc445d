"""``rechunk``: copy session files with datasets stored row by row, verified.

NSD writes its betas from MATLAB with one chunk per voxel (``(750, 1)`` as h5py sees it), so
any one trial reads the whole file. A one-off copy that stores the key's rows whole (rows
contiguous, or chunks of whole rows) makes a trial one read of its own bytes. ``rechunk``
writes, for each source file, a copy with the same name under an output directory, with one
or several keys (e.g. ``X`` and ``layers/counts``) stored anew in one pass over the file:

* the key's dataset stored *contiguous* (``layout="auto"`` when the source has no filters and
  a fixed shape: loaderkit then reads rows with one ``os.preadv`` per run, no HDF5 call, and
  a random row reads only its own bytes), or in *chunks of whole rows* of about
  ``chunk_bytes`` (1 MiB; the source's filters kept: compression needs chunks);
* a key that is an ``.h5ad`` CSR matrix group (``X``, ``layers/<name>``, ``raw/X``: public
  files often store them gzip-compressed) with its ``data`` and ``indices`` uncompressed,
  contiguous (``layout="chunked"``: uncompressed chunks), ``indptr`` and its attributes as
  they are, so that anndata reads the same matrix and loaderkit reads rows raw
  (``loaderkit.hdf5.convert.csrcopy``);
* every other object and attribute copied as it is (HDF5's own object copy), links kept as
  links;
* read in blocks of whole source chunks (blocks of columns for column-chunked sources, of
  rows otherwise; chunked output from a column-chunked source goes through a contiguous
  scratch copy in the output directory, removed afterwards);
* verified after writing: the keys' values compared bit for bit with the source, every
  other dataset's values, every object's attributes, block by block;
* in bounded memory, whatever the file's size: writing holds one block, verifying two (the
  source's values of a block and the copy's, read into two buffers reused for every block and
  compared ``COMPARE_BYTES`` (1 MiB) at a time); raw reads of column chunks stage at most
  ``STAGE_BYTES`` (2 MiB) more. A block is at most ``block_bytes``, or one band of whole
  source chunks where that is larger (all rows of one chunk column; the rows of one chunk).
  The peak is ``2 * block_bytes`` plus a fixed 10-20 MiB, whatever the file's size: the
  staging and comparison slices, and HDF5's own state (its metadata cache per open file, its
  chunk buffer of 1 MiB per open dataset, a few KiB per chunk a read touches, at most
  ``BLOCK_CHUNKS`` a block; the object copy of the other datasets runs a chunk at a time).
  Measured on a 96 MB session in chunks of whole rows with 32 MiB blocks: 72 MiB (contiguous
  copy), 83 MiB (chunked). Variable-length values (strings, ragged arrays) are read as h5py's
  object arrays, one block at a time;
* written under a temporary name in the output directory and renamed over the final name only
  once verified: a failure never leaves a half-written file under the final name.

It refuses to write over a source (the same file by path, symlink or hard link) and over an
existing file unless ``overwrite=True``; a key given twice, or one inside another (``X`` and
``X/data``), before anything is read. The command line is ``loaderkit rechunk`` (``--key``
once per key).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from loaderkit.errors import ConfigError, HDF5FileError, MissingKeyError, add_note
from loaderkit.hdf5.convert import csrcopy
from loaderkit.hdf5.convert.h5copy import (
    COMPARE_BYTES,
    copy_tree,
    create_like,
    reading,
    row_blocks,
    same_attrs,
    same_bits,
)
from loaderkit.hdf5.meta.columnblocks import column_blocks
from loaderkit.hdf5.meta.diagnose import hdf5_message, repair_advice
from loaderkit.hdf5.meta.layout import dataset_names
from loaderkit.hdf5.read.rawio import chunk_map
from loaderkit.hdf5.read.widerows import BLOCK_CHUNKS, read_rows_raw

__all__ = [
    "CHUNK_BYTES",
    "COMPARE_BYTES",
    "LAYOUTS",
    "STAGE_BYTES",
    "RechunkResult",
    "choose_layout",
    "rechunk",
]

logger = logging.getLogger(__name__)

try:  # the filters of the files being copied, in this process too
    import hdf5plugin  # noqa: F401
except ImportError:  # pragma: no cover - depends on the environment
    logger.debug("hdf5plugin is not installed: only HDF5's built-in filters are available")

#: ``layout=`` values: ``"auto"`` (contiguous unless the source has filters or can grow),
#: ``"contiguous"`` or ``"chunked"`` (chunks of whole rows).
LAYOUTS = ("auto", "contiguous", "chunked")
#: Bytes per chunk of whole rows (at least one row per chunk).
CHUNK_BYTES = 1 << 20
#: Bytes read or written per block.
BLOCK_BYTES = 64 << 20
#: Most bytes raw reads of unfiltered column chunks stage beside a block.
STAGE_BYTES = 2 << 20

#: Called as ``progress(description, done_bytes, total_bytes)`` after every block.
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class RechunkResult:
    """One key of one file rewritten (``rechunk`` returns one per file and key).

    Attributes:
        source: The file read.
        target: The copy written (same name, in the output directory).
        key: The dataset stored row by row, or the CSR matrix group (without a leading
            ``/``).
        shape: Its shape (a CSR group's: the matrix's, cells x genes).
        layout: ``"contiguous"`` or ``"chunks (R, ...)"``; for a CSR group
            ``"CSR values contiguous"`` or ``"CSR values chunks (N,)"``.
        nbytes: Bytes of the key's values (a CSR group's ``data`` and ``indices``).
        seconds: Time the file's copy took, verification included (the same for every key
            of the file: they are written in one copy).

    Example:
        >>> RechunkResult(Path("a.h5"), Path("out/a.h5"), "betas", (750, 10), "contiguous",
        ...               15000, 0.1).layout
        'contiguous'
    """

    source: Path
    target: Path
    key: str
    shape: tuple[int, ...]
    layout: str
    nbytes: int
    seconds: float


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _plan_targets(
    sources: Sequence[Path], out_dir: Path, *, overwrite: bool
) -> list[tuple[Path, Path]]:
    """Each source with its target; refuse writing over a source or an existing file."""
    if not sources:
        raise ConfigError("rechunk: no files given; pass the session files to rewrite.")
    stats = {}
    for source in sources:
        try:
            stats[source] = os.stat(source)
        except FileNotFoundError:
            raise FileNotFoundError(f"rechunk: {source} does not exist; check the path.") from None
    names: dict[str, Path] = {}
    pairs = []
    for source in sources:
        other = names.setdefault(source.name, source)
        if other != source:
            raise ConfigError(
                f"rechunk: {other} and {source} have the same name {source.name!r}, so both "
                f"copies would be {out_dir / source.name}. Rewrite them into separate --out "
                "directories."
            )
        target = out_dir / source.name
        try:
            existing = os.stat(target)
        except FileNotFoundError:
            existing = None
        if existing is not None:
            same = [s for s, st in stats.items() if _same_file(st, existing)]
            if same:
                raise ConfigError(
                    f"rechunk: refusing to write over a source: {target} is {same[0]} (the "
                    "same file: same path, a symlink or a hard link). Pass another --out "
                    "directory."
                )
            if not overwrite:
                raise FileExistsError(
                    f"rechunk: {target} already exists (not one of the sources); remove it or "
                    "pass overwrite=True (--overwrite) to replace it."
                )
        pairs.append((source, target))
    return pairs


def _open_source(source: Path) -> h5py.File:
    """``source`` opened for reading, or an ``HDF5FileError`` naming it and what to do."""
    try:
        return h5py.File(source, "r")
    except OSError as exc:
        if isinstance(exc, FileNotFoundError | PermissionError):
            raise
        raise HDF5FileError(
            f"rechunk: cannot open {source} as HDF5 ({hdf5_message(exc)}). "
            f"{repair_advice(str(source))}."
        ) from exc


def _dataset(f: h5py.File, key: str, path: Path) -> h5py.Dataset | h5py.Group:
    with reading(path, f"dataset {key!r}"):
        return _lookup(f, key, path)


def _lookup(f: h5py.File, key: str, path: Path) -> h5py.Dataset | h5py.Group:
    """The dataset ``key`` of ``path``, or its CSR matrix group (checked); else a named error."""
    parts = key.split("/")
    for depth in range(1, len(parts)):  # a key reached through a link is not copied anew
        above = "/".join(parts[:depth])
        if isinstance(f.get(above, getlink=True), (h5py.SoftLink, h5py.ExternalLink)):
            raise ConfigError(
                f"rechunk: {key!r} in {path} lies under {above!r}, a link; pass the path "
                "of the dataset's own group as --key (the link is copied as it is)."
            )
    link = f.get(key, getlink=True)
    if isinstance(link, (h5py.SoftLink, h5py.ExternalLink)):
        raise ConfigError(
            f"rechunk: {key!r} in {path} is a link ({link!r}); pass the dataset's own path "
            "as --key (the link is copied as it is)."
        )
    obj = f.get(key)
    if isinstance(obj, h5py.Group) and csrcopy.check_source(obj, key, path) is not None:
        return obj
    if not isinstance(obj, h5py.Dataset):
        what = "a group" if obj is not None else "missing"
        raise MissingKeyError(
            f"rechunk: {path} has no dataset {key!r} ({what}); datasets present: "
            f"{dataset_names(f)}. Pass the right --key: a dataset, or a CSR matrix group "
            "(X, layers/<name>, raw/X)."
        )
    if obj.ndim < 1 or obj.shape is None:
        raise ConfigError(
            f"rechunk: {key!r} in {path} is scalar (shape {obj.shape}): its first axis must "
            "index rows."
        )
    return obj


def _chunks_of(
    obj: h5py.Dataset | h5py.Group, layout: str, chunk_bytes: int
) -> tuple[int, ...] | None:
    """``choose_layout`` for a dataset; a CSR group's ``data`` chunks (``None``: contiguous)."""
    if isinstance(obj, h5py.Group):
        return csrcopy.value_chunks(obj["data"], layout, chunk_bytes)
    return choose_layout(obj, layout, chunk_bytes)


def _shape_of(obj: h5py.Dataset | h5py.Group) -> tuple[int, ...]:
    """A dataset's shape; a CSR group's matrix shape (cells, genes)."""
    if isinstance(obj, h5py.Dataset):
        return tuple(int(n) for n in obj.shape)
    shape = obj.attrs["shape"] if "shape" in obj.attrs else obj.attrs["h5sparse_shape"]
    return tuple(int(n) for n in np.asarray(shape).ravel())


def _nbytes(obj: h5py.Dataset | h5py.Group) -> int:
    """Bytes of the values stored anew (a CSR group's ``data`` and ``indices``)."""
    if isinstance(obj, h5py.Group):
        return csrcopy.values_nbytes(obj)
    return int(obj.size or 0) * obj.dtype.itemsize


def _keys(key: str | Sequence[str]) -> list[str]:
    """The keys without leading ``/``; ``ConfigError`` for none, a repeat or one inside another."""
    given = [key] if isinstance(key, str) else list(key)
    if not given:
        raise ConfigError(
            "rechunk: no key given; pass the dataset or CSR group to rewrite (key='X', "
            "--key X), or several (['X', 'layers/counts'], --key X --key layers/counts)."
        )
    keys: list[str] = []
    for item in given:
        name = item.strip("/") if isinstance(item, str) else ""
        if not name:
            raise ConfigError(
                f"rechunk: key {item!r} is not a path to a dataset or group (e.g. 'X')."
            )
        if name in keys:
            raise ConfigError(
                f"rechunk: key {name!r} is given twice ({given}); pass each key once."
            )
        for other in keys:
            inner, outer = (name, other) if name.startswith(other + "/") else (other, name)
            if inner.startswith(outer + "/"):
                raise ConfigError(
                    f"rechunk: key {inner!r} is inside {outer!r} (both given: {given}); pass "
                    f"only {outer!r} (a CSR group's values are rewritten with it)."
                )
        keys.append(name)
    return keys


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
    (``loaderkit.hdf5.read.widerows.read_rows_raw``, staging at most ``STAGE_BYTES``),
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


def _write(
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
                made[path] = create_like(src, group, name, _chunks_of(src, *layout))

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
            done += _nbytes(src)


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
    _remove(scratch)


def _copy_userblock(source: Path, target: Path, size: int) -> None:
    """The source's user block (bytes before the HDF5 data, e.g. a MATLAB header)."""
    if size <= 0:
        return
    with open(source, "rb") as src, open(target, "r+b") as dst:
        dst.write(src.read(size))


def _verify(
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


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        return
    except OSError:  # pragma: no cover - reported by the caller's own error
        logger.warning("could not remove %s", path, exc_info=True)


def _rechunk_one(
    source: Path,
    target: Path,
    keys: list[str],
    layout: str,
    chunk_bytes: int,
    block_bytes: int,
    progress: Progress | None,
) -> list[RechunkResult]:
    started = time.perf_counter()
    tmp = target.parent / f".{target.name}.rechunk-{os.getpid()}.tmp"
    scratch = target.parent / f".{target.name}.rechunk-{os.getpid()}.scratch"
    what = ", ".join(map(repr, keys))
    try:
        with _open_source(source) as src_file:
            objs = {key: _dataset(src_file, key, source) for key in keys}
            with reading(source, f"dataset {what}"):
                found = {
                    key: (_chunks_of(obj, layout, chunk_bytes), _shape_of(obj), _nbytes(obj))
                    for key, obj in objs.items()
                }
            total = max(1, sum(nbytes for _, _, nbytes in found.values()))

            def report(phase: str, done: int) -> None:
                if progress is not None:
                    progress(f"{source.name}: {phase}", min(done, total), total)

            settings = (layout, chunk_bytes)
            _write(src_file, objs, tmp, scratch, settings, block_bytes, report, source)
            _copy_userblock(source, tmp, src_file.userblock_size)
            with h5py.File(tmp, "r") as out, reading(source, "the objects, verifying the copy"):
                _verify(src_file, out, keys, block_bytes, report)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, target)  # the final name appears only now, whole and verified
    except BaseException as exc:
        _remove(tmp)
        _remove(scratch)
        if isinstance(exc, Exception):
            add_note(
                exc,
                f"loaderkit rechunk: {source} (key {what}) -> {target}: nothing was written "
                "under the final name.",
            )
            if isinstance(exc, HDF5FileError) and str(exc).startswith("verification failed"):
                raise HDF5FileError(
                    f"rechunk: the copy of {source} (key {what}) does not hold what the "
                    f"source holds: {exc}. It was removed; {target} was not written."
                ) from exc
        raise
    seconds = time.perf_counter() - started
    results = []
    for key, (chunks, shape, nbytes) in found.items():
        laid = "contiguous" if chunks is None else f"chunks {chunks}"
        laid = f"CSR values {laid}" if isinstance(objs[key], h5py.Group) else laid
        results.append(RechunkResult(source, target, key, shape, laid, int(nbytes), seconds))
    return results


def rechunk(
    files: Sequence[str | os.PathLike[str]],
    key: str | Sequence[str],
    out_dir: str | os.PathLike[str],
    *,
    layout: str = "auto",
    chunk_bytes: int = CHUNK_BYTES,
    block_bytes: int = BLOCK_BYTES,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> list[RechunkResult]:
    """Copy each file into ``out_dir`` (same name) with ``key`` stored row by row, verified.

    Args:
        files: The session files to rewrite (any number; never written to).
        key: The dataset to store row by row (a path inside the files, e.g. ``"betas"``), or
            an ``.h5ad`` CSR matrix group (``"X"``, ``"layers/counts"``, ``"raw/X"``) whose
            ``data`` and ``indices`` are stored uncompressed; or a sequence of such keys,
            all rewritten in one copy of each file (one pass over it). A key given twice,
            or one inside another (``"X"`` and ``"X/data"``), is refused.
        out_dir: Where the copies go (created if missing; must not hold a source).
        layout: ``"auto"`` (contiguous, or chunks of whole rows when the source has filters
            or can grow), ``"contiguous"`` or ``"chunked"`` (chunks of whole rows, the
            source's filters kept). A CSR group's values: contiguous, or with ``"chunked"``
            uncompressed chunks of about ``chunk_bytes`` that keep the maximum shape.
        chunk_bytes: Target bytes per chunk for chunked output (at least one whole row).
        block_bytes: Bytes read and written per block (at least one band of whole source
            chunks). The peak memory is twice this (verification compares two blocks) plus
            a fixed 10-20 MiB (HDF5's caches, ``STAGE_BYTES``, ``COMPARE_BYTES``).
        overwrite: Replace copies that already exist in ``out_dir`` (never a source).
        progress: Called as ``progress(description, done_bytes, total_bytes)`` after every
            block (the command line draws tqdm bars with it).

    Returns:
        One ``RechunkResult`` per file and key: files in order, each file's keys in the
        order given (a single key: one per file).

    Raises:
        ConfigError: No files, no key, a key given twice or inside another, a key under a
            link, a bad ``layout``, a target that is a source (same path,
            symlink or hard link), two sources with the same name, ``"contiguous"`` for a
            dataset that needs chunks, or a sparse matrix that is not CSR (CSC: named, with
            how to convert).
        FileExistsError: A target exists and ``overwrite`` is false.
        FileNotFoundError: A source does not exist.
        KeyError: A source has no dataset ``key`` (the message names the key and lists what
            the file holds), checked for every file and key before anything is written.
        HDF5FileError: A source cannot be read (a damaged CSR group's first bad row named),
            or the copy does not verify (it is removed).

    Example:
        >>> import h5py, numpy as np, tempfile, os
        >>> root = tempfile.mkdtemp()
        >>> src = os.path.join(root, "betas_session01.hdf5")
        >>> with h5py.File(src, "w") as f:
        ...     _ = f.create_dataset("betas", data=np.arange(60, dtype="i2").reshape(6, 10),
        ...                          chunks=(6, 1))
        >>> [result] = rechunk([src], "betas", os.path.join(root, "rows"))
        >>> result.layout, result.target.name
        ('contiguous', 'betas_session01.hdf5')
        >>> with h5py.File(result.target) as f:
        ...     betas = f["betas"]
        ...     betas.chunks is None, int(betas[5, 9])
        (True, 59)
        >>> with h5py.File(src, "a") as f:
        ...     _ = f.create_dataset("masks", data=np.ones((6, 8), "u1"), chunks=(6, 1))
        >>> both = rechunk([src], ["betas", "masks"], os.path.join(root, "both"))
        >>> [(r.key, r.layout) for r in both], both[0].target == both[1].target
        ([('betas', 'contiguous'), ('masks', 'contiguous')], True)
    """
    if layout not in LAYOUTS:
        raise ConfigError(f"rechunk: layout must be one of {LAYOUTS}, got {layout!r}.")
    if chunk_bytes < 1 or block_bytes < 1:
        raise ConfigError(
            f"rechunk: chunk_bytes and block_bytes must be >= 1, got {chunk_bytes} and "
            f"{block_bytes}."
        )
    keys = _keys(key)
    out = Path(out_dir).expanduser().absolute()
    sources = [Path(f).expanduser().absolute() for f in files]
    pairs = _plan_targets(sources, out, overwrite=overwrite)
    for source, _ in pairs:  # every source readable, with every key, before writing anything
        with _open_source(source) as f:
            for name in keys:
                dset = _dataset(f, name, source)
                with reading(source, f"dataset {name!r}"):
                    _chunks_of(dset, layout, chunk_bytes)
    out.mkdir(parents=True, exist_ok=True)
    return [
        result
        for source, target in pairs
        for result in _rechunk_one(source, target, keys, layout, chunk_bytes, block_bytes, progress)
    ]
