"""What a loader asks of a dataset beyond torch's protocol: ``LoaderSupport``.

torch's ``DataLoader`` asks a map-style dataset for ``__len__`` and ``__getitem__`` and probes
an optional ``__getitems__``. loaderkit's loader probes one more optional method,
``loader_support()``, which returns a ``LoaderSupport``: every question the loader, its
planning, the block sampler and sample seeding ask a dataset, each with an answer that means
"nothing to add" by default. A dataset overrides only what it knows:

* ``thread_safe``: its reads may run in several threads at once (``worker_method="auto"``);
* ``sparse_samples``: its samples hold sparse tensors, which torch's ``default_collate``
  refuses (an unset ``collate_fn`` becomes one that stacks them);
* ``missing_values``: its samples may hold ``None``, which ``default_collate`` refuses too (an
  unset ``collate_fn`` becomes one that lists them);
* ``read_path()``: how batches are read and why (a plan row);
* ``sample_nbytes()``: bytes of one sample, known without reading (the ``/dev/shm`` check);
* ``session_index()``: which session and row every sample is (``shuffle="block"``,
  ``BlockShuffleSampler``);
* ``fit(shape)``: its own budgets fitted to the loader's readers and the machine, applied
  where the caller left them unset, with the plan rows and hints that say so;
* ``resources()``: the files and memory each reading process holds (the descriptor and
  memory checks);
* ``empty_reason()``: why it has no sample, when it has none;
* ``read_seeded(indices, seed_sample)``: a batch read at once with each sample's random step
  seeded (``sample_seeding=True``);
* ``prefetch_watcher()`` and ``cache_stats()``: a node cache fetched ahead in the loader's
  order, and its counters (``describe()``);
* ``use_batch_memory(memory)``: where this process writes the batches it reads from now on
  (``loaderkit.batches.BatchMemory``: a worker's batch slot), handed over by the loader as
  each worker process starts.

A dataset without ``loader_support()`` gets ``LoaderSupport.of(dataset)``, which reads the
plain attributes such a dataset may have (``thread_safe = True``, ``max_open_files``,
``fds_per_file``, ``sample_nbytes``). ``loaderkit.HDF5SessionDataset`` implements the whole
protocol. This module imports nothing of torch or of the rest of loaderkit but the plan and
the batch contract (``loaderkit.batches``).

Example:
    >>> class Tokens:
    ...     thread_safe = True
    ...     def __len__(self): return 4
    ...     def __getitem__(self, i): return i
    >>> support_of(Tokens()).thread_safe, support_of(Tokens()).session_index()
    (True, None)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from loaderkit.batches.contract import BatchMemory
from loaderkit.errors import ArgumentTypeError
from loaderkit.plan import PlanEntry

__all__ = [
    "DatasetResources",
    "Fitted",
    "LoaderShape",
    "LoaderSupport",
    "SessionIndex",
    "answers",
    "support_of",
]


@dataclass(frozen=True)
class SessionIndex:
    """Which session and row every sample is: what keeps a session's rows together.

    Attributes:
        positions: ``(n,)`` int64: the position of sample ``i``'s session (``0..sessions-1``).
        rows: ``(n,)`` int64: its row in that session.
        chunk_rows: ``(sessions,)`` int64: rows per storage chunk of each session (1 where
            rows are stored contiguously): blocks are cut at chunk bounds.
        open_files: Sessions each reading process keeps open at once (``None``: unbounded);
            the block sampler interleaves at most this many.
        held_sessions: Whole sessions each process holds in memory (``None``: nothing is held;
            0: not even one fits).

    Example:
        >>> index = SessionIndex(np.array([0, 0, 1]), np.array([0, 1, 0]), np.ones(2, np.int64))
        >>> index.sessions
        2
    """

    positions: np.ndarray
    rows: np.ndarray
    chunk_rows: np.ndarray
    open_files: int | None = None
    held_sessions: int | None = None

    @property
    def sessions(self) -> int:
        """Number of sessions (``len(chunk_rows)``)."""
        return int(self.chunk_rows.shape[0])


@dataclass(frozen=True)
class LoaderShape:
    """What a dataset's budgets are fitted to: the loader's readers and the machine.

    Attributes:
        processes: Worker processes (0: the main process reads; thread workers count 0).
        threads: Worker threads (``worker_method="thread"``), sharing one process's files.
        start_method: How worker processes start (``None``: no workers).
        open_files_soft: The soft descriptor limit (``None``: unlimited).
        memory_bytes: Memory the loader's processes may use together
            (``PlatformInfo.memory_bytes``: the lowest cgroup limit on the process's path, else
            physical memory; ``None``: unknown).
        memory_source: Where ``memory_bytes`` came from (``PlatformInfo.memory_source``).
        open_fds: Descriptors the main process holds now (``None``: unknown).
        uniform_shuffle: The order draws every batch from anywhere in the dataset.
        block_order: The order is loaderkit's block sampler (``shuffle="block"``), built
            after the fit: it reads one session at a time when only one is held.

    Example:
        >>> LoaderShape(processes=2).threads
        0
    """

    processes: int = 0
    threads: int = 0
    start_method: str | None = None
    open_files_soft: int | None = None
    memory_bytes: int | None = None
    open_fds: int | None = None
    uniform_shuffle: bool = False
    memory_source: str | None = None
    block_order: bool = False


@dataclass(frozen=True)
class Fitted:
    """What ``LoaderSupport.fit`` decided: plan rows, and advice about speed.

    Attributes:
        entries: Plan rows (the budgets applied, how rows are read, a node cache's limits).
        hints: Messages for ``PerformanceHint`` warnings.

    Example:
        >>> Fitted().entries
        ()
    """

    entries: tuple[PlanEntry, ...] = ()
    hints: tuple[str, ...] = ()


@dataclass(frozen=True)
class DatasetResources:
    """What each reading process of a dataset holds, for the loader's checks.

    Attributes:
        open_files: Files each process keeps open at most (``None``: not bounded by the
            dataset; nothing to check).
        fds_per_file: Descriptors one open file holds (2 where it is also memory-mapped).
        held_bytes: Bytes of whole sessions each process holds in memory.
        fitted: ``open_files`` was fitted by the dataset, not given by its caller (advice then
            does not ask the caller to lower it).

    Example:
        >>> DatasetResources().fds_per_file
        1
    """

    open_files: int | None = None
    fds_per_file: int = 1
    held_bytes: int = 0
    fitted: bool = False


class LoaderSupport:
    """What a loader asks of a dataset beyond torch's protocol; every answer optional.

    Subclass it and override what your dataset knows; return an instance from the
    dataset's ``loader_support()``. The defaults answer "nothing to add".

    Attributes:
        thread_safe: The dataset's reads may run in several threads at once.
        sparse_samples: The dataset's samples hold sparse tensors (rows of a sparse matrix).
        missing_values: The dataset's samples may hold ``None`` (a string column's missing
            values), which torch's ``default_collate`` refuses too.

    Example:
        >>> class Rows(LoaderSupport):
        ...     thread_safe = True
        ...     def sample_nbytes(self): return 4096
        >>> Rows().sample_nbytes(), Rows().read_path()
        (4096, None)
    """

    thread_safe: bool = False
    sparse_samples: bool = False
    missing_values: bool = False

    def read_path(self) -> tuple[str, str] | None:
        """How batches are read and why, for the plan (``None``: nothing to say)."""
        return None

    def sample_nbytes(self) -> int | None:
        """Bytes of one sample, known without reading one (``None``: unknown)."""
        return None

    def session_index(self) -> SessionIndex | None:
        """Which session and row every sample is (``None``: the dataset has no sessions)."""
        return None

    def fit(self, shape: LoaderShape) -> Fitted:
        """Fit the dataset's own budgets to ``shape``, apply those left unset, say why.

        Called once per loader, in the process that builds it, before any worker starts.
        """
        return Fitted()

    def resources(self) -> DatasetResources:
        """What each reading process holds (after ``fit``)."""
        return DatasetResources()

    def read_seeded(
        self, indices: Sequence[int], seed_sample: Callable[[int], None]
    ) -> list[Any] | None:
        """A batch read at once, ``seed_sample(i)`` called before sample ``i``'s random step.

        ``None``: the loader reads sample by sample, seeding each before ``dataset[i]``.
        """
        return None

    def prefetch_watcher(self) -> Any | None:
        """A watcher of the loader's coming indices that fetches ahead (``None``: none).

        Called at the start of every pass, in the process that draws the indices; it must
        have ``watch(indices)`` (see ``loaderkit.storage.OrderWatcher``).
        """
        return None

    def cache_stats(self) -> Any | None:
        """Counters of a node cache the dataset reads through (``None``: none)."""
        return None

    def use_batch_memory(self, memory: BatchMemory) -> None:
        """Write the batches this process reads from now on where ``memory`` says.

        Called by the loader in each worker process as it starts (the worker's batch slot,
        ``loaderkit.workers.collate.WorkerMemory``); a dataset that never asked stays with
        plain memory (``loaderkit.batches.PLAIN``). Nothing here: a dataset that reads
        batches into buffers of its own (``RowBatch``) overrides it.
        """

    def empty_reason(self) -> str | None:
        """Why the dataset has no sample, when it has none (``None``: nothing to add).

        The loader names it where a sampler it builds would yield 0 batches.
        """
        return None

    def samples_key(self) -> str | None:
        """What defines the dataset's samples: a short string (a digest; ``None``: unknown).

        A loader's ``state_dict()`` records it and ``load_state_dict`` refuses a state whose
        key differs (other chosen cells, genes or files of the same length). Compute it once
        and keep it: the loader asks at every ``state_dict()``.
        """
        return None

    @classmethod
    def of(cls, dataset: Any) -> LoaderSupport:
        """The support a dataset without ``loader_support()`` has: its plain attributes.

        A class attribute ``thread_safe = True``, an int ``max_open_files`` (and
        ``fds_per_file``), an int ``sample_nbytes`` are read once, here.

        Example:
            >>> LoaderSupport.of([1, 2]).resources().open_files is None
            True
        """
        return _Attributes(dataset)


class _Attributes(LoaderSupport):
    """``LoaderSupport`` read from a dataset's plain attributes, once."""

    def __init__(self, dataset: Any) -> None:
        self.thread_safe = getattr(dataset, "thread_safe", False) is True
        files = getattr(dataset, "max_open_files", None)
        fds = getattr(dataset, "fds_per_file", 1)
        self._resources = DatasetResources(
            open_files=files if _is_int(files) else None,
            fds_per_file=fds if _is_int(fds) else 1,
        )
        nbytes = getattr(dataset, "sample_nbytes", None)
        self._nbytes = nbytes if _is_int(nbytes) else None

    def sample_nbytes(self) -> int | None:
        return self._nbytes

    def resources(self) -> DatasetResources:
        return self._resources


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def support_of(dataset: Any) -> LoaderSupport:
    """The ``LoaderSupport`` of ``dataset``: its ``loader_support()``, else its attributes.

    Raises:
        ArgumentTypeError: ``loader_support()`` returned something that is not a
            ``LoaderSupport`` (a ``TypeError``).

    Example:
        >>> support_of(range(3)).thread_safe
        False
    """
    method = getattr(dataset, "loader_support", None)
    if not callable(method):
        return LoaderSupport.of(dataset)
    support = method()
    if not isinstance(support, LoaderSupport):
        raise ArgumentTypeError(
            f"{type(dataset).__name__}.loader_support() must return a "
            f"loaderkit.LoaderSupport (subclass it and override what the dataset knows), got "
            f"{type(support).__name__}"
        )
    return support


def answers(support: LoaderSupport, question: str) -> bool:
    """Whether ``support``'s class answers ``question`` itself (overrides the default).

    Cheap: nothing is computed. ``shuffle="block"`` asks it of ``session_index`` before a
    sampler reads the index.

    Example:
        >>> class Sessions(LoaderSupport):
        ...     def session_index(self): ...
        >>> answers(Sessions(), "session_index"), answers(LoaderSupport(), "session_index")
        (True, False)
    """
    return getattr(type(support), question) is not getattr(LoaderSupport, question)
