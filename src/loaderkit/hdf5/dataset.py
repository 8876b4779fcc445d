"""``HDF5SessionDataset``: one map-style dataset over many per-session HDF5 files.

This module holds the dataset class itself: its hooks (``read``, ``read_rows``,
``build_index``, ``transform``), accessors, lifecycle and pickling. What the files hold is read
once, in the process that constructs the dataset (``loaderkit.hdf5.keys``: keys, layouts, types,
filters, identities); the sample index is packed by ``loaderkit.hdf5.index``; files are opened
lazily, read-only, in the process that reads, and read by ``loaderkit.hdf5.reader.SessionReader``
(per-process handle cache, batched reads, the checks that a file did not change).
"""

from __future__ import annotations

import logging
import operator
import os
from collections.abc import Hashable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from torch.utils.data import Dataset

from loaderkit.budgets import (
    CHUNK_INDEX_BYTES,
    FILE_OVERHEAD_BYTES,
    FileBudget,
    SessionBudget,
    fit_open_files,
    fit_session_bytes,
)
from loaderkit.errors import ConfigError, HDF5FileError, warn
from loaderkit.hdf5.arguments import (
    check_max_open_files,
    check_max_session_bytes,
    check_options,
    normalize_files,
)
from loaderkit.hdf5.diagnose import open_failure
from loaderkit.hdf5.handles import CacheInfo
from loaderkit.hdf5.held import HeldInfo
from loaderkit.hdf5.index import (
    _ROW_BITS,
    _ROW_MASK,
    SampleIndex,
    decode_index,
    default_index,
    encode_index,
    lookup,
    pack_index,
    unpack_index,
)
from loaderkit.hdf5.keys import (
    check_aligned,
    check_rows,
    inspect_session,
    parse_keys,
    row_types,
    sample_type,
)
from loaderkit.hdf5.layout import (
    SessionLayout,
    _dataset_names,
    add_note,
    advise,
    default_chunk_cache,
    open_kwargs,
)
from loaderkit.hdf5.reader import KeySpec, SessionReader, SessionRecord
from loaderkit.hdf5.reading import (
    ReadMode,
    overrides,
    plan_runs,
    read_mode,
    read_runs_hook,
    uses_default_read,
)
from loaderkit.hdf5.types import Kind, RowType
from loaderkit.platform import memory_bytes, open_file_limits

__all__ = [
    "HDF5FileError",
    "HDF5SessionDataset",
    "SampleIndex",
    "SessionLayout",
    "default_chunk_cache",
]

logger = logging.getLogger(__name__)

try:  # Registers Blosc, LZ4, Zstd, bzip2, bitshuffle, ZFP... in every process that reads.
    import hdf5plugin  # noqa: F401
except ImportError:  # pragma: no cover - depends on the environment
    logger.debug("hdf5plugin is not installed: only HDF5's built-in filters are available")

#: ``max_open_files`` while a dataset is being built with ``max_open_files=None`` (the index is
#: built with it; the fitted budget replaces it before the first read).
_STANDALONE_FILES = 8
#: HDF5's own chunk cache size (2.0 and later), used when no ``rdcc_nbytes`` is passed.
_HDF5_DEFAULT_CACHE = 8 << 20


def _overrides(cls: type, name: str) -> bool:
    return overrides(cls, HDF5SessionDataset, name)


