"""What an ``HDF5SessionDataset`` costs a process: open files and sessions held in memory.

``DatasetBudgets`` is the part the dataset shows as ``ds.budgets``, over its reader: the
values asked for (``open_files_requested``, ``session_bytes_requested``), the values in use
(``max_open_files``, ``max_session_bytes``: the dataset's attributes of those names read
them here), the memory one open file may hold, and the one place where both budgets are
fitted to a loader (``fit_open_files``, ``fit_session_bytes``; ``loaderkit.policy.budgets``
does the arithmetic) — on its own at construction, and for a loader's processes when it is
built.
"""

from __future__ import annotations

from loaderkit.hdf5.dataset.arguments import (
    check_max_open_files,
    check_max_session_bytes,
)
from loaderkit.hdf5.read.heldsessions import HeldInfo
from loaderkit.hdf5.read.mapped import DUPLICATES_FD
from loaderkit.hdf5.read.reader import Reader
from loaderkit.machine.distributed import local_world_size
from loaderkit.plan import UNSET, PlanEntry, counted
from loaderkit.policy.budgets import (
    CHUNK_INDEX_BYTES,
    FILE_MEMORY_SHARE,
    FILE_OVERHEAD_BYTES,
    FileBudget,
    fit_open_files,
)
from loaderkit.policy.held import SessionBudget, fit_session_bytes
from loaderkit.support import LoaderShape

__all__ = ["DatasetBudgets"]

#: HDF5's own chunk buffer size (2.0 and later), used when no ``rdcc_nbytes`` is passed.
_HDF5_DEFAULT_BUFFER = 8 << 20


