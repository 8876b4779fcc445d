"""Worker threads against worker processes and no workers, side by side in one run.

Usage: python benchmarks/threads.py [--quick] [--json PATH] [--repeats N] [--later-passes N]

Three workloads, written into a temporary directory (read from the page cache), batch 64,
``shuffle=True, seed=0``, ``HDF5SessionDataset(paths, key="betas")``, everything else left to
loaderkit:

- ``contiguous``: 8 sessions of 750 rows of 64 x 64 float32 (16 KiB rows), contiguous storage
  (``--quick``: 200 rows);
- ``gzip-chunked``: the same rows in chunks of 8 rows, gzip level 1;
- ``NSD layout``: 4 sessions of 750 x 20,000 int16 with chunks ``(750, 1)`` (``--quick``:
  2,000 voxels), every session held whole in memory by each process that reads it.

Each cell runs twice, each time in a fresh process (so its memory is its own; ``--quick``: once,
in this process). It builds the loader (``persistent_workers=True`` with workers) and runs one
pass: its samples/s are timed from ``iter(loader)`` (starting the workers counts). The second
run then makes ``--later-passes`` more passes (default 2) and gives the growth of the whole
process tree's memory over its passes (the summed USS, ``psutil.Process.memory_full_info().uss``,
of the process and every child, sampled every 20 ms by this script; the peak minus the value
before the loader was built; and the same for PSS, which also counts memory processes share,
such as batches in shared memory). Rates come from the run nobody samples: a sample costs about
4 ms of CPU, a fifth of a core at that rate, and sampling from inside the cell would also take
the GIL from its worker threads. Configurations: no workers, 2 forked worker processes, 1 worker
thread, 2 worker threads. Cells are interleaved and rotated between ``--repeats`` rounds.

Later passes (the workers already running, as in the later epochs of a training run) are timed
side by side: for each workload and repeat, one fresh process nobody samples holds a persistent
loader of every configuration and runs ``ROUNDS`` rounds, each configuration's whole passes for
at least ``SLICE_S`` seconds per round, in an order rotated between rounds (``interleaved``).
The table gives the median samples/s over all rounds, and the later-pass ratios are the median
of each round's ratio: the speed of a shared machine drifts by a third over minutes, which
moves one round's configurations alike.

A second table: the time from ``iter(loader)`` to the first batch with 2 workers, on the NSD
layout, for processes started with ``fork``, ``forkserver`` (the first loader of a process:
its server starts too) and ``spawn``, and for threads; each in a fresh process.

HDF5 reads run outside loaderkit's locks and, where the read path allows (``hdf5_reads`` in the
plan: ``preadv``, raw or decoded chunks), outside h5py's too; ``benchmarks/parallel_reads.py``
measures the reads alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

try:
    import _cli
except ImportError:  # imported as a module from elsewhere (tests)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _cli

__all__ = ["CONFIGS", "interleaved", "main", "paired", "run"]

#: (name, num_workers, worker_method, start method)
CONFIGS: tuple[tuple[str, int, str | None, str | None], ...] = (
    ("0 workers", 0, None, None),
    ("2 processes (fork)", 2, "process", "fork"),
    ("1 thread", 1, "thread", None),
    ("2 threads", 2, "thread", None),
)
STARTS: tuple[tuple[str, str, str | None], ...] = (
    ("processes, fork", "process", "fork"),
    ("processes, forkserver", "process", "forkserver"),
    ("processes, spawn", "process", "spawn"),
    ("threads", "thread", None),
)
WORKLOADS = ("contiguous", "gzip-chunked", "NSD layout")
BATCH = 64
#: Later passes side by side: rounds per repeat, and the least time of each configuration's
#: whole passes in a round (seconds).
ROUNDS, SLICE_S = 5, 0.5


def tree_memory(root: psutil.Process | None = None) -> tuple[int, int]:
    """Summed (USS, PSS) of ``root`` (this process) and every descendant (bytes); 0 once gone.

    USS counts only pages no other process maps: memory two processes share (forked pages not
    yet written, shared-memory batches) is in neither's USS; PSS splits it between them.
    """
    uss = pss = 0
    with contextlib.suppress(psutil.NoSuchProcess):
        root = root or psutil.Process()
        for process in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                info = process.memory_full_info()
                uss += info.uss
                pss += getattr(info, "pss", info.uss)
    return uss, pss


class _Peak(threading.Thread):
    """Samples ``tree_memory(root)`` every 20 ms until stopped; keeps the peaks.

    A cell's own tree is sampled from the process that started it: sampling inside it would
    take the GIL from its worker threads (parsing ``/proc``), and from no worker process.
    """

    def __init__(self, root: psutil.Process | None = None) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.peak = tree_memory(root)
        self.done = threading.Event()

    def _sample(self) -> None:
        now = tree_memory(self.root)
        self.peak = (max(self.peak[0], now[0]), max(self.peak[1], now[1]))

    def run(self) -> None:
        while not self.done.wait(0.02):
            self._sample()

    def stop(self) -> tuple[int, int]:
        self.done.set()
        self.join()
        self._sample()
        return self.peak


def write(root: Path, workload: str, quick: bool) -> list[str]:
    """The session files of ``workload`` under ``root``."""
    if workload == "NSD layout":
        from nsd_layout import QUICK_VOXELS, SESSIONS, VOXELS, write_sessions

        paths, _ = write_sessions(root, QUICK_VOXELS if quick else VOXELS, SESSIONS)
    else:
        from _workloads import WORKLOADS as SHAPES
        from _workloads import Workload, make_workload

        base = SHAPES["gzip-chunked" if workload == "gzip-chunked" else "small-rows"]
        shape = Workload(
            workload, base.sessions, base.rows, base.quick_rows, base.row_shape,
            base.chunk_rows, base.compression, base.compression_opts,
        )  # fmt: skip
        paths = make_workload(root, shape, quick=quick)
    return [str(p) for p in paths]


def _loader(paths: Sequence[str], workers: int, method: str | None, start: str | None) -> Any:
    """A configuration's loader, over a dataset of its own (persistent workers where any)."""
    import loaderkit

    return loaderkit.DataLoader(
        loaderkit.HDF5SessionDataset(list(paths), key="betas"),
        batch_size=BATCH,
        shuffle=True,
        seed=0,
        num_workers=workers,
        worker_method=method,
        multiprocessing_context=start if workers else None,
        persistent_workers=bool(workers),
    )


