"""NSD betas as they are stored: every way of reading them, side by side in one run.

Usage: python benchmarks/nsd_layout.py [--quick] [--json PATH] [--repeats N] [--real-size]

NSD writes its single-trial betas from MATLAB with ``ChunkSize [1 1 1 750]``, so h5py sees
``betas`` as ``(750, V)`` int16 (betas x 300) with chunks ``(750, 1)``: each chunk is one
voxel's 750 trials and one trial touches every chunk. The scaled layout (issue 28): 4 session
files ``betas_sessionNN.hdf5`` of 750 x 20,000 int16 (30 MB each; ``--quick``: 750 x 2,000),
written into a temporary directory (so read from the page cache), batch 64. Rows, on the same
files:

- ``each session read whole once``: ``h5py.File(path)["betas"][:]`` per session, the bound
  (NSD users load a session whole and draw trials from it);
- ``seeds' dataset, 2 workers``: the seeds' code, per item, ``h5py.File`` handles opened lazily
  and never closed, under ``torch.utils.data.DataLoader(shuffle=True, num_workers=2)``, timed on
  a prefix of the pass (it reads the whole session file for every trial);
- ``loaderkit shuffle=True`` with 0 and 2 workers: ``loaderkit.DataLoader(HDF5SessionDataset(
  paths, key="betas"), shuffle=True, seed=0)``, everything else left to loaderkit (here every
  session fits the fitted ``max_session_bytes``, so each process reads each session once and
  serves the rest from memory);
- ``loaderkit shuffle=True, max_session_bytes=0`` with 0 and 2 workers: nothing held, every
  batch reads its rows of each session in one pass over that session's chunks (what happens
  when sessions do not fit);
- ``loaderkit shuffle="block"`` with 0 and 2 workers;
- after ``loaderkit rechunk`` (contiguous rows, the default): ``shuffle=True`` with 2 workers;
  and after ``rechunk --layout chunked`` (chunks of whole rows, about 1 MiB): the same.

Each loader row is a fresh dataset and loader; its first pass is timed (worker start-up
included: it is what a training run pays); batches are only counted (converting to float32
would cost every row alike and the bound nothing). An untimed second pass checks every sample:
the first two voxels of every trial hold its session and trial number, and every trial's sum
is known. Rows are interleaved and rotated between ``--repeats`` rounds; the table gives the
median samples/s and its ratios to the bound and to the seeds' dataset, with the targets of
issue 28: block with 0 workers >= 0.5x the bound; ``shuffle=True`` with 2 workers >= 20x the
seeds' dataset; after rechunk, ``shuffle=True`` with 2 workers >= 100x the seeds' dataset.
The seeds' dataset (about one sample a second here) is timed in the first round only, on its
first two batches (one per worker).

``--real-size``: one session at NSD's 1.8 mm size, 750 x 699,192 int16 (1.05 GB), chunks
``(750, 1)``: one ``dset[:]`` of it (in a fresh process: its time and peak RSS) against
``shuffle="block"`` with 2 workers (one pass; each worker's peak RSS above its RSS at start,
beside the budget the plan states: ``max_session_bytes``, the open files' memory, the hand-off's
batch slots and one staging block). Target: block >= 0.5x one read, each worker within that
budget.
"""

from __future__ import annotations

import gc
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import psutil
import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset

try:
    import _cli
except ImportError:  # imported as a module from elsewhere (tests)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _cli

import loaderkit
from loaderkit import HDF5SessionDataset, PerformanceHint
from loaderkit.hdf5 import rechunk
from loaderkit.hdf5.read.widerows import BLOCK_BYTES

__all__ = ["SeedsDataset", "format_table", "main", "run", "write_sessions"]

TRIALS = 750
SESSIONS = 4
VOXELS = 20_000
QUICK_VOXELS = 2_000
REAL_VOXELS = 699_192
BATCH = 64
SCALE = np.float32(300)
BOUND = "each session read whole once"
SEEDS = "seeds' dataset, 2 workers"
RECHUNKED = "after rechunk: shuffle=True"
RECHUNKED_CHUNKS = "after rechunk --layout chunked: shuffle=True"


# ------------------------------------------------------------------ the files


