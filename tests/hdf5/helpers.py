"""Importable helpers for the HDF5 tests (spawned workers must be able to import them)."""

from __future__ import annotations

import os
from collections.abc import Sequence
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
