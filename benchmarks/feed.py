"""End-to-end feed: samples/s a training loop gets from each loader, side by side in one run.

Usage: python benchmarks/feed.py [--quick] [--json PATH] [--workers 4,8,12] [--passes N]
[--repeats N] [--device cpu|cuda] [--open-per-item-batches N]

Follows ``BENCHMARKS.md``, section "End-to-end feed (loader → GPU)".

Workload (``feed``, the issue's NSD-like case): 16 session files ``betas_sessionNN.hdf5``, each
1,500 rows of 1x96x96 float32 (36 KiB a row, contiguous storage, deterministic content from
``_workloads.session_rows``) written into a temporary directory (so read from the page cache),
batch 256, uniform shuffling unless stated. ``--quick``: 16 sessions x 200 rows, batch 64.
Every row reads its own byte-identical copy of the files (see Measurement).

Rows of the table (one block per worker count; full run 4, 8, 12 workers, ``--quick`` 0 and 2,
``--workers`` overrides). The three torch rows are the seeds' code: a plain
``torch.utils.data.DataLoader`` (``shuffle=True``) reading one row per item from
``h5py.File(path, "r")`` handles kept per process as follows.

- ``open-per-item`` (:class:`OpenPerItemDataset`): opens the session's file for every item,
  reads the row, closes it: the seeds' recommended fix, and the reference (ratio 1.00) of the
  column "vs seeds' fix". It can be timed on a shuffled prefix of each pass
  (``--open-per-item-batches``; the table's footnote says when).
- ``LRU of 5 handles`` (:class:`LRUDataset`): the seeds' other fix, an ``OrderedDict`` LRU of at
  most 5 open files per process (the least recently used one is closed first).
- ``never-closed cache`` (:class:`NeverClosedDataset`): the seeds' original code, every handle
  opened lazily and kept forever. The reference of the column "vs never-closed".
- ``loaderkit default``: ``loaderkit.DataLoader(HDF5SessionDataset(paths, key="betas"),
  shuffle=True, seed=0)``, everything else left to loaderkit, including the dataset's
  ``max_open_files`` (the table shows the effective value) and ``pin_memory``.
- ``loaderkit max_open_files=8``: the same with ``HDF5SessionDataset(..., max_open_files=8)``,
  the old fixed handle budget (with 16 sessions and uniform shuffling it evicts constantly).
- ``loaderkit block``: the default dataset with ``shuffle="block"`` (locality-aware shuffling:
  runs of contiguous rows, batches still mixing sessions).
- ``loaderkit default, threads`` and ``loaderkit block, threads``: those two loaders with
  ``worker_method="thread"``: the same number of workers as threads of this process (the
  batches never cross a process boundary; pinning happens in the worker threads).
- ``loaderkit block, torch's hand-off``: the same with loaderkit's worker hand-off switched off
  (each batch a new shared-memory segment, torch's path), beside ``loaderkit block``, which
  hands batches over in long-lived slots (``docs/handoff.md``).
- ``loaderkit block + sample_seeding``: the same with ``sample_seeding=True`` (per-sample
  seeding, which reads samples one by one).
- ``loaderkit default + DevicePrefetcher`` and ``loaderkit block + DevicePrefetcher``: those
  loaders iterated through ``loaderkit.DevicePrefetcher(loader, device)`` (on CUDA it copies
  the next batch on a side stream while the model runs; on the CPU it is a pass-through). If
  the prefetcher refuses the device, these two rows are left out with a note.
- ``compute only``: the same number of batches per pass, of the same shape, already on the
  device, consumed by the same consumer with no loader: the ceiling. With the CPU's no-op
  consumer it is effectively infinite, so it is reported but kept out of every ratio there
  ("n/a").

Every loader with workers has ``persistent_workers=True`` (``persistent_workers=workers > 0`` for
the loaderkit rows too), so the warm-up pass starts the workers once and the timed passes
measure the feed, not worker start-up.

Consumer: by default a no-op on the CPU (the batch is only touched), which measures the loader
alone; ``pin_memory`` is then left unset everywhere. ``--device cuda`` copies every batch with
``batch.to("cuda", non_blocking=True)`` (a no-op for batches the prefetcher or compute-only
already put there) and runs a small CNN training step on it (two stride-2 3x3 convolutions,
pooling, a linear layer; forward, backward, SGD), synchronising at the end of each timed pass;
the torch rows then get ``pin_memory=True``, and the loaderkit rows leave it unset (loaderkit's
pin-memory policy pins on a CUDA machine).

Measurement: for each worker count, every row is built once and runs one untimed warm-up pass
(starting its persistent workers); all rows of the block then stay alive together. Each of
``--repeats`` rounds runs ``--passes`` timed passes (samples/s each) of every row in turn
(interleaved, the order rotated between rounds, so all see the same machine state); the block's
loaders are closed at its end. The table gives the median samples/s over all timed passes, its
ratio to the medians of open-per-item, of the never-closed cache and of compute only at the same
worker count (same run), the most ``.hdf5`` files open (a file counted once per process that has
it open; the JSON's ``most_hdf5_fds`` counts descriptors) and the peak RSS (which includes any
file pages a loader has memory-mapped), both sampled during the timed passes every 20 batches
and at the last batch of a pass (the time spent sampling is left out of the pass's time).
Because every row's workers stay alive through the block, both are taken over the main process
and that row's own worker processes (the rest of the process tree belongs to other rows), and
every row reads its own copy of the files: HDF5 shares one open file between handles on the same
inode within a process, so with 0 workers one row's open handles would otherwise make another
row's opens nearly free, and the open files of different rows could not be told apart. RSS is
summed over those processes (the main process, shared by all rows, included).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import h5py
import psutil
import torch
from torch.utils.data import Dataset, RandomSampler

try:
    import _cli
    from _workloads import Workload, make_workload
except ImportError:  # imported as a module from elsewhere (tests)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _cli
    from _workloads import Workload, make_workload

import loaderkit
from loaderkit import HDF5SessionDataset

FEED = Workload("feed", 16, 1500, 200, (1, 96, 96))

SEEDS_FIX = "open-per-item"
LRU = "LRU of 5 handles"
BASELINE = "never-closed cache"
COMPUTE = "compute only"
PREFETCHED = ("loaderkit default + DevicePrefetcher", "loaderkit block + DevicePrefetcher")
#: ``loaderkit block`` with its worker hand-off switched to torch's path (no batch slots).
TORCH_HANDOFF = "loaderkit block, torch's hand-off"
#: The loaderkit rows again with worker threads (``worker_method="thread"``) for processes.
THREADED = ("loaderkit default, threads", "loaderkit block, threads")
LOADERS = (
    SEEDS_FIX,
    LRU,
    BASELINE,
    "loaderkit default",
    "loaderkit max_open_files=8",
    "loaderkit block",
    *THREADED,
    TORCH_HANDOFF,
    "loaderkit block + sample_seeding",
    *PREFETCHED,
    COMPUTE,
)

#: Handles the LRU row keeps open per process.
LRU_HANDLES = 5
#: Sample RSS and open files every this many batches (and at the last batch of a pass).
SAMPLE_EVERY = 20


class _SessionRows(Dataset):
    """One row per item from per-session HDF5 files (item ``i``: session ``i // rows``)."""

    def __init__(self, paths: list[Path], key: str, rows_per_session: int) -> None:
        self.paths = [os.fspath(p) for p in paths]
        self.key = key
        self.rows = rows_per_session

    def __len__(self) -> int:
        return len(self.paths) * self.rows


class OpenPerItemDataset(_SessionRows):
    """Open the session's file for every item, read the row, close it (the seeds' fix)."""

    def __getitem__(self, index: int) -> torch.Tensor:
        session, row = divmod(index, self.rows)
        with h5py.File(self.paths[session], "r") as handle:
            return torch.from_numpy(handle[self.key][row])


class LRUDataset(_SessionRows):
    """Keep at most ``LRU_HANDLES`` files open per process, closing the least recently used.

    Each worker gets its own (empty) cache with its copy of the dataset; nothing is opened
    before the workers start.
    """

    def __init__(self, paths: list[Path], key: str, rows_per_session: int) -> None:
        super().__init__(paths, key, rows_per_session)
        self._files: OrderedDict[int, h5py.File] = OrderedDict()

    def __getitem__(self, index: int) -> torch.Tensor:
        session, row = divmod(index, self.rows)
        handle = self._files.get(session)
        if handle is None:
            if len(self._files) >= LRU_HANDLES:
                self._files.popitem(last=False)[1].close()
            handle = self._files[session] = h5py.File(self.paths[session], "r")
        else:
            self._files.move_to_end(session)
        return torch.from_numpy(handle[self.key][row])

    def close(self) -> None:
        """Close the handles this process has open."""
        while self._files:
            self._files.popitem()[1].close()


class NeverClosedDataset(_SessionRows):
    """One row per item from per-session HDF5 files whose handles are never closed.

    Each process opens a session's file the first time it reads from it and keeps the handle
    (and the ``h5py.Dataset``) for the rest of its life: the pattern loaderkit replaces.
    """

    def __init__(self, paths: list[Path], key: str, rows_per_session: int) -> None:
        super().__init__(paths, key, rows_per_session)
        self._files: dict[int, h5py.File] = {}
        self._dsets: dict[int, h5py.Dataset] = {}

    def __getitem__(self, index: int) -> torch.Tensor:
        session, row = divmod(index, self.rows)
        dset = self._dsets.get(session)
        if dset is None:
            handle = h5py.File(self.paths[session], "r")
            self._files[session] = handle
            dset = self._dsets[session] = handle[self.key]
        return torch.from_numpy(dset[row])


TORCH_DATASETS: dict[str, type[_SessionRows]] = {
    SEEDS_FIX: OpenPerItemDataset,
    LRU: LRUDataset,
    BASELINE: NeverClosedDataset,
}
#: ``max_open_files`` of the torch rows (per process; ``None``: unbounded).
TORCH_MAX_OPEN: dict[str, int | None] = {SEEDS_FIX: 1, LRU: LRU_HANDLES, BASELINE: None}


class Monitor:
    """Peak RSS and most ``.hdf5`` files open under ``root`` in this process and ``pids``.

    A file counts once per process that has it open (``files_open``), however many descriptors
    that process holds on it (``fds_open`` counts those).
    """

    def __init__(self, root: Path | None, pids: list[int]) -> None:
        self.roots = () if root is None else (str(root.resolve()) + os.sep, str(root) + os.sep)
        self.processes = [psutil.Process()]
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                self.processes.append(psutil.Process(pid))
        self.peak_rss = 0
        self.files_open = 0
        self.fds_open = 0

    def sample(self) -> None:
        """Add up the RSS and the open ``.hdf5`` files now; keep the largest sums seen."""
        rss = files = fds = 0
        for proc in self.processes:
            with contextlib.suppress(psutil.Error):  # a worker that just exited
                rss += proc.memory_info().rss
                if self.roots:
                    paths = [
                        f.path
                        for f in proc.open_files()
                        if f.path.endswith(".hdf5") and f.path.startswith(self.roots)
                    ]
                    files += len(set(paths))
                    fds += len(paths)
        self.peak_rss = max(self.peak_rss, rss)
        self.files_open = max(self.files_open, files)
        self.fds_open = max(self.fds_open, fds)


class Consumer:
    """What the training loop does with a batch: nothing (CPU) or a small CNN step (CUDA)."""

    def __init__(self, device: str) -> None:
        self.device = device
        if device == "cuda":
            torch.manual_seed(0)
            self.model = torch.nn.Sequential(
                torch.nn.Conv2d(1, 16, 3, stride=2, padding=1),
                torch.nn.ReLU(),
                torch.nn.Conv2d(16, 32, 3, stride=2, padding=1),
                torch.nn.ReLU(),
                torch.nn.AdaptiveAvgPool2d(1),
                torch.nn.Flatten(),
                torch.nn.Linear(32, 10),
            ).to("cuda")
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-3)

    def __call__(self, batch: torch.Tensor) -> int:
        """Consume one batch; return its number of samples."""
        if self.device != "cuda":
            return int(batch.shape[0])  # touch the batch only
        x = batch.to("cuda", non_blocking=True)  # no-op for a batch already on the GPU
        loss = self.model(x).square().mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return int(x.shape[0])

    def finish(self) -> None:
        """Wait for queued GPU work (end of a timed pass)."""
        if self.device == "cuda":
            torch.cuda.synchronize()


