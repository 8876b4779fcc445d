"""Resource budgets: will a loader fit the open-file limit, shared memory and memory?

Descriptors are budgeted per process (``RLIMIT_NOFILE`` is each process's own): the main
process and each worker are checked separately against the soft limit.

Pure arithmetic over numbers the caller gathered (worker count, files per process, limits from
``PlatformInfo``): the loader's planning turns a verdict into an error or a warning, and
``loaderkit doctor`` reports it with advice. Nothing here reads the machine. What whole
sessions a loader may hold in memory is fitted in ``held``.
"""

from __future__ import annotations

from dataclasses import dataclass

from loaderkit.plan import counted
from loaderkit.policy.held import memory_words, size_words

__all__ = [
    "CHUNK_INDEX_BYTES",
    "FDS_FORK_INHERITED_PER_WORKER",
    "FDS_MAIN_MARGIN",
    "FDS_MAIN_PROCESS",
    "FDS_PER_WORKER",
    "FDS_SPAWNED_INTERPRETER",
    "FILE_MEMORY_SHARE",
    "FILE_OVERHEAD_BYTES",
    "BudgetVerdict",
    "FileBudget",
    "LoaderFds",
    "check_open_file_budget",
    "check_session_memory",
    "check_shared_memory",
    "fit_open_files",
    "loader_fds",
]

#: Descriptors one worker costs, counted in the worker (its index and result queue pipes, the
#: shared-memory batches it has sent and not yet seen released, the resource sharer's socket)
#: and again in the main process (its ends of the queues, the process sentinel, and one
#: descriptor per shared tensor received and not yet consumed: torch keeps each mapped).
FDS_PER_WORKER = 16
#: Descriptors the main process is assumed to hold of its own when they were not measured.
FDS_MAIN_PROCESS = 64
#: Added to a measured count of the main process's descriptors: files, sockets and logs the
#: program opens after the loader is built.
FDS_MAIN_MARGIN = 16
#: Descriptors a forked worker inherits for each worker started before it or with it (queue
#: pipes and sentinels the main process holds when it forks).
FDS_FORK_INHERITED_PER_WORKER = 4
#: Descriptors of a fresh interpreter with torch imported (a spawn or forkserver worker
#: before it opens anything: measured 8 to 10).
FDS_SPAWNED_INTERPRETER = 16
#: Share of memory the open files of one loader (all its processes together) may hold: chunk
#: buffers and HDF5's per-file state.
FILE_MEMORY_SHARE = 1 / 16
#: Memory HDF5 holds (metadata cache, free lists) once it has walked the chunk index of a
#: dataset whose rows span many chunks: measured 14-18 MiB per open file for 40,000 and
#: 200,000 chunks alike (h5py 3.16 / HDF5 2.0).
CHUNK_INDEX_BYTES = 16 << 20
#: Memory an open HDF5 file holds besides its chunk buffer (measured about 0.1 MiB for
#: contiguous and 0.6 MiB for gzip-chunked session files, rounded up).
FILE_OVERHEAD_BYTES = 1 << 20


@dataclass(frozen=True)
class LoaderFds:
    """Descriptors each process of a loader holds besides the dataset's files.

    Every process has its own ``RLIMIT_NOFILE``: the main process and each worker are budgeted
    separately, never summed.

    Attributes:
        main: The main process: its own descriptors plus ``FDS_PER_WORKER`` per worker.
        worker: Each worker (0 without workers): a fresh interpreter under spawn/forkserver,
            or, under fork, what it inherits from the main process, plus its own queues.
        main_detail: How ``main`` adds up, for messages.
        worker_detail: How ``worker`` adds up, for messages.
    """

    main: int
    worker: int
    main_detail: str
    worker_detail: str

    @property
    def most(self) -> int:
        """The larger of ``main`` and ``worker``: the process that binds the budget."""
        return max(self.main, self.worker)


