"""The seeds' NSD layout inside a job's memory limit: seen as the machine, then as the job.

Usage: python benchmarks/job_limits.py [--quick] [--json PATH] [--root DIR] [--limit-mib N]

The seeds' own layout (issue 62): 6 session files of 750 trials x 300,000 int16 voxels in
``(750, 1)`` chunks (442 MiB each, 2.65 GiB in all; ``--quick``: 750 x 24,000, 34 MiB each),
read in a child memory cgroup of this process's own (cgroup v1, as root; 1.5 GiB, ``--quick``
384 MiB), as a Slurm job or a systemd scope limits a process below the root of the cgroup
tree. Every row is a fresh interpreter in a fresh child cgroup, the files evicted from the
page cache first (``posix_fadvise(DONTNEED)``), one epoch at batch 64 with ``seed=0``:

- ``seen as the machine``: the loader is given a ``PlatformInfo`` whose memory is the
  machine's physical memory (what loaderkit saw while it read limits at the cgroup root only);
- ``seen as the job``: detected, as loaderkit does now (the child cgroup's limit).

For ``shuffle=True`` and ``shuffle="block"`` with 0 and 2 workers: the exit status (137: the
kernel's OOM killer), trials/s, the cgroup's peak (page cache included: it fills the limit
and is reclaimed), the peak anonymous memory (private + shared memory, sampled every 20 ms:
what the kernel cannot reclaim), ``memory.failcnt``, and the fitted ``max_session_bytes`` with
its reason. Targets: every "seen as the job" row exits 0 with its anonymous peak below the
limit. Where no child cgroup can be made, it says why and exits 0 with no rows.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import psutil

try:
    import _cli
except ImportError:  # imported as a module from elsewhere (tests)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _cli
import _cgroups
from single_cell import evict

__all__ = ["format_table", "main", "run", "write_sessions"]

TRIALS, SESSIONS, BATCH = 750, 6, 64
VOXELS, QUICK_VOXELS = 300_000, 24_000
LIMIT_MIB, QUICK_LIMIT_MIB = 1536, 384
ORDERS: tuple[tuple[Any, int], ...] = ((True, 0), ("block", 0), (True, 2), ("block", 2))
VIEWS = ("seen as the machine", "seen as the job")

EPOCH = """
import dataclasses, json, sys, time
import psutil
from loaderkit import create_dataloader, detect_platform
from loaderkit.hdf5 import HDF5SessionDataset

paths, workers, shuffle, machine = json.loads(sys.argv[1])
platform = detect_platform()
if machine:
    physical = psutil.virtual_memory().total
    platform = dataclasses.replace(
        platform, memory_bytes=physical, memory_source="physical memory"
    )
ds = HDF5SessionDataset(paths, key="betas")
start = time.perf_counter()
count = 0
with create_dataloader(
    ds, batch_size=BATCH, shuffle=shuffle, num_workers=workers, seed=0, platform=platform
) as loader:
    row = loader.plan["max_session_bytes"]
    print(json.dumps({"held": row.value, "why": row.reason}), flush=True)
    for batch in loader:
        count += len(batch)
