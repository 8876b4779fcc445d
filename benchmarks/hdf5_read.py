"""HDF5 read strategies side by side: items/s ratios on the BENCHMARKS.md workloads.

Run ``python benchmarks/hdf5_read.py`` (add ``--quick`` for a run under a minute, ``--json PATH``
to save the numbers). For every workload it writes NSD-like session files to a temporary
directory, then measures each strategy on the same files and the same index order:

- ``open-per-item``: open the file, read one row, close.
- ``unbounded-cache``: a dict of ``h5py.Dataset`` objects opened once and never closed, with
  the index pre-converted to Python lists (the strongest simple per-item baseline).
- ``loaderkit-item``: ``HDF5SessionDataset[i]`` with ``max_open_files`` >= sessions;
  ``loaderkit-item-lru2``: the same with ``max_open_files=2`` (eviction on).
- ``loaderkit-batch``: ``__getitems__`` on batches of 64 random indices;
  ``loaderkit-batch-mmap``: the same with ``memory_map=True`` (contiguous data only).
- ``loaderkit-block``: ``__getitems__`` on batches of 64 in ``BlockShuffleSampler`` order;
  ``loaderkit-block-mmap``: the same with ``memory_map=True`` (contiguous data only).
- ``memory-limit``: one ``np.take`` per batch from in-memory arrays of all rows into a batch
  tensor, same batches as ``loaderkit-block`` (the ceiling).

Then the **types** rows (real files hold more than native float32): the same bytes per row
stored as native float32, big-endian float32 (``>f4``, as older instruments and Fortran/IDL
tools write), a compound record (a PyTables/pandas-style table row: an image sub-array field
and scalar fields) and the same compound big-endian; each read batched (``__getitems__`` +
``loaderkit.workers.collate``, block order) and per item (``ds[i]`` + ``default_collate``). Targets:
every batched row >= 0.8x the native batched read of the same bytes, and >= 5x its own
per-item read. ``--types-only`` runs just these rows.

Every strategy delivers each batch as a training loop receives it: one tensor, collated as
torch's fetcher does (``default_collate`` of the samples; ``loaderkit.workers.collate`` for
loaderkit's batched reads, which return the tensor they read into).

Fairness: a fresh reader (fresh dataset, fresh chunk buffer) per strategy and repeat, every file
opened and untimed warm-up batches read first, strategies interleaved (rotated every repeat),
median of the repeats, garbage collection off while timing, and every strategy releases a
batch's samples before reading the next one (as torch's fetcher does; holding two batches
would let the allocator recycle memory in a way no training loop does). Slow strategies
(open-per-item, lru2) are timed on a prefix of the same order. An untimed pass per strategy
checks every value against the in-memory copy and samples ``psutil.Process().open_files()``
after every batch.
"""

from __future__ import annotations

import argparse
import gc
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
import psutil
import torch
from torch.utils.data import default_collate

try:
    from _workloads import WORKLOADS, Workload, make_workload
except ImportError:  # imported as a module from elsewhere (tests)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _workloads import WORKLOADS, Workload, make_workload

from loaderkit.hdf5 import BlockShuffleSampler, HDF5SessionDataset
from loaderkit.workers.collate import collate

__all__ = ["STRATEGIES", "TARGETS", "evaluate_targets", "format_table", "main", "run_benchmark"]

BATCH = 64
KEY = "betas"
STRATEGIES = (
    "open-per-item",
    "unbounded-cache",
    "loaderkit-item",
    "loaderkit-item-lru2",
    "loaderkit-batch",
    "loaderkit-batch-mmap",
    "loaderkit-block",
    "loaderkit-block-mmap",
    "memory-limit",
)
SLOW = {"open-per-item", "loaderkit-item-lru2"}
BLOCK_ORDER = {"loaderkit-block", "loaderkit-block-mmap", "memory-limit"}

# (timed items, warm-up batches) per workload, full and quick.
SIZES = {
    "small-rows": ((4096, 4), (512, 2)),
    "tiny-rows": ((16384, 4), (2048, 2)),
    "gzip-chunked": ((2048, 4), (256, 2)),
    "large-rows": ((320, 1), (64, 1)),
}

