"""The ``loaderkit bench`` measurements: loader configurations on one dataset, side by side.

``run_bench`` builds a loader per configuration (``num_workers`` x ``batch_size`` x
``persistent_workers``), times two passes of ``batches`` batches each (the second pass shows
what persistent workers save) and recommends the fastest. With workers it also measures their
unique memory (USS) after the first batch and at the end of the first pass: a dataset whose
Python objects forked workers copy as they read them (copy-on-read) shows there as growth per
worker. Nothing here prints.
"""

from __future__ import annotations

import importlib
import tempfile
import time
from dataclasses import asdict, dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

from loaderkit.errors import ConfigError
from loaderkit.factory import create_dataloader
from loaderkit.loader import DataLoader
from loaderkit.memory.resources import worker_uss
from loaderkit.order.hooks import call_hook
from loaderkit.plan import counted
from loaderkit.policy import recommended_num_workers

__all__ = ["NOISE", "BenchReport", "BenchResult", "load_dataset_class", "run_bench"]


#: Samples/s within this fraction of the best are within one run's noise on a shared machine
#: (a busy 2-core machine's repeated runs of one configuration differ by a few per cent).
NOISE = 0.05


@dataclass(frozen=True)
class BenchResult:
    """One configuration's measurements.

    Attributes:
        num_workers: Worker processes.
        batch_size: Samples per batch.
        persistent_workers: Whether workers survive between passes.
        first_batch_s: Seconds until the first batch of the first pass (worker start-up).
        second_pass_first_batch_s: The same for the second pass (restart cost).
        samples_per_s: Samples per second over both passes, start-ups included.
        batches: Batches timed per pass.
        worker_uss_mib: Unique memory (USS) of each worker at the end of the first pass, MiB
            (mean over workers; ``None`` without workers).
        worker_uss_growth_mib: How much each worker's USS grew over the first pass, from its
            first batch to its last, MiB (mean over workers; ``None`` without workers).
    """

    num_workers: int
    batch_size: int
    persistent_workers: bool
    first_batch_s: float
    second_pass_first_batch_s: float
    samples_per_s: float
    batches: int
    worker_uss_mib: float | None = None
    worker_uss_growth_mib: float | None = None


