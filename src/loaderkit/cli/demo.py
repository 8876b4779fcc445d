"""The ``loaderkit demo`` job: train and evaluate a tiny model on generated session files.

``run_demo`` generates NSD-like session files (int16 betas scaled by 300 and a label per
trial), trains a linear classifier with ``training=True`` (block-shuffled batched reads,
persistent seeded workers), evaluates it with ``training=False``, and measures throughput,
files open per process, worker processes, determinism and cleanup. It returns a
``DemoReport``; the CLI prints it. Nothing here prints.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import h5py
import numpy as np
import psutil
import torch

from loaderkit.factory import create_dataloader
from loaderkit.hdf5 import HDF5SessionDataset
from loaderkit.loader import DataLoader
from loaderkit.memory.resources import LeakReport, compare, snapshot, worker_processes
from loaderkit.order.seeding import DeterminismReport, check_determinism, seed_everything

__all__ = ["DemoReport", "DemoSessions", "make_sessions", "run_demo"]

T = TypeVar("T")
#: ``progress(iterable, description, total)`` wraps an iterable with a progress display.
Progress = Callable[[Iterable[T], str, int], Iterable[T]]

SESSIONS = 8
TRIALS = 600
VOXELS = 256
CLASSES = 4
BETA_SCALE = 300.0
MAX_OPEN_FILES = 4


def make_sessions(
    root: Path,
    *,
    sessions: int = SESSIONS,
    trials: int = TRIALS,
    voxels: int = VOXELS,
    seed: int = 0,
) -> list[Path]:
    """Write NSD-like ``betas_sessionNN.hdf5`` files with a learnable label per trial.

    Each file holds ``betas`` (trials x voxels, int16 = percent signal change x 300, like NSD)
    and ``labels`` (int64): the class whose random prototype the trial's pattern was drawn
    around.

    Examples:
        >>> import tempfile
        >>> paths = make_sessions(Path(tempfile.mkdtemp()), sessions=2, trials=4, voxels=3)
        >>> len(paths)
        2
    """
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    prototypes = rng.normal(0.0, 0.12, (CLASSES, voxels))
    paths = []
    for s in range(1, sessions + 1):
        labels = rng.integers(0, CLASSES, trials)
        signal = prototypes[labels] + rng.normal(0.0, 1.0, (trials, voxels))
        path = root / f"betas_session{s:02d}.hdf5"
        with h5py.File(path, "w") as f:
            f.create_dataset("betas", data=np.round(signal * BETA_SCALE).astype(np.int16))
            f.create_dataset("labels", data=labels.astype(np.int64))
        paths.append(path)
    return paths


class DemoSessions(HDF5SessionDataset):
    """Samples ``(betas as float32 / 300, label)`` from the demo's session files.

    ``read_rows`` opts into batched reads: one slab read per run of consecutive rows.
    """

    def read(self, session: Hashable, row: int) -> tuple[torch.Tensor, int]:
        """One trial: converted betas and its label."""
        betas = self.h5dataset(session)[row].astype(np.float32) / BETA_SCALE
        return torch.from_numpy(betas), int(self.file(session)["labels"][row])

    def read_rows(self, session: Hashable, start: int, stop: int) -> list[tuple[Any, int]]:
        """Trials ``start..stop-1`` with two slab reads."""
        betas = self.h5dataset(session)[start:stop].astype(np.float32) / BETA_SCALE
        labels = self.file(session)["labels"][start:stop]
        tensor = torch.from_numpy(betas)
        return [(tensor[i], int(labels[i])) for i in range(stop - start)]


@dataclass
class DemoReport:
    """What the demo measured, and its checks (``name -> (passed, detail)``)."""

    root: str
    workers: int
    epochs: int
    samples: int
    plan: str = ""
    train_samples_per_s: float = 0.0
    eval_samples_per_s: float = 0.0
    losses: list[float] = field(default_factory=list)
    accuracy: float = 0.0
    max_files_open_per_process: int = 0
    max_worker_processes: int = 0
    checks: dict[str, tuple[bool, str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when every check passed."""
        return all(passed for passed, _ in self.checks.values())


def _no_progress(iterable: Iterable[T], description: str, total: int) -> Iterable[T]:
    return iterable


class _Monitor:
    """Samples files open per process and worker processes while a loader runs."""

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self.max_files = 0
        self.max_workers = 0

    def sample(self) -> None:
        workers = worker_processes()
        for process in (psutil.Process(), *workers):
            try:
                files = sum(f.path.startswith(self.root) for f in process.open_files())
            except psutil.Error:
                continue
            self.max_files = max(self.max_files, files)
        self.max_workers = max(self.max_workers, len(workers))

    def watch(self, batches: Iterable[T], every: int = 5) -> Iterator[T]:
        for i, batch in enumerate(batches):
            if i % every == 0:
                self.sample()
            yield batch


