"""Block locality of the elastic block order against the per-rank block sampler (no files).

``python benchmarks/elastic_blocks.py`` compares, for every rank's batches of one epoch, two
``BlockShuffleSampler`` orders over the same session index:

* ``per-rank``: what ``shuffle="block"`` built before the elastic order (``partition="block"``
  without ``batch_size``): blocks dealt to ranks, each rank interleaving its own blocks;
* ``elastic``: ``batch_size`` given (what ``shuffle="block"`` with a ``seed`` builds): one
  block order of the whole dataset, rank ``r`` reading part ``r`` of every global batch.

Per batch it counts the slab reads (runs of consecutive rows of one session), the rows read,
the chunks touched (for chunked data the bytes read are chunks x chunk bytes: a chunk is
decompressed whole) and the sessions, averaged over ranks, 2 epochs and 4 seeds; the ratio
columns are elastic / per-rank (the target is at most 1.1). Everything is computed from the
sampler's indices, so it is exact and the same on every machine.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

try:
    from _cli import emit, parser
    from _workloads import IndexOnly
except ImportError:  # imported from elsewhere
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _cli import emit, parser
    from _workloads import IndexOnly

from loaderkit.hdf5 import BlockShuffleSampler

__all__ = ["CONFIGS", "locality", "main", "measure"]

#: (name, sessions, rows per session, chunk rows (0: contiguous), block size (None: default),
#: batch size per rank, world sizes)
CONFIGS: tuple[tuple[str, int, int, int, int | None, int, tuple[int, ...]], ...] = (
    ("40x750 contiguous, batch 64", 40, 750, 0, None, 64, (2, 4, 8)),
    ("40x750 chunks of 16, batch 64", 40, 750, 16, None, 64, (2, 4, 8)),
    ("40x750 chunks of 10, batch 32", 40, 750, 10, None, 32, (2, 4, 8)),
    ("8x750 contiguous, batch 16", 8, 750, 0, None, 16, (2, 4)),
    ("1x96 (the test file), batch 8/world", 1, 96, 0, None, 0, (2, 4)),
)


def locality(dataset: IndexOnly, order: np.ndarray, batch_size: int) -> dict[str, float]:
    """Mean slab reads, rows, chunks and sessions per batch of ``batch_size`` over ``order``."""
    pos, rows = dataset.index.positions, dataset.index.rows
    sess, row = pos[order], rows[order]
    reads, chunks, sessions, sizes = [], [], [], []
    for k in range(0, order.shape[0], batch_size):
        s, r = sess[k : k + batch_size], row[k : k + batch_size]
        reads.append(1 + int(np.count_nonzero((s[1:] != s[:-1]) | (r[1:] - r[:-1] != 1))))
        sizes.append(s.shape[0])
        sessions.append(np.unique(s).size)
        if dataset.chunk_rows:
            chunks.append(np.unique(s * 10**9 + r // dataset.chunk_rows).size)
    return {
        "reads": float(np.mean(reads)),
        "rows": float(np.mean(sizes)),
        "chunks": float(np.mean(chunks)) if chunks else float("nan"),
        "sessions": float(np.mean(sessions)),
    }


def measure(
    sessions: int,
    rows: int,
    chunk_rows: int,
    block_size: int | None,
    batch_size: int,
    world: int,
    *,
    epochs: int = 2,
    seeds: Sequence[int] = (0, 1, 2, 3),
) -> dict[str, dict[str, float]]:
    """Per-batch locality of both orders, averaged over ranks, epochs and seeds."""
    dataset = IndexOnly(sessions, rows, chunk_rows)
    out: dict[str, dict[str, float]] = {}
    for label, extra in (("per-rank", {}), ("elastic", {"batch_size": batch_size})):
        stats: list[dict[str, float]] = []
        for seed, rank in itertools.product(seeds, range(world)):
            sampler = BlockShuffleSampler(
                dataset,
                seed=seed,
                block_size=block_size,
                num_replicas=world,
                rank=rank,
                **extra,  # type: ignore[arg-type]
            )
            for epoch in range(epochs):
                sampler.set_epoch(epoch)
                stats.append(locality(dataset, sampler.indices(), batch_size))
        out[label] = {key: float(np.mean([s[key] for s in stats])) for key in stats[0]}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    args = parser(__doc__, "one seed instead of four").parse_args(argv)
    seeds = (0,) if args.quick else (0, 1, 2, 3)
    lines = [
        "| data | world | per-rank reads/batch | elastic reads/batch | reads ratio | "
        "chunks/batch per-rank / elastic | chunks ratio | sessions/batch per-rank / elastic |",
        "|---|---|---|---|---|---|---|---|",
    ]
    data: list[dict[str, Any]] = []
    for name, sessions, rows, chunk, block, batch, worlds in CONFIGS:
        for world in worlds:
            size = batch or 8 // world
            result = measure(sessions, rows, chunk, block, size, world, seeds=seeds)
            old, new = result["per-rank"], result["elastic"]
            reads_ratio = new["reads"] / old["reads"]
            chunk_ratio = new["chunks"] / old["chunks"] if chunk else float("nan")
            chunk_cell = f"{old['chunks']:.2f} / {new['chunks']:.2f}" if chunk else "-"
            chunk_ratio_cell = f"{chunk_ratio:.2f}" if chunk else "-"
            lines.append(
                f"| {name} | {world} | {old['reads']:.2f} | {new['reads']:.2f} | "
                f"{reads_ratio:.2f} | {chunk_cell} | {chunk_ratio_cell} | "
                f"{old['sessions']:.2f} / {new['sessions']:.2f} |"
            )
            data.append(
                {
                    "data": name,
                    "world": world,
                    "batch_size": size,
                    "per_rank": old,
                    "elastic": new,
                    "reads_ratio": reads_ratio,
                    "chunks_ratio": None if not chunk else chunk_ratio,
                }
            )
    emit({"rows": data}, "\n".join(lines), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
