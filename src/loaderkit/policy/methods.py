"""``worker_method``: whether a loader's workers are processes or threads of the caller.

Pure functions of the request, the dataset's facts and a ``PlatformInfo``; see
``loaderkit.policy``. The rule, as the plan states it (row ``worker_method``):

* given ``"process"`` or ``"thread"``: as given;
* ``"auto"``: threads on Windows (worker processes start slowly there and need everything
  picklable), and where workers would start with ``spawn``/``forkserver`` (each re-imports the
  program and unpickles the dataset: seconds, and a copy of torch per worker) for a dataset
  that says it is safe to share between threads (``HDF5SessionDataset``, or a dataset with
  ``thread_safe = True``); processes elsewhere (``fork`` starts in milliseconds, and processes
  run Python in parallel);
* unset: processes (torch's behaviour), except under the Windows policy: on Windows, with
  ``force_zero_workers_on_windows`` left unset, ``num_workers=N`` loads with ``N`` threads.

``force_zero_workers_on_windows`` is ``None`` (unset) by default so that an explicit ``True``
can be told apart: ``True`` keeps the zero-worker policy (no workers at all on Windows),
``False`` keeps worker processes, unset lets the policy choose threads.

Examples:
    >>> from dataclasses import replace
    >>> from loaderkit.machine.platform import detect_platform
    >>> win = replace(detect_platform(), os_name="Windows", is_windows=True)
    >>> resolve_worker_method(None, win, DatasetFacts(), num_workers=2).value
    'thread'
"""

from __future__ import annotations

from loaderkit.errors import ConfigError
from loaderkit.machine.platform import PlatformInfo
from loaderkit.plan import counted
from loaderkit.policy.request import DatasetFacts, Decision

__all__ = ["WORKER_METHODS", "resolve_worker_method", "thread_workers_advice", "windows_threads"]

#: The values ``worker_method`` accepts (``None``: unset).
WORKER_METHODS = ("process", "thread", "auto")


def thread_workers_advice(num_workers: int, platform: PlatformInfo) -> str | None:
    """The advice torch gives on too many workers, for threads (``None``: no more than CPUs).

    torch warns of more worker *processes* than usable CPUs; threads share this process and
    its CPUs in the same way, so they get the same advice in words for threads (the loader
    warns it as a ``PerformanceHint``: loading stays correct, only slower).

    Examples:
        >>> from dataclasses import replace
        >>> from loaderkit.machine.platform import detect_platform
        >>> two = replace(detect_platform(), usable_cpus=2)
        >>> thread_workers_advice(2, two) is None
        True
        >>> advice = thread_workers_advice(4, two)
        >>> advice.startswith("This DataLoader will run 4 worker threads"), "is 2 (the" in advice
        (True, True)
    """
    if num_workers <= platform.usable_cpus:
        return None
    return (
        f"This DataLoader will run {num_workers} worker threads in this process. The suggested "
        f"max number of worker threads on this system is {platform.usable_cpus} (the CPUs "
        "this process may use), which is fewer than this DataLoader is going to run: threads "
        "beyond it take turns on the same CPUs and can make loading slower, not faster. Lower "
        f"num_workers to {platform.usable_cpus} or fewer if loading is slow."
    )


def windows_threads(platform: PlatformInfo, force_zero_workers_on_windows: bool | None) -> bool:
    """Whether the Windows policy turns worker processes into threads (force left unset).

    Examples:
        >>> from dataclasses import replace
        >>> from loaderkit.machine.platform import detect_platform
        >>> win = replace(detect_platform(), os_name="Windows", is_windows=True)
        >>> windows_threads(win, None), windows_threads(win, True)
        (True, False)
    """
    return platform.is_windows and force_zero_workers_on_windows is None


def resolve_worker_method(
    requested: str | None,
    platform: PlatformInfo,
    facts: DatasetFacts,
    *,
    num_workers: int,
    start_method: str = "fork",
    force_zero_workers_on_windows: bool | None = None,
    thread_problem: str | None = None,
) -> Decision[str]:
    """Decide whether workers are processes (``"process"``) or threads (``"thread"``).

    Args:
        requested: The ``worker_method`` argument (``None``: unset).
        platform: The platform to decide for.
        facts: What the policy needs of the dataset (``thread_safe``).
        num_workers: The resolved worker count (0: no workers, the value is moot).
        start_method: The start method worker processes would use.
        force_zero_workers_on_windows: As passed (``None``: unset).
        thread_problem: Why this torch cannot run thread workers (``None``: it can).

    Raises:
        ConfigError: An unknown value, or ``"thread"`` where this torch cannot run them.

    Examples:
        >>> from loaderkit.machine.platform import detect_platform
        >>> resolve_worker_method("thread", detect_platform(), DatasetFacts(), num_workers=2).value
        'thread'
        >>> resolve_worker_method(None, detect_platform(), DatasetFacts(), num_workers=2).value
        'process'
    """
    if requested is not None and requested not in WORKER_METHODS:
        raise ConfigError(
            f"worker_method={requested!r}: expected one of {', '.join(map(repr, WORKER_METHODS))}"
            " (or leave it unset: processes, threads under the Windows policy)"
        )
    if requested == "thread" and thread_problem is not None:
        raise ConfigError(
            f"worker_method='thread' cannot work with this torch: {thread_problem}. Use "
            "worker_method='process' (or leave it unset)."
        )
    if num_workers <= 0:
        return Decision(requested or "process", "no workers: batches load in the caller's thread")
    if requested in ("process", "thread"):
        return Decision(requested, "as given")
    threads_ok = thread_problem is None
    if requested == "auto":
        if platform.is_windows and threads_ok:
            return Decision(
                "thread", "'auto' on Windows: worker processes start slowly and pickle everything"
            )
        if start_method in ("spawn", "forkserver") and facts.thread_safe and threads_ok:
            return Decision(
                "thread",
                f"'auto': '{start_method}' workers re-import the program and unpickle "
                f"{facts.type_name} (seconds, a copy each); it is safe to share between "
                "threads, which start at once and share it",
            )
        why = (
            f"'{start_method}' starts worker processes quickly"
            if start_method == "fork"
            else f"{facts.type_name} does not say it is safe to share between threads "
            "(thread_safe = True)"
        )
        if not threads_ok:
            why = f"threads cannot work with this torch ({thread_problem})"
        return Decision("process", f"'auto': processes ({why}; they run Python in parallel)")
    if windows_threads(platform, force_zero_workers_on_windows) and threads_ok:
        return Decision(
            "thread",
            f"Windows: {counted(num_workers, 'thread')} of this process instead of worker "
            "processes "
            "(they start slowly and need everything picklable); worker_method='process' keeps "
            "processes, force_zero_workers_on_windows=True loads in the main process",
        )
    return Decision("process", "unset: worker processes (torch's behaviour)")