def loader_fds(
    num_workers: int, *, main_fds: int | None = None, start_method: str = "fork"
) -> LoaderFds:
    """Descriptors the main process and each worker hold besides the dataset's files.

    Args:
        num_workers: Worker processes of the loader (0: the main process only).
        main_fds: Descriptors the main process holds now (``PlatformInfo.open_fds``);
            ``None``: ``FDS_MAIN_PROCESS`` is assumed.
        start_method: How workers start: ``"fork"`` workers inherit the main process's
            descriptors, ``"spawn"``/``"forkserver"`` workers start from a fresh interpreter.

    Returns:
        The ``LoaderFds``.

    Examples:
        >>> fds = loader_fds(2, main_fds=10)
        >>> fds.main, fds.worker  # 10 + 16 margin + 2 x 16; 26 inherited + 2 x 4 + 16
        (58, 50)
        >>> loader_fds(2, main_fds=10, start_method="spawn").worker
        32
        >>> loader_fds(0).worker
        0
    """
    workers = max(0, num_workers)
    if main_fds is None:
        own, own_text = FDS_MAIN_PROCESS, f"{FDS_MAIN_PROCESS} assumed for the program itself"
    else:
        own = main_fds + FDS_MAIN_MARGIN
        own_text = f"{main_fds} open now + {FDS_MAIN_MARGIN} margin"
    main = own + workers * FDS_PER_WORKER
    main_text = own_text + (
        f" + {counted(workers, 'worker')} x {FDS_PER_WORKER} (queues, shared batches)"
        if workers
        else ""
    )
    if workers == 0:
        return LoaderFds(main, 0, main_text, "no workers")
    if start_method == "fork":
        inherited = own + workers * FDS_FORK_INHERITED_PER_WORKER
        worker = inherited + FDS_PER_WORKER
        worker_text = (
            f"{inherited} inherited from the main process by fork + {FDS_PER_WORKER} of its own"
        )
    else:
        worker = FDS_SPAWNED_INTERPRETER + FDS_PER_WORKER
        worker_text = (
            f"{FDS_SPAWNED_INTERPRETER} for a fresh interpreter + {FDS_PER_WORKER} of its own"
        )
    return LoaderFds(main, worker, main_text, worker_text)


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
    *,
    main_fds: int | None = None,
    start_method: str = "fork",
    memory_source: str | None = None,
) -> FileBudget:
    """Files per process that fit the descriptor limit and memory: all sessions when they fit.

    Every process of the loader (the main one and each worker) may keep ``files`` files open.
    Two bounds apply, and the default takes every session unless one of them is lower:

    * descriptors, per process (each has its own soft ``RLIMIT_NOFILE``): the descriptors the
      busiest process holds besides the files (``loader_fds``) plus ``files x fds_per_file``
      stay within *half* the soft limit (where ``check_open_file_budget`` starts warning);
      when not even one file fits in half, what is left of the whole limit is used, down to
      1 file (``check_open_file_budget`` refuses what cannot run at all);
    * memory, for all processes together: ``processes x files x file_bytes`` (chunk buffer
      plus ``FILE_OVERHEAD_BYTES`` per open file) stays within ``FILE_MEMORY_SHARE`` of
      memory.

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
        main_fds: Descriptors the main process holds now (``PlatformInfo.open_fds``).
        start_method: How workers start (see ``loader_fds``).
        memory_source: Where ``memory_bytes`` came from (``PlatformInfo.memory_source``), for
            the reason.

    Returns:
        The ``FileBudget``.

    Examples:
        >>> fit_open_files(16, 8, 1024, 9 << 20, 24 << 30).files
        16
        >>> budget = fit_open_files(1000, 8, 1024, 2 << 20, None, main_fds=20)
        >>> budget.files, budget.reason.split(":")[0]  # 512 - (20 + 16 + 8 x 16)
        (348, '348 of 1000 sessions per process')
        >>> fit_open_files(40, 2, 64, 1 << 20, None, main_fds=8).files  # 64 - 56: whole limit
        8
    """
    processes = num_workers + 1
    sessions = max(1, sessions)
    fds_per_file = max(1, fds_per_file)
    mib = 1 << 20
    bounds: list[tuple[int, str]] = []
    if soft_limit is not None:
        fds = loader_fds(num_workers, main_fds=main_fds, start_method=start_method)
        other = fds.most
        busiest = "the main process" if fds.main >= fds.worker else "each worker"
        per_file = f" x {fds_per_file} descriptors" if fds_per_file != 1 else ""
        in_half = (soft_limit // 2 - other) // fds_per_file
        if in_half >= 1:
            by_fds, room = in_half, f"{soft_limit // 2} (half the soft limit {soft_limit})"
        else:
            by_fds = max(1, (soft_limit - other) // fds_per_file)
            room = f"{soft_limit} (the whole soft limit: half of it does not fit one file)"
        bounds.append(
            (
                by_fds,
                f"per process, {busiest} holds {other} other descriptors + {{files}}"
                f"{per_file} <= {room}",
            )
        )
    if memory_bytes is not None and file_bytes > 0:
        share = int(memory_bytes * FILE_MEMORY_SHARE)
        by_memory = max(1, share // (processes * file_bytes))
        bounds.append(
            (
                by_memory,
                f"{counted(processes, 'process', 'processes')} x {{files}} x "
                f"{file_bytes / mib:.1f} MiB <= "
                f"{share / mib:.0f} MiB ({FILE_MEMORY_SHARE:.3g} of "
                f"{memory_words(memory_bytes, memory_source)})",
            )
        )
    files = min([sessions, *(bound for bound, _ in bounds)])
    head = (
        f"all {counted(sessions, 'session')} per process"
        if files == sessions
        else f"{files} of {counted(sessions, 'session')} per process"
    )
    checks = "; ".join(text.format(files=counted(files, "file")) for _, text in bounds)
    return FileBudget(files, f"{head}: {checks}" if checks else head)


def check_session_memory(
    num_workers: int,
    max_session_bytes: int,
    memory_bytes: int | None,
    memory_source: str | None = None,
) -> BudgetVerdict:
    """Compare the sessions all processes of a loader may hold with the machine's memory.

    Every process (the main one and each worker) may hold ``max_session_bytes``; above half
    of memory together: ``"warn"`` (the kernel's OOM killer ends a worker with no Python
    error).

    Examples:
        >>> check_session_memory(2, 1 << 30, 24 << 30).level
        'ok'
        >>> check_session_memory(8, 4 << 30, 24 << 30).level
        'warn'
    """
    processes = max(0, num_workers) + 1
    total = processes * max(0, max_session_bytes)
    if memory_bytes is None or total == 0:
        return BudgetVerdict("ok", "nothing to check")
    message = (
        f"{counted(processes, 'process', 'processes')} x "
        f"max_session_bytes={size_words(max_session_bytes)} = "
        f"{size_words(total)} of session rows may be held in memory, of "
        f"{memory_words(memory_bytes, memory_source)}"
    )
    if total > memory_bytes // 2:
        return BudgetVerdict(
            "warn",
            f"{message}: over half of it; workers may be killed for memory. Fix: lower "
            "max_session_bytes (or leave it unset: loaderkit fits it) or num_workers.",
            total,
            memory_bytes,
        )
    return BudgetVerdict("ok", message, total, memory_bytes)


@dataclass(frozen=True)
class BudgetVerdict:
    """Outcome of a resource check: ``level`` is ``"ok"``, ``"warn"`` or ``"error"``.

    Attributes:
        level: ``"ok"``, ``"warn"`` or ``"error"``.
        message: What was compared, and the fix when not ``"ok"``.
        needed: What the busiest process (descriptors) or ``/dev/shm`` (bytes) needs.
        limit: What it is compared with.
    """

    level: str
    message: str
    needed: int | None = None
    limit: int | None = None


def _raise_limit_to(needed: int) -> int:
    """A soft limit with room: the power of two at or above twice ``needed`` (at least 1024)."""
    target = 1024
    while target < 2 * needed:
        target *= 2
    return target


def _limit_fix(needed: int, hard_limit: int | None) -> str:
    """The advice on the limit itself: raise the soft limit, or ask for a higher hard one."""
    target = _raise_limit_to(needed)
    if hard_limit is not None and target > hard_limit:
        target = hard_limit
    if target > needed:
        return (
            f"raise the soft limit to {target} (`ulimit -n {target}` in the shell that starts "
            "Python, or resource.setrlimit(resource.RLIMIT_NOFILE, "
            f"({target}, hard)) before building the loader)"
        )
    return (
        f"ask for a higher hard limit (it is {hard_limit}; the busiest process needs "
        f"about {needed})"
    )


def check_open_file_budget(
    num_workers: int,
    max_open_files: int | None,
    soft_limit: int | None,
    *,
    binding: bool = True,
    fds_per_file: int = 1,
    main_fds: int | None = None,
    start_method: str = "fork",
    hard_limit: int | None = None,
    fitted: bool = False,
) -> BudgetVerdict:
    """Compare the descriptors each process of a loader will hold with its soft limit.

    ``RLIMIT_NOFILE`` is per process: the main process and each worker are checked on their
    own. Each may hold ``max_open_files x fds_per_file`` descriptors for the dataset's files
    plus what ``loader_fds`` counts (the main process: its own descriptors and
    ``FDS_PER_WORKER`` per worker; a worker: its interpreter, or what it inherited by fork,
    and its queues). Above half the limit: ``"warn"``; above the limit: ``"error"``, or
    ``"warn"`` when not ``binding``: a dataset that does not declare ``max_open_files`` never
    opted into this accounting, and torch itself only warns about too many workers.

    Args:
        num_workers: Worker processes (0: the main process only).
        max_open_files: Files each process may keep open (``None``: none declared).
        soft_limit: Soft ``RLIMIT_NOFILE`` (``None``: unlimited).
        binding: Over the limit is an error (else a warning).
        fds_per_file: Descriptors one open file holds (2 when memory-mapped).
        main_fds: Descriptors the main process holds now (``PlatformInfo.open_fds``).
        start_method: How workers start (see ``loader_fds``).
        hard_limit: Hard ``RLIMIT_NOFILE``, for the advice (``None``: unlimited or unknown).
        fitted: ``max_open_files`` was fitted by loaderkit (the advice then does not ask the
            user to lower it).

    Returns:
        The ``BudgetVerdict``; ``needed`` is the busiest process's count.

    Examples:
        >>> check_open_file_budget(4, 8, 1024, main_fds=10).level
        'ok'
        >>> check_open_file_budget(16, 300, 1024, main_fds=10).level  # 282 + 300 > 512
        'warn'
        >>> check_open_file_budget(16, 800, 1024, main_fds=10).level
        'error'
        >>> check_open_file_budget(16, 800, 1024, main_fds=10, binding=False).level
        'warn'
    """
    if soft_limit is None:
        return BudgetVerdict("ok", "no open-file limit")
    fds = loader_fds(num_workers, main_fds=main_fds, start_method=start_method)
    files = (max_open_files or 0) * max(1, fds_per_file)
    per_file = f" x {fds_per_file}" if fds_per_file != 1 else ""
    file_text = f" + max_open_files={max_open_files}{per_file}" if max_open_files else ""
    main_need = fds.main + files
    worker_need = fds.worker + files if num_workers > 0 else 0
    needed = max(main_need, worker_need)
    detail = (
        f"each process has its own limit of {soft_limit} file descriptors (soft `ulimit -n`): the "
        f"main process may hold about {main_need} ({fds.main_detail}{file_text})"
    )
    if num_workers > 0:
        detail += f" and each worker about {worker_need} ({fds.worker_detail}{file_text})"
    fixes: list[str] = []
    fits = (soft_limit - fds.most) // max(1, fds_per_file)
    if not fitted and max_open_files and fits >= 1 and fits < max_open_files:
        fixes.append(
            f"set max_open_files <= {fits} on the dataset (or leave it unset: loaderkit fits it)"
        )
    if num_workers > 0:
        for workers in range(num_workers - 1, -1, -1):
            fewer = loader_fds(workers, main_fds=main_fds, start_method=start_method)
            if fewer.most + files <= soft_limit:
                fixes.append(f"use num_workers <= {workers}")
                break
    fixes.append(_limit_fix(needed, hard_limit))
    fix_text = "; or ".join(fixes)
    if needed > soft_limit:
        what = (
            "even max_open_files=1 per process does not fit"
            if fitted
            else "'Too many open files' is likely"
        )
        return BudgetVerdict(
            "error" if binding else "warn",
            f"{detail}: {what}. Fix: {fix_text}.",
            needed,
            soft_limit,
        )
    if needed > soft_limit // 2:
        return BudgetVerdict(
            "warn", f"{detail}: over half the limit. Consider: {fix_text}.", needed, soft_limit
        )
    return BudgetVerdict("ok", detail, needed, soft_limit)


def check_shared_memory(
    num_workers: int,
    prefetch_factor: int | None,
    batch_bytes: int | None,
    shm_bytes: int | None,
    *,
    pool_slots: int = 0,
    memory_bytes: int | None = None,
    memory_source: str | None = None,
) -> BudgetVerdict:
    """Compare the batches in flight with the size of ``/dev/shm``, and the slot pool with RAM.

    Workers hand batches to the main process through shared memory; up to
    ``prefetch_factor x num_workers`` batches are in flight at once. A too-small ``/dev/shm``
    (Docker's default is 64 MB) kills workers with a bus error. With loaderkit's slot pool
    (``pool_slots`` per worker, ``loaderkit.workers.worker``) the batches live in anonymous shared
    memory that ``/dev/shm``'s size does not limit; ``/dev/shm`` then only holds batches that
    found no free slot (at most as many as without the pool), and the pool itself,
    ``num_workers x pool_slots`` batches, is memory the loader keeps: it warns above a quarter
    of ``memory_bytes``.

    Examples:
        >>> check_shared_memory(8, 2, 64 * 2**20, 64 * 2**20).level
        'warn'
        >>> check_shared_memory(2, 2, 2**20, 2**30, pool_slots=5).message.startswith("slot pool")
        True
    """
    if num_workers <= 0 or not batch_bytes:
        return BudgetVerdict("ok", "nothing to check")
    mib = 2**20
    pool = num_workers * pool_slots * batch_bytes
    pool_text = (
        f"slot pool {num_workers} x {pool_slots} x ~{batch_bytes / mib:.1f} MiB = "
        f"{pool / mib:.0f} MiB of anonymous shared memory (outside /dev/shm); "
        if pool
        else ""
    )
    if pool and memory_bytes and pool > memory_bytes // 4:
        return BudgetVerdict(
            "warn",
            f"{pool_text}that is more than a quarter of the "
            f"{memory_words(memory_bytes, memory_source)} this process may use. Fix: lower "
            "num_workers, prefetch_factor or batch_size.",
            pool,
            memory_bytes,
        )
    if not shm_bytes:
        return BudgetVerdict("ok", pool_text.rstrip("; ") or "nothing to check")
    in_flight = (prefetch_factor or 2) * num_workers * batch_bytes
    message = (
        f"{pool_text}up to {prefetch_factor or 2} x {num_workers} batches of "
        f"~{batch_bytes / mib:.1f} MiB = {in_flight / mib:.0f} MiB can sit in /dev/shm"
        f"{' (batches that find no free slot)' if pool else ''}, which holds "
        f"{shm_bytes / mib:.0f} MiB"
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
