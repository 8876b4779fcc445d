"""Resource budgets: will a loader fit the machine's open-file limit and shared memory?

Pure arithmetic over numbers the caller gathered (worker count, files per process, limits from
``PlatformInfo``): the loader's planning turns a verdict into an error or a warning, and
``loaderkit doctor`` reports it with advice. Nothing here reads the machine.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "FDS_MAIN_PROCESS",
    "FDS_PER_WORKER",
    "FILE_MEMORY_SHARE",
    "FILE_OVERHEAD_BYTES",
    "BudgetVerdict",
    "FileBudget",
    "check_open_file_budget",
    "check_shared_memory",
    "fit_open_files",
]

#: Descriptors one worker process needs besides the dataset's files: its index queue and result
#: queue pipes, the shared-memory segments of batches in flight, the interpreter's own files.
FDS_PER_WORKER = 16
#: Descriptors the main process needs besides the dataset's files (queues, pipes, logs, ...).
FDS_MAIN_PROCESS = 64
#: Share of memory the open files of one loader (all its processes together) may hold: chunk
#: caches and HDF5's per-file state.
FILE_MEMORY_SHARE = 1 / 16
#: Memory an open HDF5 file holds besides its chunk cache (measured about 0.1 MiB for
#: contiguous and 0.6 MiB for gzip-chunked session files, rounded up).
FILE_OVERHEAD_BYTES = 1 << 20


@dataclass(frozen=True)
class FileBudget:
    """How many files each process of a loader keeps open, and the arithmetic behind it.

    Attributes:
        files: Files open at once per process (``max_open_files``).
        reason: The arithmetic, for the plan.
    """

    files: int
    reason: str


def fit_open_files(
    sessions: int,
    num_workers: int,
    soft_limit: int | None,
    file_bytes: int,
    memory_bytes: int | None,
    fds_per_file: int = 1,
) -> FileBudget:
    """Files per process that fit the descriptor limit and memory: all sessions when they fit.

    Every process of the loader (the main one and each worker) may keep ``files`` files open.
    Two bounds apply, and the default takes every session unless one of them is lower:

    * descriptors: ``processes x files x fds_per_file`` plus the queues and shared batches of
      the workers
      (``FDS_PER_WORKER`` each) and ``FDS_MAIN_PROCESS`` stay within *half* the soft
      ``RLIMIT_NOFILE`` (where ``check_open_file_budget`` starts warning);
    * memory: ``processes x files x file_bytes`` (chunk cache plus ``FILE_OVERHEAD_BYTES`` per
      open file) stays within ``FILE_MEMORY_SHARE`` of memory.

    Fewer files than sessions means files are closed and reopened as batches move between
    sessions, which costs far more than the descriptors: a budget that fits is preferred to a
    small fixed one.

    Args:
        sessions: Session files of the dataset.
        num_workers: Worker processes of the loader (0: the main process only).
        soft_limit: Soft ``RLIMIT_NOFILE`` (``None``: unlimited).
        file_bytes: Memory one open file may hold.
        memory_bytes: Memory of the machine or container (``None``: unknown).
        fds_per_file: Descriptors one open file holds (2 when its rows are memory-mapped).

    Returns:
        The ``FileBudget``.

    Examples:
        >>> fit_open_files(16, 8, 1024, 9 << 20, 24 << 30).files
        16
        >>> budget = fit_open_files(100, 8, 1024, 2 << 20, 24 << 30)
        >>> budget.files, budget.reason.split(":")[0]
        (35, '35 of 100 sessions per process')
    """
    processes = num_workers + 1
    sessions = max(1, sessions)
    mib = 1 << 20
    bounds: list[tuple[int, str]] = []
    if soft_limit is not None:
        other = num_workers * FDS_PER_WORKER + FDS_MAIN_PROCESS
        by_fds = max(1, (soft_limit // 2 - other) // (processes * fds_per_file))
        per_file = f" x {fds_per_file} descriptors" if fds_per_file != 1 else ""
        bounds.append(
            (
                by_fds,
                f"{processes} processes x {{files}} files{per_file} + {other} other descriptors "
                f"<= {soft_limit // 2} (half the soft limit {soft_limit})",
            )
        )
    if memory_bytes is not None and file_bytes > 0:
        share = int(memory_bytes * FILE_MEMORY_SHARE)
        by_memory = max(1, share // (processes * file_bytes))
        bounds.append(
            (
                by_memory,
                f"{processes} processes x {{files}} files x {file_bytes / mib:.1f} MiB <= "
                f"{share / mib:.0f} MiB ({FILE_MEMORY_SHARE:.3g} of {memory_bytes / mib:.0f} MiB)",
            )
        )
    files = min([sessions, *(bound for bound, _ in bounds)])
    head = (
        f"all {sessions} sessions per process"
        if files == sessions
        else f"{files} of {sessions} sessions per process"
    )
    checks = "; ".join(text.format(files=files) for _, text in bounds)
    return FileBudget(files, f"{head}: {checks}" if checks else head)


@dataclass(frozen=True)
class BudgetVerdict:
    """Outcome of a resource check: ``level`` is ``"ok"``, ``"warn"`` or ``"error"``."""

    level: str
    message: str
    needed: int | None = None
    limit: int | None = None


def check_open_file_budget(
    num_workers: int, max_open_files: int | None, soft_limit: int | None, *, binding: bool = True
) -> BudgetVerdict:
    """Compare the descriptors a loader will hold with the soft ``RLIMIT_NOFILE``.

    The budget is ``(num_workers + 1) x max_open_files`` (the main process and every worker
    may each hold the dataset's files) plus ``FDS_PER_WORKER`` per worker (queues, pipes,
    shared-memory batches in flight, whose descriptors the main process receives too) plus
    ``FDS_MAIN_PROCESS``. The limit is per process, but workers inherit it and the main
    process receives a descriptor for every shared batch, so the sum is the safe measure. Above
    half the limit: ``"warn"``; above the limit: ``"error"``, or ``"warn"`` when not
    ``binding``: a dataset that does not declare ``max_open_files`` never opted into this
    accounting, and torch itself only warns about too many workers.

    Examples:
        >>> check_open_file_budget(4, 8, 1024).level
        'ok'
        >>> check_open_file_budget(16, 64, 1024).level
        'error'
        >>> check_open_file_budget(16, 64, 1024, binding=False).level
        'warn'
    """
    if soft_limit is None:
        return BudgetVerdict("ok", "no open-file limit")
    files = max_open_files or 0
    needed = (num_workers + 1) * files + num_workers * FDS_PER_WORKER + FDS_MAIN_PROCESS
    detail = (
        f"the loader may hold about {needed} file descriptors ((num_workers={num_workers} + 1) "
        f"x max_open_files={files} + {num_workers} x {FDS_PER_WORKER} for worker queues and "
        f"shared batches + {FDS_MAIN_PROCESS} for the main process) against a soft limit of "
        f"{soft_limit} (`ulimit -n`)"
    )
    fixes = (
        "lower max_open_files on the dataset, use fewer workers, or raise the limit "
        "(`ulimit -n 65536` in the shell, or resource.setrlimit(resource.RLIMIT_NOFILE, ...) up "
        "to the hard limit)"
    )
    if needed > soft_limit:
        return BudgetVerdict(
            "error" if binding else "warn",
            f"{detail}: 'Too many open files' is likely. Fix: {fixes}.",
            needed,
            soft_limit,
        )
    if needed > soft_limit // 2:
        return BudgetVerdict(
            "warn", f"{detail}: over half the limit. Consider: {fixes}.", needed, soft_limit
        )
    return BudgetVerdict("ok", detail, needed, soft_limit)


def check_shared_memory(
    num_workers: int, prefetch_factor: int | None, batch_bytes: int | None, shm_bytes: int | None
) -> BudgetVerdict:
    """Compare the batches in flight with the size of ``/dev/shm``.

    Workers hand batches to the main process through shared memory; up to
    ``prefetch_factor x num_workers`` batches are in flight at once. A too-small ``/dev/shm``
    (Docker's default is 64 MB) kills workers with a bus error.

    Examples:
        >>> check_shared_memory(8, 2, 64 * 2**20, 64 * 2**20).level
        'warn'
    """
    if num_workers <= 0 or not batch_bytes or not shm_bytes:
        return BudgetVerdict("ok", "nothing to check")
    in_flight = (prefetch_factor or 2) * num_workers * batch_bytes
    mib = 2**20
    message = (
        f"up to {prefetch_factor or 2} x {num_workers} batches of ~{batch_bytes / mib:.1f} MiB "
        f"= {in_flight / mib:.0f} MiB can sit in /dev/shm, which holds {shm_bytes / mib:.0f} MiB"
    )
    if in_flight > shm_bytes // 2:
        return BudgetVerdict(
            "warn",
            f"{message}: workers may die with a bus error. Fix: enlarge /dev/shm "
            "(docker run --shm-size=8g), lower prefetch_factor or num_workers, or call "
            "torch.multiprocessing.set_sharing_strategy('file_system').",
            in_flight,
            shm_bytes,
        )
    return BudgetVerdict("ok", message, in_flight, shm_bytes)
