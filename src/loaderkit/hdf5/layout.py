"""Per-session layout of the ``key`` dataset: description, validation, chunk cache and advice.

``SessionLayout`` describes the dataset read in one session file (shape, dtype, chunking,
filters); ``describe_layout`` builds it, ``check_same_rows`` validates layouts across sessions,
``default_chunk_cache`` chooses HDF5's chunk-cache settings from it, and ``advise`` warns about
layouts that read slowly. ``_hint`` turns well-known HDF5 failures into a remedy.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, NamedTuple

import h5py
import numpy as np

from loaderkit.errors import ConfigError, PerformanceHint, warn

__all__ = [
    "SessionLayout",
    "advise",
    "check_same_rows",
    "default_chunk_cache",
    "describe_layout",
    "open_kwargs",
]

logger = logging.getLogger(__name__)

#: Chunk cache used for chunked datasets: room for this many chunks, within the bounds below.
_CACHE_CHUNKS = 8
_CACHE_MIN_BYTES = 8 << 20  # HDF5 2.0's own default: never less cache than plain h5py
_CACHE_ONE_ROW_BYTES = 1 << 20
_CACHE_MAX_BYTES = 64 << 20


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


def open_kwargs(
    layout: SessionLayout | None, h5py_options: Mapping[str, Any], *, default_read: bool
) -> dict[str, Any]:
    """Keyword arguments for ``h5py.File`` of one session: chunk cache, then the user's options.

    Args:
        layout: The session's layout (``None`` when there is no key).
        h5py_options: The user's ``h5py.File`` options; they win over loaderkit's defaults.
        default_read: Whether the dataset reads rows itself (``read`` not overridden); the
            chunk cache of contiguous data is then switched off too.

    Returns:
        The keyword arguments.

    Example:
        >>> lay = SessionLayout(10, (4,), np.dtype("f4"), None, None, ())
        >>> open_kwargs(lay, {"locking": False}, default_read=True)
        {'rdcc_nbytes': 0, 'locking': False}
    """
    kwargs: dict[str, Any] = {}
    if layout is not None and (layout.chunk_bytes is not None or default_read):
        kwargs.update(default_chunk_cache(layout))
    kwargs.update(h5py_options)  # explicit user values win
    return kwargs


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


def describe_layout(f: h5py.File, key: str, session: Hashable, path: str) -> SessionLayout:
    """Describe dataset ``key`` of the open file ``f`` (session ``session`` at ``path``).

    Args:
        f: The open file.
        key: Name of the per-sample dataset.
        session: Session id (for messages).
        path: File path (for messages).

    Returns:
        The layout.

    Raises:
        KeyError: ``key`` is missing or a group (the message lists the datasets present).
        ConfigError: The dataset is scalar.

    Example:
        >>> import h5py, numpy as np, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "s.h5")
        >>> with h5py.File(path, "w") as f:
        ...     _ = f.create_dataset("x", data=np.zeros((6, 3), "f4"), chunks=(2, 3))
        ...     describe_layout(f, "x", 0, path)[:2]
        (6, (3,))
    """
    try:
        obj = f[key]
    except KeyError:
        raise KeyError(
            f"session {session!r}: {path} has no dataset {key!r}; datasets present: "
            f"{_dataset_names(f)}. Pass the right key=."
        ) from None
    if not isinstance(obj, h5py.Dataset):
        raise KeyError(
            f"session {session!r}: {key!r} in {path} is a group, not a dataset; datasets "
            f"present: {_dataset_names(f)}."
        )
    if obj.shape is None or len(obj.shape) == 0:
        raise ConfigError(
            f"session {session!r}: dataset {key!r} in {path} is scalar (shape {obj.shape}); "
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


def check_same_rows(
    layouts: Sequence[SessionLayout | None],
    key: str | None,
    ids: Sequence[Hashable],
    paths: Sequence[str],
) -> None:
    """Raise ``ConfigError`` unless every non-empty session has the same row shape and dtype.

    Args:
        layouts: One layout per session (``None``: no key).
        key: Name of the dataset (for the message).
        ids: Session ids, in the order of ``layouts``.
        paths: File paths, in the order of ``layouts``.

    Raises:
        ConfigError: Two sessions differ; the message names both.

    Example:
        >>> a = SessionLayout(3, (4,), np.dtype("f4"), None, None, ())
        >>> check_same_rows([a, a._replace(rows=5)], "x", [0, 1], ["a.h5", "b.h5"])
    """
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
                f"rows of {key!r} differ between sessions: session {ids[rpos]!r} "
                f"({paths[rpos]}) has shape {rl.row_shape} {rl.dtype}, session "
                f"{ids[pos]!r} ({paths[pos]}) has {layout.row_shape} "
                f"{layout.dtype}. Batches need equal rows: fix the files, or override "
                "read() to convert each sample to a common shape/dtype."
            )


def advise(layout: SessionLayout, session: Hashable, key: str | None) -> None:
    """Warn (``PerformanceHint``) when one row spans many chunks; log compressed chunking.

    Args:
        layout: The session's layout.
        session: Session id (for the message).
        key: Name of the dataset (for the message).

    Example:
        >>> advise(SessionLayout(10, (4,), np.dtype("f4"), 10, 160, ()), 0, "x")  # quiet
    """
    if layout.chunk_rows is None or layout.chunk_bytes is None:
        return
    row_elems = int(np.prod(layout.row_shape, dtype=np.int64)) if layout.row_shape else 1
    chunk_elems = layout.chunk_bytes // max(1, layout.dtype.itemsize)
    per_row = chunk_elems // max(1, layout.chunk_rows)
    if per_row and row_elems > per_row * 8:
        warn(
            f"session {session!r}: one row of {key!r} spans "
            f"{-(-row_elems // per_row)} chunks ({layout.chunk_bytes} bytes each, probably "
            "h5py auto-chunking); every sample then reads many chunks. Rewrite with "
            "chunks=(1, *row_shape) or contiguous storage.",
            PerformanceHint,
        )
    elif layout.compression and layout.chunk_rows > 1:
        logger.info(
            "session %r: %r is compressed (%s) with %d rows per chunk: random rows "
            "decompress whole chunks; BlockShuffleSampler keeps reads chunk-aligned.",
            session,
            key,
            ",".join(layout.compression),
            layout.chunk_rows,
        )
