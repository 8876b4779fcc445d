"""The checks before workers start: worker processes, what they receive, their start method.

``plan_loader`` (``loaderkit.planning``) calls them in order: ``pickle_checks`` pickles once
what spawn/forkserver workers would receive; ``fit_start_method_to`` puts ``fork`` in place of
a spawn-like default the program cannot run under (``loaderkit.policy.start_method``: a main
script's unguarded top level, a dataset that cannot be pickled), or raises; ``check_picklable``
turns what is left into the picklability ``ConfigError`` or warnings and the
``pickled_dataset`` plan row. ``Findings`` collects what every check adds to the plan.

Examples:
    >>> from loaderkit.policy import DatasetFacts, LoaderRequest, resolve
    >>> from loaderkit.machine.platform import detect_platform
    >>> res = resolve(LoaderRequest(num_workers=2), DatasetFacts(), detect_platform())
    >>> worker_processes(res) in (0, 2)
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from loaderkit import _torch
from loaderkit.errors import ConfigError
from loaderkit.machine.main_module import find_unguarded_call
from loaderkit.machine.platform import PlatformInfo
from loaderkit.memory.preflight import check_pickle
from loaderkit.plan import UNSET, PlanEntry, counted
from loaderkit.policy import LoaderRequest, Resolution, unpicklable_is_error
from loaderkit.policy.start_method import fit_start_method

__all__ = [
    "LARGE_PICKLE_BYTES",
    "Findings",
    "check_picklable",
    "counted_processes",
    "fit_start_method_to",
    "pickle_checks",
    "worker_processes",
    "worker_threads",
]

#: Pickled dataset size above which spawn/forkserver loaders warn (each worker gets a copy).
LARGE_PICKLE_BYTES = 64 * 2**20

#: Loaders given fork instead of a spawn-like default, already warned about (once per cause).
_WARNED_START_METHODS: set[tuple[str, ...]] = set()


@dataclass
class Findings:
    """What the checks add to the plan: warning texts, hint texts and plan entries."""

    warnings: list[str]
    entries: list[PlanEntry]
    hints: list[str] = field(default_factory=list)


#: Start methods the checks know (an invalid ``multiprocessing_context`` is torch's to reject).
_START_METHODS = ("fork", "spawn", "forkserver")


def worker_processes(res: Resolution) -> int:
    """The resolved count of worker *processes*, 0 when none (threads, or not an int)."""
    num_workers = res.values["num_workers"]
    ok = isinstance(num_workers, int) and res.start_method in _START_METHODS
    ok = ok and res.worker_method == "process"
    return num_workers if ok and num_workers > 0 else 0


def counted_processes(res: Resolution) -> Any:
    """``num_workers`` as the budgets count processes: 0 worker processes for threads."""
    return 0 if res.worker_method == "thread" else res.values["num_workers"]


def worker_threads(res: Resolution) -> int:
    """The loader's worker threads: ``num_workers`` under ``worker_method="thread"``, else 0."""
    workers = res.values["num_workers"]
    return max(0, workers) if res.worker_method == "thread" and isinstance(workers, int) else 0


def pickle_checks(dataset: Any, request: LoaderRequest, res: Resolution) -> dict[str, Any]:
    """What spawn/forkserver workers would receive, each pickled once (``{}``: nothing sent)."""
    if not worker_processes(res) or res.start_method not in ("spawn", "forkserver"):
        # fork, or an invalid multiprocessing_context that torch rejects with its own error
        return {}
    # what torch really sends (DataPipes go inside a wrapper that falls back to dill)
    objects = {name: getattr(request, name) for name in ("collate_fn", "worker_init_fn")}
    objects.update(sampler=request.sampler, batch_sampler=request.batch_sampler)
    objects = {"dataset": _torch.as_sent_to_workers(dataset), **objects}
    return {name: check_pickle(obj, name) for name, obj in objects.items() if obj is not None}


def fit_start_method_to(
    res: Resolution, platform: PlatformInfo, checks: Mapping[str, Any], found: Findings
) -> Resolution:
    """Fork in place of a spawn-like default the program cannot run under (policy.start_method)."""
    if not checks:
        return res
    context = res.values["multiprocessing_context"]
    problems = [c.problem for n, c in checks.items() if c.problem and unpicklable_is_error(n)]
    fit = fit_start_method(
        platform,
        res.start_method,
        "argument" if context is not None else platform.start_method_source,
        rerun=find_unguarded_call(),
        problem=problems[0].message(res.start_method) if problems else None,
    )
    if fit is None:
        return res
    if fit.key not in _WARNED_START_METHODS:
        _WARNED_START_METHODS.add(fit.key)
        found.warnings.append(fit.warning)
    row = PlanEntry("start_method", UNSET, fit.start_method, fit.reason)
    found.entries[:] = [row if e.name == "start_method" else e for e in found.entries]
    values = {**res.values, "multiprocessing_context": fit.start_method}
    return replace(res, start_method=fit.start_method, values=values)


def check_picklable(checks: Mapping[str, Any], res: Resolution, found: Findings) -> None:
    """Spawn/forkserver preflight: fail early, naming the attribute that cannot be pickled."""
    if not checks or res.start_method not in ("spawn", "forkserver"):
        return
    num_workers = res.values["num_workers"]
    for name, check in checks.items():
        problem = check.problem
        if problem is None:
            continue
        if unpicklable_is_error(name):
            raise ConfigError(problem.message(res.start_method))
        found.warnings.append(
            f"{problem.path} cannot be pickled ({problem.reason}). It stays in the main "
            "process, so loading works, but it cannot be checkpointed or sent to another "
            f"process. Fix: {problem.fix}."
        )
    size = checks["dataset"].size or 0  # pickled once, above
    found.entries.append(
        PlanEntry(
            "pickled_dataset",
            None,
            f"{size / 2**20:.1f} MiB",
            f"copied to each of {num_workers} '{res.start_method}' workers at start",
        )
    )
    if size > LARGE_PICKLE_BYTES:
        found.warnings.append(
            f"the dataset pickles to {size / 2**20:.0f} MiB and the '{res.start_method}' start "
            f"method sends a copy to each of the {counted(num_workers, 'worker')} "
            f"({num_workers * size / 2**20:.0f} MiB in all, at every start). Keep large arrays "
            "as torch tensors (shared, not copied), memory-map them, or load them lazily in "
            "the worker."
        )