def _session(session: int, voxels: int, start: int, stop: int) -> np.ndarray:
    """Columns ``start..stop-1`` of a session: int16 betas x 300 (deterministic).

    Voxel 0 holds the trial number and voxel 1 the session, so every sample says where it
    came from.
    """
    rng = np.random.default_rng([session, start])
    block = rng.integers(-3000, 3000, size=(TRIALS, stop - start), dtype=np.int16)
    if start == 0:
        block[:, 0] = np.arange(TRIALS)
        if stop > 1:
            block[:, 1] = session
    return block


def write_sessions(root: Path, voxels: int, sessions: int) -> tuple[list[Path], np.ndarray]:
    """NSD-layout session files; returns the paths and every trial's sum (int64)."""
    root.mkdir(parents=True, exist_ok=True)
    paths, sums = [], np.zeros((sessions, TRIALS), np.int64)
    step = max(1, (64 << 20) // (TRIALS * 2))  # write in 64 MB blocks of columns
    for s in range(sessions):
        path = root / f"betas_session{s + 1:02d}.hdf5"
        with h5py.File(path, "w") as f:
            d = f.create_dataset("betas", shape=(TRIALS, voxels), dtype="<i2", chunks=(TRIALS, 1))
            for start in range(0, voxels, step):
                block = _session(s, voxels, start, min(voxels, start + step))
                d[:, start : start + block.shape[1]] = block
                sums[s] += block.sum(axis=1, dtype=np.int64)
            d.attrs["scale"] = SCALE
        paths.append(path)
    return paths, sums


class SeedsDataset(Dataset):
    """The seeds' dataset: one trial per item, handles opened lazily and never closed."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.paths = [str(p) for p in paths]
        self.files: dict[int, h5py.File] = {}

    def __len__(self) -> int:
        return len(self.paths) * TRIALS

    def __getitem__(self, index: int) -> np.ndarray:
        session, trial = divmod(index, TRIALS)
        if session not in self.files:
            self.files[session] = h5py.File(self.paths[session], "r")
        return self.files[session]["betas"][trial]


# ------------------------------------------------------------------ measuring


def _consume(batch: Any) -> int:
    """The batch is only counted: the loaders are measured, not the conversion to float32
    (which costs every row the same, about 10 ms a batch here, and the bound nothing)."""
    return int(torch.as_tensor(batch).shape[0])


def _check(batches: Sequence[Any], sums: np.ndarray, complete: bool) -> int:
    """Every sample is the trial it says it is; with ``complete``, each trial exactly once."""
    seen = np.zeros(sums.shape, np.int64)
    for batch in batches:
        values = np.asarray(torch.as_tensor(batch))
        trial, session = values[:, 0].astype(np.int64), values[:, 1].astype(np.int64)
        got = values.astype(np.int64).sum(axis=1)
        if not np.array_equal(got, sums[session, trial]):
            raise AssertionError("a sample holds other values than its trial's")
        np.add.at(seen, (session, trial), 1)
    if complete and not np.all(seen == 1):
        raise AssertionError("trials missing or repeated in a pass")
    return int(seen.sum())


def _time_bound(paths: Sequence[Path]) -> tuple[float, int]:
    started = time.perf_counter()
    n = 0
    for path in paths:
        with h5py.File(path, "r") as f:
            n += f["betas"][:].shape[0]
    return time.perf_counter() - started, n


def _time_seeds(paths: Sequence[Path], batches: int, sums: np.ndarray) -> tuple[float, int, int]:
    loader = TorchDataLoader(
        SeedsDataset(paths), batch_size=BATCH, shuffle=True, num_workers=2, persistent_workers=False
    )
    got: list[Any] = []
    started = time.perf_counter()
    n = 0
    for k, batch in enumerate(loader):
        n += _consume(batch)
        got.append(batch)
        if k + 1 >= batches:
            break
    elapsed = time.perf_counter() - started
    del loader
    return elapsed, n, _check(got, sums, complete=False)


def _time_loader(make: Callable[[], Any], sums: np.ndarray) -> tuple[float, int, int, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PerformanceHint)
        loader = make()
    try:
        started = time.perf_counter()
        n = sum(_consume(batch) for batch in loader)
        elapsed = time.perf_counter() - started
        checked = _check(list(loader), sums, complete=True)  # untimed: every sample
        plan = {name: loader.plan[name].value for name in loader.plan}
    finally:
        loader.close()
    return elapsed, n, checked, plan


def _loader(paths: Sequence[Path], workers: int, shuffle: Any, **dataset: Any) -> Callable[[], Any]:
    def make() -> Any:
        ds = HDF5SessionDataset(paths, key="betas", **dataset)
        return loaderkit.DataLoader(
            ds,
            batch_size=BATCH,
            shuffle=shuffle,
            num_workers=workers,
            seed=0,
            persistent_workers=workers > 0,
        )

    return make


def run(
    *, quick: bool = False, repeats: int = 3, root: str | os.PathLike[str] | None = None
) -> dict[str, Any]:
    """The scaled layout's rows, ``repeats`` interleaved rounds; returns the numbers."""
    voxels = QUICK_VOXELS if quick else VOXELS
    seeds_batches = 2  # a prefix: one batch per worker
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        base = Path(tmp)
        paths, sums = write_sessions(base / "nsd", voxels, SESSIONS)
        started = time.perf_counter()
        rows_dir = [r.target for r in rechunk(paths, "betas", base / "rows")]
        rechunk_s = time.perf_counter() - started
        chunked_dir = [
            r.target for r in rechunk(paths, "betas", base / "chunked", layout="chunked")
        ]
        rows: dict[str, Callable[[], tuple[float, int, int, Any]]] = {}

        def bound() -> tuple[float, int, int, Any]:
            elapsed, n = _time_bound(paths)
            return elapsed, n, n, None

        def seeds() -> tuple[float, int, int, Any]:
            return (*_time_seeds(paths, seeds_batches, sums), None)

        rows[BOUND] = bound
        rows[SEEDS] = seeds
        for workers in (0, 2):
            rows[f"loaderkit shuffle=True, {workers} workers"] = _bind(
                _loader(paths, workers, True), sums
            )
        for workers in (0, 2):
            rows[f"loaderkit shuffle=True, max_session_bytes=0, {workers} workers"] = _bind(
                _loader(paths, workers, True, max_session_bytes=0), sums
            )
        for workers in (0, 2):
            rows[f'loaderkit shuffle="block", {workers} workers'] = _bind(
                _loader(paths, workers, "block"), sums
            )
        rows[f"{RECHUNKED}, 2 workers"] = _bind(_loader(rows_dir, 2, True), sums)
        rows[f"{RECHUNKED_CHUNKS}, 2 workers"] = _bind(_loader(chunked_dir, 2, True), sums)

        names = list(rows)
        times: dict[str, list[float]] = {name: [] for name in names}
        counts: dict[str, tuple[int, int]] = {}
        plans: dict[str, Any] = {}
        for r in range(repeats):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                if name == SEEDS and r:
                    continue  # slow: the first round only
                gc.collect()
                elapsed, n, checked, plan = rows[name]()
                times[name].append(n / elapsed)
                counts[name] = (n, checked)
                if plan is not None:
                    plans[name] = plan
    bound_rate = statistics.median(times[BOUND])
    seeds_rate = statistics.median(times[SEEDS])
    results = []
    for name in names:
        rate = statistics.median(times[name])
        plan = plans.get(name, {})
        results.append(
            {
                "row": name,
                "samples_per_s": rate,
                "vs_bound": rate / bound_rate,
                "vs_seeds": rate / seeds_rate,
                "timed_samples": counts[name][0],
                "checked_samples": counts[name][1],
                "max_session_bytes": plan.get("max_session_bytes"),
                "repeats": times[name],
            }
        )
    by = {row["row"]: row for row in results}
    targets = [
        _target(
            "block, 0 workers >= 0.5x the bound",
            by['loaderkit shuffle="block", 0 workers'],
            "vs_bound",
            0.5,
        ),
        _target(
            "shuffle=True, 2 workers >= 20x the seeds' dataset",
            by["loaderkit shuffle=True, 2 workers"],
            "vs_seeds",
            20,
        ),
        _target(
            "after rechunk, shuffle=True, 2 workers >= 100x the seeds' dataset",
            by[f"{RECHUNKED}, 2 workers"],
            "vs_seeds",
            100,
        ),
    ]
    return {
        "layout": {
            "sessions": SESSIONS,
            "trials": TRIALS,
            "voxels": voxels,
            "chunks": [TRIALS, 1],
            "dtype": "int16",
            "batch": BATCH,
            "session_mb": TRIALS * voxels * 2 / 1e6,
        },
        "quick": quick,
        "repeats": repeats,
        "seeds_timed_batches": seeds_batches,
        "rechunk_seconds": rechunk_s,
        "rows": results,
        "targets": targets,
        "versions": {
            "h5py": h5py.__version__,
            "hdf5": h5py.version.hdf5_version,
            "torch": torch.__version__,
        },
    }


def _bind(make: Callable[[], Any], sums: np.ndarray) -> Callable[[], tuple[float, int, int, Any]]:
    return lambda: _time_loader(make, sums)


def _target(text: str, row: dict[str, Any], column: str, needed: float) -> dict[str, Any]:
    return {"target": text, "ratio": row[column], "passed": row[column] >= needed}


# ------------------------------------------------------------------ the real size


_ONE_READ = textwrap.dedent(
    """
    import resource, sys, time, h5py
    started = time.perf_counter()
    with h5py.File(sys.argv[1], "r") as f:
        rows = f["betas"][:].shape[0]
    elapsed = time.perf_counter() - started
    print(rows, elapsed, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    """
)


class _Sampler(threading.Thread):
    """Peak RSS of each worker process of the current process, sampled every 20 ms."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peaks: dict[int, int] = {}
        self.starts: dict[int, int] = {}
        self.running = True

    def run(self) -> None:
        me = psutil.Process()
        while self.running:
            for child in me.children():
                try:
                    rss = child.memory_info().rss
                except psutil.Error:
                    continue
                self.starts.setdefault(child.pid, rss)
                self.peaks[child.pid] = max(self.peaks.get(child.pid, 0), rss)
            time.sleep(0.02)


def run_real_size(root: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """One session at the real size: one ``dset[:]`` against block order with 2 workers."""
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        started = time.perf_counter()
        paths, sums = write_sessions(Path(tmp), REAL_VOXELS, 1)
        write_s = time.perf_counter() - started
        one = subprocess.run(
            [sys.executable, "-c", _ONE_READ, str(paths[0])],
            capture_output=True,
            text=True,
            check=True,
        )
        rows, read_s, read_rss = one.stdout.split()
        read_rate = int(rows) / float(read_s)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PerformanceHint)
            ds = HDF5SessionDataset(paths, key="betas")
        loader = loaderkit.DataLoader(ds, batch_size=BATCH, shuffle="block", num_workers=2, seed=0)
        budget = loader.plan["max_session_bytes"].value
        files = loader.plan["max_open_files"].value
        found = re.search(r"\((\d+) per worker\)", str(loader.plan["handoff"].value))
        slots = int(found.group(1)) if found else 0  # torch's path: batches in /dev/shm
        batch_bytes = BATCH * (ds.handles.sample_nbytes or 0)
        per_process = (
            budget + files * ds.budgets.file_memory_bytes + BLOCK_BYTES + slots * batch_bytes
        )
        sampler = _Sampler()
        sampler.start()
        started = time.perf_counter()
        n, got = 0, []
        for batch in loader:
            n += _consume(batch)
            got.append(batch[:, :2].clone())
        block_s = time.perf_counter() - started
        sampler.running = False
        sampler.join()
        loader.close()
        seen = torch.cat(got).numpy()
        assert sorted(seen[:, 0].tolist()) == list(range(TRIALS)), "trials missing"
        workers = [
            {
                "pid": pid,
                "start_rss": sampler.starts[pid],
                "peak_rss": peak,
                "grown": peak - sampler.starts[pid],
            }
            for pid, peak in sampler.peaks.items()
        ]
        del sums
    block_rate = n / block_s
    return {
        "voxels": REAL_VOXELS,
        "session_bytes": TRIALS * REAL_VOXELS * 2,
        "write_seconds": write_s,
        "one_read_seconds": float(read_s),
        "one_read_samples_per_s": read_rate,
        "one_read_peak_rss": int(read_rss),
        "block_2_workers_seconds": block_s,
        "block_2_workers_samples_per_s": block_rate,
        "vs_one_read": block_rate / read_rate,
        "plan_max_session_bytes": budget,
        "plan_max_open_files": files,
        "file_memory_bytes": ds.budgets.file_memory_bytes,
        "plan_handoff_slots": slots,
        "batch_bytes": batch_bytes,
        "per_process_budget": per_process,
        "workers": workers,
        "targets": [
            {
                "target": "block, 2 workers >= 0.5x one read of the session",
                "ratio": block_rate / read_rate,
                "passed": block_rate / read_rate >= 0.5,
            },
            {
                "target": "each worker's RSS growth within the budget the plan states",
                "ratio": max((w["grown"] for w in workers), default=0) / per_process,
                "passed": all(w["grown"] <= per_process for w in workers),
            },
        ],
    }


# ------------------------------------------------------------------ output


def _rate(x: float) -> str:
    return f"{x / 1000:.1f}k" if x >= 10_000 else f"{x:,.0f}" if x >= 10 else f"{x:.2f}"


def _mb(n: int | None) -> str:
    return "" if not n else f"{n / (1 << 20):,.0f} MiB"


def format_table(data: dict[str, Any]) -> str:
    """The markdown tables."""
    lay = data["layout"]
    lines = [
        f"NSD layout: {lay['sessions']} sessions x ({lay['trials']}, {lay['voxels']:,}) int16, "
        f"chunks ({lay['trials']}, 1), {lay['session_mb']:.0f} MB each, batch {lay['batch']}; "
        f"median of {data['repeats']} interleaved rounds (first pass of a fresh loader); "
        f"h5py {data['versions']['h5py']} / HDF5 {data['versions']['hdf5']}, "
        f"torch {data['versions']['torch']}",
        "",
        "| read | samples/s | vs bound | vs seeds' dataset | max_session_bytes | samples checked |",
        "|---|---|---|---|---|---|",
    ]
    for row in data["rows"]:
        lines.append(
            f"| {row['row']} | {_rate(row['samples_per_s'])} | {row['vs_bound']:.2f} | "
            f"{row['vs_seeds']:,.0f} | {_mb(row['max_session_bytes'])} | "
            f"{row['checked_samples']} |"
        )
    lines += [
        "",
        f"seeds' dataset timed on its first {data['seeds_timed_batches']} batches; "
        f"loaderkit rechunk of the {lay['sessions']} files took {data['rechunk_seconds']:.1f} s.",
        "",
        "| target | measured | result |",
        "|---|---|---|",
    ]
    for t in data["targets"]:
        lines.append(f"| {t['target']} | {t['ratio']:.2f}x | {'pass' if t['passed'] else 'FAIL'} |")
    real = data.get("real_size")
    if real:
        lines += [
            "",
            f"Real size: one session of (750, {real['voxels']:,}) int16, "
            f"{real['session_bytes'] / 1e9:.2f} GB, chunks (750, 1)",
            "",
            "| read | seconds | samples/s | vs one read | peak RSS |",
            "|---|---|---|---|---|",
            f"| one read (`dset[:]`, fresh process) | {real['one_read_seconds']:.1f} | "
            f"{_rate(real['one_read_samples_per_s'])} | 1.00 | {_mb(real['one_read_peak_rss'])} |",
            f'| loaderkit shuffle="block", 2 workers | {real["block_2_workers_seconds"]:.1f} | '
            f"{_rate(real['block_2_workers_samples_per_s'])} | {real['vs_one_read']:.2f} | "
            + ", ".join(
                f"worker {_mb(w['peak_rss'])} (+{_mb(w['grown'])})" for w in real["workers"]
            )
            + " |",
            "",
            f"plan: max_session_bytes = {_mb(real['plan_max_session_bytes'])}, max_open_files = "
            f"{real['plan_max_open_files']} x {_mb(real['file_memory_bytes'])}, hand-off "
            f"{real['plan_handoff_slots']} batch slots per worker x "
            f"{_mb(real['batch_bytes'])}; a worker's budget (those + one staging block of "
            f"{_mb(BLOCK_BYTES)}) = {_mb(real['per_process_budget'])}",
            "",
            "| target | measured | result |",
            "|---|---|---|",
        ]
        for t in real["targets"]:
            lines.append(
                f"| {t['target']} | {t['ratio']:.2f}x | {'pass' if t['passed'] else 'FAIL'} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    parser = _cli.parser(__doc__ or "", "small files (2,000 voxels), one round: under a minute")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--root", help="directory for the generated files (default: temp dir)")
    parser.add_argument(
        "--real-size",
        action="store_true",
        help="also one session at NSD's real size (1.05 GB written, about 2 minutes)",
    )
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    data = run(quick=args.quick, repeats=1 if args.quick else args.repeats, root=args.root)
    if args.real_size:
        data["real_size"] = run_real_size(args.root)
    _cli.emit(data, format_table(data), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