class HDF5SessionDataset(Dataset):
    """A map-style dataset over per-session HDF5 files with a bounded per-process handle cache.

    Sample ``i`` is row ``locate(i)[1]`` of the session file ``locate(i)[0]``. The index is built
    once, here, from the files' shapes (override ``build_index`` for your own) and files are
    opened lazily, read-only, at most ``max_open_files`` at a time in every process. Handles are
    never pickled (spawn/forkserver workers get paths and the index) and never shared with a
    forked child (the child closes its inherited copies and opens its own).

    What a sample holds follows the HDF5 type (docs/hdf5.md, "Types"): numbers of any byte
    order become native numpy arrays, compound rows a dict of fields, strings ``str``,
    variable-length arrays a 1-D tensor; types with no torch dtype are refused here.

    Args:
        files: Mapping session id -> path, or a sequence of paths (ids ``0..n-1``).
        key: The HDF5 dataset the default ``read`` returns rows of: a path (links are
            followed), a tuple/list of paths (a sample is a dict path -> row, rows aligned), or
            a mapping name -> path (a dict name -> row). A path naming a *group* makes every
            dataset in it one sample (in h5py's order). ``None`` picks the only dataset of the
            first file (error if there are several).
        fields: Only these fields of a compound (table) dataset are read (``None``: all).
        sample_axis: The axis of ``key`` that indexes samples (default 0; ``-1`` for files
            from MATLAB/Fortran pipelines read as ``dset[..., i]``). Batched reads still read
            runs of consecutive samples as one slab.
        max_open_files: Most files open at once per process (least recently used closed first).
            ``None`` (default): every session when that fits the machine, fewer otherwise
            (``file_budget``): on its own, for this process's descriptor limit and memory; a
            ``loaderkit.DataLoader`` refits it for its number of processes and records the
            arithmetic in its plan. An int is kept as given.
        h5py_options: Extra keyword arguments for ``h5py.File`` (``rdcc_nbytes``,
            ``rdcc_nslots``, ``locking``, ``swmr``, ``driver``, ...). They win over loaderkit's
            defaults (see ``default_chunk_cache``). The mode is always ``"r"``.
        memory_map: Read contiguous, unfiltered rows through a read-only memory map of each
            open file instead of ``os.preadv`` (a memory copy from the page cache, no system
            call per read; see docs/hdf5.md for when it pays). Costs: each open file holds a
            second descriptor, mapped pages count in every reading process's RSS (as shared
            file pages the kernel can reclaim), and every process faults each page in once.
            The file is checked before every copy, so a file truncated between reads is an
            ``HDF5FileError``; one truncated *during* a copy still ends the reading process
            with ``SIGBUS`` (the loader's error then names memory-mapped reads). Off by default.
        max_session_bytes: For keys whose rows span many chunks (NSD betas: ``(750, V)``,
            chunks ``(750, 1)``; see docs/hdf5.md): most bytes of whole sessions' rows each
            process holds in memory, so that a session is read once while its rows are
            served (least recently used dropped first). ``None`` (default): as many sessions
            as fit a quarter of memory shared by the loader's processes
            (``session_budget``; a ``loaderkit.DataLoader`` refits it and records it in its
            plan). ``0``: nothing held; every batch reads its rows in one pass over their
            sessions' chunks. An int is kept as given.

    Raises:
        ConfigError: ``max_open_files < 1``, ``max_session_bytes < 0``, a ``mode`` other
            than ``"r"``, ``key=None`` with
            several datasets, row shapes/dtypes that differ between sessions, keys whose rows
            do not align, or a type no torch dtype holds (long double, 128-bit float, time,
            reference, opaque).
        FileNotFoundError: A file is missing (the message names the session and path).
        HDF5FileError: A file is not readable HDF5 (an ``OSError``), or a compression filter
            the data needs is not available (the message names it and its package).
        KeyError: ``key`` is missing from a file (the message lists the datasets present).

    Example:
        >>> import h5py, numpy as np, tempfile, os
        >>> root = tempfile.mkdtemp()
        >>> paths = [os.path.join(root, f"s{i}.h5") for i in range(2)]
        >>> for p in paths:
        ...     with h5py.File(p, "w") as f:
        ...         _ = f.create_dataset("betas", data=np.zeros((3, 4), ">f4"))
        ...         _ = f.create_dataset("labels", data=np.arange(3))
        >>> with HDF5SessionDataset(paths, key="betas") as ds:
        ...     len(ds), ds.locate(4), ds[4].shape, ds[4].dtype.isnative
        (6, (1, 1), (4,), True)
        >>> with HDF5SessionDataset(paths, key=("betas", "labels")) as ds:
        ...     ds[4].get("betas").shape, int(ds[4].get("labels"))
        ((4,), 1)
    """

    def __init__(
        self,
        files: Mapping[Hashable, str | os.PathLike[str]] | Sequence[str | os.PathLike[str]],
        *,
        key: str | Sequence[str] | Mapping[str, str] | None = None,
        fields: Sequence[str] | None = None,
        sample_axis: int = 0,
        max_open_files: int | None = None,
        h5py_options: Mapping[str, Any] | None = None,
        memory_map: bool = False,
        max_session_bytes: int | None = None,
    ) -> None:
        if max_open_files is not None:
            check_max_open_files(max_open_files)
        if max_session_bytes is not None:
            check_max_session_bytes(max_session_bytes)
        self.files: dict[Hashable, Path] = normalize_files(files)
        self.key = key
        self.fields = None if fields is None else tuple(fields)
        self.sample_axis = sample_axis
        #: The value passed (``None``: fitted to the machine, see ``file_budget``).
        self.max_open_files_requested = max_open_files
        #: Files open at once per process, as used now.
        self.max_open_files = max_open_files or _STANDALONE_FILES
        self.h5py_options: dict[str, Any] = check_options(h5py_options)
        self.memory_map = bool(memory_map)
        #: The value passed (``None``: fitted to the machine, see ``session_budget``).
        self.max_session_bytes_requested = max_session_bytes
        #: Bytes of whole sessions held in memory per process, as used now.
        self.max_session_bytes = max_session_bytes or 0
        self._ids: list[Hashable] = list(self.files)
        self._paths: list[str] = [os.fspath(p) for p in self.files.values()]
        self._position: dict[Hashable, int] = {sid: i for i, sid in enumerate(self._ids)}
        self._item_fast = uses_default_read(type(self), HDF5SessionDataset)
        self._mode = read_mode(type(self), HDF5SessionDataset)
        self._transforms = _overrides(type(self), "transform")
        for sid, path in self.files.items():
            if not path.exists():
                raise FileNotFoundError(
                    f"session {sid!r}: file {path} does not exist. Check the path (and that the "
                    "file system is mounted) or remove the session from `files`."
                )
        self._reader = self._inspect_files()
        try:
            try:
                index = self.build_index()
            except Exception as exc:
                add_note(
                    exc,
                    f"loaderkit: in {type(self).__name__}.build_index() (process "
                    f"{os.getpid()}, {len(self._ids)} sessions)",
                )
                raise
            self._key = self._index_key(index)
            self._key.setflags(write=False)
        finally:
            self._reader.cache.close()  # never leave a file open in the constructing process
        if max_open_files is None:
            soft, _ = open_file_limits()
            self.set_open_files(self.file_budget(0, soft, memory_bytes()).files)
        if max_session_bytes is None:
            self.set_session_bytes(self.session_budget(0, memory_bytes()).bytes)
        else:
            self.set_session_bytes(max_session_bytes)

    # ------------------------------------------------------------------ file budget

    @property
    def file_memory_bytes(self) -> int:
        """Memory one open session file may hold (chunk cache and HDF5's per-file state).

        The chunk cache counts for chunked data only; the per-file state is
        ``loaderkit.budgets.FILE_OVERHEAD_BYTES``, plus ``CHUNK_INDEX_BYTES`` when rows span
        chunks shared with other rows (every read walks the whole chunk index).

        Example:
            >>> ds.file_memory_bytes  # doctest: +SKIP
            9437184
        """
        cache = 0
        if self._reader.chunked:
            cache = max(
                int(kw.get("rdcc_nbytes", _HDF5_DEFAULT_CACHE)) for kw in self._reader.open_kwargs
            )
        index = CHUNK_INDEX_BYTES if any(self._reader.any_wide) else 0
        return cache + FILE_OVERHEAD_BYTES + index

    def file_budget(
        self, num_workers: int, soft_limit: int | None, memory: int | None
    ) -> FileBudget:
        """The ``max_open_files`` that fits a loader with ``num_workers`` workers.

        ``loaderkit.budgets.fit_open_files`` over this dataset's sessions and
        ``file_memory_bytes``: every session when they fit under half the descriptor limit and
        within a share of memory, fewer otherwise. Applied only when ``max_open_files`` was
        left unset (``max_open_files_requested is None``); an explicit value always wins.

        Args:
            num_workers: Worker processes of the loader (0: the main process only).
            soft_limit: Soft ``RLIMIT_NOFILE`` (``None``: unlimited).
            memory: Memory of the machine or container in bytes (``None``: unknown).

        Returns:
            The ``FileBudget``.

        Example:
            >>> ds.file_budget(8, 1024, 24 << 30).files  # doctest: +SKIP
            16
        """
        return fit_open_files(
            len(self._ids),
            num_workers,
            soft_limit,
            self.file_memory_bytes,
            memory,
            self.fds_per_file,
        )

    @property
    def fds_per_file(self) -> int:
        """Descriptors one open session file holds: 2 when its rows are memory-mapped.

        Python's ``mmap`` keeps a duplicate of the file's descriptor while the map is open.
        """
        return 2 if self.memory_map and self._reader.contiguous else 1

    def set_open_files(self, files: int) -> None:
        """Keep at most ``files`` files open per process from now on (the loader's budget).

        Files over the new bound are closed as others are opened. Worker processes started
        later inherit the bound with the dataset.

        Args:
            files: An int >= 1.

        Raises:
            ConfigError: ``files`` is not an int >= 1.
        """
        check_max_open_files(files)
        self.max_open_files = files
        self._reader.cache.max_open = files

    # ------------------------------------------------------------------ sessions in memory

    @property
    def session_memory_bytes(self) -> int:
        """Bytes the largest session's rows take when held in memory (``max_session_bytes``).

        Counts the keys whose rows span chunks shared with other rows
        (``SessionLayout.shares_chunks``),
        the only ones held; 0 when there are none.

        Example:
            >>> ds.session_memory_bytes  # doctest: +SKIP
            30000000
        """
        return max(self._reader.session_nbytes, default=0)

    def session_budget(self, num_workers: int, memory: int | None) -> SessionBudget:
        """The ``max_session_bytes`` that fits a loader with ``num_workers`` workers.

        ``loaderkit.budgets.fit_session_bytes`` over this dataset's sessions and
        ``session_memory_bytes``: as many whole sessions as fit a quarter of memory shared
        by the loader's processes. Applied only when ``max_session_bytes`` was left unset.

        Args:
            num_workers: Worker processes of the loader (0: the main process only).
            memory: Memory of the machine or container in bytes (``None``: unknown).

        Returns:
            The ``SessionBudget``.

        Example:
            >>> ds.session_budget(2, 24 << 30).sessions  # doctest: +SKIP
            4
        """
        held = [n for n in self._reader.session_nbytes if n]
        return fit_session_bytes(max(held, default=0), len(held), num_workers, memory)

    def set_session_bytes(self, nbytes: int) -> None:
        """Hold at most ``nbytes`` of whole sessions in memory per process from now on.

        Sessions over the new bound are dropped now (in this process); worker processes
        started later inherit the bound with the dataset.

        Args:
            nbytes: An int >= 0 (0: hold nothing).

        Raises:
            ConfigError: ``nbytes`` is not an int >= 0.

        Example:
            >>> ds.set_session_bytes(2 << 30)  # doctest: +SKIP
        """
        check_max_session_bytes(nbytes)
        self.max_session_bytes = nbytes
        self._reader.held.set_max_bytes(nbytes)

    @property
    def held_capacity(self) -> int | None:
        """Whole sessions ``max_session_bytes`` holds at once (``None``: nothing to hold).

        ``None`` when no key's rows span many chunks; 0 when not even one session fits (each
        batch then reads its rows in one pass over their sessions' chunks).
        ``BlockShuffleSampler`` keeps its window of active sessions within it, so that each
        session is read once per pass in each process.

        Example:
            >>> ds.held_capacity  # doctest: +SKIP
            4
        """
        size = self.session_memory_bytes
        if size == 0:
            return None
        held = sum(1 for n in self._reader.session_nbytes if n)
        return min(held, self.max_session_bytes // size)

    def held_info(self) -> HeldInfo:
        """Statistics of the sessions held in memory by the current process.

        Returns:
            ``HeldInfo(loads, hits, evictions, held, held_bytes, max_bytes)``; counters start
            at zero in every new process.

        Example:
            >>> ds.held_info().loads  # doctest: +SKIP
            4
        """
        return self._reader.held.info()

    # ------------------------------------------------------------------ construction helpers

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
            locking = self.h5py_options.get("locking", True) is not False
            hint, os_error = open_failure(path, locking=locking)
            raise HDF5FileError(
                *((os_error.errno,) if os_error is not None and os_error.errno else ()),
                f"session {sid!r}: cannot open {path} as HDF5: {hint or 'HDF5 refused it'} "
                f"(HDF5: {exc}).",
            ) from (os_error or exc)

    def _inspect_files(self) -> SessionReader:
        """Read what every file holds (main process only) and build the reader over it."""
        specs = parse_keys(self.key, self.sample_axis)
        if specs is None:
            found = self._autodetect_key()
            specs = [] if found is None else parse_keys(found, self.sample_axis) or []
            self.key = found
        records: list[SessionRecord] = []
        resolved: list[KeySpec] = list(specs)
        uneven = [False] * len(specs)
        for pos, (sid, path) in enumerate(zip(self._ids, self._paths, strict=True)):
            with self._open_for_inspection(pos) as f:
                record, resolved, odd = inspect_session(f, specs, sid, path)
            records.append(record)
            uneven = [a or b for a, b in zip(uneven, odd, strict=True)]
        files = list(zip(self._ids, self._paths, strict=True))
        check_aligned(records, resolved, files)
        types: list[RowType] = []
        type_error: ConfigError | None = None
        try:
            check_rows(records, resolved, files)
            types = row_types(records, resolved, self.fields, files, self._open_for_inspection)
        except ConfigError as exc:
            if self._item_fast:
                raise
            # ``read`` is overridden and may convert such rows itself: the base ``read``
            # raises this when (and only when) an override calls it through ``super()``
            type_error = exc
        for k, spec in enumerate(resolved):  # group keys: one row shape in every session
            shapes = {rec.layouts[k].row_shape for rec in records if rec.layouts[k].rows}
            uneven[k] = uneven[k] or (spec.members and len(shapes) > 1)
            if not spec.members:
                advise([rec.layouts[k] for rec in records], self._ids, self._paths, spec.path)
        first = [rec.layouts[0] if rec.layouts else None for rec in records]
        return SessionReader(
            ids=self._ids,
            paths=self._paths,
            canonical=self._canonical(records),
            specs=resolved,
            types=types,
            type_error=type_error,
            records=records,
            open_kwargs=[
                open_kwargs(lay, self.h5py_options, default_read=self._item_fast) for lay in first
            ],
            max_open=self.max_open_files,
            memory_map=self.memory_map,
            fast=self._item_fast,
            single=isinstance(self.key, str),
            label=f"{type(self).__name__} over {len(self._ids)} session(s)",
            uneven=[k for k, odd in enumerate(uneven) if odd],
            max_session_bytes=self.max_session_bytes,
        )

    def _canonical(self, records: Sequence[SessionRecord]) -> list[int]:
        """Per session, the first session with the same file (path, symlink or hard link)."""
        seen: dict[tuple[int, int], int] = {}
        canonical = []
        for pos, rec in enumerate(records):
            ident = rec.identity
            if ident is None:
                canonical.append(pos)
                continue
            first = seen.setdefault((ident.device, ident.inode), pos)
            if first != pos:
                warn(
                    f"sessions {self._ids[first]!r} ({self._paths[first]}) and "
                    f"{self._ids[pos]!r} ({self._paths[pos]}) are the same file (same device "
                    "and inode: a repeated path, a symlink or a hard link): its samples appear "
                    "once per session. Remove one of them unless you mean to repeat the file."
                )
            canonical.append(first)
        return canonical

    def _autodetect_key(self) -> str | None:
        with self._open_for_inspection(0) as f:
            names = _dataset_names(f, limit=10**9)
        if len(names) == 1:
            return names[0]
        if _overrides(type(self), "build_index") and not self._item_fast:
            return None  # the subclass reads and indexes on its own
        raise ConfigError(
            f"key=None but session {self._ids[0]!r} ({self._paths[0]}) holds "
            f"{len(names)} datasets {names[:25]}; pass key='<name of the per-sample dataset>', "
            "several as key=('a', 'b'), or a group whose datasets are the samples."
        )

    def _index_key(self, index: Any) -> np.ndarray:
        records = self._reader.records
        check_rows = self._item_fast and all(rec.layouts for rec in records)
        return pack_index(
            index,
            self._ids,
            row_counts=[rec.layouts[0].rows for rec in records] if check_rows else None,
            paths=self._paths,
            key=self._key_name,
        )

    @property
    def _key_name(self) -> str | None:
        specs = self._reader.specs
        return specs[0].path if len(specs) == 1 else None if not specs else str(self.key)

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
        counts = np.array(
            [rec.layouts[0].rows if rec.layouts else 0 for rec in self._reader.records], np.int64
        )
        return default_index(self._ids, counts)

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
        return self._reader.read_one(-1, self._pos_of(session), row)

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
        with self.lock:
            return self._reader.handle(pos, 0, -1).file

    def h5dataset(self, session: Hashable, key: str | None = None) -> h5py.Dataset:
        """Return the cached ``h5py.Dataset`` of ``key`` in ``session``'s file.

        Cheaper than ``file(session)[key]`` (no name lookup per call).

        Args:
            session: Session id.
            key: Which key, by its name (default: the first).

        Returns:
            The open ``h5py.Dataset`` (the ``h5py.Group`` for a group key).

        Example:
            >>> ds.h5dataset(0)[3].shape  # doctest: +SKIP
            (64, 64)
        """
        pos = self._pos_of(session)
        specs = self._reader.specs
        if not specs:
            raise ConfigError("h5dataset() needs key=; use file(session)[name] instead.")
        names = [spec.name for spec in specs]
        if key is not None and key not in names:
            raise KeyError(f"h5dataset(): no key {key!r}; keys: {names}")
        k = 0 if key is None else names.index(key)
        with self.lock:
            return self._reader.handle(pos, 0, -1).datasets[k]

    @property
    def lock(self) -> Any:
        """The re-entrant lock guarding this process's handle cache."""
        return self._reader.cache.lock

    @property
    def open_files(self) -> int:
        """Number of files this dataset holds open in the current process."""
        return len(self._reader.cache)

    def cache_info(self) -> CacheInfo:
        """Handle-cache statistics of the current process.

        Returns:
            ``CacheInfo(hits, misses, evictions, opens, open_files, max_open_files)``; counters
            start at zero in every new process (fork or spawn).

        Example:
            >>> ds.cache_info().opens  # doctest: +SKIP
            8
        """
        return self._reader.cache.info()

    def layout(self, session: Hashable) -> SessionLayout | None:
        """Return the layout of (the first) ``key`` in ``session`` (``None`` without a key).

        Example:
            >>> ds.layout(0).chunk_rows  # doctest: +SKIP
            8
        """
        layouts = self._reader.records[self._pos_of(session)].layouts
        return layouts[0] if layouts else None

    @property
    def sample_type(self) -> RowType | None:
        """How a sample is typed (``None`` when ``read`` is overridden); see docs/hdf5.md.

        Example:
            >>> ds.sample_type.kind  # doctest: +SKIP
            <Kind.NUMBER: 'number'>
        """
        reader = self._reader
        if not self._item_fast or not reader.types:
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
        reader = self._reader
        if (
            not self._item_fast
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
        return tuple(self._ids)

    def index_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Return read-only ``(session_positions, rows)`` arrays of the whole index.

        ``session_positions[i]`` is the position of sample ``i``'s session in
        ``session_ids``. Samplers use these to find contiguous rows.

        Example:
            >>> pos, rows = ds.index_arrays()  # doctest: +SKIP
        """
        return unpack_index(self._key)

    def close(self) -> None:
        """Close every file this dataset holds open in the current process.

        Sessions held in memory (``max_session_bytes``) are dropped too. The dataset stays
        usable: the next read reopens what it needs.

        Example:
            >>> ds.close()  # doctest: +SKIP
        """
        reader = self.__dict__.get("_reader")
        if reader is not None and reader.__dict__.get("cache") is not None:
            reader.cache.close()
        if reader is not None and reader.__dict__.get("held") is not None:
            reader.held.clear()

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
        state["_key"] = encode_index(state["_key"])
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._key = decode_index(state["_key"])
        self._mode = read_mode(type(self), HDF5SessionDataset)
        self._transforms = _overrides(type(self), "transform")

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

    def __getitem__(self, index: int) -> Any:
        i = self._check_index(index)
        key = int(self._key[i])
        pos, row = key >> _ROW_BITS, key & _ROW_MASK
        reader = self._reader
        with reader.cache.lock:
            if self._item_fast:
                sample = reader.read_one(i, pos, row)
            else:
                try:
                    sample = self.read(self._ids[pos], row)
                except Exception as exc:
                    reader.cache.discard(reader.canonical[pos])
                    reader.note(exc, pos, row, i)
                    raise
        return self._transform(sample, i, pos, row) if self._transforms else sample

    def _transform(self, sample: Any, index: int, pos: int, row: int) -> Any:
        """``transform`` with the error context every other hook gets."""
        try:
            return self.transform(sample, index)
        except Exception as exc:
            add_note(
                exc, f"in {type(self).__name__}.transform: " + self._reader.context(pos, row, index)
            )
            raise

    def _transform_all(
        self, batch: Sequence[Any], idx: np.ndarray, keys: np.ndarray, seed_sample: Any = None
    ) -> list[Any]:
        out = []
        for sample, i, key in zip(batch, idx.tolist(), keys.tolist(), strict=True):
            if seed_sample is not None:
                seed_sample(i)
            out.append(self._transform(sample, i, key >> _ROW_BITS, key & _ROW_MASK))
        return out

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """Read a batch of samples at once (torch's fetcher calls this with a batch).

        With the default reads (*batch-native*), indices are grouped by session, consecutive
        rows are read as one slab, and every key's rows land straight in one batch buffer
        allocated as ``default_collate`` would (in shared memory inside a worker). The result
        is a ``loaderkit.collate.RowBatch``: a list of the samples, in request order (views of
        the buffer), so any ``collate_fn`` sees what per-item reads give, while
        ``loaderkit.collate.collate`` (filled in by the loader when ``collate_fn`` is unset)
        returns the batch it was read into: a tensor, or a dict of per-field batches for
        compound rows and several keys; no split, no re-stack. ``transform``, when
        overridden, is applied to each row after the batched read. When a subclass overrides
        ``read`` or ``__getitem__`` (and not ``read_rows``), ``self[i]`` is called once per
        item.

        Args:
            indices: Dataset indices, any order, duplicates allowed.

        Returns:
            One sample per index, in the order given.

        Example:
            >>> [x.shape for x in ds.__getitems__([5, 6, 7])]  # doctest: +SKIP
            [(64, 64), (64, 64), (64, 64)]
        """
        mode = self._mode
        if mode is ReadMode.ITEM:
            return [self[i] for i in indices]
        idx, keys = lookup(self._key, indices)
        if idx.size == 0:
            return []
        if mode is ReadMode.ROWS:
            with self.lock:
                order, starts = plan_runs(keys, sort=self._reader.chunked, always=True)
                batch = read_runs_hook(self._reader, self.read_rows, idx, keys, order, starts)
        else:
            batch = self._reader.read_batch(idx, keys)
        if self._transforms:
            return self._transform_all(batch, idx, keys)
        return batch

    def transform(self, sample: Any, index: int) -> Any:
        """Per-sample hook applied after reading (default: none). Override it for augmentation.

        It runs on every sample, after the batched read, in whatever process reads (a worker):
        ``sample`` is the row as read (a numpy array view, yours to modify or replace) and
        ``index`` its dataset index. Draw randomness from ``loaderkit.worker_rng()``,
        ``torch``, ``numpy`` or ``random``: with ``sample_seeding=True`` the loader seeds them
        from ``(seed, epoch, index)`` right before each call, and the batch is still read with
        one batched read (overriding ``__getitem__`` or ``read`` instead gives per-sample
        reads). Samples that come out of ``transform`` are collated by ``default_collate``.

        Args:
            sample: The sample as read.
            index: Its dataset index.

        Returns:
            The transformed sample.

        Example:
            >>> class Noisy(HDF5SessionDataset):  # doctest: +SKIP
            ...     def transform(self, sample, index):
            ...         return sample + np.random.normal(0, 0.1, sample.shape).astype(sample.dtype)
        """
        return sample

    def getitems_seeded(self, indices: Sequence[int], seed_sample: Any) -> list[Any]:
        """``__getitems__`` with ``seed_sample(index)`` called right before each random step.

        ``sample_seeding=True`` calls this instead of reading sample by sample: the reads are
        deterministic, so the batch is read at once and only ``transform`` (when overridden) runs
        per sample, each after its ``seed_sample(index)``. A subclass that overrides ``read``,
        ``read_rows`` or ``__getitem__`` gets ``seed_sample(i)`` then ``self[i]`` for each index.

        Args:
            indices: Dataset indices of the batch.
            seed_sample: Called with each index right before that sample's random step.

        Returns:
            One sample per index, in the order given.
        """
        if self._mode is not ReadMode.FAST:
            samples = []
            for i in indices:
                seed_sample(int(i))
                samples.append(self[i])
            return samples
        idx, keys = lookup(self._key, indices)
        if idx.size == 0:
            return []
        batch = self._reader.read_batch(idx, keys)
        if not self._transforms:
            return batch  # nothing random happens: nothing to seed
        return self._transform_all(batch, idx, keys, seed_sample)

    @property
    def read_path(self) -> tuple[str, str]:
        """How batches are read (``"batch-native"``, ``"runs"`` or ``"per-sample"``) and why.

        Example:
            >>> ds.read_path[0]  # doctest: +SKIP
            'batch-native'
        """
        name = type(self).__name__
        if self._mode is ReadMode.ITEM:
            return (
                "per-sample",
                f"{name} overrides read or __getitem__: one self[i] per sample "
                "(override transform instead to keep batched reads)",
            )
        if self._mode is ReadMode.ROWS:
            return "runs", f"{name} overrides read_rows: one call per run of consecutive rows"
        if self._transforms:
            return (
                "batch-native",
                "rows read into one batch buffer, then transform per sample "
                "(default_collate stacks the results)",
            )
        kind = self.sample_type
        what = (
            "one batch tensor"
            if kind is None or kind.kind is Kind.NUMBER
            else ("one buffer per key, split into per-field batches")
        )
        return (
            "batch-native",
            f"rows read straight into {what} (in shared memory in a worker); "
            "collation returns it as is",
        )