Sink = Callable[[list[int], Any], None]


class _Context:
    def __init__(self, paths: list[Path], mem: np.ndarray, sess: np.ndarray, rows: np.ndarray):
        self.paths = [str(p) for p in paths]
        self.mem = mem
        self.sess = sess.tolist()
        self.rows = rows.tolist()


class _Strategy:
    name = ""

    def __init__(self, ctx: _Context) -> None:
        self.ctx = ctx

    def run(self, batches: Sequence[list[int]], sink: Sink | None = None) -> None:
        raise NotImplementedError

    def open_all(self) -> None:
        """Touch every session once (untimed)."""

    def close(self) -> None:
        """Release what the strategy opened."""


class OpenPerItem(_Strategy):
    name = "open-per-item"

    def run(self, batches: Sequence[list[int]], sink: Sink | None = None) -> None:
        paths, sess, rows = self.ctx.paths, self.ctx.sess, self.ctx.rows
        for batch in batches:
            out = []
            for i in batch:
                with h5py.File(paths[sess[i]], "r") as f:
                    out.append(f[KEY][rows[i]])
            out = default_collate(out)
            if sink is not None:
                sink(batch, out)
            del out  # like torch's fetcher: a batch is released before the next is read


class UnboundedCache(_Strategy):
    name = "unbounded-cache"

    def __init__(self, ctx: _Context) -> None:
        super().__init__(ctx)
        self.files: list[h5py.File] = []
        self.dsets: dict[int, h5py.Dataset] = {}

    def _open(self, s: int) -> h5py.Dataset:
        f = h5py.File(self.ctx.paths[s], "r")
        self.files.append(f)
        d = self.dsets[s] = f[KEY]
        return d

    def open_all(self) -> None:
        for s in range(len(self.ctx.paths)):
            self._open(s)[0]

    def run(self, batches: Sequence[list[int]], sink: Sink | None = None) -> None:
        sess, rows, dsets = self.ctx.sess, self.ctx.rows, self.dsets
        for batch in batches:
            out = []
            for i in batch:
                s = sess[i]
                d = dsets.get(s)
                if d is None:
                    d = self._open(s)
                out.append(d[rows[i]])
            out = default_collate(out)
            if sink is not None:
                sink(batch, out)
            del out  # like torch's fetcher: a batch is released before the next is read

    def close(self) -> None:
        for f in self.files:
            f.close()


class LoaderkitItem(_Strategy):
    name = "loaderkit-item"
    max_open: int | None = None
    memory_map = False

    def __init__(self, ctx: _Context) -> None:
        super().__init__(ctx)
        max_open = self.max_open or len(ctx.paths)
        self.ds = HDF5SessionDataset(
            ctx.paths, key=KEY, max_open_files=max_open, memory_map=self.memory_map
        )

    def open_all(self) -> None:
        for s in range(len(self.ctx.paths)):
            self.ds.file(s)

    def run(self, batches: Sequence[list[int]], sink: Sink | None = None) -> None:
        ds = self.ds
        for batch in batches:
            out = default_collate([ds[i] for i in batch])
            if sink is not None:
                sink(batch, out)
            del out  # like torch's fetcher: a batch is released before the next is read

    def close(self) -> None:
        self.ds.close()


class LoaderkitItemLru2(LoaderkitItem):
    name = "loaderkit-item-lru2"
    max_open = 2


class LoaderkitBatch(LoaderkitItem):
    name = "loaderkit-batch"

    def run(self, batches: Sequence[list[int]], sink: Sink | None = None) -> None:
        getitems = self.ds.__getitems__
        for batch in batches:
            out = collate(getitems(batch))
            if sink is not None:
                sink(batch, out)
            del out  # like torch's fetcher: a batch is released before the next is read


class LoaderkitBatchMapped(LoaderkitBatch):
    name = "loaderkit-batch-mmap"
    memory_map = True


class LoaderkitBlock(LoaderkitBatch):
    name = "loaderkit-block"


class LoaderkitBlockMapped(LoaderkitBatch):
    name = "loaderkit-block-mmap"
    memory_map = True


