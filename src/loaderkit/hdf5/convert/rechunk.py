"""``rechunk``: copy session files with one dataset stored row by row, verified.

NSD writes its betas from MATLAB with one chunk per voxel (``(750, 1)`` as h5py sees it), so
any one trial reads the whole file. A one-off copy that stores the key's rows whole (rows
contiguous, or chunks of whole rows) makes a trial one read of its own bytes. ``rechunk``
writes, for each source file, a copy with the same name under an output directory:

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
  rows otherwise), so memory stays within ``block_bytes`` plus HDF5's own per-chunk state,
  whatever the file's size (chunked output from a column-chunked source goes through a
  contiguous scratch copy in the output directory, removed afterwards);
* verified after writing: the key's values compared bit for bit with the source, every
  other dataset's values, every object's attributes, block by block;
* written under a temporary name in the output directory and renamed over the final name only
  once verified: a failure never leaves a half-written file under the final name.

It refuses to write over a source (the same file by path, symlink or hard link) and over an
existing file unless ``overwrite=True``. The command line is ``loaderkit rechunk``.
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

__all__ = ["CHUNK_BYTES", "LAYOUTS", "RechunkResult", "choose_layout", "rechunk"]

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

#: Called as ``progress(description, done_bytes, total_bytes)`` after every block.
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class RechunkResult:
    """One file rewritten.

    Attributes:
        source: The file read.
        target: The copy written (same name, in the output directory).
        key: The dataset stored row by row, or the CSR matrix group.
        shape: Its shape (a CSR group's: the matrix's, cells x genes).
        layout: ``"contiguous"`` or ``"chunks (R, ...)"``; for a CSR group
            ``"CSR values contiguous"`` or ``"CSR values chunks (N,)"``.
        nbytes: Bytes of the key's values (a CSR group's ``data`` and ``indices``).
        seconds: Time taken, verification included.

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


def _box_reader(src_file: h5py.File, src: h5py.Dataset) -> Callable[[tuple[slice, ...]], Any]:
    """Reads a box of ``_source_blocks`` from ``src``: raw chunk bytes where possible.

    Unfiltered column chunks (NSD's ``(750, 1)``) are read with ``os.preadv`` in file order
    (``loaderkit.hdf5.read.widerows.read_rows_raw``), several times faster than HDF5's per-chunk
    bookkeeping; the boxes of ``column_blocks`` over such chunks are flat ranges of columns.
    """
    cmap = chunk_map(src_file, src) if src.ndim > 1 else None
    if cmap is None:
        return lambda box: src[box]
    shape = tuple(int(n) for n in src.shape)
    rows = np.arange(shape[0])

    def read(box: tuple[slice, ...]) -> np.ndarray:
        sizes = tuple(b.stop - b.start for b in box[1:])
        lo = int(np.ravel_multi_index(tuple(b.start for b in box[1:]), shape[1:]))
        out = np.empty((shape[0], *sizes), src.dtype)
        read_rows_raw(cmap, rows, out.reshape(shape[0], -1), columns=(lo, lo + out[0].size))
        return out

    return read


