"""NSD-like session-file workloads shared by the HDF5 benchmarks (see shared BENCHMARKS.md).

Each workload is a set of ``betas_sessionNN.hdf5`` files with one ``betas`` dataset of
``rows x row_shape`` float32 values. :func:`make_workload` writes them (deterministic content:
``session_rows`` is a pure function of the workload and session) so tests can check every
value.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

__all__ = ["WORKLOADS", "IndexOnly", "Workload", "make_workload", "session_rows"]


@dataclass(frozen=True)
class Workload:
    """One benchmark workload.

    Attributes:
        name: Name used in tables (``small-rows`` ...).
        sessions: Number of session files.
        rows: Rows per session (full size).
        quick_rows: Rows per session in ``--quick`` runs.
        row_shape: Shape of one row.
        chunk_rows: Rows per chunk, or ``None`` for contiguous storage.
        compression: h5py compression name (``"gzip"``) or ``None``.
        compression_opts: Compression level.
    """

    name: str
    sessions: int
    rows: int
    quick_rows: int
    row_shape: tuple[int, ...]
    chunk_rows: int | None = None
    compression: str | None = None
    compression_opts: int | None = None

    @property
    def row_bytes(self) -> int:
        """Bytes of one float32 row."""
        return int(np.prod(self.row_shape)) * 4


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("small-rows", 8, 750, 200, (64, 64)),
        Workload("tiny-rows", 8, 4000, 800, (16, 16)),
        Workload(
            "gzip-chunked",
            8,
            750,
            200,
            (64, 64),
            chunk_rows=8,
            compression="gzip",
            compression_opts=1,
        ),
        Workload("large-rows", 4, 100, 40, (256, 256, 4)),
    )
}


def session_rows(workload: Workload, session: int, rows: int) -> np.ndarray:
    """The float32 values stored in ``session`` (deterministic for the workload and session).

    Normal noise rounded to 1/64 (few significant bits, like NSD's int16 betas scaled by 300,
    so gzip has realistic work) with the row and session numbers in the first two elements of
    every row, which makes any mix-up of rows or sessions visible.
    """
    rng = np.random.default_rng([zlib.crc32(workload.name.encode()), session])
    data = rng.standard_normal((rows, *workload.row_shape), dtype=np.float32)
    data = np.round(data * 64) / 64
    flat = data.reshape(rows, -1)
    flat[:, 0] = np.arange(rows, dtype=np.float32)
    flat[:, 1] = session
    return data


def make_workload(root: Path, workload: Workload, *, quick: bool = False) -> list[Path]:
    """Write the workload's session files under ``root`` and return their paths."""
    rows = workload.quick_rows if quick else workload.rows
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for session in range(workload.sessions):
        path = root / f"betas_session{session + 1:02d}.hdf5"
        with h5py.File(path, "w") as f:
            kwargs: dict[str, object] = {}
            if workload.chunk_rows is not None:
                kwargs["chunks"] = (workload.chunk_rows, *workload.row_shape)
            if workload.compression is not None:
                kwargs["compression"] = workload.compression
                kwargs["compression_opts"] = workload.compression_opts
            f.create_dataset("betas", data=session_rows(workload, session, rows), **kwargs)
        paths.append(path)
    return paths


class IndexOnly:
    """Sessions without files, for the sampler: ``loader_support()`` answers the index.

    ``sessions`` sessions of ``rows`` rows each, stored in chunks of ``chunk_rows`` rows (0:
    contiguous); the block sampler interleaves at most ``max_open_files`` sessions.
    """

    def __init__(self, sessions: int, rows: int, chunk_rows: int = 0, max_open_files: int = 8):
        from loaderkit.support import SessionIndex

        self.chunk_rows = chunk_rows
        self.index = SessionIndex(
            positions=np.repeat(np.arange(sessions), rows),
            rows=np.tile(np.arange(rows), sessions),
            chunk_rows=np.full(sessions, max(chunk_rows, 1), np.int64),
            open_files=max_open_files,
        )

    def __len__(self) -> int:
        return int(self.index.positions.shape[0])

    def loader_support(self) -> object:
        from loaderkit.support import LoaderSupport, SessionIndex

        index = self.index

        class Sessions(LoaderSupport):
            def session_index(self) -> SessionIndex:
                return index

        return Sessions()
