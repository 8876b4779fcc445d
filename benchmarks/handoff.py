"""Worker-to-main hand-off per batch, torch's path beside loaderkit's slots, side by side.

Usage: python benchmarks/handoff.py [--quick] [--json PATH] [--skip-hdf5]

Part 1, ``results``: batches of the feed workload (``batch x 1 x 96 x 96`` float32) made by a
dataset that does no reading at all (each batch filled in place through ``batch_buffer``).
What is left is what every loader pays between the worker and the training loop:

- ``main process only``: ``num_workers=0``, the same batches filled in the main process;
- ``torch hand-off``: one worker, the batch sent through torch's result queue as a new
  shared-memory segment (what loaderkit did before its slots: ``handoff`` off), mapped by the
  main process, which touches every page once (as the pin-memory thread or ``.to(device)``
  does);
- ``loaderkit slots``: one worker with loaderkit's hand-off: the batch is filled in one of the
  worker's long-lived slots and crosses as a slot number;
- ``+ one more copy``: the same, plus a copy of each batch into a reused buffer in a second
  thread: the work torch's pin-memory thread does on a CUDA host when the batch is not
  already pinned (loaderkit's slots are registered as pinned there, so this copy is not made).

Part 2, ``hdf5``: the workload of issue 21: 8 HDF5 session files (page cache), 600 rows each of
1x96x96 float32, ``create_dataloader(ds, batch_size=128, shuffle="block", seed=0,
training=True, num_workers=N)``, a loop that reads every byte of every batch (``batch.sum()``):
main process only, then 1 and 2 workers with torch's path and with loaderkit's slots; and a pass
of 2 workers whose loop keeps a reference to every batch of the epoch, checked at the end
against a copy taken when each batch arrived (``changed`` must be 0; ``fallback`` batches are
those that found every slot held).

The ratio columns show each row against ``main process only`` of its part, all measured in one
run, interleaved, median of the repeats. Each timed pass follows an untimed pass of the same
loader, so what the previous row left running does not land in it (after a main-process pass,
torch's OpenMP threads spin on for milliseconds and took a CPU from the next row's worker).
Loaders with workers run as loaderkit plans them: on a host with fewer CPUs than torch's threads
plus the workers, torch's threads in this process are lowered for each pass
(``loader.plan["main_threads"]``).
"""

from __future__ import annotations

import queue
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from torch.utils.data import Dataset

try:
    import _cli
except ImportError:  # imported as a module from elsewhere (tests)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _cli

from loaderkit import DataLoader, HDF5SessionDataset, create_dataloader
from loaderkit.workers.collate import RowBatch, batch_buffer, collate

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


def _read_all(batch: torch.Tensor) -> float:
    return float(batch.sum())  # every byte, as a pin-memory copy or .to(device) does


#: A row's extra work per batch: none, a copy in a second thread (as pinning does), or the
#: loop keeping every batch of the pass (an evaluation set, a replay buffer).
COPY, KEEP = "copy", "keep"


def _pass(loader: DataLoader[Any], extra: str | None, use: Callable[[Any], float]) -> float:
    """Seconds for one pass; ``extra``: ``COPY`` (a thread copies each batch) or ``KEEP``."""
    extra_copy = extra == COPY
    kept: list[Any] = []
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
        use(batch)
        if thread is not None:
            done.put(batch)
        if extra == KEEP:
            kept.append(batch)
    if thread is not None:
        done.put(None)
        thread.join()
    return time.perf_counter() - start


def _measure(
    loaders: dict[str, tuple[DataLoader[Any], str | None]],
    repeats: int,
    samples: int,
    batches: int,
    use: Callable[[Any], float],
) -> dict[str, dict[str, float]]:
    times: dict[str, list[float]] = {name: [] for name in loaders}
    try:
        for loader, extra in loaders.values():
            _pass(loader, extra, use)  # warm-up: workers start, slots are made
        for _ in range(repeats):
            for name, (loader, extra) in loaders.items():
                # an untimed pass first absorbs what the previous row left running: the
                # OpenMP threads of a main-process pass spin on for milliseconds after its
                # last parallel op, and torch's path frees its segments behind it
                _pass(loader, extra, use)
                times[name].append(_pass(loader, extra, use))
    finally:
        for loader, _ in loaders.values():
            loader.close()
    base = samples / statistics.median(next(iter(times.values())))
    results = {}
    for name, t in times.items():
        rate = samples / statistics.median(t)
        results[name] = {
            "samples_per_s": rate,
            "us_per_batch": statistics.median(t) / batches * 1e6,
            "ratio": rate / base,
        }
    return results


def run_filled(quick: bool) -> dict[str, Any]:
    """Part 1: the hand-off alone (batches filled in place, no reading)."""
    batch, batches = (64, 40) if quick else (256, 60)
    repeats = 3 if quick else 5

    def make(workers: int, handoff: str = "auto") -> DataLoader[Any]:
        return DataLoader(
            FilledBatches(batch * batches),
            batch_size=batch,
            num_workers=workers,
            persistent_workers=workers > 0,
            collate_fn=collate,
            handoff=handoff,  # type: ignore[arg-type]
        )

    loaders: dict[str, tuple[DataLoader[Any], str | None]] = {
        "main process only": (make(0), None),
        "torch hand-off": (make(1, "torch"), None),
        "torch hand-off + one more copy": (make(1, "torch"), COPY),
        "loaderkit slots": (make(1), None),
        "loaderkit slots + one more copy": (make(1), COPY),
        "loaderkit slots, loop keeps every batch": (make(1), KEEP),
    }
    results = _measure(loaders, repeats, batch * batches, batches, _touch)
    mib = batch * int(np.prod(SHAPE)) * 4 / 2**20
    return {"batch": batch, "batch_mib": mib, "repeats": repeats, "results": results}