def _write(
    src_file: h5py.File,
    src: h5py.Dataset | h5py.Group,
    tmp: Path,
    scratch: Path,
    key: str,
    layout: tuple[str, int],
    block_bytes: int,
    report: Callable[[str, int], None],
    source: Path,
) -> None:
    """Write the copy to ``tmp`` (the key's values streamed in blocks).

    ``layout`` is ``(layout, chunk_bytes)`` as ``rechunk`` takes them.
    """
    path = src.name.lstrip("/")
    userblock = src_file.userblock_size  # e.g. MATLAB v7.3 files: kept, byte for byte
    with h5py.File(tmp, "w", libver=src_file.libver, userblock_size=userblock) as out:
        holder: list[Any] = []
        chunks = _chunks_of(src, *layout)

        def make_key(group: h5py.Group, name: str) -> None:
            if isinstance(src, h5py.Group):
                holder.append(csrcopy.create_csr(src, group, name, *layout))
            else:
                holder.append(create_like(src, group, name, chunks))

        with reading(source, "the objects and attributes"):
            copy_tree(src_file, out, path, make_key)
        (target,) = holder
        if isinstance(src, h5py.Group):
            csrcopy.copy_values(src, target, block_bytes, report, source)
            return
        if src.size == 0:
            return
        reader = _box_reader(src_file, src)

        def read(box: tuple[slice, ...]) -> np.ndarray:
            with reading(source, f"the rows {box} of {key!r}"):
                return reader(box)

        column_chunked = src.chunks is not None and tuple(src.chunks[1:]) != tuple(src.shape[1:])
        if chunks is None or not column_chunked or src.ndim == 1:
            done = 0
            for box in _source_blocks(src, block_bytes):  # every source chunk read once
                data = read(box)
                target[box] = data
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
                staged[box] = data
                done += data.nbytes // 2
                report("writing", done)
            rows = max(1, block_bytes // (_row_bytes(src) * chunks[0])) * chunks[0]
            for block in row_blocks(src.shape[0], rows):
                data = staged[block]
                target[block] = data
                done += data.nbytes - data.nbytes // 2
                report("writing", done)


def _copy_userblock(source: Path, target: Path, size: int) -> None:
    """The source's user block (bytes before the HDF5 data, e.g. a MATLAB header)."""
    if size <= 0:
        return
    with open(source, "rb") as src, open(target, "r+b") as dst:
        dst.write(src.read(size))


def _verify(src_file: h5py.File, out: h5py.File, key: str, block_bytes: int, report: Any) -> None:
    """Raise ``HDF5FileError`` unless ``out`` holds what ``src_file`` holds."""
    problems: list[str] = []
    names: list[str] = []
    src_file.visit(names.append)
    copied: list[str] = []
    out.visit(copied.append)
    if sorted(names) != sorted(copied):
        missing = sorted(set(names) - set(copied))
        extra = sorted(set(copied) - set(names))
        problems.append(f"objects differ (missing {missing[:5]}, extra {extra[:5]})")
    stored = src_file[key]
    key_name = stored.name.lstrip("/")
    if isinstance(stored, h5py.Dataset):
        read_key: Callable[[tuple[slice, ...]], Any] | None = _box_reader(src_file, stored)
        rewritten = {key_name}
    else:  # a CSR group: its values are read through HDF5, as any dataset
        read_key, rewritten = None, {f"{key_name}/{n}" for n in csrcopy.VALUES}
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
            x, y = (read_key(box) if read_key and name == key_name else a[box]), b[box]
            if not same_bits(np.asarray(x), np.asarray(y)):
                problems.append(f"values of {name!r} in {box}")
                break
            if name in rewritten:
                done += np.asarray(x).nbytes
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
    key: str,
    layout: str,
    chunk_bytes: int,
    block_bytes: int,
    progress: Progress | None,
) -> RechunkResult:
    started = time.perf_counter()
    tmp = target.parent / f".{target.name}.rechunk-{os.getpid()}.tmp"
    scratch = target.parent / f".{target.name}.rechunk-{os.getpid()}.scratch"
    try:
        with _open_source(source) as src_file:
            src = _dataset(src_file, key, source)
            with reading(source, f"dataset {key!r}"):
                chunks = _chunks_of(src, layout, chunk_bytes)
                csr = isinstance(src, h5py.Group)
                nbytes = csrcopy.values_nbytes(src) if csr else src.size * src.dtype.itemsize
                shape = _shape_of(src)
            total = max(1, nbytes)

            def report(phase: str, done: int) -> None:
                if progress is not None:
                    progress(f"{source.name}: {phase}", min(done, total), total)

            settings = (layout, chunk_bytes)
            _write(src_file, src, tmp, scratch, key, settings, block_bytes, report, source)
            _remove(scratch)
            _copy_userblock(source, tmp, src_file.userblock_size)
            with h5py.File(tmp, "r") as out, reading(source, "the objects, verifying the copy"):
                _verify(src_file, out, key, block_bytes, report)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, target)  # the final name appears only now, whole and verified
    except BaseException as exc:
        _remove(tmp)
        _remove(scratch)
        if isinstance(exc, Exception):
            add_note(
                exc,
                f"loaderkit rechunk: {source} (key {key!r}) -> {target}: nothing was written "
                "under the final name.",
            )
            if isinstance(exc, HDF5FileError) and str(exc).startswith("verification failed"):
                raise HDF5FileError(
                    f"rechunk: the copy of {source} (key {key!r}) does not hold what the "
                    f"source holds: {exc}. It was removed; {target} was not written."
                ) from exc
        raise
    what = "contiguous" if chunks is None else f"chunks {chunks}"
    what = f"CSR values {what}" if csr else what
    seconds = time.perf_counter() - started
    return RechunkResult(source, target, key, shape, what, int(nbytes), seconds)


def rechunk(
    files: Sequence[str | os.PathLike[str]],
    key: str,
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
            ``data`` and ``indices`` are stored uncompressed.
        out_dir: Where the copies go (created if missing; must not hold a source).
        layout: ``"auto"`` (contiguous, or chunks of whole rows when the source has filters
            or can grow), ``"contiguous"`` or ``"chunked"`` (chunks of whole rows, the
            source's filters kept). A CSR group's values: contiguous, or with ``"chunked"``
            uncompressed chunks of about ``chunk_bytes`` that keep the maximum shape.
        chunk_bytes: Target bytes per chunk for chunked output (at least one whole row).
        block_bytes: Bytes read and written per block (memory bound, besides HDF5's state).
        overwrite: Replace copies that already exist in ``out_dir`` (never a source).
        progress: Called as ``progress(description, done_bytes, total_bytes)`` after every
            block (the command line draws tqdm bars with it).

    Returns:
        One ``RechunkResult`` per file, in order.

    Raises:
        ConfigError: No files, a bad ``layout``, a target that is a source (same path,
            symlink or hard link), two sources with the same name, ``"contiguous"`` for a
            dataset that needs chunks, or a sparse matrix that is not CSR (CSC: named, with
            how to convert).
        FileExistsError: A target exists and ``overwrite`` is false.
        FileNotFoundError: A source does not exist.
        KeyError: A source has no dataset ``key`` (the message lists what it holds).
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
    """
    if layout not in LAYOUTS:
        raise ConfigError(f"rechunk: layout must be one of {LAYOUTS}, got {layout!r}.")
    if chunk_bytes < 1 or block_bytes < 1:
        raise ConfigError(
            f"rechunk: chunk_bytes and block_bytes must be >= 1, got {chunk_bytes} and "
            f"{block_bytes}."
        )
    out = Path(out_dir).expanduser().absolute()
    sources = [Path(f).expanduser().absolute() for f in files]
    pairs = _plan_targets(sources, out, overwrite=overwrite)
    for source, _ in pairs:  # every source readable, with the key, before writing anything
        with _open_source(source) as f:
            dset = _dataset(f, key, source)
            with reading(source, f"dataset {key!r}"):
                _chunks_of(dset, layout, chunk_bytes)
    out.mkdir(parents=True, exist_ok=True)
    return [
        _rechunk_one(source, target, key, layout, chunk_bytes, block_bytes, progress)
        for source, target in pairs
    ]
