"""What torch's worker-to-main hand-off costs per batch, measured on the CPU, side by side.

Usage: python benchmarks/handoff.py [--quick] [--json PATH]

Batches of the feed workload (``batch x 1 x 96 x 96`` float32) are produced by a dataset that
does no reading at all: each batch is a tensor filled in place (``batch-native`` allocation,
shared memory in a worker). What is left is what every loader pays between the worker and the
training loop:

- ``worker hand-off``: the batch sent through torch's result queue (a shared-memory descriptor)
  and mapped by the main process, which touches every page once (as the pin-memory thread or a
  ``.to(device)`` does);
- ``+ one more copy``: the same, plus a copy of each batch into a reused buffer in a second
  thread: the work torch's pin-memory thread does on a CUDA host (there the buffer is pinned);
- ``main process only``: ``num_workers=0``, the same batches filled in the main process (no
  hand-off at all).

The ratio column shows each row against ``main process only``. On a GPU host, compare with
``benchmarks/feed.py --device cuda`` (pinned memory for real).
"""

from __future__ import annotations

import queue
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

try:
    import _cli
except ImportError:  # imported as a module from elsewhere (tests)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _cli

from loaderkit import DataLoader
from loaderkit.collate import RowBatch, batch_buffer, collate

SHAPE = (1, 96, 96)


class FilledBatches(Dataset):
    """``__getitems__`` fills one batch tensor in place: no file, no per-sample objects."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full(SHAPE, i, np.float32)

    def __getitems__(self, indices: list[int]) -> RowBatch:
        tensor, out = batch_buffer(len(indices), SHAPE, np.dtype("f4"))
        out[:] = np.asarray(indices, np.float32).reshape(-1, 1, 1, 1)
        return RowBatch(tensor, out)


def _touch(batch: torch.Tensor) -> float:
    return float(batch[:, 0, 0, ::4096].sum())  # one read per page: maps every page


def _pass(loader: DataLoader, extra_copy: bool) -> float:
    """Seconds for one pass; with ``extra_copy`` a thread copies each batch, as pinning does."""
    done: queue.Queue[Any] = queue.Queue(maxsize=2)
    buffer: list[torch.Tensor] = []

    def copier() -> None:
        while (batch := done.get()) is not None:
            if not buffer:
                buffer.append(torch.empty_like(batch))
            buffer[0][: len(batch)].copy_(batch)

    thread = threading.Thread(target=copier) if extra_copy else None
    if thread is not None:
        thread.start()
    start = time.perf_counter()
    for batch in loader:
        _touch(batch)
        if thread is not None:
            done.put(batch)
    if thread is not None:
        done.put(None)
        thread.join()
    return time.perf_counter() - start


def run(quick: bool) -> dict[str, Any]:
    """Measure every row; return samples/s and ratios."""
    batch, batches = (64, 40) if quick else (256, 60)
    repeats = 3 if quick else 5
    rows = {
        "main process only": (0, False),
        "worker hand-off": (1, False),
        "worker hand-off + one more copy": (1, True),
    }
    loaders: dict[str, DataLoader[Any]] = {
        name: DataLoader(
            FilledBatches(batch * batches),
            batch_size=batch,
            num_workers=workers,
            persistent_workers=workers > 0,
            collate_fn=collate,
        )
        for name, (workers, _) in rows.items()
    }
    times: dict[str, list[float]] = {name: [] for name in rows}
    try:
        for name, loader in loaders.items():
            _pass(loader, rows[name][1])  # warm-up: workers start, pages recycled
        for _ in range(repeats):
            for name, loader in loaders.items():
                times[name].append(_pass(loader, rows[name][1]))
    finally:
        for loader in loaders.values():
            loader.close()
    samples = batch * batches
    mib = batch * int(np.prod(SHAPE)) * 4 / 2**20
    base = samples / statistics.median(times["main process only"])
    results = {}
    for name, t in times.items():
        rate = samples / statistics.median(t)
        results[name] = {
            "samples_per_s": rate,
            "us_per_batch": statistics.median(t) / batches * 1e6,
            "ratio": rate / base,
        }
    return {"batch": batch, "batch_mib": mib, "repeats": repeats, "results": results}


def format_table(data: dict[str, Any]) -> str:
    """The results as a markdown table."""
    lines = [
        f"batch {data['batch']} x 1x96x96 float32 ({data['batch_mib']:.1f} MiB), "
        f"median of {data['repeats']}",
        "",
        "| row | samples/s | µs per batch | vs main process only |",
        "|---|---|---|---|",
    ]
    for name, r in data["results"].items():
        lines.append(
            f"| {name} | {r['samples_per_s']:,.0f} | {r['us_per_batch']:,.0f} | {r['ratio']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = _cli.parser(__doc__, "smaller batches, fewer repeats")
    args = parser.parse_args(argv)
    data = run(args.quick)
    _cli.emit(data, format_table(data), args.json)
    return data


if __name__ == "__main__":
    main()