class MemoryLimit(_Strategy):
    name = "memory-limit"

    def run(self, batches: Sequence[list[int]], sink: Sink | None = None) -> None:
        mem = self.ctx.mem
        for batch in batches:
            out = torch.from_numpy(np.take(mem, np.asarray(batch), axis=0))
            if sink is not None:
                sink(batch, out)
            del out  # like torch's fetcher: a batch is released before the next is read


_CLASSES: dict[str, type[_Strategy]] = {
    cls.name: cls
    for cls in (
        OpenPerItem,
        UnboundedCache,
        LoaderkitItem,
        LoaderkitItemLru2,
        LoaderkitBatch,
        LoaderkitBlock,
        LoaderkitBatchMapped,
        LoaderkitBlockMapped,
        MemoryLimit,
    )
}

# Targets of issue 6 item 5 and issue 16 (block reads against the in-memory gather):
# (workload, strategy, reference strategy, minimum ratio).
TARGETS: list[tuple[str, str, str, float]] = [
    ("small-rows", "loaderkit-item", "open-per-item", 15.0),
    ("small-rows", "loaderkit-item", "unbounded-cache", 0.9),
    *[(w, "loaderkit-batch", "loaderkit-item", 0.9) for w in WORKLOADS],
    ("small-rows", "loaderkit-block", "unbounded-cache", 3.0),
    ("tiny-rows", "loaderkit-block", "unbounded-cache", 8.0),
    ("gzip-chunked", "loaderkit-block", "loaderkit-item", 2.5),
    ("small-rows", "loaderkit-block", "memory-limit", 0.8),
    ("tiny-rows", "loaderkit-block", "memory-limit", 0.5),
]


def _batches(order: np.ndarray) -> list[list[int]]:
    return [order[i : i + BATCH].tolist() for i in range(0, order.shape[0], BATCH)]


def _open_count(root: str) -> int:
    return sum(1 for f in psutil.Process().open_files() if f.path.startswith(root))


def _time(strategy: _Strategy, batches: list[list[int]]) -> float:
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        strategy.run(batches)
        return time.perf_counter() - t0
    finally:
        gc.enable()


def _check_pass(
    ctx: _Context, strategy: _Strategy, warm: list[list[int]], timed: list[list[int]], root: str
) -> tuple[int, int, int]:
    """Untimed pass: (values checked, mismatches, most files open at once)."""
    checked = mismatches = 0
    most = _open_count(root)

    def sink(batch: list[int], out: Any) -> None:
        nonlocal checked, mismatches, most
        for k, i in enumerate(batch):
            checked += 1
            if not np.array_equal(np.asarray(out[k]), ctx.mem[i]):
                mismatches += 1
        most = max(most, _open_count(root))

    strategy.open_all()
    most = max(most, _open_count(root))
    strategy.run(warm, sink)
    strategy.run(timed, sink)
    return checked, mismatches, most