print(json.dumps({"samples": count, "seconds": time.perf_counter() - start}), flush=True)
""".replace("BATCH", str(BATCH))


def write_sessions(root: Path, voxels: int) -> list[str]:
    """The seeds' layout: ``betas`` (750, voxels) int16 in (750, 1) chunks, 64 MB at a time."""
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    step = max(1, (64 << 20) // (TRIALS * 2))
    for s in range(SESSIONS):
        path = root / f"betas_session{s + 1:02d}.hdf5"
        if not path.exists():
            with h5py.File(path.with_suffix(".tmp"), "w") as f:
                d = f.create_dataset("betas", (TRIALS, voxels), "<i2", chunks=(TRIALS, 1))
                for start in range(0, voxels, step):
                    stop = min(voxels, start + step)
                    rng = np.random.default_rng([s, start])
                    d[:, start:stop] = rng.integers(-3000, 3000, (TRIALS, stop - start), np.int16)
            path.with_suffix(".tmp").rename(path)
        paths.append(str(path))
    return paths


def _one(paths: list[str], limit: int, shuffle: Any, workers: int, view: str) -> dict[str, Any]:
    evict([Path(p) for p in paths])
    args = json.dumps([paths, workers, shuffle, view == VIEWS[0]])
    with _cgroups.child_cgroup(memory_bytes=limit) as group:
        begun = time.perf_counter()
        got = group.run([sys.executable, "-c", EPOCH, args], timeout=3600)
        wall = time.perf_counter() - begun
    lines = [json.loads(line) for line in got.stdout.splitlines() if line.startswith("{")]
    facts = {k: v for line in lines for k, v in line.items()}
    seconds = facts.get("seconds")
    return {
        "order": f"shuffle={shuffle!r}",
        "workers": workers,
        "view": view,
        "exit": got.returncode,
        "samples": facts.get("samples"),
        "trials_per_s": facts["samples"] / seconds if seconds else None,
        "wall_s": wall,
        "peak_mib": got.peak_bytes / 2**20,
        "peak_anon_mib": got.peak_anon / 2**20,
        "failcnt": got.failcnt,
        "max_session_bytes": facts.get("held"),
        "why": facts.get("why"),
        "stderr": got.stderr[-600:] if got.returncode else "",
    }


def run(root: str | None = None, *, quick: bool = False, limit_mib: int | None = None) -> dict:
    """Every order, worker count and view in its own child cgroup; the results as a dict."""
    limit = (limit_mib or (QUICK_LIMIT_MIB if quick else LIMIT_MIB)) << 20
    voxels = QUICK_VOXELS if quick else VOXELS
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        paths = write_sessions(Path(tmp), voxels)
        data: dict[str, Any] = {
            "stack": {
                "python": sys.version.split()[0],
                "numpy": np.__version__,
                "torch": __import__("torch").__version__,
            },
            "limit_mib": limit >> 20,
            "session_mib": TRIALS * voxels * 2 / 2**20,
            "sessions": SESSIONS,
            "physical_gib": psutil.virtual_memory().total / 2**30,
            "rows": [],
        }
        try:
            for shuffle, workers in ORDERS:
                for view in VIEWS:
                    data["rows"].append(_one(paths, limit, shuffle, workers, view))
        except _cgroups.CgroupUnavailable as exc:
            data["unavailable"] = str(exc)
    return data


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_table(data: dict[str, Any]) -> str:
    """The rows as a markdown table, with the layout and the stack above it."""
    stack = data["stack"]
    head = (
        f"{data['sessions']} sessions x {data['session_mib']:.0f} MiB in a "
        f"{data['limit_mib']} MiB child cgroup ({data['physical_gib']:.1f} GiB physical); "
        f"Python {stack['python']}, torch {stack['torch']}, numpy {stack['numpy']}"
    )
    if "unavailable" in data:
        return f"{head}\n\nno child cgroup: {data['unavailable']}\n\n|---|"
    lines = [
        head,
        "",
        "| order | workers | memory | exit | trials/s | peak MiB | anon peak MiB | failcnt "
        "| max_session_bytes |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in data["rows"]:
        lines.append(
            f"| {row['order']} | {row['workers']} | {row['view']} | {row['exit']} | "
            f"{_fmt(row['trials_per_s'], ',.1f')} | {row['peak_mib']:.0f} | "
            f"{row['peak_anon_mib']:.0f} | {row['failcnt']:,} | {row['max_session_bytes']} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run and print the table (``--json PATH``: also the numbers)."""
    parser = _cli.parser(__doc__ or "", "750 x 20,000 sessions in a 384 MiB cgroup")
    parser.add_argument("--root", help="where the session files are written (a temp folder)")
    parser.add_argument("--limit-mib", type=int, help="the child cgroup's memory limit")
    args = parser.parse_args(argv)
    data = run(args.root, quick=args.quick, limit_mib=args.limit_mib)
    _cli.emit(data, format_table(data), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
