"""How BlockShuffleSampler's block size trades randomness for read speed.

``python benchmarks/hdf5_block_size.py`` prints two tables:

1. Randomness (no files needed): for NSD-sized data (40 sessions x 750 trials) and the benchmark
   size (8 x 750), batches of 64, the default window, it reports per batch the distinct sessions,
   the h5py reads (runs of consecutive rows) and the largest share of one session, and per
   session the fraction of the epoch during which it is being read (1.0 = spread over the whole
   epoch, as with a uniform shuffle).
2. Speed: ``loaderkit-block`` items/s (and its ratio to ``unbounded-cache`` and
   ``memory-limit``) for each block size on the small-rows, tiny-rows and gzip-chunked
   workloads (``--quick`` files; ``--repeats`` timed repeats).

The numbers quoted in docs/hdf5.md come from this script.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

try:
    from _workloads import IndexOnly
    from hdf5_read import run_benchmark
except ImportError:  # imported from elsewhere
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _workloads import IndexOnly
    from hdf5_read import run_benchmark

from loaderkit.hdf5 import BlockShuffleSampler

__all__ = ["main", "randomness"]

BATCH = 64
BLOCK_SIZES = (1, 4, 8, 16, 32, 64)


def randomness(
    sessions: int, rows: int, block_size: int, *, window: int | None = None, seed: int = 0
) -> dict[str, float]:
    """Per-batch and per-session statistics of one epoch of the sampler's order."""
    ds = IndexOnly(sessions, rows)
    order = BlockShuffleSampler(ds, seed=seed, block_size=block_size, window=window).indices()
    pos, rows_ = ds.index.positions, ds.index.rows
    sess, row = pos[order], rows_[order]
    n = order.shape[0]
    per_batch_sessions, per_batch_reads, per_batch_share = [], [], []
    for k in range(0, n - BATCH + 1, BATCH):
        s, r = sess[k : k + BATCH], row[k : k + BATCH]
        per_batch_sessions.append(np.unique(s).size)
        per_batch_reads.append(1 + int(np.count_nonzero((s[1:] != s[:-1]) | (r[1:] - r[:-1] != 1))))
        per_batch_share.append(np.bincount(s).max() / BATCH)
    spans = []
    for p in range(sessions):
        where = np.flatnonzero(sess == p)
        spans.append((where[-1] - where[0] + 1) / n)
    return {
        "sessions_per_batch": float(np.mean(per_batch_sessions)),
        "reads_per_batch": float(np.mean(per_batch_reads)),
        "max_session_share": float(np.mean(per_batch_share)),
        "session_span": float(np.mean(spans)),
    }


def _randomness_table() -> list[str]:
    lines = [
        "| data | order | sessions/batch | reads/batch | largest session share | "
        "session active for |",
        "|---|---|---|---|---|---|",
    ]
    for sessions, rows in ((40, 750), (8, 750)):
        configs: list[tuple[str, int, int | None]] = [("uniform shuffle", 1, sessions)]
        configs += [(f"block {b}, window 8", b, None) for b in BLOCK_SIZES]
        for label, block, window in configs:
            stats = randomness(sessions, rows, block, window=window)
            lines.append(
                f"| {sessions}x{rows} | {label} | {stats['sessions_per_batch']:.1f} | "
                f"{stats['reads_per_batch']:.1f} | {stats['max_session_share']:.2f} | "
                f"{stats['session_span']:.0%} of the epoch |"
            )
    return lines


def _speed_table(repeats: int, quick: bool) -> list[str]:
    lines = [
        "| workload | block size | loaderkit-block items/s | vs unbounded-cache | "
        "vs memory-limit |",
        "|---|---|---|---|---|",
    ]
    rows: dict[tuple[str, int], Any] = {}
    for block in BLOCK_SIZES[1:]:
        res = run_benchmark(
            quick=quick,
            repeats=repeats,
            workloads=["small-rows", "tiny-rows", "gzip-chunked"],
            strategies=["unbounded-cache", "loaderkit-block", "memory-limit"],
            block_size=block,
        )
        for w in res["workloads"]:
            rows[(w["workload"], block)] = w["strategies"]
    for wname in ("small-rows", "tiny-rows", "gzip-chunked"):
        for block in BLOCK_SIZES[1:]:
            st = rows[(wname, block)]
            blk = st["loaderkit-block"]["items_per_s"]
            lines.append(
                f"| {wname} | {block} | {blk / 1e3:.0f}k | "
                f"{blk / st['unbounded-cache']['items_per_s']:.1f} | "
                f"{blk / st['memory-limit']['items_per_s']:.2f} |"
            )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--full", action="store_true", help="full-size files for the speed part")
    parser.add_argument("--no-speed", action="store_true", help="only the randomness table")
    args = parser.parse_args(argv)
    lines = _randomness_table()
    if not args.no_speed:
        lines += ["", *_speed_table(args.repeats, quick=not args.full)]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
