"""Per-session layout of the ``key`` dataset: description, validation, chunk buffer and advice.

``SessionLayout`` describes the dataset read in one session file (shape, dtype, chunking,
filters); ``describe_layout`` builds it, ``check_same_rows`` validates layouts across sessions,
``default_chunk_buffer`` chooses HDF5's chunk-buffer settings from it, and ``advise`` warns about
layouts that read slowly (``read_amplification``: what one sample reads versus returns).
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, NamedTuple

import h5py
import numpy as np

from loaderkit.errors import ConfigError, MissingKeyError, PerformanceHint, warn
from loaderkit.hdf5.meta.columnblocks import chunks_per_row
from loaderkit.hdf5.meta.diagnose import metadata_errors
from loaderkit.plan import counted

__all__ = [
    "MANY_CHUNKS",
    "Amplification",
    "SessionLayout",
    "advise",
    "check_same_rows",
    "dataset_at",
    "dataset_names",
    "default_chunk_buffer",
    "describe_layout",
    "open_kwargs",
    "open_object",
    "read_amplification",
]

logger = logging.getLogger(__name__)

#: Chunk buffer of chunked datasets: room for this many chunks, within the bounds below.
_BUFFER_CHUNKS = 8
_BUFFER_MIN_BYTES = 8 << 20  # HDF5 2.0's own default: never less than plain h5py
_BUFFER_ONE_ROW_BYTES = 1 << 20
_BUFFER_MAX_BYTES = 64 << 20
#: A row touching at least this many chunks "spans many chunks": the dataset warns
#: (``advise``); when other rows share those chunks, batches read each chunk once per session
#: (``loaderkit.hdf5.read.widerows``) and sessions may be held in memory (``max_session_bytes``).
MANY_CHUNKS = 8
#: Most hash slots: HDF5 allocates and walks the slot table at every dataset open (millions of
#: slots for tiny chunks cost 15 ms per open and tens of MiB per open file).
_MAX_SLOTS = 100_000


class SessionLayout(NamedTuple):
    """Shape and storage of the ``key`` dataset in one session file.

    Attributes:
        rows: Length of the first axis (samples in the session).
        row_shape: Shape of one row (one sample).
        dtype: Element type.
        chunk_rows: Rows per chunk along the first axis, or ``None`` for contiguous storage.
        chunk_bytes: Bytes of one chunk, or ``None`` for contiguous storage.
        compression: Filter names (e.g. ``"gzip"``), empty when uncompressed.
        chunk_shape: The chunk shape, sample axis first like ``(rows, *row_shape)``
            (``None`` for contiguous storage).

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
    chunk_shape: tuple[int, ...] | None = None

    @property
    def chunks_per_row(self) -> int:
        """Chunks one row (sample) touches (1 for contiguous data).

        Example:
            >>> lay = SessionLayout(750, (20000,), np.dtype("i2"), 750, 1500, (), (750, 1))
            >>> lay.chunks_per_row, lay.shares_chunks
            (20000, True)
        """
        if self.chunk_shape is None:
            return 1
        return chunks_per_row((self.rows, *self.row_shape), self.chunk_shape)

    @property
    def spans_many_chunks(self) -> bool:
        """Whether one row touches ``MANY_CHUNKS`` chunks or more (the dataset warns)."""
        return self.rows > 0 and self.chunks_per_row >= MANY_CHUNKS

    @property
    def shares_chunks(self) -> bool:
        """Whether rows spanning many chunks share them with other rows (several per chunk).

        One row then reads other rows' bytes too (read amplification): batches read each
        chunk once per session (``loaderkit.hdf5.read.widerows``) and whole sessions may be held in
        memory (``max_session_bytes``). Chunks of one row each cost lookups, not bytes.

        Example:
            >>> lay = SessionLayout(6, (256, 256), np.dtype("f4"), 1, 16384, (), (1, 64, 64))
            >>> lay.spans_many_chunks, lay.shares_chunks
            (True, False)
        """
        return self.spans_many_chunks and (self.chunk_rows or 1) > 1


def _next_prime(n: int) -> int:
    n = max(n, 2)
    while True:
        if all(n % p for p in range(2, int(n**0.5) + 1)):
            return n
        n += 1


