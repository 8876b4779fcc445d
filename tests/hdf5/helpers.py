"""Importable helpers for the HDF5 tests (spawned workers must be able to import them)."""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import psutil

from loaderkit.hdf5 import HDF5SessionDataset, SampleIndex

ROW_SHAPE = (3, 4)


def row_value(session: int, row: int) -> np.ndarray:
    """The value stored in every test file: identifies session and row exactly."""
    base = np.arange(np.prod(ROW_SHAPE), dtype=np.float32).reshape(ROW_SHAPE)
    return base + np.float32(session * 10000 + row * 10)


def write_sessions(
    root: Path,
    rows: Sequence[int],
    *,
    key: str = "betas",
    chunks: int | None = None,
    compression: str | None = None,
    dtype: str = "f4",
    row_shape: tuple[int, ...] = ROW_SHAPE,
    extra: dict[str, np.ndarray] | None = None,
) -> list[Path]:
    """Write one file per session with ``rows[s]`` rows of ``row_value(s, r)``."""
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for s, n in enumerate(rows):
        path = root / f"betas_session{s + 1:02d}.hdf5"
        if row_shape == ROW_SHAPE:
            data = np.stack([row_value(s, r) for r in range(n)]) if n else np.zeros((0, *ROW_SHAPE))
        else:
            data = np.full((n, *row_shape), s, dtype=np.float64)
        kwargs: dict[str, Any] = {}
        if chunks is not None and n:
            kwargs["chunks"] = (min(chunks, n), *data.shape[1:])
        if compression is not None and n:
            kwargs["compression"] = compression
        with h5py.File(path, "w") as f:
            f.create_dataset(key, data=data.astype(dtype), **kwargs)
            for name, value in (extra or {}).items():
                f.create_dataset(name, data=value)
        paths.append(path)
    return paths


def expected(ds: HDF5SessionDataset, index: int) -> np.ndarray:
    session, row = ds.locate(index)
    return row_value(int(session), row)


def hdf5_fds(root: str | os.PathLike[str]) -> list[str]:
    """Paths under ``root`` this process has open, one entry per file descriptor (psutil)."""
    prefix = os.fspath(root)
    return [f.path for f in psutil.Process().open_files() if f.path.startswith(prefix)]


class Probe(HDF5SessionDataset):
    """Batches of (index, sample, files open in this process per psutil, pid)."""

    def __init__(self, *args: Any, root: str, **kwargs: Any) -> None:
        self.root = root
        super().__init__(*args, **kwargs)

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        samples = super().__getitems__(indices)
        fds = len(hdf5_fds(self.root))
        return [(i, s, fds, os.getpid()) for i, s in zip(indices, samples, strict=True)]


class Transformed(HDF5SessionDataset):
    """Overrides __getitem__ (a transform): batched reads must go through it."""

    def __getitem__(self, index: int) -> np.ndarray:
        return super().__getitem__(index) + 0.5


class Scaled(HDF5SessionDataset):
    """Overrides read(): per-item semantics in __getitems__ (returns float64 * 2)."""

    def read(self, session: Any, row: int) -> np.ndarray:
        return self.h5dataset(session)[row].astype(np.float64) * 2


class ScaledRows(Scaled):
    """Opts into batched reads with read_rows()."""

    calls = 0

    def read_rows(self, session: Any, start: int, stop: int) -> list[np.ndarray]:
        type(self).calls += 1
        return list(self.h5dataset(session)[start:stop].astype(np.float64) * 2)


class FailingRead(HDF5SessionDataset):
    """read() raises a ValueError for row 1 of every session."""

    def read(self, session: Any, row: int) -> np.ndarray:
        if row == 1:
            raise ValueError("bad sample")
        return self.h5dataset(session)[row]


class EveryOther(HDF5SessionDataset):
    """Custom build_index: even rows only, sessions in reverse order (as pairs)."""

    def build_index(self) -> list[tuple[Any, int]]:
        pairs = []
        for sid in reversed(list(self.files)):
            n = self.file(sid)[self.key].shape[0]
            pairs.extend((sid, r) for r in range(0, n, 2))
        return pairs


class Shuffled(HDF5SessionDataset):
    """Custom index in random order with repeats (no runs to encode)."""

    def build_index(self) -> SampleIndex:
        rng = np.random.default_rng(0)
        return SampleIndex(rng.integers(0, 2, 500), rng.integers(0, 50, 500))


# ------------------------------------------------------------------ rows spanning many chunks