def _write_sessions(root: Path, sessions: int, rows: int) -> list[Path]:
    paths = []
    rng = np.random.default_rng(0)
    for session in range(sessions):
        path = root / f"betas_session{session + 1:02d}.hdf5"
        with h5py.File(path, "w") as f:
            f["betas"] = rng.standard_normal((rows, *SHAPE), dtype=np.float32)
        paths.append(path)
    for path in paths:
        path.read_bytes()  # into the page cache
    return paths


def _kept_pass(loader: DataLoader[Any]) -> dict[str, int]:
    """One pass keeping every batch, each checked at the end against a copy taken on arrival."""
    kept = [(batch, batch.clone()) for batch in loader]
    changed = sum(not torch.equal(batch, copy) for batch, copy in kept)
    return {"batches": len(kept), "changed": changed}


def run_hdf5(quick: bool) -> dict[str, Any]:
    """Part 2: issue 21's HDF5 workload, main process vs workers, torch's path vs slots."""
    sessions, rows = (8, 200) if quick else (8, 600)
    batch = 128
    repeats = 3 if quick else 5
    with tempfile.TemporaryDirectory() as tmp:
        paths = _write_sessions(Path(tmp), sessions, rows)

        def make(workers: int, handoff: str = "auto") -> DataLoader[Any]:
            ds = HDF5SessionDataset(paths, key="betas")
            return create_dataloader(
                ds,
                batch_size=batch,
                shuffle="block",
                seed=0,
                training=True,
                num_workers=workers,
                handoff=handoff,  # type: ignore[arg-type]
            )

        loaders: dict[str, tuple[DataLoader[Any], str | None]] = {
            "main process only": (make(0), None),
            "torch path, 1 worker": (make(1, "torch"), None),
            "slots, 1 worker": (make(1), None),
            "torch path, 2 workers": (make(2, "torch"), None),
            "slots, 2 workers": (make(2), None),
            "torch path, 2 workers, loop keeps every batch": (make(2, "torch"), KEEP),
            "slots, 2 workers, loop keeps every batch": (make(2), KEEP),
        }
        samples = sessions * rows
        batches = -(-samples // batch)
        results = _measure(loaders, repeats, samples, batches, _read_all)
        with make(2) as loader:
            kept = _kept_pass(loader)
            stats = loader.handoff_stats()
        kept.update(
            pooled=stats.pooled, fallback=stats.fallback, slots=stats.slots, copied_out=stats.kept
        )
        slots = results["slots, 2 workers"]["samples_per_s"]
        keeping = results["slots, 2 workers, loop keeps every batch"]["samples_per_s"]
        kept["keep_vs_drop"] = keeping / slots
    return {
        "sessions": sessions,
        "rows": rows,
        "batch": batch,
        "repeats": repeats,
        "results": results,
        "kept_every_batch": kept,
    }


def run(quick: bool, hdf5: bool = True) -> dict[str, Any]:
    """Measure every row; return samples/s and ratios."""
    data = run_filled(quick)
    if hdf5:
        data["hdf5"] = run_hdf5(quick)
    return data


def _rows(results: dict[str, Any]) -> list[str]:
    lines = [
        "| row | samples/s | µs per batch | vs main process only |",
        "|---|---|---|---|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['samples_per_s']:,.0f} | {r['us_per_batch']:,.0f} | {r['ratio']:.2f} |"
        )
    return lines


def format_table(data: dict[str, Any]) -> str:
    """The results as markdown tables."""
    lines = [
        f"batch {data['batch']} x 1x96x96 float32 ({data['batch_mib']:.1f} MiB) filled in "
        f"place, median of {data['repeats']}",
        "",
        *_rows(data["results"]),
    ]
    hdf5 = data.get("hdf5")
    if hdf5:
        kept = hdf5["kept_every_batch"]
        lines += [
            "",
            f"HDF5: {hdf5['sessions']} sessions x {hdf5['rows']} rows of 1x96x96 float32, "
            f"batch {hdf5['batch']}, shuffle='block', every byte read, median of "
            f"{hdf5['repeats']}",
            "",
            *_rows(hdf5["results"]),
            "",
            f"2 workers, loop keeping every batch of a pass: {kept['batches']} batches, "
            f"{kept['changed']} changed, {kept['pooled']} in slots ({kept['copied_out']} of "
            f"them copied out here as the loop kept them), {kept['fallback']} on torch's path "
            f"({kept['slots']} slots per worker); keeping every batch runs at "
            f"{kept['keep_vs_drop']:.2f}x the same loop letting them go",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = _cli.parser(__doc__, "smaller batches and files, fewer repeats")
    parser.add_argument("--skip-hdf5", action="store_true", help="only the hand-off alone")
    args = parser.parse_args(argv)
    data = run(args.quick, hdf5=not args.skip_hdf5)
    _cli.emit(data, format_table(data), args.json)
    return data


if __name__ == "__main__":
    main()
