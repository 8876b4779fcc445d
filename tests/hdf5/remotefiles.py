"""Remote session files for the HDF5 tests: the same files on disk and in moto's S3 on 127.0.0.1.

Importable by forked and spawned processes (rank functions live in the test modules, the data
here). Each session ``s`` holds ``x`` of ``ROWS x COLS`` float32 with ``x[r, 0] = 1000 s + r``,
chunked by ``CHUNK`` rows, and ``label[r] = r``: a sample names its session and row.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from tests.storage.s3server import KEY, SECRET, S3Server, serving

SESSIONS = 6
ROWS = 96
COLS = 2048  # 8 KiB rows: 768 KiB per session, larger than a metadata block (256 KiB)
CHUNK = 8
BUCKET = "loaderkit-remote"


def write_session(path: Path, session: int, scale: float = 1.0) -> None:
    """One session file (``scale`` makes a replacement with other values, same size)."""
    x = np.random.default_rng(session).standard_normal((ROWS, COLS), dtype=np.float32)
    x[:, 0] = 1000 * session + np.arange(ROWS)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x * np.float32(scale), chunks=(CHUNK, COLS))
        f.create_dataset("label", data=np.arange(ROWS, dtype=np.int64))


@dataclass
class Remote:
    """The server, the bucket's URLs, the local copies, and helpers."""

    server: S3Server
    root: Path
    paths: list[str] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)

    @property
    def options(self) -> dict[str, Any]:
        return {"endpoint_url": self.server.url, "key": KEY, "secret": SECRET}

    def client(self) -> Any:
        import boto3  # type: ignore[import-untyped]

        return boto3.client(
            "s3",
            endpoint_url=self.server.url,
            region_name="us-east-1",
            aws_access_key_id=KEY,
            aws_secret_access_key=SECRET,
        )

    def put(self, key: str, path: Path | str) -> str:
        self.client().upload_file(str(path), BUCKET, key)
        return f"s3://{BUCKET}/{key}"

    def whole_gets(self, url: str) -> int:
        """GETs of the whole object (no Range): downloads."""
        key = url.split(f"{BUCKET}/", 1)[1]
        return sum(r.range is None for r in self.server.object_gets(key, BUCKET))

    def range_gets(self, url: str) -> list[str]:
        key = url.split(f"{BUCKET}/", 1)[1]
        return [r.range for r in self.server.object_gets(key, BUCKET) if r.range is not None]


def start(root: Path, sessions: int = SESSIONS) -> Iterator[Remote]:
    """The server with ``sessions`` sessions uploaded (for a module-scoped fixture)."""
    with serving() as server:
        remote = Remote(server, root)
        remote.client().create_bucket(Bucket=BUCKET)
        for s in range(sessions):
            path = root / f"betas_session{s:02d}.h5"
            write_session(path, s)
            remote.paths.append(str(path))
            remote.urls.append(remote.put(path.name, path))
            remote.sizes.append(os.path.getsize(path))
        server.requests.clear()
        yield remote


def rows(batch: Any) -> list[tuple[int, int]]:
    """``(session, row)`` of each sample of a batch of ``x`` rows."""
    first = np.asarray(batch)[..., 0].reshape(-1)
    return [(int(v) // 1000, int(v) % 1000) for v in first]