def wide_rows(session: int, rows: int, row_shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Values of a session whose rows span many chunks: distinct per session, row and column."""
    n = int(np.prod(row_shape))
    data = (np.arange(rows)[:, None] * 7 + np.arange(n)[None, :] * 3 + session * 1000) % 30011
    return (data - 15000).astype(dtype).reshape(rows, *row_shape)


def write_wide(
    root: Path,
    sessions: int,
    rows: int,
    row_shape: tuple[int, ...],
    *,
    chunk_rows: int | None = None,
    dtype: str = "<i2",
    compression: str | None = None,
    skip_chunk: bool = False,
) -> tuple[list[Path], list[np.ndarray]]:
    """NSD-like files: ``betas`` of ``(rows, *row_shape)`` with chunks ``(chunk_rows, 1, ...)``.

    ``skip_chunk`` leaves one chunk unwritten (it reads as the fill value, 0). Returns the
    paths and the arrays as stored (what every read must give back, in native order).
    """
    root.mkdir(parents=True, exist_ok=True)
    paths, arrays = [], []
    for s in range(sessions):
        data = wide_rows(s, rows, row_shape, dtype)
        path = root / f"betas_session{s + 1:02d}.hdf5"
        chunks = (chunk_rows or rows, *(1,) * len(row_shape))
        with h5py.File(path, "w") as f:
            d = f.create_dataset(
                "betas", shape=data.shape, dtype=dtype, chunks=chunks, compression=compression
            )
            if skip_chunk:
                flat = data.reshape(rows, -1)
                d2 = d  # write every column but the last one, chunk by chunk column
                for col in range(flat.shape[1] - 1):
                    index = np.unravel_index(col, row_shape)
                    d2[(slice(None), *index)] = flat[:, col]
                data = data.copy()
                data.reshape(rows, -1)[:, -1] = 0
            else:
                d[...] = data
        paths.append(path)
        arrays.append(data.astype(np.dtype(dtype).newbyteorder("=")))
    return paths, arrays


#: What ``record_worker_start`` saw when this worker process started.
WORKER_START: dict[str, int] = {}


def _io_read() -> int:
    try:
        return int(psutil.Process().io_counters().read_chars)
    except (AttributeError, NotImplementedError):  # not Linux
        return -1


def _reset_peak_rss() -> None:
    """Start counting this process's peak RSS afresh (Linux: ``VmHWM`` reset)."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:  # not Linux: the peak since the process started counts
        return


def peak_rss() -> int:
    """Peak RSS of this process since ``_reset_peak_rss`` (or since it started)."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def record_worker_start(worker_id: int) -> None:
    """``worker_init_fn``: this worker's RSS and bytes read before it reads anything.

    The peak RSS counts from here (a spawned interpreter's start-up peaks higher than the
    RSS it settles at).
    """
    del worker_id
    _reset_peak_rss()
    WORKER_START["rss"] = psutil.Process().memory_info().rss
    WORKER_START["read"] = _io_read()


def report_collate(batch: Sequence[Any]) -> dict[str, Any]:
    """``collate_fn`` that measures the worker that read the batch (or the main process).

    Returns the stacked rows with this process's pid, bytes read (``read_chars``), peak RSS
    (``peak_rss``) and RSS at start, and the dataset's ``held_info()``.
    """
    import torch

    info = torch.utils.data.get_worker_info()
    held = info.dataset.budgets.held_info() if info is not None else None
    return {
        "rows": torch.from_numpy(np.stack([np.asarray(s) for s in batch])),
        "pid": os.getpid(),
        "read": _io_read() - WORKER_START.get("read", 0),
        "peak_rss": peak_rss(),
        "start_rss": WORKER_START.get("rss", 0),
        "held": held,
    }


def shuffled_with_repeats(n: int, seed: int = 0) -> list[int]:
    """Every index of ``n`` once, half as many repeats, and the ends again, shuffled."""
    rng = random.Random(seed)
    order = list(range(n)) + [rng.randrange(n) for _ in range(n // 2)] + [n - 1, 0, 0]
    rng.shuffle(order)
    return order


def load(loader: Any) -> list[Any]:
    """Every batch of a loader. Its workers are shut down even when a batch raises: a failing
    test's traceback would otherwise keep them alive until the interpreter exits (5 s each)."""
    iterator = iter(loader)
    try:
        return list(iterator)
    finally:
        getattr(iterator, "_shutdown_workers", lambda: None)()


def run_in_threads(read: Callable[[range], None], items: int, threads: int) -> None:
    """Run ``read(part)`` in ``threads`` threads at once; thread ``t`` gets t, t + threads, ...

    The first exception a thread raised (an assertion included) is raised here after all joined.
    """
    errors: list[BaseException] = []

    def run(part: range) -> None:
        try:
            read(part)
        except BaseException as exc:  # handed to the caller's thread
            errors.append(exc)

    started = [
        threading.Thread(target=run, args=(range(t, items, threads),)) for t in range(threads)
    ]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join()
    if errors:
        raise errors[0]