def cell(
    paths: Sequence[str],
    workers: int,
    method: str | None,
    start: str | None,
    later: int = 0,
    sample: bool = True,
) -> dict:
    """One pass and ``later`` more in this process: samples/s, tree memory, first batch.

    Without ``sample`` the peaks are left to whoever samples this process from outside: the
    result then holds the memory before the loader was built (``before_uss``, ``before_pss``).
    """
    import warnings

    warnings.simplefilter("ignore")
    before = tree_memory()
    peak = _Peak() if sample else None
    if peak is not None:
        peak.start()
    loader = _loader(paths, workers, method, start)
    began = time.perf_counter()
    iterator = iter(loader)
    first = next(iterator)
    first_s = time.perf_counter() - began
    samples = len(first)
    for batch in iterator:
        samples += len(batch)
    elapsed = time.perf_counter() - began
    again, later_began = 0, time.perf_counter()
    for _ in range(later):
        for batch in loader:
            again += len(batch)
    later_s = time.perf_counter() - later_began
    uss, pss = peak.stop() if peak is not None else before
    loader.close()
    return {
        "samples_per_s": samples / elapsed,
        "later_samples_per_s": again / later_s if later else 0.0,
        "memory_growth": uss - before[0],
        "pss_growth": pss - before[1],
        "before_uss": before[0],
        "before_pss": before[1],
        "first_batch_s": first_s,
    }


def interleaved(paths: Sequence[str], rounds: int, slice_s: float) -> dict[str, list[float]]:
    """Later passes of every configuration side by side in this process: samples/s per round.

    One persistent loader per configuration, each over its own dataset (its own open files
    and held sessions), the processes' loader first (its workers fork before this process
    has a thread), then one pass of each to start its workers and warm its files. In each of
    ``rounds`` rounds every configuration, in an order rotated between rounds, runs whole
    passes for at least ``slice_s`` seconds, while the others' workers wait idle between
    passes. Drift of the machine's speed over minutes (a third on a shared 2-core VM) then
    moves every configuration of a round alike, and the ratios of one round are side by side.
    """
    import warnings

    warnings.simplefilter("ignore")
    configs = sorted(CONFIGS, key=lambda c: c[2] != "process")  # processes' loader first
    loaders: dict[str, Any] = {}
    rates: dict[str, list[float]] = {c[0]: [] for c in CONFIGS}
    names = [c[0] for c in CONFIGS]
    try:
        for name, workers, method, start in configs:
            loaders[name] = _loader(paths, workers, method, start)
            for _ in loaders[name]:  # starts its workers, warms its files
                pass
        for round_ in range(rounds):
            shift = round_ % len(names)
            for name in names[shift:] + names[:shift]:
                samples, began = 0, time.perf_counter()
                while True:
                    for batch in loaders[name]:
                        samples += len(batch)
                    if time.perf_counter() - began >= slice_s:
                        break
                rates[name].append(samples / (time.perf_counter() - began))
    finally:
        for loader in loaders.values():
            loader.close()
    return rates