def _run_workload(
    workload: Workload,
    root: Path,
    *,
    quick: bool,
    repeats: int,
    strategies: Sequence[str],
    block_size: int | None,
) -> dict[str, Any]:
    paths = make_workload(root, workload, quick=quick)
    with HDF5SessionDataset(paths, key=KEY) as ds:
        sess, rows = ds.handles.index_arrays()
        sampler = BlockShuffleSampler(ds, seed=1234, block_size=block_size)
        block_order = sampler.indices()
        block_size = max(sampler.block_rows)
    mem_parts = []
    for p in paths:
        with h5py.File(p, "r") as f:
            mem_parts.append(f[KEY][:])
    mem = np.concatenate(mem_parts)
    del mem_parts
    ctx = _Context(paths, mem, sess, rows)
    n = len(sess)
    timed_items, warm_batches = SIZES[workload.name][1 if quick else 0]
    rng = np.random.default_rng(99)
    random_order = rng.permutation(n)
    orders = {"random": _batches(random_order), "block": _batches(block_order)}
    timed_batches = max(1, min(len(orders["block"]) - warm_batches, timed_items // BATCH))
    slow_batches = max(1, timed_batches // 4)

    def plan(name: str) -> tuple[list[list[int]], list[list[int]]]:
        batches = orders["block" if name in BLOCK_ORDER else "random"]
        count = slow_batches if name in SLOW else timed_batches
        return batches[:warm_batches], batches[warm_batches : warm_batches + count]

    times: dict[str, list[float]] = {name: [] for name in strategies}
    for rep in range(repeats):
        rotated = list(strategies[rep % len(strategies) :]) + list(
            strategies[: rep % len(strategies)]
        )
        for name in rotated:
            strategy = _CLASSES[name](ctx)
            try:
                warm, timed = plan(name)
                strategy.open_all()
                strategy.run(warm)
                elapsed = _time(strategy, timed)
            finally:
                strategy.close()
            times[name].append(sum(len(b) for b in timed) / elapsed)

    out: dict[str, Any] = {
        "workload": workload.name,
        "sessions": workload.sessions,
        "rows_per_session": n // workload.sessions,
        "row_bytes": workload.row_bytes,
        "block_size": block_size,
        "strategies": {},
    }
    root_str = str(root)
    for name in strategies:
        strategy = _CLASSES[name](ctx)
        try:
            warm, timed = plan(name)
            checked, mismatches, most = _check_pass(ctx, strategy, warm, timed, root_str)
        finally:
            strategy.close()
        max_open = None
        fds_per_file = 1
        if isinstance(strategy, LoaderkitItem):
            max_open = strategy.ds.max_open_files
            fds_per_file = (
                strategy.ds.budgets.fds_per_file
            )  # 2 with a memory map (a dup'd descriptor)
        out["strategies"][name] = {
            "items_per_s": statistics.median(times[name]),
            "repeats": times[name],
            "checked": checked,
            "mismatches": mismatches,
            "max_open_files_seen": most,
            "max_open_files": max_open,
            "fds_per_file": fds_per_file,
        }
    base = out["strategies"].get("open-per-item", {}).get("items_per_s")
    ceil = out["strategies"].get("memory-limit", {}).get("items_per_s")
    for res in out["strategies"].values():
        res["vs_open_per_item"] = res["items_per_s"] / base if base else None
        res["vs_memory_limit"] = res["items_per_s"] / ceil if ceil else None
    return out


def run_benchmark(
    *,
    quick: bool = False,
    root: str | Path | None = None,
    repeats: int = 5,
    workloads: Sequence[str] | None = None,
    strategies: Sequence[str] = STRATEGIES,
    block_size: int | None = None,
    types: bool = True,
) -> dict[str, Any]:
    """Run the benchmark and return its results (what ``--json`` writes).

    Args:
        quick: Smaller files and fewer timed items (the whole run takes well under a minute).
        root: Directory for the generated files (default: a temporary directory).
        repeats: Timed repeats per strategy (the median is reported).
        workloads: Names from ``WORKLOADS`` (default: all).
        strategies: Strategy names (default: all).
        block_size: ``BlockShuffleSampler`` block size (default: the sampler's default).
        types: Also run the types rows (big-endian and compound beside native).
    """
    names = list(WORKLOADS if workloads is None else workloads)
    results: dict[str, Any] = {
        "quick": quick,
        "repeats": repeats,
        "batch_size": BATCH,
        "h5py": h5py.version.version,
        "hdf5": h5py.version.hdf5_version,
        "workloads": [],
    }
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        for name in names:
            wdir = Path(tmp) / name
            results["workloads"].append(
                _run_workload(
                    WORKLOADS[name],
                    wdir,
                    quick=quick,
                    repeats=repeats,
                    strategies=strategies,
                    block_size=block_size,
                )
            )
        if types:
            tdir = Path(tmp) / "types"
            tdir.mkdir()
            results["types"] = run_types(quick=quick, repeats=repeats, root=tdir)
    results["targets"] = evaluate_targets(results)
    return results


#: (name, how the row's bytes are stored) for the types rows; every row is TYPE_ROW_BYTES long.
TYPE_ROW_BYTES = 1024  # a table row (the tiny-rows workload's bytes per row)
TYPE_ROWS = ("native-f4", "big-endian-f4", "compound", "compound-big-endian")
#: (timed items, warm-up batches), full and quick.
TYPE_SIZES = ((16384, 4), (4096, 2))


def _record(order: str) -> np.dtype:
    """A table row of TYPE_ROW_BYTES: an image sub-array, a label, a time and flags."""
    image = (TYPE_ROW_BYTES - 8 - 8 - 16) // 4
    return np.dtype(
        [
            ("image", f"{order}f4", (image,)),
            ("label", f"{order}i8"),
            ("time", f"{order}f8"),
            ("flags", f"{order}i4", (4,)),
        ]
    )


def _write_types(root: Path, sessions: int, rows: int) -> list[Path]:
    rng = np.random.default_rng(7)
    paths = []
    for s in range(sessions):
        values = rng.standard_normal((rows, TYPE_ROW_BYTES // 4)).astype("f4")
        record = np.zeros(rows, _record("<"))
        record["image"] = values[:, : record["image"].shape[1]]
        record["label"] = np.arange(rows) + s * rows
        record["time"] = np.arange(rows) * 0.5
        path = root / f"types{s:02d}.h5"
        with h5py.File(path, "w") as f:
            f.create_dataset("native-f4", data=values)
            f.create_dataset("big-endian-f4", data=values.astype(">f4"))
            f.create_dataset("compound", data=record)
            f.create_dataset("compound-big-endian", data=record.astype(_record(">")))
        paths.append(path)
    return paths


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return torch.equal(torch.as_tensor(a), torch.as_tensor(b))


def run_types(*, quick: bool, repeats: int, root: str | Path) -> dict[str, Any]:
    """Big-endian and compound rows beside native ones, batched and per item (same bytes)."""
    timed_items, warm = TYPE_SIZES[1 if quick else 0]
    sessions, rows = 4, max(64, (timed_items + warm * BATCH) // 4 + BATCH)
    paths = _write_types(Path(root), sessions, rows)
    rates: dict[str, dict[str, list[float]]] = {k: {"batch": [], "item": []} for k in TYPE_ROWS}
    checked = 0
    for rep in range(repeats):
        for key in TYPE_ROWS[rep % 4 :] + TYPE_ROWS[: rep % 4]:
            with HDF5SessionDataset(paths, key=key) as ds:
                order = BlockShuffleSampler(ds, seed=1234).indices()
                batches = _batches(order)
                warm_b = batches[:warm]
                timed = batches[warm : warm + max(1, timed_items // BATCH)]
                item_timed = timed[: max(1, len(timed) // 4)]
                for b in warm_b:
                    collate(ds.__getitems__(b))
                    default_collate([ds[i] for i in b])
                if rep == 0:  # untimed: the batched and per-item paths agree
                    for b in timed[:2]:
                        assert _same(
                            collate(ds.__getitems__(b)), default_collate([ds[i] for i in b])
                        )
                        checked += len(b)
                for mode, bs in (("batch", timed), ("item", item_timed)):
                    gc.collect()
                    gc.disable()
                    try:
                        t0 = time.perf_counter()
                        for b in bs:
                            if mode == "batch":
                                out = collate(ds.__getitems__(b))
                            else:
                                out = default_collate([ds[i] for i in b])
                            del out
                        elapsed = time.perf_counter() - t0
                    finally:
                        gc.enable()
                    rates[key][mode].append(sum(len(b) for b in bs) / elapsed)
    result: dict[str, Any] = {"row_bytes": TYPE_ROW_BYTES, "checked": checked, "rows": {}}
    native = statistics.median(rates["native-f4"]["batch"])
    for key in TYPE_ROWS:
        batch = statistics.median(rates[key]["batch"])
        item = statistics.median(rates[key]["item"])
        result["rows"][key] = {
            "batch_items_per_s": batch,
            "item_items_per_s": item,
            "batch_vs_native": batch / native,
            "batch_vs_item": batch / item,
        }
    result["targets"] = [
        check
        for key in TYPE_ROWS[1:]
        for check in (
            {
                "target": f"types: {key} batched >= 0.8x native-f4 batched (same bytes)",
                "ratio": result["rows"][key]["batch_vs_native"],
                "passed": result["rows"][key]["batch_vs_native"] >= 0.8,
            },
            {
                "target": f"types: {key} batched >= 5x its per-item read",
                "ratio": result["rows"][key]["batch_vs_item"],
                "passed": result["rows"][key]["batch_vs_item"] >= 5,
            },
        )
    ]
    return result


def evaluate_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Check the issue-6 targets against ``results`` (those whose strategies were run)."""
    by_name = {w["workload"]: w["strategies"] for w in results["workloads"]}
    checks = list(results.get("types", {}).get("targets", []))
    for wname, strategy, ref, minimum in TARGETS:
        strategies = by_name.get(wname, {})
        if strategy not in strategies or ref not in strategies:
            continue
        ratio = strategies[strategy]["items_per_s"] / strategies[ref]["items_per_s"]
        checks.append(
            {
                "target": f"{wname}: {strategy} >= {minimum:g}x {ref}",
                "ratio": ratio,
                "passed": ratio >= minimum,
            }
        )
    for w in results["workloads"]:
        for name, res in w["strategies"].items():
            if res["max_open_files"] is not None:
                checks.append(
                    {
                        "target": f"{w['workload']}: {name} descriptors open <= "
                        f"max_open_files ({res['max_open_files']}) x {res['fds_per_file']}",
                        "ratio": None,
                        "passed": res["max_open_files_seen"]
                        <= res["max_open_files"] * res["fds_per_file"],
                    }
                )
    return checks


def _fmt_rate(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}"


def format_table(results: dict[str, Any]) -> str:
    """Render the results as markdown tables (one row per workload and strategy, then targets)."""
    lines = [
        f"h5py {results['h5py']} / HDF5 {results['hdf5']}, batch {results['batch_size']}, "
        f"median of {results['repeats']} repeats{' (quick)' if results['quick'] else ''}",
        "",
        "| workload | strategy | items/s | vs open-per-item | vs memory-limit | files open (max) "
        "| values checked |",
        "|---|---|---|---|---|---|---|",
    ]
    for w in results["workloads"]:
        for name, res in w["strategies"].items():
            vs_open = res["vs_open_per_item"]
            vs_mem = res["vs_memory_limit"]
            bound = "" if res["max_open_files"] is None else f" / {res['max_open_files']}"
            ok = "ok" if res["mismatches"] == 0 else f"{res['mismatches']} WRONG"
            lines.append(
                f"| {w['workload']} | {name} | {_fmt_rate(res['items_per_s'])} | "
                f"{'' if vs_open is None else f'{vs_open:.1f}'} | "
                f"{'' if vs_mem is None else f'{vs_mem:.2f}'} | "
                f"{res['max_open_files_seen']}{bound} | {res['checked']} {ok} |"
            )
    types = results.get("types")
    if types:
        lines += [
            "",
            f"types: {types['row_bytes']} bytes per row, block order, values checked: "
            f"{types['checked']}",
            "",
            "| row stored as | batched items/s | per-item items/s | batched vs native | "
            "batched vs per-item |",
            "|---|---|---|---|---|",
        ]
        for key, row in types["rows"].items():
            lines.append(
                f"| {key} | {_fmt_rate(row['batch_items_per_s'])} | "
                f"{_fmt_rate(row['item_items_per_s'])} | {row['batch_vs_native']:.2f}x | "
                f"{row['batch_vs_item']:.1f}x |"
            )
    lines += ["", "| target | measured | result |", "|---|---|---|"]
    for t in results["targets"]:
        measured = "" if t["ratio"] is None else f"{t['ratio']:.2f}x"
        lines.append(f"| {t['target']} | {measured} | {'pass' if t['passed'] else 'FAIL'} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small run (under a minute)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats (default 5)")
    parser.add_argument("--root", help="directory for generated files (default: temp dir)")
    parser.add_argument(
        "--workload", action="append", choices=list(WORKLOADS), help="only these workloads"
    )
    parser.add_argument(
        "--types-only", action="store_true", help="only the big-endian and compound rows"
    )
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    results = run_benchmark(
        quick=args.quick,
        root=args.root,
        repeats=args.repeats,
        workloads=[] if args.types_only else args.workload,
    )
    print(format_table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