class DatasetBudgets:
    """The open-file and held-session budgets of a session dataset (``ds.budgets``).

    Args:
        reader: The dataset's reader (records, keys, types, open-file options); it holds the
            values in use (its file pool's bound, its held sessions' bound).
        memory_map: Contiguous rows are read through memory maps.
        open_files_requested: ``max_open_files`` as passed (``None``: fitted).
        session_bytes_requested: ``max_session_bytes`` as passed (``None``: fitted).

    Example:
        >>> DatasetBudgets.fit_open_files.__name__
        'fit_open_files'
    """

    def __init__(
        self,
        reader: Reader,
        memory_map: bool,
        open_files_requested: int | None = None,
        session_bytes_requested: int | None = None,
    ) -> None:
        self.reader = reader
        self.memory_map = memory_map
        #: ``max_open_files`` as passed to the dataset (``None``: fitted to the loader).
        self.open_files_requested = open_files_requested
        #: ``max_session_bytes`` as passed to the dataset (``None``: fitted to the loader).
        self.session_bytes_requested = session_bytes_requested
        # each file's chunk buffer as the dataset was built (``fit_chunk_buffer`` may enlarge it)
        self._rdcc_built = [
            int(kw.get("rdcc_nbytes", _HDF5_DEFAULT_BUFFER)) for kw in reader.files.open_kwargs
        ]

    # ------------------------------------------------------------------ open files

    @property
    def max_open_files(self) -> int:
        """Files open at once per process, as used now."""
        return self.reader.files.file_pool.max_open

    @property
    def file_memory_bytes(self) -> int:
        """Memory one open session file may hold (chunk buffer and HDF5's per-file state).

        The chunk buffer counts where reads fill one (chunked data, but for the uncompressed
        values and column ids of a sparse matrix, read raw); the per-file state is
        ``loaderkit.policy.budgets.FILE_OVERHEAD_BYTES``, plus ``CHUNK_INDEX_BYTES`` when rows
        span chunks shared with other rows (every read walks the whole chunk index).

        Example:
            >>> ds.budgets.file_memory_bytes  # doctest: +SKIP
            9437184
        """
        buffer = 0
        if self.reader.fills_chunk_buffer:
            buffer = max(
                int(kw.get("rdcc_nbytes", _HDF5_DEFAULT_BUFFER))
                for kw in self.reader.files.open_kwargs
            )
        index = CHUNK_INDEX_BYTES if any(self.reader.files.any_wide) else 0
        return buffer + FILE_OVERHEAD_BYTES + index

    @property
    def fds_per_file(self) -> int:
        """Descriptors one open session file holds: 2 when it is memory-mapped.

        Python's ``mmap`` keeps a duplicate of the file's descriptor while the map is open
        (before Python 3.13, or for ``memory_map=True``'s maps of whole rows).
        """
        if self.memory_map and self.reader.files.contiguous:
            return 2
        return 2 if self.reader.maps_whole_files and DUPLICATES_FD else 1

    def file_budget(self, shape: LoaderShape) -> FileBudget:
        """The ``max_open_files`` that fits a loader of ``shape`` (``fit_open_files``).

        Every session when they fit under half the descriptor limit and within a share of
        memory, fewer otherwise.

        Args:
            shape: The loader's processes and the machine (``LoaderShape()`` with the
                machine's limits: the dataset on its own).

        Returns:
            The ``FileBudget``.

        Example:
            >>> from loaderkit.support import LoaderShape
            >>> shape = LoaderShape(8, open_files_soft=1024)
            >>> ds.budgets.file_budget(shape).files  # doctest: +SKIP
            16
        """
        return fit_open_files(
            len(self.reader.files.ids),
            shape.processes,
            shape.open_files_soft,
            self.file_memory_bytes,
            shape.memory_bytes,
            self.fds_per_file,
            main_fds=shape.open_fds,
            start_method=shape.start_method or "fork",
            memory_source=shape.memory_source,
        )

    def fit_open_files(self, shape: LoaderShape, cached: int | None = None) -> PlanEntry:
        """Fit ``max_open_files`` to a loader of ``shape``; apply it where it was left unset.

        Args:
            shape: The loader's processes and the machine.
            cached: Files each reading process may keep open so the node cache never blocks
                (``CachedSessions.open_files``; ``None``: no cache).

        Returns:
            The plan row: the value used and why (an explicit value is kept, and the row says
            what unset would have given).
        """
        budget = self.file_budget(shape)
        requested = self.open_files_requested
        if requested is not None:
            reason = f"as given (unset would give {budget.files}: {budget.reason})"
            return PlanEntry("max_open_files", requested, requested, reason)
        if cached is not None and cached < budget.files:
            readers = (
                f"{counted(shape.threads, 'thread')} sharing {counted(cached, 'file')}"
                if shape.threads
                else f"{counted(max(1, shape.processes), 'reader')} x {counted(cached, 'file')}"
            )
            reason = (
                f"fits the session cache: {counted(local_world_size(), 'rank')} x ({readers} + the "
                f"prefetch window) fit its max_bytes (each open file leases its entry; "
                f"otherwise: {budget.reason})"
            )
            self.set_open_files(cached)
            return PlanEntry("max_open_files", UNSET, cached, reason)
        self.set_open_files(budget.files)
        return PlanEntry("max_open_files", UNSET, budget.files, f"fits: {budget.reason}")

    def fit_chunk_buffer(self, shape: LoaderShape, given: bool) -> PlanEntry | None:
        """Room for every decoded chunk of a compressed sparse matrix, for a shuffled epoch.

        A uniformly shuffled epoch reads each cell of a compressed matrix from a chunk it
        shares with the cells around it, in random order: with HDF5's 8 MiB a file, nearly
        every cell decodes two whole chunks (of values and of column ids). Where every file,
        open in every reading process with room for its whole decoded matrix, fits the
        open files' share of memory (``fit_open_files``), each file's chunk buffer is made
        that size: each chunk is decoded once per process. Any other loader of the dataset
        gets the size the dataset was built with. A changed size applies to files opened
        from then on (this process's open files are closed).

        Args:
            shape: The loader's processes, order and the machine.
            given: ``rdcc_nbytes`` was passed in ``h5py_options`` (kept as given).

        Returns:
            The plan row; ``None`` where it does not apply (no compressed sparse matrix, or
            no uniform shuffle).
        """
        sizes = self.reader.matrix_nbytes
        if not sizes or not self.reader.fills_chunk_buffer:
            return None
        built = self._rdcc_built
        now = max(built)
        if given:
            return PlanEntry("chunk_buffer", now, now, "rdcc_nbytes as given in h5py_options")
        entry: PlanEntry | None = None
        wanted = built
        largest = max(sizes)
        if shape.uniform_shuffle and largest > now:
            budget = fit_open_files(
                len(self.reader.files.ids),
                shape.processes,
                shape.open_files_soft,
                largest + FILE_OVERHEAD_BYTES,
                shape.memory_bytes,
                self.fds_per_file,
                main_fds=shape.open_fds,
                start_method=shape.start_method or "fork",
                memory_source=shape.memory_source,
            )
            need = (shape.processes + 1) * len(sizes) * (largest + FILE_OVERHEAD_BYTES)
            memory = shape.memory_bytes  # unknown: nothing enlarged
            if budget.files >= len(sizes) and memory and need <= memory * FILE_MEMORY_SHARE:
                wanted = [max(largest, size) for size in built]
                reason = (
                    f"{_mib(largest)} a file: a shuffled epoch decodes each chunk of the "
                    f"compressed matrix once (every file open with its decoded matrix fits: "
                    f"{budget.reason})"
                )
                entry = PlanEntry("chunk_buffer", UNSET, largest, reason)
            else:
                reason = (
                    f"{_mib(now)} a file: {counted(shape.processes + 1, 'process', 'processes')} "
                    f"x {counted(len(sizes), 'file')} x "
                    f"{_mib(largest + FILE_OVERHEAD_BYTES)} (each with its decoded matrix) "
                    f"exceed {FILE_MEMORY_SHARE:.3g} of memory or the descriptors; shuffled "
                    "cells of a compressed matrix decode whole chunks (shuffle='block' reads "
                    "neighbours from one)"
                )
                entry = PlanEntry("chunk_buffer", UNSET, now, reason)
        pairs = list(zip(self.reader.files.open_kwargs, wanted, strict=True))
        if any(int(kw.get("rdcc_nbytes", -1)) != size for kw, size in pairs):
            for kw, size in pairs:
                kw["rdcc_nbytes"] = size
            pool = self.reader.files.file_pool
            for pos in range(len(self.reader.files.ids)):  # reopened with the new size when read
                pool.discard(pos)
        return entry

    def fit_reads(self, shape: LoaderShape) -> None:
        """Fit what the reader reads around a miss and ahead to ``shape``'s memory.

        The same memory figure as every other budget (``SessionReader.fit_memory``): where
        the files fit a quarter of it a missed row's neighbours are read with it, else the
        row's bytes alone; what is asked ahead at once stays within a part of it.

        Args:
            shape: The loader's processes and the memory they may use.
        """
        self.reader.fit_memory(shape.memory_bytes, shape.memory_source)

    def set_open_files(self, files: int) -> None:
        """Keep at most ``files`` files open per process from now on.

        Files over the new bound are closed as others are opened. Worker processes started
        later inherit the bound with the dataset.

        Args:
            files: An int >= 1.

        Raises:
            ConfigError: ``files`` is not an int >= 1.
        """
        check_max_open_files(files)
        self.reader.files.file_pool.max_open = files

    # ------------------------------------------------------------------ held sessions

    @property
    def max_session_bytes(self) -> int:
        """Bytes of whole sessions held in memory per process, as used now."""
        return self.reader.files.held.max_bytes

    @property
    def session_memory_bytes(self) -> int:
        """Bytes the largest session's rows take when held in memory (``max_session_bytes``).

        Counts the keys whose rows span chunks shared with other rows
        (``SessionLayout.shares_chunks``), the only ones held; 0 when there are none.

        Example:
            >>> ds.budgets.session_memory_bytes  # doctest: +SKIP
            30000000
        """
        return max(self.reader.files.session_nbytes, default=0)

    def session_budget(self, shape: LoaderShape) -> SessionBudget:
        """The ``max_session_bytes`` that fits a loader of ``shape`` (``fit_session_bytes``).

        As many whole sessions as fit a quarter of memory shared by the loader's processes;
        for loaderkit's block order, one session per process within a third when a quarter
        holds none (``loaderkit.policy.held.fit_session_bytes``).

        Example:
            >>> from loaderkit.support import LoaderShape
            >>> shape = LoaderShape(2, memory_bytes=24 << 30)
            >>> ds.budgets.session_budget(shape).sessions  # doctest: +SKIP
            4
        """
        held = [n for n in self.reader.files.session_nbytes if n]
        return fit_session_bytes(
            max(held, default=0),
            len(held),
            shape.processes,
            shape.memory_bytes,
            shape.memory_source,
            block_order=shape.block_order,
        )

    def fit_session_bytes(self, shape: LoaderShape) -> PlanEntry | None:
        """Fit ``max_session_bytes`` to a loader of ``shape``; apply it where left unset.

        Returns:
            The plan row, or ``None`` when no key's rows span chunks shared with other rows
            (nothing is held).
        """
        if self.session_memory_bytes == 0:
            return None
        budget = self.session_budget(shape)
        requested = self.session_bytes_requested
        if requested is not None:
            reason = f"as given (unset would give {budget.bytes}: {budget.reason})"
            return PlanEntry("max_session_bytes", requested, requested, reason)
        self.set_session_bytes(budget.bytes)
        return PlanEntry("max_session_bytes", UNSET, budget.bytes, f"fits: {budget.reason}")

    def set_session_bytes(self, nbytes: int) -> None:
        """Hold at most ``nbytes`` of whole sessions in memory per process from now on.

        Sessions over the new bound are dropped now (in this process); worker processes
        started later inherit the bound with the dataset.

        Args:
            nbytes: An int >= 0 (0: hold nothing).

        Raises:
            ConfigError: ``nbytes`` is not an int >= 0.

        Example:
            >>> ds.budgets.set_session_bytes(2 << 30)  # doctest: +SKIP
        """
        check_max_session_bytes(nbytes)
        self.reader.files.held.set_max_bytes(nbytes)

    @property
    def held_capacity(self) -> int | None:
        """Whole sessions ``max_session_bytes`` holds at once (``None``: nothing to hold).

        ``None`` when no key's rows span many chunks; 0 when not even one session fits (each
        batch then reads its rows in one pass over their sessions' chunks).
        ``BlockShuffleSampler`` keeps its window of active sessions within it, so that each
        session is read once per pass in each process.

        Example:
            >>> ds.budgets.held_capacity  # doctest: +SKIP
            4
        """
        size = self.session_memory_bytes
        if size == 0:
            return None
        held = sum(1 for n in self.reader.files.session_nbytes if n)
        return min(held, self.reader.files.held.max_bytes // size)

    def held_info(self) -> HeldInfo:
        """Statistics of the sessions held in memory by the current process.

        Returns:
            ``HeldInfo(loads, hits, evictions, held, held_bytes, max_bytes)``; counters start
            at zero in every new process.

        Example:
            >>> ds.budgets.held_info().loads  # doctest: +SKIP
            4
        """
        return self.reader.files.held.info()


def _mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB"