def default_chunk_buffer(layout: SessionLayout) -> dict[str, int]:
    """HDF5's chunk-buffer options loaderkit passes to ``h5py.File`` unless you pass your own.

    The chunk buffer is what HDF5 and h5py call the raw data chunk cache (the ``rdcc_*``
    options): decoded chunks kept per open dataset. Contiguous data never goes through it, so
    it gets ``rdcc_nbytes=0`` (no buffer memory per open file). Chunked data with several rows
    per chunk gets room for ``8`` chunks, at least HDF5 2.0's own default of 8 MiB (so random
    access is never slower than with a plain ``h5py.File``) and at most 64 MiB, and a prime
    number of hash slots about 100 times the chunks that fit (at most about 100,000: the slot
    table is built at every open); the memory bound is ``workers x max_open_files x
    rdcc_nbytes``. With one row per chunk no chunk is ever read twice by batched reads, so
    1 MiB is enough (HDF5 reads chunks larger than the buffer straight through). Purely random
    per-item access to compressed data benefits from a buffer that holds the whole dataset;
    pass ``rdcc_nbytes`` for that.

    Args:
        layout: The layout of the dataset read by ``key``.

    Returns:
        ``{"rdcc_nbytes": ..., "rdcc_nslots": ...}`` (only ``rdcc_nbytes`` for contiguous data).

    Example:
        >>> default_chunk_buffer(SessionLayout(10, (4,), np.dtype("f4"), None, None, ()))
        {'rdcc_nbytes': 0}
    """
    if layout.chunk_bytes is None:
        return {"rdcc_nbytes": 0}
    if layout.chunk_rows == 1:  # no two rows share a chunk: nothing worth keeping
        nbytes = _BUFFER_ONE_ROW_BYTES
    else:
        nbytes = min(max(_BUFFER_CHUNKS * layout.chunk_bytes, _BUFFER_MIN_BYTES), _BUFFER_MAX_BYTES)
    chunks = max(1, nbytes // layout.chunk_bytes)
    return {"rdcc_nbytes": int(nbytes), "rdcc_nslots": _next_prime(min(100 * chunks, _MAX_SLOTS))}


def open_kwargs(
    layout: SessionLayout | None, h5py_options: Mapping[str, Any], *, default_read: bool
) -> dict[str, Any]:
    """Keyword arguments for ``h5py.File`` of one session: chunk buffer, then the user's options.

    Args:
        layout: The session's layout (``None`` when there is no key).
        h5py_options: The user's ``h5py.File`` options; they win over loaderkit's defaults.
        default_read: Whether the dataset reads rows itself (``read`` not overridden); the
            chunk buffer of contiguous data is then switched off too.

    Returns:
        The keyword arguments.

    Example:
        >>> lay = SessionLayout(10, (4,), np.dtype("f4"), None, None, ())
        >>> open_kwargs(lay, {"locking": False}, default_read=True)
        {'rdcc_nbytes': 0, 'locking': False}
    """
    kwargs: dict[str, Any] = {}
    if layout is not None and (layout.chunk_bytes is not None or default_read):
        kwargs.update(default_chunk_buffer(layout))
    kwargs.update(h5py_options)  # explicit user values win
    return kwargs


def dataset_names(f: h5py.Group, limit: int = 25) -> list[str]:
    """The paths of every dataset in ``f``, the first ``limit`` of them (for messages).

    Args:
        f: An open file or group.
        limit: Most names listed; more are summed up as ``"... (N more)"``.

    Returns:
        Dataset paths relative to ``f``, in h5py's visiting order.

    Example:
        >>> dataset_names(h5py.File("session.h5"))  # doctest: +SKIP
        ['betas', 'stim/ids']
    """
    names: list[str] = []

    def visit(name: str, obj: object) -> None:
        if isinstance(obj, h5py.Dataset):
            names.append(name)

    f.visititems(visit)
    if len(names) > limit:
        names = [*names[:limit], f"... ({len(names) - limit} more)"]
    return names


def describe_layout(
    f: h5py.File, key: str, session: Hashable, path: str, *, axis: int = 0
) -> SessionLayout:
    """Describe dataset ``key`` of the open file ``f`` (session ``session`` at ``path``).

    Args:
        f: The open file.
        key: Name of the per-sample dataset.
        session: Session id (for messages).
        path: File path (for messages).
        axis: The axis samples lie along (``sample_axis``, already made non-negative).

    Returns:
        The layout. Its ``dtype`` is the one h5py reads (``object`` when numpy has none: the
        type is refused later, with its HDF5 name, where default reads need it).

    Raises:
        KeyError: ``key`` is missing or a group (the message lists the datasets present).
        ConfigError: The dataset is scalar, or has no axis ``axis``.

    Example:
        >>> import h5py, numpy as np, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "s.h5")
        >>> with h5py.File(path, "w") as f:
        ...     _ = f.create_dataset("x", data=np.zeros((6, 3), "f4"), chunks=(2, 3))
        ...     describe_layout(f, "x", 0, path)[:2]
        (6, (3,))
    """
    obj = dataset_at(f, key, session, path)
    shape = obj.shape
    if shape is None or len(shape) == 0:
        raise ConfigError(
            f"session {session!r}: dataset {key!r} in {path} is scalar (shape {shape}); "
            "the first axis must index samples."
        )
    if axis >= len(shape):
        raise ConfigError(
            f"sample_axis={axis}: dataset {key!r} in {path} (session {session!r}) has only "
            f"{len(shape)} axes (shape {shape}). Pass the axis that indexes samples."
        )
    chunks = obj.chunks
    try:
        dtype = obj.dtype
        itemsize = dtype.itemsize
    except (TypeError, ValueError):  # a type numpy cannot hold: refused by default reads
        dtype, itemsize = np.dtype(object), obj.id.get_type().get_size()
    row_shape = tuple(int(n) for k, n in enumerate(shape) if k != axis)
    chunk_bytes = None
    if chunks is not None:
        chunk_bytes = int(np.prod(chunks, dtype=np.int64)) * itemsize
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
        rows=int(shape[axis]),
        row_shape=row_shape,
        dtype=dtype,
        chunk_rows=None if chunks is None else int(chunks[axis]),
        chunk_bytes=chunk_bytes,
        compression=compression,
        chunk_shape=None
        if chunks is None
        else (int(chunks[axis]), *(int(c) for k, c in enumerate(chunks) if k != axis)),
    )


