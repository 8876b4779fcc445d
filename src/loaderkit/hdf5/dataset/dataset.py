"""``HDF5SessionDataset``: one map-style dataset over many per-session HDF5 files.

This module holds the dataset class itself: its hooks (``read``, ``read_rows``,
``build_index``, ``transform``), reading, lifecycle and pickling; its bases add the accessors
(``accessors``), the file and memory budgets (``budgeting``) and the construction steps
(``inspection``). What the files hold is read once, in the process that constructs the dataset
(``loaderkit.hdf5.meta.inventory``: keys, layouts, types, filters, identities); the sample
index is packed by ``loaderkit.hdf5.meta.index``; files are opened lazily, read-only, in the
process that reads, and read by ``loaderkit.hdf5.read.reader.SessionReader`` (per-process
handle cache, batched reads, the checks that a file did not change).
"""

from __future__ import annotations

import logging
import operator
import os
from collections.abc import Hashable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from loaderkit.errors import ConfigError, HDF5FileError
from loaderkit.hdf5.dataset.accessors import SessionAccess
from loaderkit.hdf5.dataset.arguments import (
    check_max_open_files,
    check_max_session_bytes,
    check_options,
    normalize_files,
)
from loaderkit.hdf5.dataset.budgeting import SessionBudgets
from loaderkit.hdf5.dataset.inspection import DatasetInspection
from loaderkit.hdf5.meta.index import (
    ROW_BITS,
    ROW_MASK,
    SampleIndex,
    decode_index,
    default_index,
    encode_index,
    lookup,
)
from loaderkit.hdf5.meta.layout import (
    SessionLayout,
    add_note,
    default_chunk_cache,
)
from loaderkit.hdf5.meta.types import Kind
from loaderkit.hdf5.read.runs import plan_runs
from loaderkit.hdf5.read.strategy import ReadMode, overrides, read_mode, uses_default_read
from loaderkit.hdf5.remote.cachedsessions import CachedSessions
from loaderkit.hdf5.remote.sources import SessionSources, session_names
from loaderkit.machine.platform import memory_bytes, open_file_limits
from loaderkit.storage import SessionCache

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


def _overrides(cls: type, name: str) -> bool:
    return overrides(cls, HDF5SessionDataset, name)


class HDF5SessionDataset(SessionAccess, SessionBudgets, CachedSessions, DatasetInspection, Dataset):
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
        self._position: dict[Hashable, int] = {sid: i for i, sid in enumerate(self._ids)}
        self._item_fast = uses_default_read(type(self), HDF5SessionDataset)
        self._mode = read_mode(type(self), HDF5SessionDataset)
        self._transforms = _overrides(type(self), "transform")
        self._custom_index = _overrides(type(self), "build_index")
        self._sources = SessionSources.build(self._ids, self._paths, storage_options, cache)
        #: The node cache remote (and, when given, local) sessions are read through.
        self.cache = None if self._sources is None else self._sources.cache
        for sid, path in self.files.items():
            if isinstance(path, Path) and not path.exists():
                raise FileNotFoundError(
                    f"session {sid!r}: file {path} does not exist. Check the path (and that the "
                    "file system is mounted) or remove the session from `files`."
                )
        self._reader = self._inspect_files()
        self._reader.sources = self._sources
        if self._sources is not None:
            self._sources.use_keys(self._reader.specs)
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
            budget = self.file_budget(0, soft, memory_bytes()).files
            self.set_open_files(min(budget, self.cached_open_files(0) or budget))
        if max_session_bytes is None:
            self.set_session_bytes(self.session_budget(0, memory_bytes()).bytes)
        else:
            self.set_session_bytes(max_session_bytes)

    # ------------------------------------------------------------------ file budget

    # ------------------------------------------------------------------ sessions in memory

    # ------------------------------------------------------------------ construction helpers

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
        rows are read as one slab, and every key's rows land straight in one batch buffer
        allocated as ``default_collate`` would (in shared memory inside a worker). The result
        is a ``loaderkit.workers.collate.RowBatch``: a list of the samples, in request order (views
        of the buffer), so any ``collate_fn`` sees what per-item reads give, while
        ``loaderkit.workers.collate.collate`` (filled in by the loader when ``collate_fn`` is unset)
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