@dataclass
class Params:
    """The run's parameters (written to the JSON)."""

    quick: bool
    workers: list[int]
    passes: int
    repeats: int
    device: str
    batch_size: int
    rows_per_session: int
    open_per_item_batches: int | None  # None: whole passes


@dataclass
class _Row:
    """One row of a worker-count block while it is measured."""

    name: str
    iterable: Iterable[Any]  # what the training loop iterates
    loader: Any  # the DataLoader to close (None for compute only)
    root: Path | None  # this row's copy of the files
    max_open_files: int | None = None
    monitor: Monitor | None = None
    rates: list[float] = field(default_factory=list)


def _prefetcher_refusal(device: str) -> str | None:
    """Why ``DevicePrefetcher`` cannot run on ``device`` (``None`` when it can)."""
    try:
        with loaderkit.DevicePrefetcher([torch.zeros(2)], device) as batches:
            (batch,) = list(batches)
        if batch.device.type != device:
            return f"DevicePrefetcher returned a batch on {batch.device}, not {device}"
    except Exception as exc:  # its own ConfigError, or anything else that stops it
        return f"{type(exc).__name__}: {exc}"
    return None


def _batches_per_pass(params: Params) -> int:
    samples = FEED.sessions * params.rows_per_session
    return -(-samples // params.batch_size)


def _build(name: str, paths: list[Path], params: Params, workers: int) -> tuple[Any, Any]:
    """The row's (iterable, loader to close)."""
    batch = params.batch_size
    if name in TORCH_DATASETS:
        dataset = TORCH_DATASETS[name](paths, "betas", params.rows_per_session)
        sampler = None
        if name == SEEDS_FIX and params.open_per_item_batches is not None:
            # A prefix of a shuffled pass: the first N batches of a random permutation (the
            # pass ends there, so no worker is left reading items nobody will consume).
            sampler = RandomSampler(dataset, num_samples=params.open_per_item_batches * batch)
        loader = torch.utils.data.DataLoader(
            dataset,
            batch_size=batch,
            shuffle=sampler is None,
            sampler=sampler,
            num_workers=workers,
            pin_memory=params.device == "cuda",
            persistent_workers=workers > 0,
        )
        return loader, loader
    max_open = {"max_open_files": 8} if name == "loaderkit max_open_files=8" else {}
    loader = loaderkit.DataLoader(
        HDF5SessionDataset(paths, key="betas", **max_open),
        batch_size=batch,
        shuffle="block" if "block" in name else True,
        seed=0,
        sample_seeding="sample_seeding" in name,
        num_workers=workers,
        persistent_workers=workers > 0,
        # torch's row: every batch a new shared-memory segment, as torch does
        handoff="torch" if name == TORCH_HANDOFF else "auto",
        **({"worker_method": "thread"} if name in THREADED else {}),
    )
    if name in PREFETCHED:
        return loaderkit.DevicePrefetcher(loader, params.device), loader
    return loader, loader


def _close(row: _Row) -> None:
    loader = row.loader
    if loader is None:
        return
    if isinstance(loader, loaderkit.DataLoader):
        loader.close()
        return
    iterator = loader._iterator  # torch keeps the iterator of persistent workers here
    if iterator is not None:
        iterator._shutdown_workers()
        loader._iterator = None
    close = getattr(loader.dataset, "close", None)
    if callable(close):
        close()


def _worker_pids(loader: Any) -> list[int]:
    iterator = getattr(loader, "_iterator", None)
    return [w.pid for w in getattr(iterator, "_workers", ())]


def _pass(row: _Row, consume: Consumer, monitor: Monitor | None) -> float:
    """One pass over the row; returns samples/s (sampling ``monitor`` when given).

    The time spent sampling (a few ms each time, more with many processes) is left out.
    """
    last = len(row.iterable) - 1  # type: ignore[arg-type]
    samples = 0
    sampling = 0.0
    start = time.perf_counter()
    for i, batch in enumerate(row.iterable):
        samples += consume(batch)
        if monitor is not None and (i % SAMPLE_EVERY == 0 or i == last):
            begin = time.perf_counter()
            monitor.sample()  # at the last batch the workers have not stopped reading yet
            sampling += time.perf_counter() - begin
    consume.finish()
    return samples / (time.perf_counter() - start - sampling)


def _start(
    name: str, copies: dict[str, list[Path]], params: Params, workers: int, consume: Consumer
) -> _Row:
    """Build the row, run its untimed warm-up pass (starting its persistent workers)."""
    if name == COMPUTE:
        row = _Row(name, _compute_batches(params), None, None, max_open_files=0)
    else:
        paths = copies[name]
        iterable, loader = _build(name, paths, params, workers)
        row = _Row(name, iterable, loader, paths[0].parent)
    _pass(row, consume, None)
    if row.loader is not None:
        if isinstance(row.loader, loaderkit.DataLoader):
            row.max_open_files = row.loader.dataset.max_open_files
        else:
            row.max_open_files = TORCH_MAX_OPEN[name]
    pids = _worker_pids(row.loader)
    expected = 0 if name in THREADED else workers  # worker threads start no process
    if row.loader is not None and len(pids) != expected:
        print(f"note: {name}: found {len(pids)} worker processes, not {expected}", file=sys.stderr)
    row.monitor = Monitor(row.root, pids)
    return row


def _compute_batches(params: Params) -> list[torch.Tensor]:
    """A pass's worth of batches (same count and shapes as the loaders'), on the device.

    Made after every loader of the block has started its workers, so that no worker inherits
    them (on the CPU they would add to every row's RSS).
    """
    generator = torch.Generator(params.device).manual_seed(0)
    samples = FEED.sessions * params.rows_per_session
    sizes = [params.batch_size] * (samples // params.batch_size)
    if samples % params.batch_size:
        sizes.append(samples % params.batch_size)
    return [
        torch.randn((n, *FEED.row_shape), generator=generator, device=params.device) for n in sizes
    ]


def _trim_memory() -> None:
    """Give freed heap memory back to the OS where glibc can (no-op elsewhere)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


@dataclass
class _Result:
    """What a row measured in one block."""

    name: str
    max_open_files: int | None
    batches: int
    rates: list[float]
    files_open: int
    fds_open: int
    peak_rss: int


def _measure_block(
    names: list[str], copies: dict[str, list[Path]], params: Params, workers: int, consume: Consumer
) -> list[_Result]:
    """Start every row, time them interleaved, close them; results in the order of ``names``."""
    block: dict[str, _Row] = {}
    try:
        for name in sorted(names, key=lambda n: n == COMPUTE):  # compute only last
            block[name] = _start(name, copies, params, workers, consume)
        for repeat in range(params.repeats):
            shift = repeat % len(names)
            for name in names[shift:] + names[:shift]:
                row = block[name]
                for _ in range(params.passes):
                    row.rates.append(_pass(row, consume, row.monitor))
    finally:
        for row in block.values():
            _close(row)
    results = []
    for name in names:
        row = block[name]
        assert row.monitor is not None
        results.append(
            _Result(
                name,
                row.max_open_files,
                len(row.iterable),  # type: ignore[arg-type]
                row.rates,
                row.monitor.files_open,
                row.monitor.fds_open,
                row.monitor.peak_rss,
            )
        )
    return results


def _ratio(value: float, reference: float | None) -> float | None:
    return None if reference is None else value / reference


def run(params: Params) -> dict[str, Any]:
    """Measure every row at every worker count; return the parameters and the rows."""
    consume = Consumer(params.device)
    notes: list[str] = []
    refusal = _prefetcher_refusal(params.device)
    names = list(LOADERS)
    if refusal is not None:
        names = [n for n in names if n not in PREFETCHED]
        notes.append(
            f"the DevicePrefetcher rows are left out: they need CUDA here (on {params.device!r}: "
            f"{refusal})"
        )
    compute_ceiling = params.device == "cuda"  # the CPU consumer is a no-op: no ceiling
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="loaderkit-feed-") as tmp:
        source = make_workload(Path(tmp) / "source", FEED, quick=params.quick)
        copies: dict[str, list[Path]] = {}
        for number, name in enumerate(n for n in names if n != COMPUTE):
            folder = Path(tmp) / f"row{number:02d}"
            folder.mkdir()
            copies[name] = [Path(shutil.copyfile(p, folder / p.name)) for p in source]
        for workers in params.workers:
            results = _measure_block(names, copies, params, workers, consume)
            gc.collect()  # never-closed handles of a num_workers=0 row go with its dataset
            _trim_memory()  # the next block's workers should not inherit this one's garbage
            medians = {r.name: statistics.median(r.rates) for r in results}
            ceiling = medians[COMPUTE] if compute_ceiling else None
            for r in results:
                median = medians[r.name]
                in_ratios = compute_ceiling or r.name != COMPUTE
                rows.append(
                    {
                        "workers": workers,
                        "loader": r.name,
                        "max_open_files": r.max_open_files,
                        "samples_per_s": median,
                        "vs_seeds_fix": median / medians[SEEDS_FIX] if in_ratios else None,
                        "vs_never_closed": median / medians[BASELINE] if in_ratios else None,
                        "vs_compute_only": _ratio(median, ceiling),
                        "most_hdf5_open": r.files_open,
                        "most_hdf5_fds": r.fds_open,
                        "peak_rss_mib": r.peak_rss / 2**20,
                        "batches_per_pass": r.batches,
                        "pass_samples_per_s": r.rates,
                    }
                )
    doubled = sorted({r["loader"] for r in rows if r["most_hdf5_fds"] > r["most_hdf5_open"]})
    if doubled:
        notes.append(
            "most .hdf5 open counts a file once per process; these rows held more descriptors "
            f"than files (most_hdf5_fds in the JSON): {', '.join(doubled)}"
        )
    if params.open_per_item_batches is not None:
        notes.append(
            f"open-per-item is timed on the first {params.open_per_item_batches} batches of "
            f"each shuffled pass (of {_batches_per_pass(params)})"
        )
    if not compute_ceiling:
        notes.append(
            "compute only: batches already in memory, no-op consumer (effectively infinite on "
            "the CPU), so it is reported but kept out of every ratio (n/a)"
        )
    return {
        "workload": FEED.name,
        "sessions": FEED.sessions,
        "rows_per_session": params.rows_per_session,
        "row_shape": list(FEED.row_shape),
        "batch_size": params.batch_size,
        "batches_per_pass": _batches_per_pass(params),
        "workers": params.workers,
        "passes": params.passes,
        "repeats": params.repeats,
        "device": params.device,
        "quick": params.quick,
        "open_per_item_batches": params.open_per_item_batches,
        "persistent_workers": True,
        "pin_memory": "torch rows True, loaderkit rows unset (pins)"
        if params.device == "cuda"
        else "unset",
        "consumer": "small CNN training step" if params.device == "cuda" else "no-op",
        "lru_handles": LRU_HANDLES,
        "sample_every": SAMPLE_EVERY,
        "loaders": names,
        "params": asdict(params),
        "torch": torch.__version__,
        "h5py": h5py.__version__,
        "loaderkit": getattr(loaderkit, "__version__", None),
        "notes": notes,
        "rows": rows,
    }


def _cell(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def format_table(data: dict[str, Any]) -> str:
    """The rows as a markdown table, with its footnotes."""
    lines = [
        "| workers | loader | max_open_files | samples/s | vs seeds' fix | vs never-closed | "
        "vs compute only | most .hdf5 open | peak RSS MiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        max_open = "unbounded" if r["max_open_files"] is None else r["max_open_files"]
        lines.append(
            f"| {r['workers']} | {r['loader']} | {max_open} | {r['samples_per_s']:,.0f} | "
            f"{_cell(r['vs_seeds_fix'], '.2f')} | {_cell(r['vs_never_closed'], '.2f')} | "
            f"{_cell(r['vs_compute_only'], '.2f')} | {r['most_hdf5_open']} | "
            f"{r['peak_rss_mib']:,.0f} |"
        )
    footnotes = [
        f"{data['sessions']} sessions x {data['rows_per_session']} rows of "
        f"{'x'.join(map(str, data['row_shape']))} float32, batch {data['batch_size']} "
        f"({data['batches_per_pass']} batches a pass), consumer {data['consumer']} on "
        f"{data['device']}, pin_memory {data['pin_memory']}; persistent workers; median of "
        f"{data['repeats']} x {data['passes']} timed passes per row after one warm-up pass.",
        "most .hdf5 open and peak RSS: main process + the row's workers, sampled every "
        f"{data['sample_every']} batches and at the last batch of each timed pass (the "
        "sampling time is left out of samples/s); each row reads its own copy of the files.",
        *data["notes"],
    ]
    return "\n".join(lines + [""] + [f"- {note}" for note in footnotes])


def _worker_list(text: str) -> list[int]:
    try:
        workers = [int(w) for w in text.split(",") if w.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from None
    if not workers or min(workers) < 0:
        raise argparse.ArgumentTypeError(f"expected worker counts >= 0, got {text!r}")
    return workers


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = _cli.parser(__doc__, "smaller files, 0 and 2 workers")
    parser.add_argument(
        "--workers", type=_worker_list, help="comma-separated worker counts (default 4,8,12)"
    )
    parser.add_argument("--passes", type=int, default=2, help="timed passes per loader")
    parser.add_argument("--repeats", type=int, help="rounds of all loaders (default 3, quick 2)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="consumer")
    parser.add_argument(
        "--open-per-item-batches",
        type=int,
        metavar="N",
        help="time open-per-item on the first N batches of each pass (default: whole passes)",
    )
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error(
            "--device cuda needs a CUDA GPU, but torch.cuda.is_available() is False here "
            f"(torch {torch.__version__}); run without --device for the loader-only measurement"
        )
    if args.passes < 1 or (args.repeats is not None and args.repeats < 1):
        parser.error("--passes and --repeats must be >= 1")
    rows = FEED.quick_rows if args.quick else FEED.rows
    batch_size = 64 if args.quick else 256
    prefix = args.open_per_item_batches
    if prefix is not None and not 1 <= prefix <= -(-FEED.sessions * rows // batch_size):
        parser.error("--open-per-item-batches must be between 1 and the batches of a pass")
    params = Params(
        quick=args.quick,
        workers=args.workers or ([0, 2] if args.quick else [4, 8, 12]),
        passes=args.passes,
        repeats=args.repeats or (2 if args.quick else 3),
        device=args.device,
        batch_size=batch_size,
        rows_per_session=rows,
        open_per_item_batches=prefix,
    )
    data = run(params)
    _cli.emit(data, format_table(data), args.json)
    return data


if __name__ == "__main__":
    main()