def run_demo(
    root: str | Path | None = None,
    *,
    workers: int = 2,
    epochs: int = 3,
    progress: Progress[Any] | None = None,
) -> DemoReport:
    """Generate session files, train and evaluate a tiny model, and check the loaders.

    Args:
        root: Where to write the files (a temporary directory, removed afterwards, when
            ``None``).
        workers: ``num_workers`` for both loaders.
        epochs: Training epochs.
        progress: Optional progress wrapper (the CLI passes a tqdm bar).

    Returns:
        A ``DemoReport``; ``report.ok`` is False when a check failed.

    Examples:
        >>> report = run_demo(workers=0, epochs=1)  # doctest: +SKIP
        >>> report.ok  # doctest: +SKIP
        True
    """
    if root is None:
        with tempfile.TemporaryDirectory(prefix="loaderkit-demo-") as tmp:
            return run_demo(tmp, workers=workers, epochs=epochs, progress=progress)
    root = Path(root)
    wrap = progress or _no_progress
    seed_everything(0)
    paths = make_sessions(root)
    before = snapshot()
    report = DemoReport(root=str(root), workers=workers, epochs=epochs, samples=0)

    dataset = DemoSessions(paths, key="betas", max_open_files=MAX_OPEN_FILES)
    report.samples = len(dataset)
    model = torch.nn.Linear(VOXELS, CLASSES)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
    monitor = _Monitor(root)

    def train_loader() -> Any:
        return create_dataloader(
            dataset, batch_size=64, shuffle="block", training=True, num_workers=workers, seed=0
        )

    loader = train_loader()
    report.plan = loader.describe()
    start = time.perf_counter()
    with loader:
        for epoch in range(epochs):
            total, count = 0.0, 0
            for x, y in monitor.watch(wrap(loader, f"train epoch {epoch + 1}", len(loader))):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total += loss.detach().item() * len(y)
                count += len(y)
            report.losses.append(total / count)
    report.train_samples_per_s = epochs * len(dataset) / (time.perf_counter() - start)

    correct = 0
    start = time.perf_counter()
    evaluation: DataLoader[Any] = create_dataloader(
        dataset, batch_size=256, training=False, num_workers=workers
    )
    with evaluation, torch.no_grad():
        for x, y in monitor.watch(wrap(evaluation, "evaluate", len(evaluation)), every=1):
            correct += int((model(x).argmax(dim=1) == y).sum())
    report.eval_samples_per_s = len(dataset) / (time.perf_counter() - start)
    report.accuracy = correct / len(dataset)
    report.max_files_open_per_process = monitor.max_files
    report.max_worker_processes = monitor.max_workers

    determinism = check_determinism(train_loader, epochs=2)
    dataset.close()
    after = compare(before, _settled_snapshot(before))

    _judge(report, sessions=len(paths), determinism=determinism, after=after)
    return report


def _judge(
    report: DemoReport, *, sessions: int, determinism: DeterminismReport, after: LeakReport
) -> None:
    """Fill ``report.checks``: learning, files open, worker processes, determinism, cleanup."""
    checks = report.checks
    checks["learning"] = (
        report.losses[-1] < report.losses[0] or report.epochs == 1,
        f"loss {report.losses[0]:.3f} -> {report.losses[-1]:.3f}, accuracy "
        f"{report.accuracy:.1%} ({CLASSES} classes, chance {1 / CLASSES:.0%})",
    )
    checks["files open"] = (
        report.max_files_open_per_process <= MAX_OPEN_FILES,
        f"at most {report.max_files_open_per_process} of {sessions} session files open in "
        f"any process (max_open_files={MAX_OPEN_FILES})",
    )
    checks["worker processes"] = (
        report.max_worker_processes <= report.workers,
        f"at most {report.max_worker_processes} worker processes (num_workers={report.workers})",
    )
    checks["determinism"] = (determinism.deterministic, str(determinism))
    leftovers = [c.pid for c in after.new_children]
    open_files = [p for p in after.new_open_files if p.startswith(report.root)]
    checks["cleanup"] = (
        not leftovers and not open_files,
        "no worker processes and no session files left open after close()"
        if not leftovers and not open_files
        else f"left behind: processes {leftovers}, files {open_files}",
    )


def _settled_snapshot(before: Any, timeout: float = 5.0) -> Any:
    """A snapshot taken once exiting workers are gone (or after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        after = snapshot()
        if not compare(before, after).new_children or time.monotonic() > deadline:
            return after
        time.sleep(0.05)