def _in_fresh_process(args: dict, quick: bool, *, watch: bool = True) -> dict:
    """One cell in a fresh process; with ``watch``, its tree's memory sampled from here.

    Sampling costs about 4 ms of CPU every 20 ms (the kernel walks the process's pages): on 2
    cores that is time the cell's workers lose, so a cell's rates come from a run nobody
    samples (``watch=False``) and its memory from another (``watch=True``).
    """
    if quick:  # in this process: memory figures include what earlier cells left behind
        return cell(args["paths"], args["workers"], args["method"], args["start"], args["later"])
    with subprocess.Popen(
        [sys.executable, __file__, "--cell", json.dumps(args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as child:
        peak = _Peak(psutil.Process(child.pid)) if watch else None  # see _Peak
        if peak is not None:
            peak.start()
        try:
            out, err = child.communicate(timeout=600)
        finally:
            uss, pss = peak.stop() if peak is not None else (0, 0)
    if child.returncode != 0:
        raise RuntimeError(err[-3000:])
    got = json.loads(out.strip().splitlines()[-1])
    got["memory_growth"] = uss - got["before_uss"]
    got["pss_growth"] = pss - got["before_pss"]
    return dict(got)


def _measured(args: dict, quick: bool) -> dict:
    """A cell's first pass from an unwatched run, its memory growth from a watched one.

    Its later passes are timed side by side with the other configurations' (``interleaved``).
    """
    if quick:
        return _in_fresh_process(args, quick)
    got = _in_fresh_process({**args, "later": 0}, quick, watch=False)
    watched = _in_fresh_process(args, quick)
    got["memory_growth"], got["pss_growth"] = watched["memory_growth"], watched["pss_growth"]
    return got


def _interleaved(paths: Sequence[str], quick: bool) -> dict[str, list[float]]:
    """``interleaved`` in a fresh process that nobody samples (``--quick``: here, shortly)."""
    if quick:
        return interleaved(paths, 2, 0.0)
    spec = json.dumps({"paths": list(paths), "rounds": ROUNDS, "slice_s": SLICE_S})
    done = subprocess.run(
        [sys.executable, __file__, "--interleaved", spec],
        capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def run(*, quick: bool = False, repeats: int = 3, later_passes: int = 2) -> dict[str, Any]:
    """Every cell in a fresh process, interleaved over ``repeats`` rounds."""
    repeats = 1 if quick else repeats
    results: dict[str, dict[str, list[dict]]] = {w: {c[0]: [] for c in CONFIGS} for w in WORKLOADS}
    later: dict[str, dict[str, list[float]]] = {w: {c[0]: [] for c in CONFIGS} for w in WORKLOADS}
    starts: dict[str, list[float]] = {s[0]: [] for s in STARTS}
    with tempfile.TemporaryDirectory() as tmp:
        files = {w: write(Path(tmp) / str(i), w, quick) for i, w in enumerate(WORKLOADS)}
        order = [(w, c) for w in WORKLOADS for c in CONFIGS]
        for round_ in range(repeats):
            shift = round_ % len(order)
            for workload, (name, workers, method, start) in order[shift:] + order[:shift]:
                got = _measured(
                    {"paths": files[workload], "workers": workers, "method": method,
                     "start": start, "later": later_passes}, quick,
                )  # fmt: skip
                results[workload][name].append(got)
            for workload in WORKLOADS:
                for name, rates in _interleaved(files[workload], quick).items():
                    later[workload][name].extend(rates)
            for name, method, start in STARTS:
                got = _in_fresh_process(
                    {"paths": files["NSD layout"], "workers": 2, "method": method, "start": start,
                     "later": 0}, quick,
                )  # fmt: skip
                starts[name].append(got["first_batch_s"])
    table: dict[str, Any] = {}
    for workload, cells in results.items():
        table[workload] = {
            name: {
                "samples_per_s": statistics.median(c["samples_per_s"] for c in runs),
                "later_samples_per_s": statistics.median(later[workload][name]),
                "later_rounds": later[workload][name],
                "memory_growth": statistics.median(c["memory_growth"] for c in runs),
                "pss_growth": statistics.median(c["pss_growth"] for c in runs),
            }
            for name, runs in cells.items()
        }
    first = {name: statistics.median(values) for name, values in starts.items()}
    return {
        "quick": quick,
        "repeats": repeats,
        "later_passes": later_passes,
        "throughput": table,
        "first_batch_s": first,
    }


def paired(rates: Sequence[float], against: Sequence[float]) -> float:
    """The median of round-by-round ratios ``rates[i] / against[i]`` (rounds side by side).

    Example:
        >>> paired([2.0, 3.0, 9.0], [1.0, 2.0, 3.0])
        2.0
    """
    return statistics.median(a / b for a, b in zip(rates, against, strict=True))


def _ratio(growth: float, against: float) -> str:
    """``growth / against`` as ``1.23x``; ``n/a`` where ``against`` grew less than 1 MiB.

    A forked parent's USS can even shrink: pages it shared with no one become shared with
    its workers, so they leave its USS without entering theirs.
    """
    return f"{growth / against:.2f}x" if against >= 2**20 else "n/a (under 1 MiB)"


def format_table(data: dict[str, Any]) -> str:
    """The two markdown tables."""
    lines = [
        "| workload | configuration | first pass (samples/s) | x 0 workers "
        "| later passes (samples/s) | x 0 workers | tree USS growth (MiB) "
        "| tree PSS growth (MiB) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for workload, cells in data["throughput"].items():
        zero = cells["0 workers"]
        for name, c in cells.items():
            lines.append(
                f"| {workload} | {name} | {c['samples_per_s']:.0f} | "
                f"{c['samples_per_s'] / zero['samples_per_s']:.2f} | "
                f"{c['later_samples_per_s']:.0f} | "
                f"{c['later_samples_per_s'] / max(zero['later_samples_per_s'], 1e-9):.2f} | "
                f"{c['memory_growth'] / 2**20:.0f} | {c['pss_growth'] / 2**20:.0f} |"
            )
    for workload, cells in data["throughput"].items():
        two, one = cells["2 threads"], cells["1 thread"]
        procs = cells["2 processes (fork)"]
        lines.append("")
        lines.append(
            f"{workload}, first pass: 2 threads / 1 thread "
            f"{two['samples_per_s'] / one['samples_per_s']:.2f}x; 2 threads / 2 processes "
            f"{two['samples_per_s'] / procs['samples_per_s']:.2f}x"
        )
        lines.append(
            f"{workload}, later passes (median of the rounds' ratios, side by side): 2 threads / "
            f"1 thread {paired(two['later_rounds'], one['later_rounds']):.2f}x; 2 threads / 2 "
            f"processes {paired(two['later_rounds'], procs['later_rounds']):.2f}x"
        )
        lines.append(
            f"{workload}: tree memory growth 2 threads / 2 processes: USS "
            f"{_ratio(two['memory_growth'], procs['memory_growth'])}, PSS "
            f"{_ratio(two['pss_growth'], procs['pss_growth'])}"
        )
    lines += ["", "| NSD layout, 2 workers | first batch (s) | x threads |", "|---|---:|---:|"]
    threads = data["first_batch_s"]["threads"]
    for name, seconds in data["first_batch_s"].items():
        lines.append(f"| {name} | {seconds:.3f} | {seconds / threads:.1f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark (or, with ``--cell``, one cell of it) and print the tables."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["--interleaved"]:
        spec = json.loads(args_list[1])
        print(json.dumps(interleaved(spec["paths"], spec["rounds"], spec["slice_s"])))
        return 0
    if args_list[:1] == ["--cell"]:
        spec = json.loads(args_list[1])
        result = cell(
            spec["paths"], spec["workers"], spec["method"], spec["start"], spec["later"],
            sample=False,
        )  # fmt: skip
        print(json.dumps(result))
        return 0
    parser = _cli.parser(__doc__ or "", "small files, one round")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--later-passes", type=int, default=2)
    args = parser.parse_args(args_list)
    data = run(quick=args.quick, repeats=args.repeats, later_passes=args.later_passes)
    _cli.emit(data, format_table(data), args.json)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    raise SystemExit(main())
