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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from loaderkit.errors import ConfigError, HDF5FileError, MissingKeyError, add_note
from loaderkit.hdf5.convert import csrcopy
from loaderkit.hdf5.convert.blockcopy import (
    STAGE_BYTES,
    choose_layout,
    chunks_of,
    nbytes_of,
    remove_quietly,
    verify_copy,
    write_copy,
)
from loaderkit.hdf5.convert.h5copy import (
    COMPARE_BYTES,
    reading,
)
from loaderkit.hdf5.meta.diagnose import hdf5_message, repair_advice
from loaderkit.hdf5.meta.layout import dataset_names

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


def _shape_of(obj: h5py.Dataset | h5py.Group) -> tuple[int, ...]:
    """A dataset's shape; a CSR group's matrix shape (cells, genes)."""
    if isinstance(obj, h5py.Dataset):
        return tuple(int(n) for n in obj.shape)
    shape = obj.attrs["shape"] if "shape" in obj.attrs else obj.attrs["h5sparse_shape"]
    return tuple(int(n) for n in np.asarray(shape).ravel())


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


def _copy_userblock(source: Path, target: Path, size: int) -> None:
    """The source's user block (bytes before the HDF5 data, e.g. a MATLAB header)."""
    if size <= 0:
        return
    with open(source, "rb") as src, open(target, "r+b") as dst:
        dst.write(src.read(size))


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
                    key: (chunks_of(obj, layout, chunk_bytes), _shape_of(obj), nbytes_of(obj))
                    for key, obj in objs.items()
                }
            total = max(1, sum(nbytes for _, _, nbytes in found.values()))

            def report(phase: str, done: int) -> None:
                if progress is not None:
                    progress(f"{source.name}: {phase}", min(done, total), total)

            settings = (layout, chunk_bytes)
            write_copy(src_file, objs, tmp, scratch, settings, block_bytes, report, source)
            _copy_userblock(source, tmp, src_file.userblock_size)
            with h5py.File(tmp, "r") as out, reading(source, "the objects, verifying the copy"):
                verify_copy(src_file, out, keys, block_bytes, report)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, target)  # the final name appears only now, whole and verified
    except BaseException as exc:
        remove_quietly(tmp)
        remove_quietly(scratch)
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
                    chunks_of(dset, layout, chunk_bytes)
    out.mkdir(parents=True, exist_ok=True)
    return [
        result
        for source, target in pairs
        for result in _rechunk_one(source, target, keys, layout, chunk_bytes, block_bytes, progress)
    ]