@dataclass
class BenchReport:
    """All results, the dataset description and the recommendation."""

    dataset: str
    samples: int
    results: list[BenchResult] = field(default_factory=list)

    @property
    def best(self) -> BenchResult | None:
        """The configuration with the highest samples/s."""
        return max(self.results, key=lambda r: r.samples_per_s, default=None)

    def within_noise(self) -> list[BenchResult]:
        """The other configurations within ``NOISE`` of the best's samples/s, fastest first.

        One timed run each cannot tell those apart from the best: another run may rank them
        the other way.
        """
        best = self.best
        if best is None:
            return []
        close = [
            r
            for r in self.results
            if r is not best and r.samples_per_s >= (1 - NOISE) * best.samples_per_s
        ]
        return sorted(close, key=lambda r: -r.samples_per_s)

    def noise_note(self) -> str | None:
        """A line saying which configurations are within noise of the best, or ``None``.

        Example:
            >>> report = BenchReport("d", 10, [_result(0, 6379.0), _result(2, 6383.0)])
            >>> report.noise_note().split(": ")[1]
            'num_workers=0 at 6,379 samples/s vs 6,383 (0.1 % slower)'
        """
        close = self.within_noise()
        best = self.best
        if best is None or not close:
            return None
        named = ", ".join(
            f"num_workers={r.num_workers} at {r.samples_per_s:,.0f} samples/s vs "
            f"{best.samples_per_s:,.0f} ({(1 - r.samples_per_s / best.samples_per_s) * 100:.1f} "
            "% slower)"
            for r in close
        )
        fewer = any(r.num_workers < best.num_workers for r in close)
        tail = "; the one with fewer workers costs less" if fewer else ""
        return (
            f"within noise ({NOISE * 100:.0f} %) of the best: {named}: one run each cannot rank "
            f"them{tail}"
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        best = self.best
        return {
            "dataset": self.dataset,
            "samples": self.samples,
            "results": [asdict(r) for r in self.results],
            "recommended": asdict(best) if best else None,
            "within_noise": [asdict(r) for r in self.within_noise()],
        }


def _result(num_workers: int, samples_per_s: float) -> BenchResult:
    """A made-up result (examples and tests of the report's arithmetic)."""
    return BenchResult(num_workers, 64, num_workers > 0, 0.1, 0.1, samples_per_s, 10)


def load_dataset_class(spec: str) -> type:
    """Import ``"package.module:ClassName"``.

    Raises:
        ConfigError: When the spec is malformed, the module cannot be imported or has no such
            attribute.

    Examples:
        >>> load_dataset_class("torch.utils.data:TensorDataset").__name__
        'TensorDataset'
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"--dataset {spec!r}: expected MODULE:CLASS, e.g. mypkg.data:MyDataset")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"--dataset {spec!r}: cannot import {module_name!r} ({exc}); is it "
            "installed or on PYTHONPATH?"
        ) from exc
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"--dataset {spec!r}: module {module_name!r} has no {attr!r}") from None
    if not callable(obj):
        raise ConfigError(f"--dataset {spec!r}: {attr!r} is not a class or factory")
    return obj


@dataclass
class _Pass:
    """One timed pass: seconds to its first batch, seconds in all, samples, workers' USS."""

    first_s: float = 0.0
    total_s: float = 0.0
    samples: int = 0
    uss_first: dict[int, int] = field(default_factory=dict)  # worker pid -> USS after batch 1
    uss_last: dict[int, int] = field(default_factory=dict)  # ... after the last batch

    def worker_uss_mib(self) -> tuple[float | None, float | None]:
        """(mean USS at the end, mean growth from the first batch to the last), MiB."""
        pids = set(self.uss_first) & set(self.uss_last)
        if not pids:
            return None, None
        last = sum(self.uss_last[p] for p in pids) / len(pids) / 2**20
        first = sum(self.uss_first[p] for p in pids) / len(pids) / 2**20
        return last, last - first


def _pass(iterator_source: Any, batches: int, *, measure_workers: bool = False) -> _Pass:
    """Time up to ``batches`` batches; with ``measure_workers``, the workers' USS around them.

    The USS readings are not timed (the clock stops while they are taken).
    """
    result = _Pass()
    last = batches - 1
    if hasattr(iterator_source, "__len__"):
        last = min(last, len(iterator_source) - 1)
    start = time.perf_counter()
    paused = 0.0
    for index, batch in enumerate(islice(iterator_source, batches)):
        if index == 0:
            result.first_s = time.perf_counter() - start
        result.samples += _batch_len(batch)
        if measure_workers and index in (0, last):
            mark = time.perf_counter()
            if index == 0:
                result.uss_first = worker_uss()
            if index == last:
                result.uss_last = worker_uss()
            paused += time.perf_counter() - mark
    result.total_s = time.perf_counter() - start - paused
    return result


def _batch_len(batch: Any) -> int:
    if hasattr(batch, "__len__") and not isinstance(batch, (list, tuple, dict)):
        return len(batch)
    if isinstance(batch, dict):
        return _batch_len(next(iter(batch.values()))) if batch else 0
    if isinstance(batch, (list, tuple)) and batch:
        return _batch_len(batch[0])
    return 1


def run_bench(
    dataset: str | None = None,
    kwargs: dict[str, Any] | None = None,
    root: str | Path | None = None,
    workers: list[int] | None = None,
    batch_sizes: list[int] | None = None,
    batches: int = 50,
) -> BenchReport:
    """Measure loader configurations on a dataset and return the results.

    Args:
        dataset: ``"module:Class"`` of a map-style dataset, or ``None`` for the demo's
            generated session files (written under ``root``).
        kwargs: Keyword arguments for the dataset class.
        root: Directory for generated files (a temporary one when ``None``).
        workers: Worker counts (default: 0, 1, 2 and the recommended count).
        batch_sizes: Batch sizes (default: 32 and 128).
        batches: Batches per timed pass.

    Returns:
        A ``BenchReport`` (``report.best`` is the recommendation).

    Examples:
        >>> report = run_bench("torch.utils.data:TensorDataset", batches=2,  # doctest: +SKIP
        ...                    workers=[0], batch_sizes=[4])
    """
    if dataset is None:
        from loaderkit.cli.demo import DemoSessions, make_sessions

        if root is None:
            with tempfile.TemporaryDirectory(prefix="loaderkit-bench-") as tmp:
                return run_bench(None, kwargs, tmp, workers, batch_sizes, batches)
        paths = make_sessions(Path(root))
        data: Any = DemoSessions(paths, key="betas", **(kwargs or {}))
        name = f"generated session files ({counted(len(paths), 'session')}) in {root}"
    else:
        cls = load_dataset_class(dataset)
        try:
            data = cls(**(kwargs or {}))
        except TypeError as exc:
            raise ConfigError(
                f"--dataset {dataset}: cannot build it with --kwargs {kwargs or {}} ({exc})"
            ) from exc
        name = dataset
    try:
        samples = len(data)
    except TypeError:
        raise ConfigError(f"{name}: bench needs a map-style dataset with a length") from None

    counts = sorted(set(workers if workers is not None else [0, 1, 2, recommended_num_workers()]))
    report = BenchReport(dataset=name, samples=samples)
    try:
        for num_workers in counts:
            for batch_size in batch_sizes or [32, 128]:
                for persistent in [False, True] if num_workers > 0 else [False]:
                    loader: DataLoader[Any] = create_dataloader(
                        data,
                        batch_size=batch_size,
                        shuffle=True,
                        seed=0,
                        num_workers=num_workers,
                        persistent_workers=persistent,
                    )
                    with loader:
                        a = _pass(loader, batches, measure_workers=num_workers > 0)
                        b = _pass(loader, batches)
                    uss, growth = a.worker_uss_mib()
                    report.results.append(
                        BenchResult(
                            num_workers=num_workers,
                            batch_size=batch_size,
                            persistent_workers=persistent,
                            first_batch_s=a.first_s,
                            second_pass_first_batch_s=b.first_s,
                            samples_per_s=(a.samples + b.samples)
                            / max(a.total_s + b.total_s, 1e-9),
                            batches=batches,
                            worker_uss_mib=uss,
                            worker_uss_growth_mib=growth,
                        )
                    )
    finally:
        call_hook(data, "close")
    return report