def open_object(f: h5py.Group, key: str) -> Any:
    """``f[key]``, or ``None`` when the file has no object there (a missing name, a broken link).

    A name the file has whose object HDF5 cannot open (damaged metadata: h5py raises
    ``KeyError("Unable to synchronously open object (...)")`` for it as for a missing name),
    or a lookup in a file whose tree cannot be walked, re-raises h5py's exception: call it
    inside ``diagnose.metadata_errors``, which names the file.

    Example:
        >>> import h5py, numpy as np, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "o.h5")
        >>> with h5py.File(path, "w") as f:
        ...     _ = f.create_dataset("x", data=np.zeros(3))
        ...     open_object(f, "x").shape, open_object(f, "y")
        ((3,), None)
    """
    try:
        return f[key]
    except KeyError:
        try:
            present = key in f or key.strip("/") in dataset_names(f, limit=10**9)
        except Exception:  # the file's tree cannot be walked either
            present = True
        if present:
            raise  # h5py's own error for this object: its metadata cannot be read
        return None


def dataset_at(
    f: h5py.Group, key: str, session: Hashable, path: str, *, fix: str = "Pass the right key=."
) -> h5py.Dataset:
    """``f[key]`` as a dataset (links followed), or a ``KeyError`` listing the datasets present.

    Args:
        f: The open file (or a group of it).
        key: The dataset's path.
        session: Session id (for messages).
        path: File path (for messages).
        fix: The sentence ending the ``KeyError``'s message.

    Raises:
        MissingKeyError: The file has no dataset ``key`` (a ``KeyError``; the message lists
            the datasets it has).
        HDF5FileError: The file has ``key`` but HDF5 cannot open it, or cannot list the
            file's objects: its metadata is damaged.

    Example:
        >>> import h5py, numpy as np, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "k.h5")
        >>> with h5py.File(path, "w") as f:
        ...     _ = f.create_dataset("x", data=np.zeros(3))
        ...     dataset_at(f, "x", 0, path).shape
        (3,)
    """
    with metadata_errors(session, path, f"{key!r}"):
        obj = open_object(f, key)
        present = None if isinstance(obj, h5py.Dataset) else dataset_names(f)
    if obj is None:
        raise MissingKeyError(
            f"session {session!r}: {path} has no dataset {key!r} (or a link to it is broken); "
            f"datasets present: {present}. {fix}"
        )
    if not isinstance(obj, h5py.Dataset):
        raise MissingKeyError(
            f"session {session!r}: {key!r} in {path} is a group, not a dataset; datasets "
            f"present: {present}."
        )
    return obj


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


class Amplification(NamedTuple):
    """What reading one sample costs when its row spans several chunks.

    Attributes:
        chunks_per_row: Chunks one row touches.
        chunk_bytes: Bytes of one chunk (uncompressed: what HDF5 reads and decodes).
        bytes_read: Bytes of chunks one sample read on its own reads.
        bytes_returned: Bytes of the sample.

    Example:
        >>> a = read_amplification(
        ...     SessionLayout(750, (20000,), np.dtype("i2"), 750, 1500, (), (750, 1)))
        >>> a.chunks_per_row, a.bytes_read, a.bytes_returned, a.ratio
        (20000, 30000000, 40000, 750.0)
    """

    chunks_per_row: int
    chunk_bytes: int
    bytes_read: int
    bytes_returned: int

    @property
    def ratio(self) -> float:
        """Bytes read per byte returned (read amplification)."""
        return self.bytes_read / max(1, self.bytes_returned)


