"""``HDF5SessionDataset``: one map-style dataset over many per-session HDF5 files.

The class itself: hooks (``read``, ``read_rows``, ``build_index``, ``transform``), reading,
lifecycle, pickling. Its parts, each forwarded to (``forwarding``): the reader
(``read.reader.SessionReader``), the accessors (``accessors.SessionAccess``), the budgets
(``budgeting.SessionBudgets``) and the cache view (``remote.cachedsessions.CachedSessions``).
What the files hold is read once, where it is constructed (``inspection.DatasetInspection``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Hashable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from loaderkit.errors import ConfigError
from loaderkit.hdf5.dataset.accessors import SessionAccess
from loaderkit.hdf5.dataset.arguments import (
    check_max_open_files,
    check_max_session_bytes,
    check_options,
    normalize_files,
)
from loaderkit.hdf5.dataset.budgeting import SessionBudgets
from loaderkit.hdf5.dataset.forwarding import deprecated, forward, forward_property
from loaderkit.hdf5.dataset.inspection import DatasetInspection
from loaderkit.hdf5.meta.index import (
    ROW_BITS,
    ROW_MASK,
    SampleIndex,
    check_index,
    decode_index,
    default_index,
    encode_index,
    lookup,
)
from loaderkit.hdf5.meta.layout import (
    add_note,
)
from loaderkit.hdf5.meta.types import Kind
from loaderkit.hdf5.read.runs import plan_runs
from loaderkit.hdf5.read.strategy import (
    ReadMode,
    describe_read_path,
    overrides,
    read_mode,
    uses_default_read,
)
from loaderkit.hdf5.remote.cachedsessions import CachedSessions
from loaderkit.hdf5.remote.sources import SessionSources, session_names
from loaderkit.machine.platform import memory_bytes, open_file_limits
from loaderkit.storage import SessionCache

__all__ = ["HDF5SessionDataset"]

logger = logging.getLogger(__name__)

try:  # Registers Blosc, LZ4, Zstd, bzip2, bitshuffle, ZFP... in every process that reads.
    import hdf5plugin  # noqa: F401
except ImportError:  # pragma: no cover - depends on the environment
    logger.debug("hdf5plugin is not installed: only HDF5's built-in filters are available")

#: ``max_open_files`` while a dataset is built with ``max_open_files=None`` (then fitted).
_STANDALONE_FILES = 8


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
        files: Mapping session id -> path, or a sequence of paths (ids ``0..n-1``). Paths may
            be fsspec URLs (``s3://``, ``gs://``, ``az://``, ``https://``...) and, in a
            sequence, URL globs (``s3://bucket/betas_session*.hdf5``: expanded and sorted
            once, here). ``self.files`` maps each id to a ``pathlib.Path`` for a local file
            and to the URL ``str`` for a remote one. See docs/remote.md.
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
        storage_options: Keyword arguments for the fsspec filesystem of URLs, passed
            unchanged (``{"anon": True}``, ``{"endpoint_url": ...}``, credentials).
        cache: The node's ``loaderkit.SessionCache`` that sessions are read through (whole
            files, fetched ahead in the loader's order). URLs always use one (default:
            ``SessionCache()``, in ``$LOADERKIT_CACHE`` or ``~/.cache/loaderkit``); local
            paths only when it is given (a shared filesystem in front of local NVMe).
            Metadata of remote files is read with range requests and kept in the cache.

    Raises:
        ConfigError: ``max_open_files < 1``, ``max_session_bytes < 0``, a ``mode`` other
            than ``"r"``, ``key=None`` with
            several datasets, row shapes/dtypes that differ between sessions, keys whose rows
            do not align, or a type no torch dtype holds (long double, 128-bit float, time,
            reference, opaque).
        FileNotFoundError: A file, object or bucket is missing (the message names the
            session and path, or the URL).
        StorageAccessError: The store refused the credentials (a ``PermissionError``).
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
        storage_options: Mapping[str, Any] | None = None,
        cache: SessionCache | None = None,
    ) -> None:
        if max_open_files is not None:
            check_max_open_files(max_open_files)
        if max_session_bytes is not None:
            check_max_session_bytes(max_session_bytes)
        self.files: dict[Hashable, Path | str] = normalize_files(
            session_names(files, storage_options)
        )
        self.storage_options = None if storage_options is None else dict(storage_options)
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
        self._item_fast = uses_default_read(type(self), HDF5SessionDataset)
        self._mode = read_mode(type(self), HDF5SessionDataset)
        self._transforms = _overrides(type(self), "transform")
        self._sources = sources = SessionSources.build(
            self._ids, self._paths, storage_options, cache
        )
        for sid, path in self.files.items():
            if isinstance(path, Path) and not path.exists():
                raise FileNotFoundError(
                    f"session {sid!r}: file {path} does not exist. Check the path (and that the "
                    "file system is mounted) or remove the session from `files`."
                )
        inspection = DatasetInspection(
            self._ids,
            self._paths,
            key,
            fields=self.fields,
            sample_axis=sample_axis,
            h5py_options=self.h5py_options,
            sources=sources,
            item_fast=self._item_fast,
            custom_index=_overrides(type(self), "build_index"),
            label=type(self).__name__,
        )
        # the parts: the reader, and what the dataset's public names forward to
        self._reader = reader = inspection.reader(
            self.max_open_files, self.memory_map, self.max_session_bytes
        )
        self.key = inspection.key
        reader.sources = sources
        if sources is not None:
            sources.use_keys(reader.specs)
        self._access = SessionAccess(reader, self._ids, self._item_fast, type(self).__name__)
        self._budgets = SessionBudgets(reader, self.memory_map)
        self._cached = CachedSessions(sources, reader)
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
            self._key = self._cached.keys = self._access.keys = inspection.pack(index, reader)
            self._key.setflags(write=False)
        finally:
            reader.cache.close()  # never leave a file open in the constructing process
        if max_open_files is None:
            soft, _ = open_file_limits()
            budget = self.file_budget(0, soft, memory_bytes()).files
            self.set_open_files(min(budget, self.cached_open_files(0) or budget))
        if max_session_bytes is None:
            self.set_session_bytes(self.session_budget(0, memory_bytes()).bytes)
        else:
            self.set_session_bytes(max_session_bytes)

    # ------------------------------------------------------------------ parts' answers

    file = forward("_access", SessionAccess.file)
    h5dataset = forward("_access", SessionAccess.h5dataset)
    io_paths = forward("_access", SessionAccess.io_paths)
    io_plan = forward("_access", SessionAccess.io_plan)
    layout = forward("_access", SessionAccess.layout)
    handle_cache_info = forward("_access", SessionAccess.handle_cache_info)
    lock = forward_property("_access", SessionAccess, "lock")
    open_files = forward_property("_access", SessionAccess, "open_files")
    sample_type = forward_property("_access", SessionAccess, "sample_type")
    sample_nbytes = forward_property("_access", SessionAccess, "sample_nbytes")
    file_budget = forward("_budgets", SessionBudgets.file_budget)
    session_budget = forward("_budgets", SessionBudgets.session_budget)
    held_info = forward("_budgets", SessionBudgets.held_info)
    session_ids = forward_property("_access", SessionAccess, "session_ids")
    index_arrays = forward("_access", SessionAccess.index_arrays)
    file_memory_bytes = forward_property("_budgets", SessionBudgets, "file_memory_bytes")
    fds_per_file = forward_property("_budgets", SessionBudgets, "fds_per_file")
    session_memory_bytes = forward_property("_budgets", SessionBudgets, "session_memory_bytes")
    held_capacity = forward_property("_budgets", SessionBudgets, "held_capacity")
    session_cache = forward_property("_cached", CachedSessions, "session_cache")
    session_cache_stats = forward("_cached", CachedSessions.session_cache_stats)
    prefetch_watcher = forward("_cached", CachedSessions.prefetch_watcher)
    cached_open_files = forward("_cached", CachedSessions.cached_open_files)
    cache_plan = forward("_cached", CachedSessions.cache_plan)
    shuffle_hint = forward("_cached", CachedSessions.shuffle_hint)
    # old names: a LoaderkitDeprecationWarning naming the new one, then the same answer
    cache = deprecated("session_cache")
    cache_stats = deprecated("session_cache_stats")
    cache_info = deprecated("handle_cache_info")

    def set_open_files(self, files: int) -> None:
        """Keep at most ``files`` (an int >= 1) files open per process from now on.

        See ``SessionBudgets.set_open_files``; ``max_open_files`` says the value in use.
        """
        self._budgets.set_open_files(files)
        self.max_open_files = files

    def set_session_bytes(self, nbytes: int) -> None:
        """Hold at most ``nbytes`` (an int >= 0) of whole sessions in memory per process.

        See ``SessionBudgets.set_session_bytes``; ``max_session_bytes`` says the value in use.
        """
        self._budgets.set_session_bytes(nbytes)
        self.max_session_bytes = nbytes

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
        counts = np.array(self._reader.session_rows(), np.int64)
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
        return self._reader.read_one(-1, self._access.pos_of(session), row)

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

    def close(self) -> None:
        """Close every file this dataset holds open in the current process.

        Sessions held in memory (``max_session_bytes``) are dropped too. The dataset stays
        usable: the next read reopens what it needs.

        Example:
            >>> ds.close()  # doctest: +SKIP
        """
        reader = self.__dict__.get("_reader")
        if reader is not None:
            reader.close()
        sources = self.__dict__.get("_sources")
        if sources is not None:
            sources.close()

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
        self._key = self._cached.keys = self._access.keys = decode_index(state["_key"])
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
        return check_index(index, self._key.shape[0])

    def locate(self, index: int) -> tuple[Hashable, int]:
        """Return ``(session, row)`` of sample ``index``.

        Raises:
            IndexError: ``index`` is out of range.

        Example:
            >>> ds.locate(750)  # doctest: +SKIP
            (1, 0)
        """
        key = int(self._key[self._check_index(index)])
        return self._ids[key >> ROW_BITS], key & ROW_MASK

    def __getitem__(self, index: int) -> Any:
        i = self._check_index(index)
        key = int(self._key[i])
        pos, row = key >> ROW_BITS, key & ROW_MASK
        reader = self._reader
        if self._item_fast:  # no lock: the handle is leased for the read
            sample = reader.read_one(i, pos, row)
        else:
            with reader.cache.lock:  # user code and h5py objects handed out: serial
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
            out.append(self._transform(sample, i, key >> ROW_BITS, key & ROW_MASK))
        return out

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """Read a batch of samples at once (torch's fetcher calls this with a batch).

        With the default reads (*batch-native*), indices are grouped by session, consecutive
        rows are read as one slab into one batch buffer (in shared memory inside a worker):
        a ``loaderkit.workers.collate.RowBatch``, the samples in request order, which
        ``loaderkit.workers.collate.collate`` returns as the batch it was read into (see
        docs/hdf5.md). ``transform``, when overridden, runs on each row after the read; a
        subclass that overrides ``read`` or ``__getitem__`` (not ``read_rows``) gets
        ``self[i]`` once per item.

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
                batch = self._reader.read_runs(self.read_rows, idx, keys, order, starts)
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
            indices: Dataset indices of the batch (one sample each is returned, in this order).
            seed_sample: Called with each index right before that sample's random step.
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
        kind = self.sample_type
        numbers = kind is None or kind.kind is Kind.NUMBER
        return describe_read_path(self._mode, type(self).__name__, self._transforms, numbers)
