"""Cost of a mid-epoch resume: time to the first batch after resuming at 90 % of a pass.

Usage: python benchmarks/resume.py [--quick] [--json PATH]

On the ``small-rows`` workload of BENCHMARKS.md (NSD-like session files, shuffled, batch 64,
``seed`` and ``sample_seeding=True``), each scenario builds a new loader and times it to its
first batch, worker start-up included:

- ``fresh start``: pass 0 from its beginning (the reference, 1.00);
- ``resume at 90 %``: ``load_state_dict`` of a state taken after 90 % of pass 0's batches; the
  skipped batches are dropped at the index level, so nothing of them is read;
- ``replay to 90 %``: what a loader without state has to do to get there exactly: iterate and
  discard 90 % of the pass (every sample read, collated and sent from the workers).

Scenarios are interleaved and repeated; the table gives medians and ratios to the fresh start
measured in the same run. The first batch of each resumed loader is checked against the
uninterrupted run.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

try:
    import _cli
    from _workloads import WORKLOADS, make_workload
except ImportError:  # imported as a module from elsewhere (tests)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _cli
    from _workloads import WORKLOADS, make_workload

from loaderkit import DataLoader, HDF5SessionDataset

SCENARIOS = ("fresh start", "resume at 90 %", "replay to 90 %")


def _loader(paths: list[Path], workers: int) -> DataLoader:
    return DataLoader(
        HDF5SessionDataset(paths, key="betas"),
        batch_size=64,
        shuffle=True,
        seed=0,
        sample_seeding=True,
        num_workers=workers,
    )


def _first_batch(
    paths: list[Path], workers: int, prepare: Callable[[DataLoader, Any], Any]
) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    loader = _loader(paths, workers)
    iterator = prepare(loader, iter)
    batch = next(iterator)
    elapsed = time.perf_counter() - start
    del iterator
    loader.close()
    return elapsed, batch


def run(quick: bool) -> dict[str, Any]:
    """Measure every scenario for 0 and 2 workers; return the results by worker count."""
    workload = WORKLOADS["small-rows"]
    repeats = 3 if quick else 7
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        paths = make_workload(Path(tmp), workload, quick=quick)
        for workers in (0, 2):
            with _loader(paths, 0) as reference:
                batches = len(reference)
                skip = int(0.9 * batches)
                state = {**reference.state_dict(), "batches_yielded": skip}
                expected = next(b for i, b in enumerate(reference) if i == skip)

            def fresh(loader: DataLoader, make_iter: Any) -> Any:
                return make_iter(loader)

            def resume(loader: DataLoader, make_iter: Any, state: Any = state) -> Any:
                loader.load_state_dict(state)
                return make_iter(loader)

            def replay(loader: DataLoader, make_iter: Any, skip: int = skip) -> Any:
                iterator = make_iter(loader)
                for _ in range(skip):
                    next(iterator)
                return iterator

            scenarios = dict(zip(SCENARIOS, (fresh, resume, replay), strict=True))
            times: dict[str, list[float]] = {name: [] for name in SCENARIOS}
            for _ in range(repeats):
                for name, prepare in scenarios.items():
                    elapsed, batch = _first_batch(paths, workers, prepare)
                    if name != "fresh start" and not torch.equal(batch, expected):
                        raise AssertionError(f"{name}: not the batch of the uninterrupted run")
                    times[name].append(elapsed)
            base = statistics.median(times["fresh start"])
            results[f"num_workers={workers}"] = {
                "batches_per_pass": batches,
                "skipped": skip,
                "scenarios": {
                    name: {
                        "ms_to_first_batch": statistics.median(t) * 1e3,
                        "ratio_to_fresh": statistics.median(t) / base,
                    }
                    for name, t in times.items()
                },
            }
    return {"workload": workload.name, "quick": quick, "repeats": repeats, "results": results}


def format_table(data: dict[str, Any]) -> str:
    """The results as a markdown table."""
    lines = [
        "| loader | scenario | batches skipped | ms to first batch | ratio to fresh start |",
        "|---|---|---|---|---|",
    ]
    for loader, r in data["results"].items():
        for name, s in r["scenarios"].items():
            skipped = 0 if name == "fresh start" else r["skipped"]
            lines.append(
                f"| {loader} | {name} | {skipped} of {r['batches_per_pass']} | "
                f"{s['ms_to_first_batch']:.1f} | {s['ratio_to_fresh']:.2f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = _cli.parser(__doc__, "smaller files, fewer repeats")
    args = parser.parse_args(argv)
    data = run(args.quick)
    _cli.emit(data, format_table(data), args.json)
    return data


if __name__ == "__main__":
    main()