def read_amplification(layout: SessionLayout) -> Amplification:
    """The chunks and bytes one sample of ``layout`` reads on its own, versus its size.

    Example:
        >>> read_amplification(SessionLayout(10, (4,), np.dtype("f4"), None, None, ())).ratio
        1.0
    """
    row_bytes = int(np.prod(layout.row_shape, dtype=np.int64)) * max(1, layout.dtype.itemsize)
    if layout.chunk_bytes is None:
        return Amplification(1, 0, row_bytes, row_bytes)
    chunks = layout.chunks_per_row
    return Amplification(chunks, layout.chunk_bytes, chunks * layout.chunk_bytes, row_bytes)


def _bytes_text(nbytes: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{int(nbytes)} bytes"


def advise(
    layouts: Sequence[SessionLayout],
    ids: Sequence[Hashable],
    paths: Sequence[str],
    key: str | None,
) -> None:
    """Warn (``PerformanceHint``) once when rows of ``key`` span many chunks; log the rest.

    The hint states the chunks one row touches, the bytes one sample reads versus the bytes
    it returns (read amplification) and the remedies in order: ``shuffle="block"`` (each
    session read once per pass and held in memory, ``max_session_bytes``), then
    ``loaderkit rechunk`` (whole rows per chunk, once). Compressed chunks of several rows
    are logged (``INFO``): block order keeps their reads chunk-aligned.

    Args:
        layouts: The key's layout in every session.
        ids: Session ids, in the order of ``layouts``.
        paths: File paths, in the order of ``layouts``.
        key: Name of the dataset (for the message).

    Example:
        >>> advise([SessionLayout(10, (4,), np.dtype("f4"), 10, 160, (), (10, 4))], [0],
        ...        ["a.h5"], "x")  # quiet: one chunk per row
    """
    wide = [k for k, lay in enumerate(layouts) if lay.spans_many_chunks]
    if wide:
        worst = max(wide, key=lambda k: read_amplification(layouts[k]).ratio)
        lay, amp = layouts[worst], read_amplification(layouts[worst])
        chunk_text = "x".join(str(c) for c in lay.chunk_shape or ())
        filters = f", {'+'.join(lay.compression)}" if lay.compression else ""
        head = (
            f"rows of {key!r}: one row spans {amp.chunks_per_row:,} chunks (chunk shape "
            f"{chunk_text}, {amp.chunk_bytes:,} bytes each{filters}) in {len(wide)} of "
            f"{counted(len(layouts), 'session')} (e.g. session {ids[worst]!r}, {paths[worst]})."
        )
        rechunk = (
            "rewrite the files once with whole rows per chunk: loaderkit rechunk --key "
            f"{key} --out DIR FILE... (docs/hdf5.md, 'NSD')"
        )
        if lay.shares_chunks:
            held = lay.rows * amp.bytes_returned
            text = (
                f"{head} Reading one sample on its own reads {_bytes_text(amp.bytes_read)} of "
                f"chunks to return {_bytes_text(amp.bytes_returned)}: {amp.ratio:,.0f}x read "
                "amplification. loaderkit reads the rows a batch needs from one session in one "
                "pass over its chunks, so a shuffled batch still costs about a whole session "
                'for every session it draws from. Remedies, in order: (1) shuffle="block" '
                "(or BlockShuffleSampler): each process reads a session once per pass and "
                f"serves its rows from memory ({_bytes_text(held)} per session) where "
                "max_session_bytes holds one (fitted to the memory the process may use: the "
                f"loader's plan says); (2) {rechunk}."
            )
        else:
            text = (
                f"{head} Each sample costs {amp.chunks_per_row:,} chunk reads (HDF5 looks up "
                f"and reads every chunk on its own) for {_bytes_text(amp.bytes_returned)}, no "
                f"more bytes than it returns. Remedy: {rechunk}."
            )
        warn(text, PerformanceHint)
    for k, lay in enumerate(layouts):
        if k in wide or not lay.compression or not lay.chunk_rows or lay.chunk_rows <= 1:
            continue
        logger.info(
            "session %r: %r is compressed (%s) with %d rows per chunk: random rows "
            "decompress whole chunks; BlockShuffleSampler keeps reads chunk-aligned.",
            ids[k],
            key,
            ",".join(lay.compression),
            lay.chunk_rows,
        )
