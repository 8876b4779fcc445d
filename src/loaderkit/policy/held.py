"""Sessions held in memory: how many bytes of whole sessions each process of a loader may hold.

Where one row spans many chunks (NSD's betas), a process that holds a session's rows in
memory reads the session once while its rows are served (``max_session_bytes``). The budget
is a share of the memory the process may use (``PlatformInfo.memory_bytes``: the lowest
cgroup limit on its path, else physical memory), shared by the loader's processes; every
reason names that figure and where it came from (``memory_words``). Pure arithmetic: nothing
here reads the machine.
"""

from __future__ import annotations

from dataclasses import dataclass

from loaderkit.plan import counted

__all__ = [
    "BLOCK_SESSION_SHARE",
    "PROCESS_ROOM",
    "SESSION_MEMORY_SHARE",
    "SessionBudget",
    "fit_session_bytes",
    "memory_words",
    "size_words",
]

#: Share of memory the sessions held in memory by one loader may take, all its processes
#: together (rows that span many chunks: ``max_session_bytes``).
SESSION_MEMORY_SHARE = 1 / 4
#: Share of memory one session per process may take, all processes together, when the order
#: reads the sessions one at a time (``shuffle="block"``) and a quarter holds none: held, each
#: session is read once per pass; not held, every batch reads its session's chunks again.
BLOCK_SESSION_SHARE = 1 / 3
#: Memory left to each process beside the session it holds under ``BLOCK_SESSION_SHARE``:
#: Python, torch and numpy (about 340 MiB measured with torch 2.13) and the batches in flight.
PROCESS_ROOM = 512 << 20


@dataclass(frozen=True)
class SessionBudget:
    """How many bytes of whole sessions each process of a loader may hold in memory, and why.

    Attributes:
        bytes: ``max_session_bytes``: most bytes held at once per process (0: none).
        sessions: Whole sessions of the largest size that fit at once.
        reason: The arithmetic, for the plan.

    Example:
        >>> SessionBudget(1 << 30, 1, "1 of 37 sessions per process").sessions
        1
    """

    bytes: int
    sessions: int
    reason: str


def size_words(nbytes: int) -> str:
    """Bytes as MiB or GiB for messages.

    Example:
        >>> size_words(3 << 29), size_words(40 << 20)
        ('1.50 GiB', '40.0 MiB')
    """
    if nbytes >= 1 << 30:
        return f"{nbytes / (1 << 30):.2f} GiB"
    return f"{nbytes / (1 << 20):.1f} MiB"


def memory_words(memory_bytes: int, source: str | None = None) -> str:
    """The memory figure budgets are fitted to, with where it came from, for messages.

    Examples:
        >>> memory_words(1536 << 20, "cgroup v1 /slurm/uid_0/job_7 memory.limit_in_bytes")
        '1.50 GiB (cgroup v1 /slurm/uid_0/job_7 memory.limit_in_bytes)'
        >>> memory_words(24 << 30)
        '24.00 GiB'
    """
    return f"{size_words(memory_bytes)} ({source})" if source else size_words(memory_bytes)


