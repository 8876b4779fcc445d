"""What an ``HDF5SessionDataset`` says about its files: handles, layouts, types, read paths.

``SessionAccess`` is a part the dataset holds (``ds._access``), over its reader and its
session ids: this process's open ``h5py.File`` and ``h5py.Dataset`` of a session, the handle
cache's lock and statistics, each session's layout, the sample's type and size, and how rows
are read. The dataset's public accessors forward to it.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import h5py
import numpy as np

from loaderkit.errors import ArgumentTypeError, ConfigError
from loaderkit.hdf5.meta.index import unpack_index
from loaderkit.hdf5.meta.inventory import (
    sample_type,
)
from loaderkit.hdf5.meta.layout import (
    SessionLayout,
)
from loaderkit.hdf5.meta.types import Kind, RowType
from loaderkit.hdf5.read.chunkio import ReadPath
from loaderkit.hdf5.read.handles import CacheInfo
from loaderkit.hdf5.read.reader import SessionReader

__all__ = ["SessionAccess"]


class SessionAccess:
    """What a session dataset's files hold and how they are read, per session id.

    Args:
        reader: The dataset's reader (its handle cache, records, keys and types).
        ids: Session ids, in position order.
        item_fast: The dataset reads with the default ``read`` (no hook overridden).
        label: The dataset's class name, for messages and plan rows.

    Example:
        >>> SessionAccess.h5dataset.__name__
        'h5dataset'
    """

    def __init__(
        self, reader: SessionReader, ids: Sequence[Hashable], item_fast: bool, label: str
    ) -> None:
        self.reader = reader
        self.ids = list(ids)
        self.position = {sid: i for i, sid in enumerate(self.ids)}
        self.item_fast = item_fast
        self.label = label
        #: The dataset's packed index (set once it is built).
        self.keys: np.ndarray = np.empty(0, np.int64)

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "keys": None}  # the dataset pickles its index, packed

    def pos_of(self, session: Hashable) -> int:
        """The position of ``session`` in ``ids``.

        Raises:
            KeyError: An unknown session (the message lists the first ids).
        """
        try:
            return self.position[session]
        except (KeyError, TypeError):
            raise KeyError(
                f"unknown session {session!r}; sessions: {self.ids[:20]}"
                + (" ..." if len(self.ids) > 20 else "")
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
        pos = self.pos_of(session)
        with self.lock:
            return self.reader.handle(pos, 0, -1).file

    def h5dataset(self, session: Hashable, key: str | None = None) -> h5py.Dataset:
        """Return this process's cached ``h5py.Dataset`` of ``key`` in ``session``'s file.

        ``key`` is one of the dataset's keys, by its name (as given to ``key=``) or its path,
        or the path of any other dataset in the file (trial ids, labels, timestamps beside
        the per-sample data). Each is looked up once per process and open file and cached
        with the file's handle, so it is cheaper than ``file(session)[key]`` (no name lookup
        per call); it is closed, and looked up again at the next call, when the handle is
        evicted (``max_open_files``) or ``close()`` is called. From several threads, use it
        only inside ``read``/``read_rows`` or while holding ``lock``.

        Args:
            session: Session id.
            key: A key's name, or the path of any dataset in the file (default: the first
                key).

        Returns:
            The open ``h5py.Dataset`` (the ``h5py.Group`` for a group key).

        Raises:
            KeyError: An unknown session, or a path the file has no dataset at (a
                ``MissingKeyError``; the message lists the file's datasets).
            HDF5FileError: The file cannot be opened, or HDF5 cannot open the dataset
                (damaged metadata); the message names the session, the file and the fix.
            ConfigError: ``key`` left out on a dataset built without ``key=``.

        Example:
            >>> class WithStimulus(HDF5SessionDataset):  # doctest: +SKIP
            ...     def read(self, session, row):
            ...         betas = super().read(session, row)
            ...         return betas, int(self.h5dataset(session, "stim_ids")[row])
        """
        pos = self.pos_of(session)
        specs = self.reader.specs
        if key is None and not specs:
            raise ConfigError(
                "h5dataset(session) without a name needs key=; pass the dataset's path: "
                "h5dataset(session, 'name')."
            )
        if key is not None and not isinstance(key, str):
            raise ArgumentTypeError(
                f"h5dataset(): key must be a key's name or a dataset path (str), got "
                f"{type(key).__name__} {key!r}."
            )
        k = next(
            (k for k, spec in enumerate(specs) if key in (None, spec.name)),
            next((k for k, spec in enumerate(specs) if key == spec.path), None),
        )
        with self.lock:
            handle = self.reader.handle(pos, 0, -1)
            if k is not None:
                return handle.datasets[k]
            assert key is not None
            return self.reader.other_dataset(handle, pos, key)

    def io_paths(self, session: Hashable | None = None) -> dict[str, ReadPath]:
        """How each key's rows are read from ``session``'s file, and why (``ReadPath``).

        ``"memory map"``, ``"preadv"``, ``"raw chunks"``, ``"decoded chunks"`` and
        ``"column chunks"`` read outside every lock (threads read in parallel); ``"h5py"``
        is the fallback (serial under h5py's global lock), its reason naming what made the
        faster paths decline. Decided per file when it is opened: this opens ``session``'s
        file if it is not open (and closes it again).

        Args:
            session: Session id (default: the first session).

        Returns:
            ``{key name: ReadPath}``.

        Example:
            >>> ds.io_paths()["betas"].kind  # doctest: +SKIP
            'decoded chunks'
        """
        pos = 0 if session is None else self.pos_of(session)
        reader = self.reader
        key = reader.canonical[pos]
        was_open = reader.cache.peek(key) is not None
        handle = reader.leased(pos, 0, -1)
        try:
            return reader.read_paths(handle)
        finally:
            reader.cache.release(handle)
            if not was_open:
                reader.cache.discard(key)

    def io_plan(self) -> list[tuple[str, bool, Any, str]]:
        """The plan row saying how rows are read (``hdf5_reads``), from the first session.

        Returns:
            ``[(name, given, value, reason)]`` (empty for a dataset without keys).
        """
        reader = self.reader
        if not reader.specs or not self.ids:
            return []
        if not self.item_fast:
            return [
                (
                    "hdf5_reads",
                    False,
                    "h5py (hooks)",
                    f"{self.label} overrides read: its hooks read under the dataset's "
                    "lock, serially",
                )
            ]
        sources = reader.sources
        if sources is not None and sources.cached(0):
            return [
                (
                    "hdf5_reads",
                    False,
                    "per file",
                    "decided when each cached copy is opened (io_paths(session))",
                )
            ]
        paths = self.io_paths()
        if len(paths) == 1:
            value = next(iter(paths.values())).kind
        else:
            value = ", ".join(f"{name}: {path.kind}" for name, path in paths.items())
        reasons = "; ".join(
            f"{name!r}: {path.reason}" + ("" if path.parallel else " (serial under h5py's lock)")
            for name, path in paths.items()
        )
        return [("hdf5_reads", False, value, f"session {self.ids[0]!r}: {reasons}")]

    @property
    def lock(self) -> Any:
        """The re-entrant lock that keeps handed-out h5py objects open (``HookLock``).

        Hold it while using ``file()`` / ``h5dataset()`` objects from several threads; the
        overridden ``read`` / ``read_rows`` / ``__getitem__`` run under it. The default reads
        never take it (they lease their handle).
        """
        return self.reader.cache.lock

    @property
    def open_files(self) -> int:
        """Number of files this dataset holds open in the current process."""
        return len(self.reader.cache)

    def handle_cache_info(self) -> CacheInfo:
        """Statistics of this process's cache of open files (the handle cache).

        Returns:
            ``CacheInfo(hits, misses, evictions, opens, open_files, max_open_files)``; counters
            start at zero in every new process (fork or spawn).

        Example:
            >>> ds.handle_cache_info().opens  # doctest: +SKIP
            8
        """
        return self.reader.cache.info()

    def layout(self, session: Hashable) -> SessionLayout | None:
        """Return the layout of (the first) ``key`` in ``session`` (``None`` without a key).

        Example:
            >>> ds.layout(0).chunk_rows  # doctest: +SKIP
            8
        """
        layouts = self.reader.records[self.pos_of(session)].layouts
        return layouts[0] if layouts else None

    @property
    def sample_type(self) -> RowType | None:
        """How a sample is typed (``None`` when ``read`` is overridden); see docs/hdf5.md.

        Example:
            >>> ds.sample_type.kind  # doctest: +SKIP
            <Kind.NUMBER: 'number'>
        """
        reader = self.reader
        if not self.item_fast or not reader.types:
            return None
        return sample_type(reader.types, reader.specs)

    @property
    def sample_nbytes(self) -> int | None:
        """Bytes of one sample as the default ``read`` returns it (``None`` when overridden).

        Counts fixed-size data (numbers, compound rows); ``None`` for variable-length rows.

        Example:
            >>> ds.sample_nbytes  # doctest: +SKIP
            16384
        """
        reader = self.reader
        if (
            not self.item_fast
            or not reader.types
            or any(
                rt.kind in (Kind.TEXT, Kind.RAGGED)
                or rt.ragged_field() is not None
                or rt.mem_dtype.hasobject
                for rt in reader.types
            )
        ):
            return None
        return sum(reader.row_bytes)

    @property
    def session_ids(self) -> tuple[Hashable, ...]:
        """Session ids in the order of ``files`` (position ``p`` in ``index_arrays``)."""
        return tuple(self.ids)

    def index_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Return read-only ``(session_positions, rows)`` arrays of the whole index.

        ``session_positions[i]`` is the position of sample ``i``'s session in
        ``session_ids``. Samplers use these to find contiguous rows.

        Example:
            >>> pos, rows = ds.index_arrays()  # doctest: +SKIP
        """
        return unpack_index(self.keys)
