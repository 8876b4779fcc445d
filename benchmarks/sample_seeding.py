"""Cost of sample_seeding=True per sample, measured side by side in one run.

Usage: python benchmarks/sample_seeding.py [--quick] [--json PATH]

Prints a markdown table: microseconds per sample with and without per-sample seeding, for a
cheap sample (the overhead dominates) in the main process (num_workers=0, which also saves and
restores the main process's RNG state) and with one worker process.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch
from torch.utils.data import Dataset

from loaderkit import create_dataloader, worker_rng


class AugmentedDataset(Dataset):
    """A 16x16 sample with a random flip and noise: a cheap but realistic augmentation."""

    def __init__(self, n: int) -> None:
        self.data = torch.arange(n * 256, dtype=torch.float32).reshape(n, 16, 16)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> torch.Tensor:
        x = self.data[i]
        if worker_rng().random() < 0.5:
            x = x.flip(-1)
        return x + torch.randn(16, 16) * 0.01


def _epoch_seconds(n: int, num_workers: int, sample_seeding: bool) -> float:
    loader = create_dataloader(
        AugmentedDataset(n),
        batch_size=64,
        num_workers=num_workers,
        seed=0,
        sample_seeding=sample_seeding,
        persistent_workers=num_workers > 0 or None,
    )
    for _ in loader:  # warm-up pass (starts persistent workers)
        pass
    start = time.perf_counter()
    for _ in loader:
        pass
    elapsed = time.perf_counter() - start
    loader.close()
    return elapsed


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples and repeats")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    n, repeats = (2_000, 3) if args.quick else (10_000, 5)
    results = {}
    for num_workers in (0, 1):
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(repeats):  # interleaved: both variants see the same machine state
            for seeding in (False, True):
                times[seeding].append(_epoch_seconds(n, num_workers, seeding))
        off = statistics.median(times[False]) / n * 1e6
        on = statistics.median(times[True]) / n * 1e6
        results[f"num_workers={num_workers}"] = {
            "us_per_sample_off": off,
            "us_per_sample_on": on,
            "overhead_us": on - off,
            "ratio": on / off,
        }
    print("| loader | µs/sample off | µs/sample on | overhead µs/sample | ratio on/off |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        print(
            f"| {name} | {r['us_per_sample_off']:.1f} | {r['us_per_sample_on']:.1f} | "
            f"{r['overhead_us']:.1f} | {r['ratio']:.2f} |"
        )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"samples": n, "repeats": repeats, "results": results}, handle, indent=2)
    return results


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