def fit_session_bytes(
    session_bytes: int,
    sessions: int,
    num_workers: int,
    memory_bytes: int | None,
    memory_source: str | None = None,
    *,
    block_order: bool = False,
) -> SessionBudget:
    """Bytes of whole sessions each process may hold: as many sessions as fit a share of memory.

    When one row spans many chunks (NSD betas), reading any rows of a session reads every
    chunk of it, so a process that holds the session's rows in memory reads it once while
    its rows are served. Every process of the loader (the main one and each worker) may hold
    ``bytes``; all of them together stay within ``SESSION_MEMORY_SHARE`` of memory. The
    budget is a whole number of the largest sessions, at most all of them. When none fits and
    the order reads the sessions one at a time (``block_order``: loaderkit's block sampler,
    whose window then is one session), one session per process may take up to
    ``BLOCK_SESSION_SHARE`` of memory, all processes together, where that leaves each
    process ``PROCESS_ROOM``: the order then reads each session once per pass instead of
    once per batch. Else 0: rows are read batch by batch,
    each batch reading every chunk of its sessions once.

    Args:
        session_bytes: Bytes of the largest session's rows held in memory (0: nothing to
            hold, no key's rows span many chunks).
        sessions: Session files of the dataset.
        num_workers: Worker processes of the loader (0: the main process only).
        memory_bytes: Memory this process may use (``PlatformInfo.memory_bytes``; ``None``:
            unknown, nothing held).
        memory_source: Where ``memory_bytes`` came from, for the reason.
        block_order: The loader's order reads its sessions one at a time when one is held
            (``shuffle="block"``).

    Returns:
        The ``SessionBudget``.

    Examples:
        >>> budget = fit_session_bytes(30 << 20, 4, 2, 24 << 30)
        >>> budget.bytes == 4 * (30 << 20), budget.sessions
        (True, 4)
        >>> fit_session_bytes(1 << 30, 37, 2, 24 << 30).sessions  # 6 GiB / 3 processes
        2
        >>> fit_session_bytes(1 << 30, 37, 8, 16 << 30).bytes  # 4 GiB / 9 processes < 1 GiB
        0
        >>> job = 1536 << 20  # NSD's 429 MiB sessions in a 1.5 GiB job
        >>> fit_session_bytes(450_000_000, 6, 0, job).sessions  # a quarter: 384 MiB
        0
        >>> fit_session_bytes(450_000_000, 6, 0, job, block_order=True).sessions  # a third
        1
        >>> procs = fit_session_bytes(450_000_000, 6, 2, job, block_order=True)  # 3 x 429 MiB
        >>> procs.sessions, "worker_method='thread'" in procs.reason
        (0, True)
        >>> fit_session_bytes(150 << 20, 6, 0, 512 << 20, block_order=True).sessions  # no room
        0
    """
    processes = max(0, num_workers) + 1
    if session_bytes <= 0:
        return SessionBudget(0, 0, "no key's rows span many chunks: nothing to hold")
    if memory_bytes is None:
        return SessionBudget(
            0, 0, "the machine's memory is unknown: nothing held (pass max_session_bytes=)"
        )
    share = int(memory_bytes * SESSION_MEMORY_SHARE)
    per_process = share // processes
    fit = min(max(1, sessions), per_process // session_bytes)
    arithmetic = (
        f"{counted(processes, 'process', 'processes')} x {{held}} <= {size_words(share)} "
        f"({SESSION_MEMORY_SHARE:.3g} of "
        f"{memory_words(memory_bytes, memory_source)})"
    )
    if fit == 0 and block_order:
        block = _block_budget(session_bytes, processes, memory_bytes, memory_source)
        if block is not None:
            return block
    if fit == 0:
        threads = ""
        if block_order and processes > 1 and _block_budget(session_bytes, 1, memory_bytes, None):
            threads = (
                "; worker threads share one process, which holds one session "
                "(worker_method='thread': each session read once per pass)"
            )
        return SessionBudget(
            0,
            0,
            f"one session's rows ({size_words(session_bytes)}) do not fit: "
            + arithmetic.format(held=size_words(session_bytes))
            + " fails; nothing held: each batch reads its sessions' chunks once"
            + threads,
        )
    held = fit * session_bytes
    head = (
        f"all {counted(fit, 'session')} per process"
        if fit >= sessions
        else f"{fit} of {counted(sessions, 'session')} per process"
    )
    return SessionBudget(
        held,
        fit,
        f"{head} ({fit} x {size_words(session_bytes)}): "
        + arithmetic.format(held=size_words(held)),
    )


def _block_budget(
    session_bytes: int, processes: int, memory_bytes: int, memory_source: str | None
) -> SessionBudget | None:
    """One session per process within ``BLOCK_SESSION_SHARE`` of memory, or ``None``."""
    share = int(memory_bytes * BLOCK_SESSION_SHARE)
    held = processes * session_bytes
    if held > share or memory_bytes - held < processes * PROCESS_ROOM:
        return None
    return SessionBudget(
        session_bytes,
        1,
        f"block order: 1 session per process ({size_words(session_bytes)}), so that each is "
        f"read once per pass: {counted(processes, 'process', 'processes')} x "
        f"{size_words(session_bytes)} <= {size_words(share)} ({BLOCK_SESSION_SHARE:.3g} of "
        f"{memory_words(memory_bytes, memory_source)}; a quarter holds none), leaving "
        f"{size_words(PROCESS_ROOM)} or more a process",
    )
