"""``HDF5SessionDataset``: one map-style dataset over many per-session HDF5 files.

The index (dataset index -> session, row) is built once, in the process that constructs the
dataset, from the files' shapes, and kept as two numpy arrays (run-length encoded when pickled,
so a million samples ship in a few kilobytes to spawn workers). Files are opened lazily, read-only,
in the process that reads, through a bounded per-process LRU (``loaderkit.hdf5.handles``).

Batched reads (``__getitems__``, called by torch's fetcher with a whole batch of indices) group
the batch by session, coalesce runs of consecutive rows into one slab read each, and hand back
per-sample views of one batch buffer in request order.
"""

from __future__ import annotations

import logging
import operator
import os
import sys
from collections.abc import Hashable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, cast

import h5py
import numpy as np
from h5py import h5d, h5s, h5t
from torch.utils.data import Dataset

from loaderkit.errors import ConfigError, HDF5FileError, PerformanceHint, warn
from loaderkit.hdf5.handles import CacheInfo, Handle, HandleCache

try:  # Registers blosc/lz4/zstd/bitshuffle filters in every process that reads (rule 17).
    import hdf5plugin
except ImportError:  # pragma: no cover - depends on the environment
    hdf5plugin = None

__all__ = [
    "HDF5FileError",
    "HDF5SessionDataset",
    "SampleIndex",
    "SessionLayout",
    "default_chunk_cache",
]

logger = logging.getLogger(__name__)

#: The index is one int64 array: session position in the high bits, row in the low bits.
_ROW_BITS = 36
_ROW_LIMIT = 1 << _ROW_BITS
_ROW_MASK = _ROW_LIMIT - 1

_FAST = 0  # default read(): coalesced slab reads
_ROWS = 1  # subclass overrides read_rows(): coalesced runs through the hook
_ITEM = 2  # subclass overrides read() only: one read() call per item

#: Slabs at least this large are read straight into the batch buffer (``H5Dread`` into the
#: destination); smaller ones go through h5py's Cython fast path and one copy, which has less
#: per-call overhead. Measured with ``benchmarks/hdf5_read.py`` (see docs/hdf5.md).
_DIRECT_READ_BYTES = 256 * 1024

#: Rows at least this large are read into one buffer per run instead of one per batch (see
#: ``_read_runs``).
_RUN_BUFFER_BYTES = 256 * 1024

#: Chunk cache used for chunked datasets: room for this many chunks, within the bounds below.
_CACHE_CHUNKS = 8
_CACHE_MIN_BYTES = 8 << 20  # HDF5 2.0's own default: never less cache than plain h5py
_CACHE_ONE_ROW_BYTES = 1 << 20
_CACHE_MAX_BYTES = 64 << 20


class SampleIndex(NamedTuple):
    """What ``HDF5SessionDataset.build_index`` may return: two equal-length 1-D arrays.

    Attributes:
        sessions: Session id of every sample (ids as in ``dataset.files``).
        rows: Row of every sample inside its session's file.

    Example:
        >>> import numpy as np
        >>> SampleIndex(np.array([0, 0, 1]), np.array([0, 1, 0])).rows.tolist()
        [0, 1, 0]
    """

    sessions: Any
    rows: Any


class SessionLayout(NamedTuple):
    """Shape and storage of the ``key`` dataset in one session file.

    Attributes:
        rows: Length of the first axis (samples in the session).
        row_shape: Shape of one row (one sample).
        dtype: Element type.
        chunk_rows: Rows per chunk along the first axis, or ``None`` for contiguous storage.
        chunk_bytes: Bytes of one chunk, or ``None`` for contiguous storage.
        compression: Filter names (e.g. ``"gzip"``), empty when uncompressed.

    Example:
        >>> SessionLayout(750, (64, 64), np.dtype("f4"), None, None, ()).rows
        750
    """

    rows: int
    row_shape: tuple[int, ...]
    dtype: np.dtype
    chunk_rows: int | None
    chunk_bytes: int | None
    compression: tuple[str, ...]


def _next_prime(n: int) -> int:
    n = max(n, 2)
    while True:
        if all(n % p for p in range(2, int(n**0.5) + 1)):
            return n
        n += 1


