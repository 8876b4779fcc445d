"""``HDF5SessionDataset``: one map-style dataset over many per-session HDF5 files.

The class shows what a subclass author uses: the hooks (``read``, ``read_rows``,
``build_index``, ``transform``), the helpers a hook calls (``file``, ``h5dataset``,
``layout``, ``lock``), its constructor's arguments (read-only), ``locate``, ``session_ids``
and ``close``. Its parts answer the rest, each reached through one attribute: ``handles``
(``accessors.SessionHandles``: open files, read paths, types), ``budgets``
(``budgeting.DatasetBudgets``: open-file and held-session budgets) and ``cached_sessions``
(``remote.cachedsessions.CachedSessions``: the node cache). What the loader asks of it is
``loader_support()`` (``loaderkit.support.LoaderSupport``). The reader
(``read.reader.SessionReader``) owns the index and the open files; what the files hold is read
once, where the dataset is constructed (``inspection.DatasetInspection``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from torch.utils.data import Dataset

from loaderkit.batches.contract import BatchMemory
from loaderkit.errors import (
    ArgumentTypeError,
    ConfigError,
    MovedAttribute,
    add_note,
)
from loaderkit.hdf5.dataset.accessors import SessionHandles
from loaderkit.hdf5.dataset.arguments import (
    check_max_open_files,
    check_max_session_bytes,
    check_options,
    normalize_files,
)
from loaderkit.hdf5.dataset.budgeting import DatasetBudgets
from loaderkit.hdf5.dataset.inspection import DatasetInspection
from loaderkit.hdf5.dataset.readmode import ReadMode, overrides, read_mode, uses_default_read
from loaderkit.hdf5.meta.index import (
    ROW_BITS,
    ROW_MASK,
    SampleIndex,
    check_index,
    default_index,
    lookup,
    unpack_index,
)
from loaderkit.hdf5.meta.layout import SessionLayout
from loaderkit.hdf5.read.runs import plan_runs, read_runs
from loaderkit.hdf5.remote.cachedsessions import CachedSessions
from loaderkit.hdf5.remote.sources import SessionSources, session_names
from loaderkit.machine.platform import open_file_limits, process_memory
from loaderkit.plan import UNSET, PlanEntry, counted
from loaderkit.storage import SessionCache
from loaderkit.support import DatasetResources, Fitted, LoaderShape, LoaderSupport, SessionIndex

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
    """A map-style dataset over per-session HDF5 files with a bounded per-process file pool.

    Sample ``i`` is row ``locate(i)[1]`` of the session file ``locate(i)[0]``. The index is built
    once, here, from the files' shapes (override ``build_index`` for your own) and files are
    opened lazily, read-only, at most ``max_open_files`` at a time in every process. Handles are
    never pickled (spawn/forkserver workers get paths and the index) and never shared with a
    forked child (the child closes its inherited copies and opens its own).

    What a sample holds follows the HDF5 type (docs/hdf5.md, "Types"): numbers of any byte
    order become native numpy arrays, compound rows a dict of fields, strings ``str``,
    variable-length arrays a 1-D tensor; types with no torch dtype are refused here.

    On the class: the hooks a subclass overrides (``read``, ``read_rows``, ``build_index``,
    ``transform``; ``__getitem__``/``__getitems__``), the helpers a hook calls (``file``,
    ``h5dataset``, ``layout``, ``lock``), the constructor's arguments (read-only),
    ``locate``, ``session_ids`` and ``close``/``with``. Figures live on three parts:
    ``handles`` (this process's open files, how rows are read), ``budgets`` (open-file and
    held-session budgets) and ``cached_sessions`` (the node cache); what the loader asks is
    ``loader_support()``.

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
            (``budgets.file_budget``): on its own, for this process's descriptor limit and
            memory; a ``loaderkit.DataLoader`` refits it for its number of processes and
            records the arithmetic in its plan. An int is kept as given.
        h5py_options: Extra keyword arguments for ``h5py.File`` (``rdcc_nbytes``,
            ``rdcc_nslots``, ``locking``, ``swmr``, ``driver``, ...). They win over loaderkit's
            defaults (see ``default_chunk_buffer``). The mode is always ``"r"``.
        memory_map: Read contiguous, unfiltered rows through a read-only memory map of each
            open file instead of ``os.preadv`` (a memory copy from the page cache, no system
            call per read; see docs/hdf5.md for when it pays). Costs: each open file holds a
            second descriptor, mapped pages count in every reading process's RSS (as shared
            file pages the kernel can reclaim), and every process faults each page in once.
            The file is checked before every copy, so a file truncated between reads is an
            ``HDF5FileError``; one truncated *during* a copy still ends the reading process
            with ``SIGBUS`` (the loader's error then names memory-mapped reads). ``None``
            (default): whole rows are read with ``os.preadv``, and a CSR matrix's (AnnData)
            batches are copied out of a read-only map of each open file once they come from
            the page cache alone (each file's size checked before every batch; pages that must
            come from the disk are read with ``os.preadv``, the misses asked for together).
            ``False``: no memory map at all.
        max_session_bytes: For keys whose rows span many chunks (NSD betas: ``(750, V)``,
            chunks ``(750, 1)``; see docs/hdf5.md): most bytes of whole sessions' rows each
            process holds in memory, so that a session is read once while its rows are
            served (least recently used dropped first). ``None`` (default): as many sessions
            as fit a quarter of memory shared by the loader's processes
            (``budgets.session_budget``; a ``loaderkit.DataLoader`` refits it and records it
            in its plan). ``0``: nothing held; every batch reads its rows in one pass over their
            sessions' chunks. An int is kept as given.
        storage_options: Keyword arguments for the fsspec filesystem of URLs, passed
            unchanged (``{"anon": True}``, ``{"endpoint_url": ...}``, credentials).
        cache: The node's ``loaderkit.SessionCache`` that sessions are read through (whole
            files, fetched ahead in the loader's order). URLs always use one (default:
            ``SessionCache()``, in ``$LOADERKIT_CACHE`` or ``~/.cache/loaderkit``); local
            paths only when it is given (a shared filesystem in front of local NVMe).
            Metadata of remote files is read with range requests and kept in the cache. The
            cache in use is ``cached_sessions.cache`` (``cache`` stays free for a subclass's
            own attribute: a common name for a memo).
        sparse: What a batch of a sparse (CSR) key is -- AnnData ``.h5ad`` matrices, see
            docs/single-cell.md: ``"csr"`` (default) one ``torch.sparse_csr_tensor`` ``(batch,
            n_vars)`` in the file's value dtype (a sample a 1-D sparse tensor); ``"dense"``
            dense rows filled straight from the sparse values; ``"tokens"`` ``{"genes",
            "values"}`` per row, padded as ``pad_collate`` pads. Dense keys leave it unset.
        genes: Only these columns of an anndata matrix key (a sparse one, or a dense ``X``,
            ``layers/<name>``, ``raw/X``), renumbered ``0..len-1``: exactly
            ``adata[:, genes]`` -- var names in the order given (a name twice gives two
            columns; a name a file's var index holds twice is refused, as anndata does),
            integer positions (negative from the end) or a boolean mask over the var index
            (the joined one under ``join=``). Across files whose var indexes differ, names
            work without ``join=`` too: a name a file lacks reads 0 there. Applied in the
            read; the served columns' names are ``ds.handles.columns``.
        join: For an anndata matrix key (sparse, or a dense ``X``, ``layers/<name>``,
            ``raw/X``, whose files' widths may then differ) over files whose var indexes
            differ (a corpus from many studies), anndata's ``concat(join=...)``:
            ``"outer"`` serves every gene of any file (in the order anndata gives: the names
            sorted, unless every file holds the same index), a gene a file lacks reading 0
            there; ``"inner"`` the genes every file has, in the first file's order.
            ``None`` (default): the files must share one var index (names and order), else
            a ``ConfigError`` says how they differ (a dense matrix: its widths).
            ``ds.handles.var_names`` is the joined index.
        cells: Only the cells (rows of ``key``) this function chooses, for ``.h5ad`` files:
            called once per file, here, as ``cells(obs)`` with the file's obs as a read-only
            mapping column name -> numpy array (``loaderkit.hdf5.anndata.obs.ObsTable``: a
            column is read when asked for; categoricals as their names, missing ``None``;
            the index as ``"_index"``), it returns a boolean mask of the file's cells or
            sorted unique positions. Sample ``i`` is the ``i``-th chosen cell in file order;
            the function is not kept (``handles.cells`` counts what each file gave). Local
            files without ``cache=`` only; not with an overridden ``build_index``.

    Raises:
        ConfigError: ``max_open_files < 1``, ``max_session_bytes < 0``, a ``mode`` other
            than ``"r"``, ``key=None`` with
            several datasets, row shapes/dtypes that differ between sessions, keys whose rows
            do not align, or a type no torch dtype holds (long double, 128-bit float, time,
            reference, opaque); ``cells=`` with URLs, ``cache=`` or an overridden
            ``build_index``, or returning anything but a mask of the file's cells or sorted
            unique positions in range (the message names the session and path).
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
        memory_map: bool | None = None,
        max_session_bytes: int | None = None,
        storage_options: Mapping[str, Any] | None = None,
        cache: SessionCache | None = None,
        sparse: str = "csr",
        genes: Sequence[str] | Sequence[int] | np.ndarray | None = None,
        join: str | None = None,
        cells: Callable[[Mapping[str, np.ndarray]], Any] | None = None,
    ) -> None:
        DatasetInspection.check_form(sparse)
        if cells is not None and _overrides(type(self), "build_index"):
            raise ConfigError(
                f"{type(self).__name__} overrides build_index() and was given cells=: both "
                "choose the samples. Choose the cells in build_index() (read obs there with "
                "self.file(session)), or drop the override and pass cells=."
            )
        if max_open_files is not None:
            check_max_open_files(max_open_files)
        if max_session_bytes is not None:
            check_max_session_bytes(max_session_bytes)
        self._files: dict[Hashable, Path | str] = normalize_files(
            session_names(files, storage_options)
        )
        if cells is not None and (
            cache is not None or any(isinstance(p, str) for p in self._files.values())
        ):
            raise ConfigError(
                "cells= reads each file's obs where the dataset is built, from local files "
                "without cache= only, for now (as keys beside the matrix are): with URLs or a "
                "node cache it is refused. Pass local paths without cache=, or choose the "
                "cells before (write the chosen cells to new files)."
            )
        self._storage_options = None if storage_options is None else dict(storage_options)
        self._fields = None if fields is None else tuple(fields)
        self._sample_axis = sample_axis
        self._h5py_options: dict[str, Any] = check_options(h5py_options)
        if memory_map not in (None, True, False):
            raise ConfigError(
                f"memory_map={memory_map!r}: expected True, False or None (loaderkit decides)"
            )
        self._memory_map_given: bool | None = memory_map
        self._memory_map = bool(memory_map)
        ids: list[Hashable] = list(self._files)
        paths = [os.fspath(p) for p in self._files.values()]
        self._item_fast = uses_default_read(type(self), HDF5SessionDataset)
        self._mode = read_mode(type(self), HDF5SessionDataset)
        self._transforms = _overrides(type(self), "transform")
        self._sources = sources = SessionSources.build(ids, paths, storage_options, cache)
        for sid, path in self._files.items():
            if isinstance(path, Path) and not path.exists():
                raise FileNotFoundError(
                    f"session {sid!r}: file {path} does not exist. Check the path (and that the "
                    "file system is mounted) or remove the session from `files`."
                )
        inspection = DatasetInspection(
            ids,
            paths,
            key,
            fields=self._fields,
            sample_axis=sample_axis,
            h5py_options=self._h5py_options,
            sources=sources,
            item_fast=self._item_fast,
            custom_index=_overrides(type(self), "build_index"),
            label=type(self).__name__,
            columns=genes is not None or join is not None,
        )
        # the reader owns the index, the open files and the held sessions; the parts read it
        self._reader, self._anndata = inspection.reader(
            max_open_files or _STANDALONE_FILES, memory_map, max_session_bytes or 0
        )
        reader = self._reader
        self._key = inspection.key
        self._sparse, self._genes, self._join = sparse, genes, join
        inspection.configure(reader, self._anndata, sparse, genes, join)
        reader.files.sources = sources
        if sources is not None:
            sources.use_keys(reader.files.specs)
        self._handles = SessionHandles(
            reader,
            anndata=self._anndata,
            item_fast=self._item_fast,
            mode=self._mode,
            transforms=self._transforms,
            label=type(self).__name__,
        )
        self._budgets = DatasetBudgets(reader, self._memory_map, max_open_files, max_session_bytes)
        self._cached = CachedSessions(sources, reader)
        try:
            if cells is not None:  # the chosen cells: the index, packed as they are chosen
                if not reader.files.specs:
                    raise ConfigError("cells= needs key=: it chooses rows (cells) of that key.")
                reader.index, self._handles.cells = inspection.choose_cells(cells, reader)
            else:
                try:
                    index = self.build_index()
                except Exception as exc:
                    add_note(
                        exc,
                        f"loaderkit: in {type(self).__name__}.build_index() (process "
                        f"{os.getpid()}, {counted(len(ids), 'session')})",
                    )
                    raise
                reader.index = inspection.pack(index, reader)
            reader.index.setflags(write=False)
        finally:
            reader.files.file_pool.close()  # never leave a file open in the constructing process
        # on its own: the budgets left unset fitted to this process and the machine
        soft, _ = open_file_limits()
        memory, source = process_memory()
        alone = LoaderShape(open_files_soft=soft, memory_bytes=memory, memory_source=source)
        self._budgets.fit_open_files(alone, self._cached.open_files(0))
        self._budgets.fit_session_bytes(alone)
        self._budgets.fit_reads(alone)

    # ------------------------------------------------------------------ hooks

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
        return self._reader.read_one(-1, self._reader.files.position(session), row)

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
        return default_index(self._reader.files.ids, counts)

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

    # ------------------------------------------------------------------ helpers inside hooks

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
        pos = self._reader.files.position(session)
        with self.lock:
            return self._reader.files.handle(pos, 0, -1).file

    def h5dataset(self, session: Hashable, key: str | None = None) -> h5py.Dataset:
        """Return this process's ``h5py.Dataset`` of ``key`` in ``session``'s file.

        ``key`` is one of the dataset's keys, by its name (as given to ``key=``) or its path,
        or the path of any other dataset in the file (trial ids, labels, timestamps beside
        the per-sample data). Each is looked up once per process and open file and kept
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
        pos = self._reader.files.position(session)
        specs = self._reader.files.specs
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
            handle = self._reader.files.handle(pos, 0, -1)
            if k is not None:
                return handle.datasets[k]
            assert key is not None
            return self._reader.files.other_dataset(handle, pos, key)

    def layout(self, session: Hashable) -> SessionLayout | None:
        """Return the layout of (the first) ``key`` in ``session`` (``None`` without a key).

        Example:
            >>> ds.layout(0).chunk_rows  # doctest: +SKIP
            8
        """
        layouts = self._reader.files.records[self._reader.files.position(session)].layouts
        return layouts[0] if layouts else None

    @property
    def lock(self) -> Any:
        """The re-entrant lock that keeps handed-out h5py objects open (``HookLock``).

        Hold it while using ``file()`` / ``h5dataset()`` objects from several threads; the
        overridden ``read`` / ``read_rows`` / ``__getitem__`` run under it. The default reads
        never take it (they lease their handle).
        """
        return self._reader.files.file_pool.lock

    # ------------------------------------------------------------------ constructor arguments

    @property
    def files(self) -> dict[Hashable, Path | str]:
        """Session id -> ``pathlib.Path`` of a local file, or the URL ``str`` of a remote one."""
        return self._files

    @property
    def key(self) -> str | Sequence[str] | Mapping[str, str] | None:
        """The key read by the default ``read`` (the one found, where ``None`` was given)."""
        return self._key

    @property
    def fields(self) -> tuple[str, ...] | None:
        """The fields of a compound dataset that are read (``None``: all)."""
        return self._fields

    @property
    def sample_axis(self) -> int:
        """The axis of ``key`` that indexes samples."""
        return self._sample_axis

    @property
    def max_open_files(self) -> int:
        """Files open at once per process, as used now: as given, or fitted where unset.

        What was given is ``budgets.open_files_requested``.
        """
        return self._budgets.max_open_files

    @property
    def h5py_options(self) -> dict[str, Any]:
        """Extra keyword arguments for ``h5py.File``, as given."""
        return self._h5py_options

    @property
    def memory_map(self) -> bool:
        """Whether rows may be read through memory maps.

        Whole rows (``memory_map=True``), or a CSR matrix's warm batches out of whole-file
        maps (unless ``memory_map=False``).
        """
        return self._memory_map or self._reader.maps_whole_files

    @property
    def max_session_bytes(self) -> int:
        """Bytes of whole sessions held in memory per process, as used now.

        As given, or fitted where unset; what was given is ``budgets.session_bytes_requested``.
        """
        return self._budgets.max_session_bytes

    @property
    def storage_options(self) -> dict[str, Any] | None:
        """Keyword arguments for the fsspec filesystem of URLs, as given."""
        return self._storage_options

    @property
    def sparse(self) -> str:
        """What a sparse (CSR) key's batch is: ``"csr"``, ``"dense"`` or ``"tokens"``."""
        return self._sparse

    @property
    def genes(self) -> Sequence[str] | Sequence[int] | np.ndarray | None:
        """The columns of a sparse key that are read, as given (``None``: all)."""
        return self._genes

    @property
    def join(self) -> str | None:
        """How files whose var indexes differ are aligned: ``"outer"``, ``"inner"``, ``None``."""
        return self._join

    # ------------------------------------------------------------------ sessions

    def locate(self, index: int) -> tuple[Hashable, int]:
        """Return ``(session, row)`` of sample ``index``.

        Raises:
            IndexError: ``index`` is out of range.

        Example:
            >>> ds.locate(750)  # doctest: +SKIP
            (1, 0)
        """
        key = int(self._reader.index[self._check_index(index)])
        return self._reader.files.ids[key >> ROW_BITS], key & ROW_MASK

    @property
    def session_ids(self) -> tuple[Hashable, ...]:
        """Session ids in the order of ``files`` (the positions ``loader_support()`` uses)."""
        return tuple(self._reader.files.ids)

    # ------------------------------------------------------------------ parts

    @property
    def handles(self) -> SessionHandles:
        """This process's open files and how rows are read (``SessionHandles``).

        Example:
            >>> ds.handles.open_files, ds.handles.file_pool_info().opens  # doctest: +SKIP
            (3, 8)
        """
        return self._handles

    @property
    def budgets(self) -> DatasetBudgets:
        """The open-file and held-session budgets, given and in use (``DatasetBudgets``).

        Example:
            >>> ds.budgets.open_files_requested, ds.budgets.max_open_files  # doctest: +SKIP
            (None, 40)
        """
        return self._budgets

    @property
    def cached_sessions(self) -> CachedSessions:
        """The node cache sessions are read through, its counters and plan (``CachedSessions``).

        Its answers are ``None`` or nothing for files read in place.

        Example:
            >>> ds.cached_sessions.cache is None  # doctest: +SKIP
            True
        """
        return self._cached

    def loader_support(self) -> LoaderSupport:
        """What ``loaderkit.DataLoader`` asks of this dataset (``loaderkit.LoaderSupport``).

        Its session index (block order), budgets fitted to the loader, read path, resources,
        seeded batch reads and node-cache prefetching. A subclass rarely needs it.

        Example:
            >>> ds.loader_support().session_index().sessions  # doctest: +SKIP
            40
        """
        return _SessionSupport(self)

    # ------------------------------------------------------------------ lifecycle

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

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._mode = read_mode(type(self), HDF5SessionDataset)
        self._transforms = _overrides(type(self), "transform")
        self._handles.mode, self._handles.transforms = self._mode, self._transforms

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
            f"samples, key {self.key!r}, {len(self._reader.files.file_pool)}/{self.max_open_files} "
            "files open>"
        )

    def __len__(self) -> int:
        return int(self._reader.index.shape[0])

    def __iter__(self) -> Iterator[Any]:
        for i in range(len(self)):
            yield self[i]

    def _check_index(self, index: Any) -> int:
        return check_index(index, self._reader.index.shape[0])

    def __getitem__(self, index: int) -> Any:
        reader = self._reader
        i = check_index(index, reader.index.shape[0])
        key = int(reader.index[i])
        pos, row = key >> ROW_BITS, key & ROW_MASK
        if self._item_fast:  # no lock: the handle is leased for the read
            sample = reader.read_one(i, pos, row)
        else:
            with reader.files.file_pool.lock:  # user code and h5py objects handed out: serial
                try:
                    sample = self.read(reader.files.ids[pos], row)
                except Exception as exc:
                    reader.files.file_pool.discard(reader.files.canonical[pos])
                    reader.files.note(exc, pos, row, i)
                    raise
        return self._transform(sample, i, pos, row) if self._transforms else sample

    def _transform(self, sample: Any, index: int, pos: int, row: int) -> Any:
        """``transform`` with the error context every other hook gets."""
        try:
            return self.transform(sample, index)
        except Exception as exc:
            add_note(
                exc,
                f"in {type(self).__name__}.transform: "
                + self._reader.files.context(pos, row, index),
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
        a ``loaderkit.batches.RowBatch``, the samples in request order, which
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
        idx, keys = lookup(self._reader.index, indices)
        if idx.size == 0:
            return []
        if mode is ReadMode.ROWS:
            with self.lock:
                order, starts = plan_runs(keys, sort=self._reader.files.chunked, always=True)
                batch = read_runs(self._reader.files, self.read_rows, idx, keys, order, starts)
        else:
            batch = self._reader.read_batch(idx, keys)
        if self._transforms:
            return self._transform_all(batch, idx, keys)
        return batch

    def _read_seeded(self, indices: Sequence[int], seed_sample: Any) -> list[Any]:
        """``__getitems__`` with ``seed_sample(index)`` called right before each random step.

        ``sample_seeding=True`` calls this (``LoaderSupport.read_seeded``) instead of reading
        sample by sample: the reads are
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
        idx, keys = lookup(self._reader.index, indices)
        if idx.size == 0:
            return []
        batch = self._reader.read_batch(idx, keys)
        if not self._transforms:
            return batch  # nothing random happens: nothing to seed
        return self._transform_all(batch, idx, keys, seed_sample)

    # ------------------------------------------------------------------ released names moved

    cache_info = MovedAttribute("handles.file_pool_info", "0.1.0")
    open_files = MovedAttribute("handles.open_files", "0.1.0")
    sample_nbytes = MovedAttribute("handles.sample_nbytes", "0.1.0")
    index_arrays = MovedAttribute("handles.index_arrays", "0.1.0")


class _SessionSupport(LoaderSupport):
    """``LoaderSupport`` of an ``HDF5SessionDataset``: its parts' answers for the loader.

    Args:
        dataset: The dataset (any subclass).
    """

    thread_safe = True  # default reads lease their handle; hooks run under the dataset's lock

    def __init__(self, dataset: HDF5SessionDataset) -> None:
        self.dataset = dataset

    @property
    def sparse_samples(self) -> bool:  # type: ignore[override]
        ds = self.dataset
        return ds._reader.sparse_samples

    @property
    def missing_values(self) -> bool:  # type: ignore[override]
        anndata = self.dataset._anndata
        return anndata is not None and anndata.missing_values

    def read_path(self) -> tuple[str, str] | None:
        return self.dataset.handles.read_path

    def sample_nbytes(self) -> int | None:
        return self.dataset.handles.sample_nbytes

    def session_index(self) -> SessionIndex:
        ds = self.dataset
        reader = ds._reader
        positions, rows = unpack_index(reader.index)
        return SessionIndex(
            positions=np.asarray(positions, np.int64),
            rows=np.asarray(rows, np.int64),
            chunk_rows=np.array(reader.chunk_rows(), np.int64),
            open_files=ds.budgets.max_open_files,
            held_sessions=ds.budgets.held_capacity,
        )

    def fit(self, shape: LoaderShape) -> Fitted:
        ds = self.dataset
        cached = ds.cached_sessions
        ds.budgets.fit_reads(shape)  # before io_plan below says what is read around and ahead
        decoded = ds.budgets.fit_chunk_buffer(shape, "rdcc_nbytes" in ds.h5py_options)
        entries = [
            ds.budgets.fit_open_files(
                shape, cached.open_files(shape.processes, threads=shape.threads)
            ),
            *([] if decoded is None else [decoded]),
        ]
        held = ds.budgets.fit_session_bytes(shape)
        if held is not None:
            entries.append(held)
        choice = ds.handles.cells
        if choice is not None:
            entries.append(PlanEntry("cells", "cells=", sum(choice.chosen), choice.summary()))
        rows = [*ds.handles.io_plan(), *cached.plan_rows(shape.processes, threads=shape.threads)]
        entries.extend(
            PlanEntry(name, value if given else UNSET, value, reason)
            for name, given, value, reason in rows
        )
        hint = cached.shuffle_hint() if shape.uniform_shuffle else None
        return Fitted(tuple(entries), () if hint is None else (hint,))

    def resources(self) -> DatasetResources:
        ds = self.dataset
        budgets = ds.budgets
        return DatasetResources(
            open_files=min(budgets.max_open_files, max(1, len(ds.files))),
            fds_per_file=budgets.fds_per_file,
            held_bytes=budgets.max_session_bytes,
            fitted=budgets.open_files_requested is None,
        )

    def read_seeded(self, indices: Sequence[int], seed_sample: Any) -> list[Any]:
        return self.dataset._read_seeded(indices, seed_sample)

    def samples_key(self) -> str | None:
        return self.dataset.handles.samples_key()

    def empty_reason(self) -> str | None:
        chosen = self.dataset.handles.cells
        return None if chosen is None else f"cells= chose no cell ({chosen.summary()})"

    def prefetch_watcher(self) -> Any | None:
        watcher = self.dataset.cached_sessions.prefetch_watcher()
        if watcher is None:  # local files: their coming reads asked for ahead, where planned
            watcher = self.dataset.handles.reader.read_ahead_watcher()
        return watcher

    def cache_stats(self) -> Any | None:
        return self.dataset.cached_sessions.stats()

    def use_batch_memory(self, memory: BatchMemory) -> None:
        self.dataset.handles.reader.use_memory(memory)
