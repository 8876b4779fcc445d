"""What an ``HDF5SessionDataset`` costs a process: open files and sessions held in memory.

``SessionBudgets`` is a part the dataset holds (``ds._budgets``), over its reader: the memory
one open file may hold, the ``max_open_files`` and ``max_session_bytes`` that fit a loader
(``loaderkit.policy.budgets`` does the arithmetic), and the sessions a byte budget holds. The
dataset keeps the values in use (``max_open_files``, ``max_session_bytes``) and forwards to it.
"""

from __future__ import annotations

from loaderkit.hdf5.dataset.arguments import (
    check_max_open_files,
    check_max_session_bytes,
)
from loaderkit.hdf5.read.heldsessions import HeldInfo
from loaderkit.hdf5.read.reader import SessionReader
from loaderkit.policy.budgets import (
    CHUNK_INDEX_BYTES,
    FILE_OVERHEAD_BYTES,
    FileBudget,
    SessionBudget,
    fit_open_files,
    fit_session_bytes,
)

__all__ = ["SessionBudgets"]

#: HDF5's own chunk cache size (2.0 and later), used when no ``rdcc_nbytes`` is passed.
_HDF5_DEFAULT_CACHE = 8 << 20


class SessionBudgets:
    """The open-file and held-session budgets of a session dataset's reader.

    Args:
        reader: The dataset's reader (records, keys, types, open-file options).
        memory_map: Contiguous rows are read through memory maps.

    Example:
        >>> SessionBudgets.file_budget.__name__
        'file_budget'
    """

    def __init__(self, reader: SessionReader, memory_map: bool) -> None:
        self.reader = reader
        self.memory_map = memory_map

    @property
    def file_memory_bytes(self) -> int:
        """Memory one open session file may hold (chunk cache and HDF5's per-file state).

        The chunk cache counts for chunked data only; the per-file state is
        ``loaderkit.policy.budgets.FILE_OVERHEAD_BYTES``, plus ``CHUNK_INDEX_BYTES`` when rows span
        chunks shared with other rows (every read walks the whole chunk index).

        Example:
            >>> ds.file_memory_bytes  # doctest: +SKIP
            9437184
        """
        cache = 0
        if self.reader.chunked:
            cache = max(
                int(kw.get("rdcc_nbytes", _HDF5_DEFAULT_CACHE)) for kw in self.reader.open_kwargs
            )
        index = CHUNK_INDEX_BYTES if any(self.reader.any_wide) else 0
        return cache + FILE_OVERHEAD_BYTES + index

    def file_budget(
        self, num_workers: int, soft_limit: int | None, memory: int | None
    ) -> FileBudget:
        """The ``max_open_files`` that fits a loader with ``num_workers`` workers.

        ``loaderkit.policy.budgets.fit_open_files`` over this dataset's sessions and
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
            len(self.reader.ids),
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
        return 2 if self.memory_map and self.reader.contiguous else 1

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
        self.reader.cache.max_open = files

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
        return max(self.reader.session_nbytes, default=0)

    def session_budget(self, num_workers: int, memory: int | None) -> SessionBudget:
        """The ``max_session_bytes`` that fits a loader with ``num_workers`` workers.

        ``loaderkit.policy.budgets.fit_session_bytes`` over this dataset's sessions and
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
        held = [n for n in self.reader.session_nbytes if n]
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
        self.reader.held.set_max_bytes(nbytes)

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
        held = sum(1 for n in self.reader.session_nbytes if n)
        return min(held, self.reader.held.max_bytes // size)

    def held_info(self) -> HeldInfo:
        """Statistics of the sessions held in memory by the current process.

        Returns:
            ``HeldInfo(loads, hits, evictions, held, held_bytes, max_bytes)``; counters start
            at zero in every new process.

        Example:
            >>> ds.held_info().loads  # doctest: +SKIP
            4
        """
        return self.reader.held.info()
