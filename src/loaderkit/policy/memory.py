"""Pure decisions about forked workers' memory: the copy-on-read advice and ``gc.freeze()``.

Policies in the sense of ``loaderkit.policy``: they receive facts (what
``loaderkit.memory.containers.survey_containers`` found in the dataset, the start method, the worker
count) and return a decision with its reason; nothing here reads the machine or the dataset,
starts a process or emits a warning (``loaderkit.planning`` emits the hint and records the plan
rows ``copy_on_read`` and ``gc_freeze``).
"""

from __future__ import annotations

from dataclasses import dataclass

from loaderkit.memory.containers import ContainerSurvey, mib
from loaderkit.plan import counted
from loaderkit.policy.request import Decision

__all__ = [
    "COPY_ON_READ_BYTES",
    "CopyOnReadAdvice",
    "advise_copy_on_read",
    "resolve_gc_freeze",
]

#: Python objects reachable from the dataset above which forked workers get a copy-on-read hint.
COPY_ON_READ_BYTES = 16 * 2**20

_COPY_ON_READ_FIX = (
    "keep such data in one buffer: loaderkit.SharedSequence(items) for a sequence of any "
    "picklable items, numpy arrays or tensors for numbers and fixed-width strings (a pandas "
    "column: df[col].to_numpy(dtype=...)), or open it lazily in each worker"
)


@dataclass(frozen=True)
class CopyOnReadAdvice:
    """What ``advise_copy_on_read`` decided: the plan row and the hint to emit, if any.

    Attributes:
        value: The ``copy_on_read`` plan row's value.
        reason: The row's reason.
        hint: The text of a ``PerformanceHint`` to emit, or ``None``.
    """

    value: str
    reason: str
    hint: str | None = None


def advise_copy_on_read(
    survey: ContainerSurvey,
    start_method: str,
    num_workers: int,
    *,
    threshold: int = COPY_ON_READ_BYTES,
) -> CopyOnReadAdvice:
    """Whether the dataset's Python containers will be copied into each worker, and the fix.

    Under ``fork``, a worker shares the parent's memory until it writes to a page, and reading a
    Python object writes its reference count: the containers a worker reads end up copied in
    it, one copy per worker, growing as it reads (copy-on-read). From ``threshold`` bytes of
    such objects the advice carries a hint naming the largest containers and the fix. Under
    ``spawn``/``forkserver`` each worker unpickles its own copy of the dataset at start, so
    nothing shared is copied later: no hint, and the row says what each worker receives.

    Args:
        survey: What ``loaderkit.memory.containers.survey_containers`` found in the dataset.
        start_method: The workers' start method.
        num_workers: Worker processes (> 0).
        threshold: Bytes of Python objects from which a forked loader gets the hint.

    Returns:
        A ``CopyOnReadAdvice``.

    Examples:
        >>> from loaderkit.memory.containers import ContainerFinding, ContainerSurvey
        >>> items = ContainerFinding("dataset.items", "list", 2_000_000, "tuples", 350 * 2**20)
        >>> survey = ContainerSurvey((items,), visited=2)
        >>> advise_copy_on_read(survey, "fork", 2).hint.startswith(
        ...     "dataset.items: list of 2,000,000 tuples, ~350 MiB, copied into each of 2 workers"
        ... )
        True
        >>> advise_copy_on_read(survey, "spawn", 2).hint is None
        True
    """
    findings = survey.findings
    walked = f"walked {survey.visited} objects" + (
        ", then stopped at the walk's limit" if survey.truncated else ""
    )
    if start_method != "fork":
        reason = (
            f"'{start_method}' workers each unpickle their own copy of the dataset at start "
            "(see pickled_dataset): nothing shared is copied as they read"
        )
        if findings:
            reason += (
                f"; its Python containers ({findings[0].describe()}"
                + (f" and {len(findings) - 1} more" if len(findings) > 1 else "")
                + f") are rebuilt object by object in each of {counted(num_workers, 'worker')}: "
                "loaderkit.SharedSequence sends such a sequence as one buffer"
            )
        return CopyOnReadAdvice("not applicable", reason)
    total = survey.nbytes
    if total < threshold:
        largest = survey.largest
        value = "none found" if largest is None else f"none over {mib(threshold)}"
        reason = (
            "no list, dict, set, object array or object column large enough to matter is "
            f"reachable from the dataset ({walked}"
            + (f"; largest: {largest.describe()}" if largest is not None else "")
            + ")"
        )
        return CopyOnReadAdvice(value, reason)
    shown = "; ".join(f.describe() for f in findings[:3])
    more = f"; and {len(findings) - 3} more" if len(findings) > 3 else ""
    several = len(findings) > 1
    hint = (
        f"{shown}{more}, copied into each of {counted(num_workers, 'worker')} as they read "
        f"{'them' if several else 'it'}"
        + (f" (~{mib(total)} in all per worker)" if several else "")
        + " (start method 'fork': reading a Python object writes its reference count, so "
        "every page of objects a worker reads becomes its own copy; memory grows with "
        "num_workers and over the first epoch, and is not a leak). Fix: "
        + _COPY_ON_READ_FIX
        + ". Measure it with loaderkit.LeakCheck (worker USS)."
    )
    value = f"~{mib(total)} per worker"
    reason = (
        f"{shown}{more}: Python objects each of {num_workers} forked workers copies as it "
        f"reads them ({walked})"
    )
    return CopyOnReadAdvice(value, reason, hint)


def resolve_gc_freeze(start_method: str, num_workers: int) -> Decision[bool]:
    """Whether each worker calls ``gc.freeze()`` as it starts.

    A forked worker's garbage collector, when it runs a full collection, writes to the header
    of every container object it inherited (the parent's modules, classes, the dataset's
    records): each page of them becomes the worker's own copy, about 35 MiB per worker with
    torch imported, and more with a large dataset. ``gc.freeze()`` in the worker, before it
    reads anything, moves what it inherited out of the collector's reach (CPython's advice for
    pre-fork servers); the training process is left alone. A ``worker_init_fn`` can call
    ``gc.unfreeze()`` to undo it.

    Args:
        start_method: The workers' start method.
        num_workers: Worker processes.

    Returns:
        ``Decision(True, ...)`` for workers forked from this process or from the forkserver.

    Examples:
        >>> resolve_gc_freeze("fork", 2).value, resolve_gc_freeze("spawn", 2).value
        (True, False)
    """
    if num_workers <= 0:
        return Decision(False, "no worker processes")
    if start_method not in ("fork", "forkserver"):
        return Decision(
            False,
            f"'{start_method}' workers start a fresh interpreter: they inherit no objects "
            "whose pages a collection could copy",
        )
    parent = "this process" if start_method == "fork" else "the forkserver process"
    return Decision(
        True,
        f"each worker calls gc.freeze() as it starts: its garbage collector then never writes "
        f"to the objects it inherited from {parent}, which stay shared instead of being copied "
        "page by page into every worker (call gc.unfreeze() in worker_init_fn to undo)",
    )
