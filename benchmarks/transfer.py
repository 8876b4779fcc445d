"""Host-to-device transfer side by side: pinned vs pageable copies, prefetcher vs plain ``.to()``.

Run ``python benchmarks/transfer.py`` (``--quick`` for a short run, ``--json PATH`` to save the
numbers). Every figure is measured in this run and reported next to the configuration it is
compared with; read the ratios, not the absolute values, which depend on the machine.

With CUDA:

- **bandwidth**: the same tensor copied to the GPU from pinned memory (``non_blocking=True``)
  and from pageable memory, into a preallocated device tensor; GB/s of each and their ratio.
- **overlap**: a list of batches consumed by a "model" (a chain of matmuls on each batch,
  calibrated so its compute time is about one batch's copy time). Measured: copies alone,
  compute alone, the plain loop ``to_device(batch)`` then model (copy and compute serialized on
  one stream), and the loop over :class:`~loaderkit.DevicePrefetcher` (copy of batch k+1 on a side
  stream during compute of batch k), each with pinned and with pageable batches. The share of
  copy time hidden is ``(plain - prefetcher) / copies alone``.
- **prefetcher / plain**: the ratio of the two loops' times for pinned and for pageable
  batches (from the overlap section) and for a data-bound feed (a DataLoader with worker
  processes, pinned and not, and a light model): at most 1.0 means the prefetcher is never
  slower than the plain loop.

Without CUDA the GPU sections are skipped (the script says so and exits 0) and the CPU
pass-through cost of the prefetcher is measured instead: per-batch traversal time of
``to_device`` and of the prefetcher over a list of batches, and the prefetcher wrapped around a
DataLoader against the bare DataLoader.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from loaderkit.device.prefetch import DevicePrefetcher
from loaderkit.device.transfer import to_device
from loaderkit.errors import LoaderkitWarning

__all__ = ["main", "run_benchmark"]

MB = 1 << 20


def _timed(fn: Callable[[], object], repeats: int, *, cuda: bool) -> float:
    """Median wall time of ``fn`` over ``repeats`` runs, after one untimed warm-up run."""
    fn()
    times = []
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeats):
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    finally:
        if gc_was_enabled:
            gc.enable()
    return statistics.median(times)


def _interleaved_min(fns: Sequence[Callable[[], object]], repeats: int) -> list[float]:
    """Best time of each CPU-only ``fn``, the functions run in turn so load affects all alike."""
    for fn in fns:
        fn()
    best = [float("inf")] * len(fns)
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeats):
            for i, fn in enumerate(fns):
                start = time.perf_counter()
                fn()
                best[i] = min(best[i], time.perf_counter() - start)
    finally:
        if gc_was_enabled:
            gc.enable()
    return best


# --------------------------------------------------------------------------- CUDA sections


def bench_bandwidth(sizes_mb: Sequence[int], copies: int, repeats: int) -> dict[str, Any]:
    device = torch.device("cuda", torch.cuda.current_device())
    rows = []
    for size in sizes_mb:
        pageable = torch.randn(size * MB // 4)
        pinned = pageable.pin_memory()
        dst = torch.empty_like(pageable, device=device)

        def copy_pinned(src: torch.Tensor = pinned, out: torch.Tensor = dst) -> None:
            for _ in range(copies):
                out.copy_(src, non_blocking=True)

        def copy_pageable(src: torch.Tensor = pageable, out: torch.Tensor = dst) -> None:
            for _ in range(copies):
                out.copy_(src)

        t_pinned = _timed(copy_pinned, repeats, cuda=True)
        t_pageable = _timed(copy_pageable, repeats, cuda=True)
        moved = size * MB * copies / 1e9
        rows.append(
            {
                "size_mb": size,
                "pinned_gb_s": moved / t_pinned,
                "pageable_gb_s": moved / t_pageable,
                "pinned_over_pageable": t_pageable / t_pinned,
            }
        )
        del pageable, pinned, dst
    return {
        "title": "Host-to-device copies: pinned vs pageable (same tensor, same run)",
        "columns": ["size_mb", "pinned_gb_s", "pageable_gb_s", "pinned_over_pageable"],
        "rows": rows,
    }


class _Model:
    """Stands in for a model: ``depth`` matmuls of a square slice of the batch."""

    def __init__(self, side: int, device: torch.device) -> None:
        self.side = side
        self.weight = torch.randn(side, side, device=device) / side**0.5
        self.depth = 1

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        h = batch.view(-1)[: self.side * self.side].view(self.side, self.side)
        for _ in range(self.depth):
            h = h @ self.weight
        return h


def bench_overlap(n_batches: int, batch_mb: int, repeats: int) -> dict[str, Any]:
    device = torch.device("cuda", torch.cuda.current_device())
    numel = batch_mb * MB // 4
    side = min(4096, int(numel**0.5))
    pageable = [torch.randn(numel) for _ in range(n_batches)]
    pinned = [b.pin_memory() for b in pageable]
    on_device = [b.to(device) for b in pinned]
    model = _Model(side, device)

    def copies_only() -> None:
        for b in pinned:
            b.to(device, non_blocking=True)

    def compute_only() -> None:
        for x in on_device:
            model(x)

    # Calibrate: about one batch's copy time of compute per batch.
    t_copy = _timed(copies_only, repeats, cuda=True)
    model.depth = 1
    t_one = _timed(compute_only, repeats, cuda=True)
    model.depth = max(1, round(t_copy / t_one))
    t_compute = _timed(compute_only, repeats, cuda=True)

    t_plain = _timed(_plain_loop(pinned, model, device), repeats, cuda=True)
    t_prefetch = _timed(_prefetched_loop(pinned, model, device), repeats, cuda=True)
    t_plain_pageable = _timed(_plain_loop(pageable, model, device), repeats, cuda=True)
    t_prefetch_pageable = _timed(_prefetched_loop(pageable, model, device), repeats, cuda=True)

    def row(name: str, seconds: float, plain: float | None) -> dict[str, Any]:
        # Copy time hidden: only pinned copies can overlap (pageable ones block the host).
        hidden = name == "prefetcher + model (pinned)" and plain is not None
        return {
            "loop": name,
            "ms": seconds * 1e3,
            "vs_plain": plain / seconds if plain is not None else None,
            "copy_hidden": (plain - seconds) / t_copy if hidden else None,
        }

    return {
        "title": (
            f"Prefetcher vs plain to_device: {n_batches} batches of {batch_mb} MB, matmul model "
            f"({model.depth} x {side}x{side}) calibrated to about one copy per batch; "
            "vs_plain = plain loop time (same memory) / this loop's time"
        ),
        "columns": ["loop", "ms", "vs_plain", "copy_hidden"],
        "rows": [
            row("copies alone (pinned)", t_copy, None),
            row("compute alone", t_compute, None),
            row("plain to_device + model (pinned)", t_plain, t_plain),
            row("prefetcher + model (pinned)", t_prefetch, t_plain),
            row("plain to_device + model (pageable)", t_plain_pageable, t_plain_pageable),
            row("prefetcher + model (pageable)", t_prefetch_pageable, t_plain_pageable),
        ],
        "ratios": {
            "list, pinned": (t_plain, t_prefetch),
            "list, pageable": (t_plain_pageable, t_prefetch_pageable),
        },
    }


def _plain_loop(batches: Iterable[Any], model: Callable[[Any], Any], device: torch.device) -> Any:
    def run() -> None:
        for b in batches:
            model(to_device(b, device))

    return run


def _prefetched_loop(
    batches: Iterable[Any], model: Callable[[Any], Any], device: torch.device
) -> Any:
    prefetcher = DevicePrefetcher(batches, device)

    def run() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LoaderkitWarning)  # the pageable advice
            for x in prefetcher:
                model(x)

    return run


class _Noise(Dataset[torch.Tensor]):
    """Samples of ``numel`` float32 values, made in the worker processes."""

    def __init__(self, n: int, numel: int) -> None:
        self.n, self.numel = n, numel

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((self.numel,), float(i))


def bench_feed(n_batches: int, batch_mb: int, workers: int, repeats: int) -> dict[str, Any]:
    """A data-bound feed: DataLoader workers make the batches, the model is one small matmul."""
    device = torch.device("cuda", torch.cuda.current_device())
    batch_size = 8
    numel = max(1, batch_mb * MB // 4 // batch_size)
    side = min(1024, int((numel * batch_size) ** 0.5))
    model = _Model(side, device)
    rows = []
    ratios = {}
    for pinned in (True, False):
        loader = DataLoader(
            _Noise(n_batches * batch_size, numel),
            batch_size=batch_size,
            num_workers=workers,
            pin_memory=pinned,
            persistent_workers=True,
        )
        t_plain = _timed(_plain_loop(loader, model, device), repeats, cuda=True)
        t_prefetch = _timed(_prefetched_loop(loader, model, device), repeats, cuda=True)
        memory = "pinned" if pinned else "pageable"
        ratios[f"feed, {memory}"] = (t_plain, t_prefetch)
        rows.append({"loop": f"plain, {memory}", "ms": t_plain * 1e3, "vs_plain": 1.0})
        rows.append(
            {
                "loop": f"prefetcher, {memory}",
                "ms": t_prefetch * 1e3,
                "vs_plain": t_plain / t_prefetch,
            }
        )
        del loader
    return {
        "title": (
            f"Data-bound feed: DataLoader({workers} workers, persistent) of {n_batches} batches "
            f"of {batch_mb} MB, one {side}x{side} matmul per batch"
        ),
        "columns": ["loop", "ms", "vs_plain"],
        "rows": rows,
        "ratios": ratios,
    }


def ratio_section(*sections: dict[str, Any]) -> dict[str, Any]:
    """The prefetcher/plain time ratio of every measured pair (at most 1.0: never slower)."""
    rows = []
    for section in sections:
        for name, (plain, prefetch) in section.get("ratios", {}).items():
            rows.append(
                {
                    "batches": name,
                    "plain_ms": plain * 1e3,
                    "prefetcher_ms": prefetch * 1e3,
                    "prefetcher_over_plain": prefetch / plain,
                }
            )
    return {
        "title": "Prefetcher / plain loop time (at most 1.0: the prefetcher is never slower)",
        "columns": ["batches", "plain_ms", "prefetcher_ms", "prefetcher_over_plain"],
        "rows": rows,
    }


# --------------------------------------------------------------------------- CPU section


class _Samples(Dataset[dict[str, Any]]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"image": torch.zeros(3, 32, 32), "label": i, "meta": {"id": i, "tags": ("a",)}}


def _batch(i: int) -> dict[str, Any]:
    return {
        "image": torch.zeros(32, 3, 32, 32),
        "label": torch.arange(32),
        "meta": {"ids": list(range(32)), "name": f"batch{i}", "mask": (torch.ones(32),)},
    }


def _drain(iterable: Iterable[Any]) -> None:
    for _ in iterable:
        pass


def bench_cpu_pass_through(n_batches: int, repeats: int) -> dict[str, Any]:
    batches = [_batch(i) for i in range(n_batches)]
    loader = DataLoader(_Samples(n_batches * 32), batch_size=32)
    prefetcher = DevicePrefetcher(batches, "cpu")
    wrapped = DevicePrefetcher(loader, "cpu")

    def to_device_loop() -> None:
        for b in batches:
            to_device(b, "cpu")

    t_to_device, t_prefetch, t_loader, t_wrapped = _interleaved_min(
        [
            to_device_loop,
            lambda: _drain(prefetcher),
            lambda: _drain(loader),
            lambda: _drain(wrapped),
        ],
        repeats,
    )

    def row(name: str, seconds: float, baseline: float) -> dict[str, Any]:
        return {
            "loop": name,
            "us_per_batch": seconds / n_batches * 1e6,
            "vs_group_baseline": seconds / baseline,
        }

    return {
        "title": (
            f"CPU pass-through: {n_batches} batches of 3 tensors, 32 ints and a string each; "
            "best of interleaved repeats; vs_group_baseline = time / time of the first row of its "
            "pair"
        ),
        "columns": ["loop", "us_per_batch", "vs_group_baseline"],
        "rows": [
            row("to_device(batch, 'cpu') over a list", t_to_device, t_to_device),
            row("DevicePrefetcher(list, 'cpu')", t_prefetch, t_to_device),
            row("DataLoader(batch_size=32, num_workers=0)", t_loader, t_loader),
            row("DevicePrefetcher(DataLoader, 'cpu')", t_wrapped, t_loader),
        ],
    }


# --------------------------------------------------------------------------- driver


def run_benchmark(*, quick: bool = False) -> dict[str, Any]:
    """Run every section that this machine supports and return the results.

    Args:
        quick: Smaller sizes and fewer repeats (a run of a few seconds).

    Returns:
        ``{"machine": {...}, "cuda": bool, "quick": bool, "notes": [...], "sections": [...]}``.
    """
    cuda = torch.cuda.is_available()
    machine: dict[str, Any] = {"torch": torch.__version__, "python": sys.version.split()[0]}
    notes: list[str] = []
    sections = []
    if cuda:
        machine["gpu"] = torch.cuda.get_device_name()
        repeats = 3 if quick else 7
        sizes = [16] if quick else [1, 16, 256]
        sections.append(bench_bandwidth(sizes, copies=4 if quick else 10, repeats=repeats))
        overlap = bench_overlap(8 if quick else 32, batch_mb=16 if quick else 64, repeats=repeats)
        # 4 MB batches, at most 4 workers: 2 x 4 x 4 MB in /dev/shm, safe in a 64 MB container.
        feed = bench_feed(
            16 if quick else 64,
            batch_mb=4,
            workers=min(2 if quick else 4, os.cpu_count() or 1),
            repeats=repeats,
        )
        sections += [overlap, feed, ratio_section(overlap, feed)]
    else:
        notes.append(
            "CUDA is not available on this machine: the host-to-device sections (pinned vs "
            "pageable bandwidth, prefetch overlap) were skipped. Measured instead: the CPU "
            "pass-through cost of DevicePrefetcher."
        )
    sections.append(bench_cpu_pass_through(200 if quick else 2000, repeats=5 if quick else 9))
    return {"machine": machine, "cuda": cuda, "quick": quick, "notes": notes, "sections": sections}


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def format_tables(results: dict[str, Any]) -> str:
    """Render the results as markdown tables."""
    lines = [f"machine: {', '.join(f'{k}={v}' for k, v in results['machine'].items())}", ""]
    for note in results["notes"]:
        lines += [f"> {note}", ""]
    for section in results["sections"]:
        columns = section["columns"]
        lines.append(f"### {section['title']}")
        lines.append("")
        lines.append("| " + " | ".join(columns) + " |")
        lines.append("|" + "|".join("---" for _ in columns) + "|")
        for row in section["rows"]:
            lines.append("| " + " | ".join(_fmt(row[c]) for c in columns) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write results as JSON")
    args = parser.parse_args(argv)
    results = run_benchmark(quick=args.quick)
    print(format_tables(results))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
