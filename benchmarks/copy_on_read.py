"""Copy-on-read in forked workers: a list of Python tuples vs loaderkit.SharedSequence.

Usage: python benchmarks/copy_on_read.py [--quick] [--json PATH]

The case of issue 30: a dataset keeping 2,000,000 ``(str, int, float)`` tuples in a list
(``--quick``: 300,000), read by 2 persistent forked workers, batch 4096, one shuffled epoch.
Side by side in one run, each on fresh workers:

* torch's ``DataLoader`` over the list;
* ``loaderkit.create_dataloader`` over the list, as is (its workers call ``gc.freeze()``);
* ``create_dataloader`` over the same items in a ``SharedSequence`` (the remedy);
* torch's ``DataLoader`` over the ``SharedSequence`` (the remedy alone, no ``gc.freeze()``);
* torch's ``DataLoader`` over the list and over the ``SharedSequence`` with ``gc.freeze()`` as
  its ``worker_init_fn``: what the freeze loaderkit's workers do adds, measured alone.

For each: the workers' unique memory (USS, mean per worker) after the first batch and after
the epoch, the growth in between as a share of the list's objects (per worker), and samples/s
over the epoch after the first batch (median over the rounds; its ratio to the list under
torch and under loaderkit). Also: the cost of loaderkit's walk over the dataset that finds the
list (``loaderkit.memory.containers.survey_containers``, median of repeats) and the hint it raises.
Targets (issue 30): with the remedy, growth <= 10 % of the list's size per worker and samples/s
>= 0.8x the plain list; the walk < 50 ms.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cli import emit, parser

from loaderkit import PerformanceHint, SharedSequence, create_dataloader
from loaderkit.memory.containers import survey_containers
from loaderkit.memory.resources import worker_processes, worker_uss

_MIB = 2**20
BATCH = 4096
WORKERS = 2


class ItemsDataset(Dataset):
    """The issue's dataset: its samples are the items of ``self.items``."""

    def __init__(self, items: Sequence[Any]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> Any:
        return self.items[index]


def _freeze(worker_id: int) -> None:
    """worker_init_fn doing what loaderkit's workers do first: gc.freeze()."""
    gc.freeze()


def _torch(items: Sequence[Any], **extra: Any) -> Any:
    return DataLoader(
        ItemsDataset(items),
        batch_size=BATCH,
        shuffle=True,
        num_workers=WORKERS,
        persistent_workers=True,
        multiprocessing_context="fork",
        generator=torch.Generator().manual_seed(0),
        **extra,
    )


def _loaderkit(items: Sequence[Any], **extra: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PerformanceHint)  # recorded once, below
        return create_dataloader(
            ItemsDataset(items),
            batch_size=BATCH,
            shuffle=True,
            num_workers=WORKERS,
            persistent_workers=True,
            multiprocessing_context="fork",
            seed=0,
            **extra,
        )


def _mean_uss() -> float:
    values = list(worker_uss().values())
    assert len(values) == WORKERS, f"expected {WORKERS} workers, found {len(values)}"
    return sum(values) / len(values) / _MIB


def _wait_workers_gone(timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while worker_processes() and time.monotonic() < deadline:
        time.sleep(0.05)


def _epoch(make: Callable[[], Any]) -> dict[str, float]:
    """One shuffled epoch on fresh workers: USS after the first batch and after it, samples/s."""
    loader = make()
    iterator = iter(loader)
    first = next(iterator)
    uss_first = _mean_uss()
    samples, batch = 0, None
    start = time.perf_counter()
    for batch in iterator:
        samples += len(batch[0])
    elapsed = time.perf_counter() - start
    uss_epoch = _mean_uss()
    del first, batch, iterator
    close = getattr(loader, "close", None)
    if close is not None:
        close()
    del loader
    gc.collect()  # torch's persistent workers stop when their iterator is collected
    _wait_workers_gone()
    return {
        "uss_first_batch_mib": uss_first,
        "uss_epoch_mib": uss_epoch,
        "samples_per_s": samples / elapsed,
    }


def _objects_bytes(items: list[tuple[Any, ...]]) -> int:
    """Bytes of the list's objects: the tuples and what they hold (getsizeof, each once)."""
    return sum(sys.getsizeof(t) + sum(sys.getsizeof(x) for x in t) for t in items)


def _walk(items: list[Any], repeats: int) -> tuple[float, str]:
    """Median milliseconds of the survey on the issue's dataset, and the hint it leads to."""
    dataset = ItemsDataset(items)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        survey_containers(dataset)
        times.append((time.perf_counter() - start) * 1e3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        create_dataloader(
            dataset, batch_size=BATCH, num_workers=WORKERS, multiprocessing_context="fork"
        )
    hints = [str(w.message) for w in caught if issubclass(w.category, PerformanceHint)]
    return statistics.median(times), hints[0] if hints else ""


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser(__doc__, "300,000 items, 2 rounds (under a minute)").parse_args(argv)
    n, rounds = (300_000, 2) if args.quick else (2_000_000, 3)
    items = [(f"trial_{i:07d}.npy", i + 1000, i * 0.5) for i in range(n)]
    list_bytes = _objects_bytes(items)
    start = time.perf_counter()
    shared = SharedSequence(items)
    build_s = time.perf_counter() - start
    walk_ms, hint = _walk(items, repeats=9)

    configs: dict[str, Callable[[], Any]] = {
        "torch DataLoader, list": lambda: _torch(items),
        "loaderkit, list": lambda: _loaderkit(items),
        "loaderkit, SharedSequence": lambda: _loaderkit(shared),
        "torch DataLoader, SharedSequence": lambda: _torch(shared),
        "torch DataLoader, list, gc.freeze()": lambda: _torch(items, worker_init_fn=_freeze),
        "torch DataLoader, SharedSequence, gc.freeze()": lambda: _torch(
            shared, worker_init_fn=_freeze
        ),
    }
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in configs}
    for _ in range(rounds):  # interleaved: every configuration sees the same machine state
        for name, make in configs.items():
            runs[name].append(_epoch(make))

    rows = []
    for name, results in runs.items():
        first = statistics.median(r["uss_first_batch_mib"] for r in results)
        epoch = statistics.median(r["uss_epoch_mib"] for r in results)
        growth = statistics.median(r["uss_epoch_mib"] - r["uss_first_batch_mib"] for r in results)
        rows.append(
            {
                "loader": name,
                "uss_first_batch_mib": first,
                "uss_epoch_mib": epoch,
                "growth_mib": growth,
                "growth_pct_of_list": 100 * growth * _MIB / list_bytes,
                "samples_per_s": statistics.median(r["samples_per_s"] for r in results),
                "rounds": results,
            }
        )
    by_name = {row["loader"]: row for row in rows}
    for row in rows:
        row["vs_torch_list"] = (
            row["samples_per_s"] / by_name["torch DataLoader, list"]["samples_per_s"]
        )
        row["vs_loaderkit_list"] = (
            row["samples_per_s"] / by_name["loaderkit, list"]["samples_per_s"]
        )

    lines = [
        f"{n:,} (str, int, float) tuples: {list_bytes / _MIB:.0f} MiB of objects in the list, "
        f"{shared.nbytes / _MIB:.0f} MiB as a SharedSequence (built in {build_s:.1f} s); "
        f"{WORKERS} persistent forked workers, batch {BATCH}, one shuffled epoch each, median "
        f"of {rounds} rounds; USS is per worker",
        "",
        "| loader | USS after 1st batch MiB | USS after epoch MiB | growth MiB | growth % of "
        "list | samples/s | vs torch list | vs loaderkit list |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['loader']} | {row['uss_first_batch_mib']:.0f} | {row['uss_epoch_mib']:.0f} "
            f"| {row['growth_mib']:+.0f} | {row['growth_pct_of_list']:.1f} % "
            f"| {row['samples_per_s']:,.0f} | {row['vs_torch_list']:.2f} "
            f"| {row['vs_loaderkit_list']:.2f} |"
        )
    lines += [
        "",
        f"walk over the dataset (survey_containers): {walk_ms:.1f} ms (median of 9)",
        f"hint: {hint[:160]}...",
    ]
    data = {
        "items": n,
        "rounds": rounds,
        "workers": WORKERS,
        "batch_size": BATCH,
        "list_mib": list_bytes / _MIB,
        "shared_sequence_mib": shared.nbytes / _MIB,
        "shared_sequence_build_s": build_s,
        "walk_ms": walk_ms,
        "hint": hint,
        "rows": rows,
    }
    emit(data, "\n".join(lines), args.json)
    return data


if __name__ == "__main__":
    main()
