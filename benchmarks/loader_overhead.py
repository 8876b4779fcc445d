"""loaderkit's overhead over torch's DataLoader, and the end-to-end HDF5 gain, side by side.

Usage: python benchmarks/loader_overhead.py [--quick] [--json PATH]

1. ``create_dataloader`` vs ``torch.utils.data.DataLoader`` with identical effective settings on
   an in-memory ``TensorDataset``: time per epoch and their ratio (target: <= 1.03), with
   ``num_workers=0`` (pure per-batch overhead) and ``num_workers=2`` (worker start included).
2. End to end with ``num_workers=2`` on the ``small-rows`` session files of BENCHMARKS.md: a
   naive per-item h5py dataset (lazily opened, cached handles, as usually written) under torch's
   DataLoader with a uniform shuffle, against ``HDF5SessionDataset`` under
   ``create_dataloader(shuffle="block")`` (batched reads, locality-aware order): items/s ratio.

Both sides of each comparison run interleaved in one process; the median of the repeats is
reported. Ratios are what matter: the machines are shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workloads import WORKLOADS, make_workload

from loaderkit import HDF5SessionDataset, create_dataloader


class NaiveH5Dataset(Dataset):
    """The usual hand-written dataset: per-item reads, handles opened lazily and kept."""

    def __init__(self, paths: Sequence[Path], key: str) -> None:
        self.paths = [str(p) for p in paths]
        self.key = key
        lengths = []
        for path in self.paths:
            with h5py.File(path, "r") as f:
                lengths.append(len(f[key]))
        self.offsets = np.concatenate([[0], np.cumsum(lengths)])
        self.files: dict[int, h5py.File] = {}

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, i: int) -> np.ndarray:
        session = int(np.searchsorted(self.offsets, i, side="right") - 1)
        if session not in self.files:
            self.files[session] = h5py.File(self.paths[session], "r")
        return self.files[session][self.key][i - self.offsets[session]]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "files": {}}


def _epoch_time(loader: Any) -> float:
    start = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - start


def _compare(make: dict[str, Callable[[], Any]], repeats: int, persistent: bool) -> dict:
    """Median epoch time per variant, variants interleaved; persistent loaders warmed first."""
    loaders = {name: factory() for name, factory in make.items()} if persistent else {}
    if persistent:
        for loader in loaders.values():
            _epoch_time(loader)  # warm-up: workers start, caches fill
    times: dict[str, list[float]] = {name: [] for name in make}
    for _ in range(repeats):
        for name, factory in make.items():
            loader = loaders[name] if persistent else factory()
            times[name].append(_epoch_time(loader))
            if not persistent:
                getattr(loader, "close", lambda: None)()
    for loader in loaders.values():
        getattr(loader, "close", lambda: None)()
    return {name: statistics.median(t) for name, t in times.items()}


def overhead(quick: bool) -> list[dict[str, Any]]:
    n = 20_000 if quick else 100_000
    repeats = 5 if quick else 9
    dataset = TensorDataset(torch.randn(n, 64), torch.randint(0, 10, (n,)))
    rows = []
    for num_workers in (0, 2):
        common = {
            "batch_size": 64,
            "shuffle": True,
            "num_workers": num_workers,
            "pin_memory": False,
            "persistent_workers": num_workers > 0,
        }

        def torch_loader(kw: dict = common) -> DataLoader:
            return DataLoader(dataset, generator=torch.Generator().manual_seed(0), **kw)

        def loaderkit_loader(kw: dict = common) -> DataLoader:
            return create_dataloader(dataset, generator=torch.Generator().manual_seed(0), **kw)

        medians = _compare(
            {"torch": torch_loader, "loaderkit": loaderkit_loader},
            repeats,
            persistent=num_workers > 0,
        )
        rows.append(
            {
                "case": f"TensorDataset {n}x64, batch 64, num_workers={num_workers}",
                "torch_s": medians["torch"],
                "loaderkit_s": medians["loaderkit"],
                "ratio": medians["loaderkit"] / medians["torch"],
            }
        )
    return rows


def end_to_end(quick: bool, root: Path) -> dict[str, Any]:
    workload = WORKLOADS["small-rows"]
    paths = make_workload(root, workload, quick=quick)
    repeats = 3 if quick else 5

    def naive() -> DataLoader:
        return DataLoader(
            NaiveH5Dataset(paths, "betas"),
            batch_size=64,
            shuffle=True,
            num_workers=2,
            persistent_workers=True,
            generator=torch.Generator().manual_seed(0),
        )

    def ours() -> DataLoader:
        return create_dataloader(
            HDF5SessionDataset(paths, key="betas"),
            batch_size=64,
            shuffle="block",
            num_workers=2,
            persistent_workers=True,
            seed=0,
        )

    medians = _compare({"naive": naive, "loaderkit": ours}, repeats, persistent=True)
    items = len(NaiveH5Dataset(paths, "betas"))
    return {
        "case": f"{workload.name}: {len(paths)} sessions x {items // len(paths)} rows, "
        "batch 64, num_workers=2, persistent",
        "naive_items_per_s": items / medians["naive"],
        "loaderkit_items_per_s": items / medians["loaderkit"],
        "ratio": medians["naive"] / medians["loaderkit"],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller data, fewer repeats")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--root", metavar="DIR", help="where to write the session files")
    args = parser.parse_args(argv)

    rows = overhead(args.quick)
    print("| loader overhead | torch s/epoch | loaderkit s/epoch | ratio (target <= 1.03) |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['torch_s']:.4f} | {r['loaderkit_s']:.4f} | {r['ratio']:.3f} |")
    with tempfile.TemporaryDirectory(dir=args.root) as tmp:
        e2e = end_to_end(args.quick, Path(tmp))
    print()
    print(
        "| end to end | naive h5py + torch items/s | HDF5SessionDataset + block items/s | ratio |"
    )
    print("|---|---|---|---|")
    print(
        f"| {e2e['case']} | {e2e['naive_items_per_s']:,.0f} | "
        f"{e2e['loaderkit_items_per_s']:,.0f} | {e2e['ratio']:.2f}x |"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"overhead": rows, "end_to_end": e2e}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