def default_chunk_cache(layout: SessionLayout) -> dict[str, int]:
    """The chunk-cache options loaderkit passes to ``h5py.File`` unless you pass your own.

    Contiguous data never goes through the chunk cache, so it gets ``rdcc_nbytes=0`` (no cache
    memory per open file). Chunked data with several rows per chunk gets room for ``8`` chunks,
    at least HDF5 2.0's own default of 8 MiB (so random access is never slower than with a
    plain ``h5py.File``) and at most 64 MiB, and a prime number of hash slots about 100 times
    the chunks that fit; the memory bound is ``workers x max_open_files x rdcc_nbytes``. With
    one row per chunk no chunk is ever read twice by batched reads, so 1 MiB is enough (HDF5
    reads chunks larger than the cache straight through). Purely random per-item access to
    compressed data benefits from a cache that holds the whole dataset; pass ``rdcc_nbytes``
    for that.

    Args:
        layout: The layout of the dataset read by ``key``.

    Returns:
        ``{"rdcc_nbytes": ..., "rdcc_nslots": ...}`` (only ``rdcc_nbytes`` for contiguous data).

    Example:
        >>> default_chunk_cache(SessionLayout(10, (4,), np.dtype("f4"), None, None, ()))
        {'rdcc_nbytes': 0}
    """
    if layout.chunk_bytes is None:
        return {"rdcc_nbytes": 0}
    if layout.chunk_rows == 1:  # no two rows share a chunk: nothing worth keeping
        nbytes = _CACHE_ONE_ROW_BYTES
    else:
        nbytes = min(max(_CACHE_CHUNKS * layout.chunk_bytes, _CACHE_MIN_BYTES), _CACHE_MAX_BYTES)
    chunks = max(1, nbytes // layout.chunk_bytes)
    return {"rdcc_nbytes": int(nbytes), "rdcc_nslots": _next_prime(100 * chunks)}


def _add_note(exc: BaseException, note: str) -> None:
    if sys.version_info >= (3, 11):
        exc.add_note(note)


def _hint(exc: BaseException) -> str:
    """Remedy for well-known HDF5 failures, or an empty string."""
    text = str(exc).lower()
    if "filter" in text and ("not registered" in text or "can't open directory" in text):
        return (
            " The file uses a compression filter that is not available in this process: "
            "`pip install hdf5plugin` (loaderkit imports it automatically) or set "
            "HDF5_PLUGIN_PATH."
        )
    errno_ = getattr(exc, "errno", None)
    if "lock" in text or errno_ in (11, 37, 524):
        return (
            " File locking failed (common on NFS/Lustre/GPFS, read-only mounts or with a "
            "writer present): pass h5py_options={'locking': False} for files that do not change "
            "while you read them, or set HDF5_USE_FILE_LOCKING=FALSE."
        )
    if "signature" in text or "not an hdf5" in text:
        return " The file is not an HDF5 file (or is truncated or corrupted)."
    return ""


def _dataset_names(f: h5py.File, limit: int = 25) -> list[str]:
    names: list[str] = []

    def visit(name: str, obj: object) -> None:
        if isinstance(obj, h5py.Dataset):
            names.append(name)

    f.visititems(visit)
    if len(names) > limit:
        names = [*names[:limit], f"... ({len(names) - limit} more)"]
    return names


def _overrides(cls: type, name: str) -> bool:
    return getattr(cls, name) is not getattr(HDF5SessionDataset, name)


class HDF5SessionDataset(Dataset):
    """A map-style dataset over per-session HDF5 files with a bounded per-process handle cache.

    Sample ``i`` is row ``locate(i)[1]`` of the session file ``locate(i)[0]``. The index is built
    once, here, from the files' shapes (override ``build_index`` for your own) and files are
    opened lazily, read-only, at most ``max_open_files`` at a time in every process. Handles are
    never pickled (spawn/forkserver workers get paths and the index) and never shared with a
    forked child (the child closes its inherited copies and opens its own).

    Args:
        files: Mapping session id -> path, or a sequence of paths (ids ``0..n-1``).
        key: Name of the HDF5 dataset the default ``read`` returns rows of. ``None``
            picks the only dataset of the first file (error if there are several).
        max_open_files: Most files open at once per process (least recently used closed first).
        h5py_options: Extra keyword arguments for ``h5py.File`` (``rdcc_nbytes``,
            ``rdcc_nslots``, ``locking``, ``swmr``, ``driver``, ...). They win over loaderkit's
            defaults (see ``default_chunk_cache``). The mode is always ``"r"``.

    Raises:
        ConfigError: ``max_open_files < 1``, a ``mode`` other than ``"r"``, ``key=None`` with
            several datasets, or row shapes/dtypes that differ between sessions.
        FileNotFoundError: A file is missing (the message names the session and path).
        HDF5FileError: A file is not readable HDF5 (an ``OSError``).
        KeyError: ``key`` is missing from a file (the message lists the datasets present).

    Example:
        >>> import h5py, numpy as np, tempfile, os
        >>> root = tempfile.mkdtemp()
        >>> paths = [os.path.join(root, f"s{i}.h5") for i in range(2)]
        >>> for p in paths:
        ...     with h5py.File(p, "w") as f:
        ...         _ = f.create_dataset("betas", data=np.zeros((3, 4), "f4"))
        >>> with HDF5SessionDataset(paths, key="betas") as ds:
        ...     len(ds), ds.locate(4), ds[4].shape
        (6, (1, 1), (4,))
    """

    def __init__(
        self,
        files: Mapping[Hashable, str | os.PathLike[str]] | Sequence[str | os.PathLike[str]],
        *,
        key: str | None = None,
        max_open_files: int = 8,
        h5py_options: Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(max_open_files, bool) or not isinstance(max_open_files, int):
            raise ConfigError(
                f"max_open_files must be an int >= 1, got {max_open_files!r}; it bounds the "
                "HDF5 files each process keeps open."
            )
        if max_open_files < 1:
            raise ConfigError(
                f"max_open_files must be >= 1, got {max_open_files}: every read needs one open "
                "file. Use a small number such as 8 (the default)."
            )
        self.files: dict[Hashable, Path] = self._normalize_files(files)
        self.key = key
        self.max_open_files = max_open_files
        self.h5py_options: dict[str, Any] = self._check_options(h5py_options)
        self._ids: list[Hashable] = list(self.files)
        self._paths: list[str] = [os.fspath(p) for p in self.files.values()]
        self._position: dict[Hashable, int] = {sid: i for i, sid in enumerate(self._ids)}
        self._mode = self._detect_mode()
        for sid, path in self.files.items():
            if not path.exists():
                raise FileNotFoundError(
                    f"session {sid!r}: file {path} does not exist. Check the path (and that the "
                    "file system is mounted) or remove the session from `files`."
                )
        self._layouts: list[SessionLayout | None] = self._inspect_files()
        self._open_kwargs: list[dict[str, Any]] = [
            self._kwargs_for(layout) for layout in self._layouts
        ]
        self._direct_ok = False
        self._row_shape: tuple[int, ...] = ()
        self._row_dtype: np.dtype | None = None
        self._row_bytes = 0
        self._chunked = False
        self._contiguous = False
        self._cache = self._new_cache()
        try:
            index = self.build_index()
            self._key = self._index_key(index)
            self._key.setflags(write=False)
        finally:
            self._cache.close()  # never leave a file open in the constructing process
        self._set_row_info()

    # ------------------------------------------------------------------ construction helpers

    @staticmethod
    def _normalize_files(files: Any) -> dict[Hashable, Path]:
        if isinstance(files, (str, bytes, os.PathLike)):
            raise ConfigError(
                "files must be a mapping session id -> path or a sequence of paths, got a single "
                f"path {files!r}; wrap it in a list: files=[{files!r}]."
            )
        if isinstance(files, Mapping):
            items = list(files.items())
        elif isinstance(files, Sequence) or hasattr(files, "__iter__"):
            items = list(enumerate(files))
        else:
            raise ConfigError(
                f"files must be a mapping session id -> path or a sequence of paths, got "
                f"{type(files).__name__}."
            )
        if not items:
            raise ConfigError("files is empty: pass at least one session file.")
        out: dict[Hashable, Path] = {}
        for sid, path in items:
            if not isinstance(path, (str, os.PathLike)):
                raise ConfigError(
                    f"session {sid!r}: expected a path (str or os.PathLike), got "
                    f"{type(path).__name__}."
                )
            out[sid] = Path(os.path.abspath(os.path.expanduser(os.fspath(path))))
        return out

    @staticmethod
    def _check_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
        opts = dict(options or {})
        mode = opts.pop("mode", "r")
        if mode != "r":
            raise ConfigError(
                f"h5py_options['mode']={mode!r}: HDF5SessionDataset always opens files "
                "read-only ('r'); remove 'mode'."
            )
        if opts.get("driver") == "stdio":
            warn(
                "h5py_options['driver']='stdio' buffers reads in the C library and has returned "
                "wrong rows after fork; use the default driver (sec2) unless you must."
            )
        return opts

    def _detect_mode(self) -> int:
        """How ``__getitems__`` reads: through ``read_rows``, per item, or coalesced slabs.

        A subclass that overrides ``read`` or ``__getitem__`` (say, to add a transform) gets
        one ``self[i]`` per item, so batched loading returns exactly what indexing does, unless
        it opts into batching by overriding ``read_rows``.
        """
        cls = type(self)
        self._item_fast = not _overrides(cls, "read")
        if _overrides(cls, "read_rows"):
            return _ROWS
        if _overrides(cls, "read") or _overrides(cls, "__getitem__"):
            return _ITEM
        return _FAST

    def _open_for_inspection(self, pos: int) -> h5py.File:
        sid, path = self._ids[pos], self._paths[pos]
        try:
            return h5py.File(path, "r", **self.h5py_options)
        except FileNotFoundError as exc:
            raise FileNotFoundError(
                f"session {sid!r}: file {path} does not exist ({exc})."
            ) from exc
        except TypeError as exc:
            raise ConfigError(
                f"h5py_options {self.h5py_options!r} rejected by h5py.File: {exc}"
            ) from exc
        except Exception as exc:
            raise HDF5FileError(
                f"session {sid!r}: cannot open {path} as HDF5 ({exc}).{_hint(exc)}"
            ) from exc

    def _inspect_files(self) -> list[SessionLayout | None]:
        """Validate every file and describe the ``key`` dataset in it (main process only)."""
        if self.key is None:
            self.key = self._autodetect_key()
        layouts: list[SessionLayout | None] = []
        for pos in range(len(self._ids)):
            with self._open_for_inspection(pos) as f:
                layouts.append(None if self.key is None else self._describe(pos, f))
        if not _overrides(type(self), "read"):
            self._check_same_rows(layouts)
        for pos, layout in enumerate(layouts):
            if layout is not None:
                self._advise(pos, layout)
        return layouts

    def _autodetect_key(self) -> str | None:
        with self._open_for_inspection(0) as f:
            names = _dataset_names(f, limit=10**9)
        if len(names) == 1:
            return names[0]
        if _overrides(type(self), "build_index") and not self._item_fast:
            return None  # the subclass reads and indexes on its own
        raise ConfigError(
            f"key=None but session {self._ids[0]!r} ({self._paths[0]}) holds "
            f"{len(names)} datasets {names[:25]}; pass key='<name of the per-sample dataset>'."
        )

    def _describe(self, pos: int, f: h5py.File) -> SessionLayout:
        sid, path, key = self._ids[pos], self._paths[pos], self.key
        assert key is not None
        try:
            obj = f[key]
        except KeyError:
            raise KeyError(
                f"session {sid!r}: {path} has no dataset {key!r}; datasets present: "
                f"{_dataset_names(f)}. Pass the right key=."
            ) from None
        if not isinstance(obj, h5py.Dataset):
            raise KeyError(
                f"session {sid!r}: {key!r} in {path} is a group, not a dataset; datasets "
                f"present: {_dataset_names(f)}."
            )
        if obj.shape is None or len(obj.shape) == 0:
            raise ConfigError(
                f"session {sid!r}: dataset {key!r} in {path} is scalar (shape {obj.shape}); "
                "the first axis must index samples."
            )
        chunks = obj.chunks
        dtype = obj.dtype
        row_shape = tuple(int(n) for n in obj.shape[1:])
        chunk_bytes = None
        if chunks is not None:
            chunk_bytes = int(np.prod(chunks, dtype=np.int64)) * dtype.itemsize
        dcpl = obj.id.get_create_plist()
        compression = tuple(
            name.decode() if isinstance(name, bytes) else str(name)
            for name in (dcpl.get_filter(k)[3] for k in range(dcpl.get_nfilters()))
        )
        compression = tuple(
            "gzip" if name == "deflate" else name
            for name in compression
            if "shuffle" not in name and "fletcher" not in name
        )
        return SessionLayout(
            rows=int(obj.shape[0]),
            row_shape=row_shape,
            dtype=dtype,
            chunk_rows=None if chunks is None else int(chunks[0]),
            chunk_bytes=chunk_bytes,
            compression=compression,
        )

    def _check_same_rows(self, layouts: list[SessionLayout | None]) -> None:
        ref: tuple[int, SessionLayout] | None = None
        for pos, layout in enumerate(layouts):
            if layout is None or layout.rows == 0:
                continue
            if ref is None:
                ref = (pos, layout)
                continue
            rpos, rl = ref
            if layout.row_shape != rl.row_shape or layout.dtype != rl.dtype:
                raise ConfigError(
                    f"rows of {self.key!r} differ between sessions: session {self._ids[rpos]!r} "
                    f"({self._paths[rpos]}) has shape {rl.row_shape} {rl.dtype}, session "
                    f"{self._ids[pos]!r} ({self._paths[pos]}) has {layout.row_shape} "
                    f"{layout.dtype}. Batches need equal rows: fix the files, or override "
                    "read() to convert each sample to a common shape/dtype."
                )

    def _advise(self, pos: int, layout: SessionLayout) -> None:
        if layout.chunk_rows is None or layout.chunk_bytes is None:
            return
        row_elems = int(np.prod(layout.row_shape, dtype=np.int64)) if layout.row_shape else 1
        chunk_elems = layout.chunk_bytes // max(1, layout.dtype.itemsize)
        per_row = chunk_elems // max(1, layout.chunk_rows)
        if per_row and row_elems > per_row * 8:
            warn(
                f"session {self._ids[pos]!r}: one row of {self.key!r} spans "
                f"{-(-row_elems // per_row)} chunks ({layout.chunk_bytes} bytes each, probably "
                "h5py auto-chunking); every sample then reads many chunks. Rewrite with "
                "chunks=(1, *row_shape) or contiguous storage.",
                PerformanceHint,
            )
        elif layout.compression and layout.chunk_rows > 1:
            logger.info(
                "session %r: %r is compressed (%s) with %d rows per chunk: random rows "
                "decompress whole chunks; BlockShuffleSampler keeps reads chunk-aligned.",
                self._ids[pos],
                self.key,
                ",".join(layout.compression),
                layout.chunk_rows,
            )

    def _kwargs_for(self, layout: SessionLayout | None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if layout is not None and (layout.chunk_bytes is not None or self._item_fast):
            kwargs.update(default_chunk_cache(layout))
        kwargs.update(self.h5py_options)  # explicit user values win
        return kwargs

    def _index_key(self, index: Any) -> np.ndarray:
        if isinstance(index, SampleIndex):
            sessions = np.asarray(index.sessions)
            rows = np.asarray(index.rows)
        elif isinstance(index, np.ndarray):
            if index.size == 0:
                sessions = rows = np.zeros(0, np.int64)
            elif index.ndim == 2 and index.shape[1] == 2:
                sessions, rows = index[:, 0], index[:, 1]
            else:
                raise ConfigError(
                    "build_index() must return a SampleIndex(sessions, rows), an (n, 2) array "
                    f"or a sequence of (session, row) pairs; got an array of shape {index.shape}."
                )
        else:
            pairs = list(index)
            try:
                sess_list = [pair[0] for pair in pairs]
                rows = np.array([operator.index(pair[1]) for pair in pairs], dtype=np.int64)
                if any(len(pair) != 2 for pair in pairs):
                    raise ValueError
            except (TypeError, ValueError, IndexError):
                raise ConfigError(
                    "build_index() must return a SampleIndex(sessions, rows), an (n, 2) array "
                    "or a sequence of (session, row) pairs with integer rows."
                ) from None
            sessions = np.empty(len(sess_list), dtype=object)
            sessions[:] = sess_list
        if sessions.ndim != 1 or rows.ndim != 1 or sessions.shape != rows.shape:
            raise ConfigError(
                "build_index(): sessions and rows must be 1-D arrays of equal length, got "
                f"shapes {sessions.shape} and {rows.shape}."
            )
        if rows.size and not np.issubdtype(rows.dtype, np.integer):
            raise ConfigError(f"build_index(): rows must be integers, got dtype {rows.dtype}.")
        if rows.size and rows.min() < 0:
            raise ConfigError("build_index(): rows must be >= 0.")
        if rows.size and rows.max() >= _ROW_LIMIT:
            raise ConfigError(f"build_index(): rows must be < 2**{_ROW_BITS}.")
        # Map session ids to positions in `files`, and pack (position, row) into one int64.
        pos = self._positions_of(sessions).astype(np.int64)
        rows = rows.astype(np.int64)
        if self._item_fast and rows.size and all(lay is not None for lay in self._layouts):
            limits = np.array([lay.rows for lay in self._layouts if lay is not None], np.int64)
            bad = np.flatnonzero(rows >= limits[pos])
            if bad.size:
                k = int(bad[0])
                p = int(pos[k])
                raise ConfigError(
                    f"build_index() entry {k} asks for row {int(rows[k])} of session "
                    f"{self._ids[p]!r}, but {self.key!r} in {self._paths[p]} has "
                    f"{int(limits[p])} rows."
                )
        return (pos << _ROW_BITS) | rows

    def _positions_of(self, sessions: np.ndarray) -> np.ndarray:
        if sessions.size == 0:
            return np.zeros(0, np.int32)
        try:
            uniq, inverse = np.unique(sessions, return_inverse=True)
        except TypeError:  # ids that do not sort: map one by one
            uniq = None
        try:
            if uniq is None:
                return np.fromiter(
                    (self._position[s] for s in sessions), np.int32, count=sessions.size
                )
            lookup = np.array(
                [self._position[u.item() if isinstance(u, np.generic) else u] for u in uniq],
                dtype=np.int32,
            )
        except KeyError as exc:
            raise ConfigError(
                f"build_index() returned session {exc.args[0]!r}, which is not in files "
                f"(sessions: {self._ids[:20]})."
            ) from None
        return lookup[inverse.reshape(-1)]

    def _set_row_info(self) -> None:
        ref = next((lay for lay in self._layouts if lay is not None and lay.rows), None)
        if ref is None:
            ref = next((lay for lay in self._layouts if lay is not None), None)
        if ref is None:
            return
        self._row_shape = ref.row_shape
        self._row_dtype = ref.dtype
        self._row_bytes = int(np.prod(ref.row_shape, dtype=np.int64)) * ref.dtype.itemsize
        self._direct_ok = ref.dtype.kind in "biufc" and ref.dtype.fields is None
        self._chunked = any(lay is not None and lay.chunk_rows is not None for lay in self._layouts)
        # Likely read with preadv (decided per file at open, see _raw_location).
        self._contiguous = (
            self._direct_ok
            and hasattr(os, "preadv")
            and self.h5py_options.get("driver") in (None, "sec2")
            and all(lay is not None and lay.chunk_rows is None for lay in self._layouts)
        )

    def _new_cache(self) -> HandleCache:
        return HandleCache(self._open, self.max_open_files, self._paths.__getitem__)

    # ------------------------------------------------------------------ hooks

    def build_index(self) -> SampleIndex | Sequence[tuple[Hashable, int]] | np.ndarray:
        """Return the sample index: which (session, row) every dataset index reads.

        The default lists every row of ``key`` in every session, sessions in the order of
        ``files``, rows in file order; empty sessions contribute nothing. Override it to select
        or reorder samples (e.g. a trial map); it runs once, in the constructing process, and any
        file it opens through ``file`` is closed afterwards.

        Returns:
            A ``SampleIndex``, an ``(n, 2)`` array or a sequence of ``(session, row)``
            pairs. ``len(dataset)`` is its length and ``locate(i)`` its ``i``-th entry.

        Example:
            >>> class FirstRows(HDF5SessionDataset):  # doctest: +SKIP
            ...     def build_index(self):
            ...         return [(sid, 0) for sid in self.files]
        """
        if self.key is None:
            raise ConfigError(
                "the default build_index() needs key=: it counts the rows of that dataset."
            )
        counts = np.array([0 if lay is None else lay.rows for lay in self._layouts], np.int64)
        ids = np.asarray(self._ids)
        if ids.ndim != 1 or ids.dtype.kind not in "iuU":
            ids = np.empty(len(self._ids), dtype=object)
            ids[:] = self._ids
        session_ids = np.repeat(ids, counts)
        starts = np.repeat(np.cumsum(counts) - counts, counts)
        rows = np.arange(int(counts.sum()), dtype=np.int64) - starts
        return SampleIndex(session_ids, rows)

    def read(self, session: Hashable, row: int) -> Any:
        """Return one sample: by default row ``row`` of ``key`` in ``session``'s file.

        Override it to return something else (several datasets, a dict, a conversion). Call
        ``file`` or ``h5dataset`` inside it to reach the open file; the dataset holds its
        handle lock while ``read`` runs, so another thread cannot close the file meanwhile.
        Exceptions keep their type; loaderkit adds a note naming the index, session and path.

        Args:
            session: Session id (a key of ``files``).
            row: Row inside that session's file.

        Returns:
            The sample (default: a numpy array, or a numpy scalar for 1-D datasets).

        Example:
            >>> class Scaled(HDF5SessionDataset):  # doctest: +SKIP
            ...     def read(self, session, row):
            ...         return self.h5dataset(session)[row].astype("float32") / 300
        """
        dset = self.h5dataset(session)
        return dset[row]

    def read_rows(self, session: Hashable, start: int, stop: int) -> Sequence[Any]:
        """Return samples for rows ``start..stop-1`` of ``session`` (batched-read opt-in).

        Only consulted when a subclass overrides it: ``__getitems__`` then coalesces each
        batch into runs of consecutive rows and calls ``read_rows`` once per run instead of
        ``read`` once per row. It must return exactly what ``[read(session, r) for r in
        range(start, stop)]`` would (e.g. ``list(converted_slab)``).

        Args:
            session: Session id.
            start: First row.
            stop: One past the last row.

        Returns:
            A sequence of ``stop - start`` samples.

        Example:
            >>> class Scaled(HDF5SessionDataset):  # doctest: +SKIP
            ...     def read_rows(self, session, start, stop):
            ...         return list(self.h5dataset(session)[start:stop].astype("float32") / 300)
        """
        return [self.read(session, row) for row in range(start, stop)]

    # ------------------------------------------------------------------ files and handles

    def _open(self, pos: int) -> Handle:
        sid, path = self._ids[pos], self._paths[pos]
        try:
            f = h5py.File(path, "r", **self._open_kwargs[pos])
        except FileNotFoundError as exc:
            raise FileNotFoundError(
                f"session {sid!r}: file {path} no longer exists (opened in process "
                f"{os.getpid()}): {exc}"
            ) from exc
        except Exception as exc:
            if isinstance(exc, MemoryError):
                raise
            raise HDF5FileError(
                f"session {sid!r}: cannot open {path} in process {os.getpid()} ({exc}).{_hint(exc)}"
            ) from exc
        if self.key is None:
            return Handle(f, None)
        try:
            dset = f[self.key]
            if not isinstance(dset, h5py.Dataset):
                raise KeyError(f"{self.key!r} is not a dataset")
        except Exception as exc:
            try:
                f.close()
            except Exception:
                logger.debug("closing %s after a failed lookup failed", path, exc_info=True)
            raise HDF5FileError(
                f"session {sid!r}: dataset {self.key!r} cannot be read from {path} in process "
                f"{os.getpid()} ({exc}); was the file replaced or corrupted?"
            ) from exc
        raw = _raw_location(f, dset) if self._item_fast else None
        return Handle(f, dset, raw)

    def _pos_of(self, session: Hashable) -> int:
        try:
            return self._position[session]
        except (KeyError, TypeError):
            raise KeyError(
                f"unknown session {session!r}; sessions: {self._ids[:20]}"
                + (" ..." if len(self._ids) > 20 else "")
            ) from None

    def file(self, session: Hashable) -> h5py.File:
        """Return this process's open, read-only ``h5py.File`` for ``session`` (opened lazily).

        The handle stays valid until it is evicted; from several threads, use it only inside
        ``read``/``read_rows`` or while holding ``lock``.

        Args:
            session: Session id (a key of ``files``).

        Returns:
            The open file.

        Example:
            >>> ds.file(0).filename  # doctest: +SKIP
            '/data/betas_session01.hdf5'
        """
        pos = self._pos_of(session)
        with self._cache.lock:
            return self._cache.get(pos).file

    def h5dataset(self, session: Hashable) -> h5py.Dataset:
        """Return the cached ``h5py.Dataset`` of ``key`` in ``session``'s file.

        Cheaper than ``file(session)[key]`` (no name lookup per call).

        Args:
            session: Session id.

        Returns:
            The open ``h5py.Dataset``.

        Example:
            >>> ds.h5dataset(0)[3].shape  # doctest: +SKIP
            (64, 64)
        """
        pos = self._pos_of(session)
        with self._cache.lock:
            dset = self._cache.get(pos).dataset
        if dset is None:
            raise ConfigError("h5dataset() needs key=; use file(session)[name] instead.")
        return dset

    @property
    def lock(self) -> Any:
        """The re-entrant lock guarding this process's handle cache."""
        return self._cache.lock

    @property
    def open_files(self) -> int:
        """Number of files this dataset holds open in the current process."""
        return len(self._cache)

    def cache_info(self) -> CacheInfo:
        """Handle-cache statistics of the current process.

        Returns:
            ``CacheInfo(hits, misses, evictions, opens, open_files, max_open_files)``; counters
            start at zero in every new process (fork or spawn).

        Example:
            >>> ds.cache_info().opens  # doctest: +SKIP
            8
        """
        return self._cache.info()

    def layout(self, session: Hashable) -> SessionLayout | None:
        """Return the layout of ``key`` in ``session`` (``None`` when there is no key).

        Example:
            >>> ds.layout(0).chunk_rows  # doctest: +SKIP
            8
        """
        return self._layouts[self._pos_of(session)]

    @property
    def sample_nbytes(self) -> int | None:
        """Bytes of one sample as the default ``read`` returns it (``None`` when overridden).

        Example:
            >>> ds.sample_nbytes  # doctest: +SKIP
            16384
        """
        if not self._item_fast or self._row_dtype is None:
            return None
        return self._row_bytes

    @property
    def session_ids(self) -> tuple[Hashable, ...]:
        """Session ids in the order of ``files`` (position ``p`` in ``index_arrays``)."""
        return tuple(self._ids)

    def index_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Return read-only ``(session_positions, rows)`` arrays of the whole index.

        ``session_positions[i]`` is the position of sample ``i``'s session in
        ``session_ids``. Samplers use these to find contiguous rows.

        Example:
            >>> pos, rows = ds.index_arrays()  # doctest: +SKIP
        """
        pos = (self._key >> _ROW_BITS).astype(np.int32)
        rows = self._key & _ROW_MASK
        pos.setflags(write=False)
        rows.setflags(write=False)
        return pos, rows

    def close(self) -> None:
        """Close every file this dataset holds open in the current process.

        The dataset stays usable: the next read reopens what it needs.

        Example:
            >>> ds.close()  # doctest: +SKIP
        """
        cache = self.__dict__.get("_cache")
        if cache is not None:
            cache.close()

    def __enter__(self) -> HDF5SessionDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: modules may already be gone
            return

    # ------------------------------------------------------------------ pickling

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cache"] = None
        state["_key"] = _pack_index(state["_key"])
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._key = _unpack_index(state["_key"])
        self._mode = self._detect_mode()
        self._cache = self._new_cache()

    # ------------------------------------------------------------------ reading

    def __repr__(self) -> str:
        """Sessions, samples, key and the files open in this process, as h5py's ``File`` does.

        Examples:
            >>> ds  # doctest: +SKIP
            <HDF5SessionDataset 40 sessions, 30000 samples, key 'betas', 3/8 files open>
        """
        sessions = len(self.session_ids)
        return (
            f"<{type(self).__name__} {sessions} session{'s' * (sessions != 1)}, {len(self)} "
            f"samples, key {self.key!r}, {self.open_files}/{self.max_open_files} files open>"
        )

    def __len__(self) -> int:
        return int(self._key.shape[0])

    def __iter__(self) -> Iterator[Any]:
        for i in range(len(self)):
            yield self[i]

    def _check_index(self, index: Any) -> int:
        n = self._key.shape[0]
        try:
            i = operator.index(index)
        except TypeError:
            raise TypeError(
                f"dataset indices must be integers, got {type(index).__name__}"
            ) from None
        if i < 0:
            i += n
        if i < 0 or i >= n:
            raise IndexError(f"index {index} is out of range for a dataset of {n} samples")
        return i

    def locate(self, index: int) -> tuple[Hashable, int]:
        """Return ``(session, row)`` of sample ``index``.

        Raises:
            IndexError: ``index`` is out of range.

        Example:
            >>> ds.locate(750)  # doctest: +SKIP
            (1, 0)
        """
        key = int(self._key[self._check_index(index)])
        return self._ids[key >> _ROW_BITS], key & _ROW_MASK

    def _context(self, pos: int, row: int, index: int) -> str:
        return (
            f"loaderkit: dataset index {index} -> session {self._ids[pos]!r}, row {row}, "
            f"file {self._paths[pos]} (key {self.key!r}, process {os.getpid()})"
        )

    def _read_error(self, exc: Exception, pos: int, rows: str, index: int) -> Exception:
        self._cache.discard(pos)
        return HDF5FileError(
            f"reading {rows} of {self.key!r} from session {self._ids[pos]!r} "
            f"({self._paths[pos]}) for dataset index {index} failed in process {os.getpid()}: "
            f"{exc}. The handle was closed; was the file modified, truncated or deleted while "
            f"being read?{_hint(exc)}"
        )

    def __getitem__(self, index: int) -> Any:
        i = self._check_index(index)
        key = int(self._key[i])
        pos = key >> _ROW_BITS
        row = key & _ROW_MASK
        cache = self._cache
        with cache.lock:
            if self._item_fast:
                try:
                    handle = cache.get(pos)
                except Exception as exc:
                    _add_note(exc, self._context(pos, row, i))
                    raise
                try:
                    raw = handle.raw
                    if raw is None:
                        return cast(Any, handle.dataset)[row]  # None only once closed
                    out = np.empty(self._row_shape, self._row_dtype)
                    _pread(raw, row * self._row_bytes, out, self._row_bytes)
                    return out if self._row_shape else out[()]
                except MemoryError:
                    raise
                except Exception as exc:
                    raise self._read_error(exc, pos, f"row {row}", i) from exc
            try:
                return self.read(self._ids[pos], row)
            except Exception as exc:
                cache.discard(pos)
                _add_note(exc, self._context(pos, row, i))
                raise

    def _keys_of(self, indices: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """``(indices, keys)`` as arrays; IndexError for an index out of range."""
        idx = np.asarray(indices)
        if idx.dtype.kind not in "iu":
            if idx.size == 0:
                idx = np.zeros(0, np.int64)
            else:
                try:
                    idx = np.fromiter((operator.index(i) for i in indices), np.int64)
                except TypeError:
                    raise TypeError(
                        f"dataset indices must be integers, got {idx.dtype} values"
                    ) from None
        if idx.ndim != 1:
            idx = idx.reshape(-1)
        try:
            return idx, self._key[idx]  # numpy checks the bounds (and wraps negatives)
        except IndexError:
            n = self._key.shape[0]
            bad = int(idx[(idx >= n) | (idx < -n)][0])
            raise IndexError(f"index {bad} is out of range for a dataset of {n} samples") from None

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """Read a batch of samples at once (torch's fetcher calls this with a batch).

        Indices are grouped by session and consecutive rows are read as one slab into a batch
        buffer; the result is a list of per-sample arrays (views of that buffer) in request
        order, so ``default_collate`` gives exactly what per-item reads would. When a subclass
        overrides ``read`` (and not ``read_rows``), ``read`` is called once per item.

        Args:
            indices: Dataset indices, any order, duplicates allowed.

        Returns:
            One sample per index, in the order given.

        Example:
            >>> [x.shape for x in ds.__getitems__([5, 6, 7])]  # doctest: +SKIP
            [(64, 64), (64, 64), (64, 64)]
        """
        if self._mode == _ITEM:
            return [self[i] for i in indices]
        idx, keys = self._keys_of(indices)
        n = idx.size
        if n == 0:
            return []
        with self._cache.lock:
            if self._mode == _ROWS:
                order, starts = _plan_runs(keys, sort=self._chunked, always=True)
                return self._read_runs_hook(idx, keys, order, starts)
            if n == 1:
                return [HDF5SessionDataset.__getitem__(self, int(idx[0]))]
            order, starts = _plan_runs(keys, sort=self._chunked, always=self._contiguous)
            if starts is None:
                return self._read_each(idx, keys)
            return self._read_runs(idx, keys, order, starts)

    def _read_each(self, idx: np.ndarray, keys: np.ndarray) -> list[Any]:
        """One read per sample (nothing to coalesce), in request order."""
        cache = self._cache
        out: list[Any] = []
        append = out.append
        last = -1
        dset: Any = None
        for j, key in enumerate(keys.tolist()):
            pos, row = key >> _ROW_BITS, key & _ROW_MASK
            if pos != last:
                try:
                    dset = cache.get(pos).dataset
                except Exception as exc:
                    _add_note(exc, self._context(pos, row, int(idx[j])))
                    raise
                last = pos
            try:
                append(dset[row])
            except MemoryError:
                raise
            except Exception as exc:
                raise self._read_error(exc, pos, f"row {row}", int(idx[j])) from exc
        return out

    def _read_runs(
        self, idx: np.ndarray, keys: np.ndarray, order: np.ndarray | None, starts: np.ndarray
    ) -> list[Any]:
        """Coalesced slab reads; ``order`` is the read order (``None``: request order).

        Small rows go into one batch buffer. Rows of ``_RUN_BUFFER_BYTES`` or more get one
        buffer per run instead: a whole batch of them in one buffer is larger than glibc's
        largest recyclable allocation (32 MiB), so it would be a fresh ``mmap`` that the kernel
        faults in page by page for every batch, while per-run buffers are reused by the
        allocator the way per-item reads are.
        """
        n = idx.size
        assert self._row_dtype is not None
        shape, dtype, row_bytes = self._row_shape, self._row_dtype, self._row_bytes
        per_run = row_bytes >= _RUN_BUFFER_BYTES
        buf = None if per_run else np.empty((n, *shape), dtype=dtype)
        samples: list[Any] = [None] * n if per_run else []
        run_keys = (keys[starts] if order is None else keys[order[starts]]).tolist()
        bounds = starts.tolist()
        bounds.append(n)
        cache = self._cache
        direct = self._direct_ok
        last = -1
        dset: Any = None
        raw: tuple[int, int] | None = None
        for r, key in enumerate(run_keys):
            pos, a = key >> _ROW_BITS, key & _ROW_MASK
            k, k2 = bounds[r], bounds[r + 1]
            length = k2 - k
            if pos != last:
                try:
                    handle = cache.get(pos)
                except Exception as exc:
                    j = k if order is None else int(order[k])
                    _add_note(exc, self._context(pos, a, int(idx[j])))
                    raise
                dset, raw = handle.dataset, handle.raw
                last = pos
            try:
                out = np.empty((length, *shape), dtype=dtype) if buf is None else buf[k:k2]
                if raw is not None:
                    _pread(raw, a * row_bytes, out, length * row_bytes)
                elif direct and length * row_bytes >= _DIRECT_READ_BYTES:
                    _read_direct(dset, a, length, out)
                elif length == 1:
                    out[0] = dset[a]
                else:
                    out[:] = dset[a : a + length]
            except MemoryError:
                raise
            except Exception as exc:
                j = k if order is None else int(order[k])
                what = f"rows {a}..{a + length - 1}"
                raise self._read_error(exc, pos, what, int(idx[j])) from exc
            if buf is None:
                samples[k:k2] = list(out)
        if buf is not None:
            samples = list(buf)
        if order is None:
            return samples
        result: list[Any] = [None] * n
        for position, target in enumerate(order.tolist()):
            result[target] = samples[position]
        return result

    def _read_runs_hook(
        self,
        idx: np.ndarray,
        keys: np.ndarray,
        order: np.ndarray | None,
        starts: np.ndarray | None,
    ) -> list[Any]:
        """Coalesced reads through the subclass's ``read_rows``."""
        n = idx.size
        if starts is None:
            starts = np.arange(n)
        run_keys = (keys[starts] if order is None else keys[order[starts]]).tolist()
        bounds = starts.tolist()
        bounds.append(n)
        result: list[Any] = [None] * n
        targets = list(range(n)) if order is None else order.tolist()
        for r, key in enumerate(run_keys):
            pos, a = key >> _ROW_BITS, key & _ROW_MASK
            k, k2 = bounds[r], bounds[r + 1]
            try:
                samples = self.read_rows(self._ids[pos], a, a + (k2 - k))
                if len(samples) != k2 - k:
                    raise ConfigError(
                        f"{type(self).__name__}.read_rows({self._ids[pos]!r}, {a}, "
                        f"{a + k2 - k}) returned {len(samples)} samples, expected {k2 - k}."
                    )
            except Exception as exc:
                self._cache.discard(pos)
                _add_note(exc, self._context(pos, a, int(idx[targets[k]])))
                raise
            for t, sample in zip(targets[k:k2], samples, strict=True):
                result[t] = sample
        return result


def _raw_location(f: h5py.File, dset: h5py.Dataset) -> tuple[int, int] | None:
    """``(fd, offset)`` when rows of ``dset`` can be read with ``os.preadv``, else ``None``.

    That is the case for data stored contiguously (not chunked, compact or external), without
    filters, fully allocated, in a plain file opened with the default ``sec2`` driver, whose file
    type is exactly the numpy dtype h5py returns: the bytes on disk are then the C-order array.
    """
    if not hasattr(os, "preadv") or f.driver != "sec2":
        return None
    try:
        dcpl = dset.id.get_create_plist()
        if dcpl.get_layout() != h5d.CONTIGUOUS or dcpl.get_nfilters() or dcpl.get_external_count():
            return None
        dtype = dset.dtype
        if dtype.kind not in "biufc" or dtype.fields is not None or dtype.subdtype is not None:
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


def _pread(
    raw: tuple[int, int], offset: int, out: np.ndarray | list[np.ndarray], nbytes: int
) -> None:
    """Read ``nbytes`` from ``offset`` bytes into the dataset's raw data into ``out``.

    ``out`` is one C-contiguous array or a list of them (filled in order, one system call).
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


def _read_direct(dset: h5py.Dataset, start: int, length: int, out: np.ndarray) -> None:
    """Read rows ``start..start+length-1`` of ``dset`` straight into ``out`` (C-contiguous)."""
    fspace = dset.id.get_space()
    count = (length, *out.shape[1:])
    fspace.select_hyperslab((start,) + (0,) * (len(count) - 1), count)
    mspace = h5s.create_simple(count)
    dset.id.read(mspace, fspace, out, dxpl=dset._dxpl)


def _plan_runs(
    keys: np.ndarray, *, sort: bool, always: bool
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Choose how to read a batch given its packed (session, row) keys.

    Returns ``(order, starts)``: ``order`` is the permutation to read in (``None``: request
    order) and ``starts`` the offsets, in that order, where a new run of consecutive rows of one
    session begins (consecutive keys differ by exactly 1). ``starts`` is ``None`` when
    per-sample reads in request order are best (nothing to coalesce through HDF5). On chunked
    data a sorted order is always used, so rows sharing a chunk are read one after another and
    the chunk is decompressed once. With ``always`` (contiguous data read with ``preadv``) runs
    in request order are always used: one system call per run, however short.
    """
    n = keys.shape[0]
    brk = np.flatnonzero(np.diff(keys) != 1)
    if (brk.size + 1) * 2 <= n or always:
        return None, np.concatenate(([0], brk + 1))
    order = np.argsort(keys, kind="stable")
    brk2 = np.flatnonzero(np.diff(keys[order]) != 1)
    if (brk2.size + 1) * 2 <= n or sort:
        return order, np.concatenate(([0], brk2 + 1))
    return None, None


def _pack_index(key: np.ndarray) -> tuple[Any, ...]:
    """Run-length encode the index for pickling when that is smaller."""
    n = key.shape[0]
    if n == 0:
        return ("raw", key)
    starts = np.concatenate(([0], np.flatnonzero(np.diff(key) != 1) + 1))
    if starts.size * 2 >= n:
        return ("raw", key)
    return ("rle", n, key[starts], starts)


def _unpack_index(packed: tuple[Any, ...]) -> np.ndarray:
    if packed[0] == "raw":
        key = np.array(packed[1], dtype=np.int64, copy=True)
    else:
        _, n, run_key, starts = packed
        lengths = np.diff(np.append(starts, n))
        key = np.arange(n, dtype=np.int64) + np.repeat(run_key - starts, lengths)
    key.setflags(write=False)
    return key
