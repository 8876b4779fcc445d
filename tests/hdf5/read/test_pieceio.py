"""``pieceio.read_pieces``: scattered reads, page cache first, the misses asked for together.

Files are evicted from the page cache with ``posix_fadvise(DONTNEED)`` so that the reads the
kernel refuses under ``RWF_NOWAIT`` really happen; the bytes must be the same either way.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from loaderkit.hdf5.read import pieceio
from loaderkit.hdf5.read.pieceio import read_pieces


@pytest.fixture
def blob(tmp_path: Path) -> Iterator[tuple[int, np.ndarray]]:
    values = np.random.default_rng(0).integers(0, 255, 1 << 20, dtype=np.uint8)
    path = tmp_path / "blob"
    path.write_bytes(values.tobytes())
    fd = os.open(path, os.O_RDONLY)
    yield fd, values
    os.close(fd)


def _plan(values: np.ndarray, count: int) -> tuple[list[int], list[int], list[int], np.ndarray]:
    rng = np.random.default_rng(count)
    where = rng.integers(0, values.size - 5000, count)
    nbytes = rng.integers(1, 5000, count)
    into = np.concatenate(([0], np.cumsum(nbytes)[:-1]))
    want = np.concatenate([values[w : w + n] for w, n in zip(where, nbytes, strict=True)])
    return where.tolist(), into.tolist(), nbytes.tolist(), want


def _evict(fd: int) -> None:
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


@pytest.mark.parametrize("around", [0, 128 << 10])
@pytest.mark.parametrize("cold", [False, True])
def test_reads_equal_the_file_warm_or_cold(
    blob: tuple[int, np.ndarray], cold: bool, around: int
) -> None:
    fd, values = blob
    where, into, nbytes, want = _plan(values, 200)
    if cold:
        _evict(fd)
    out = np.zeros(want.size, np.uint8)
    assert read_pieces(out, [fd] * len(where), where, into, nbytes, around=around)
    assert np.array_equal(out, want)


def test_without_rwf_nowait_every_read_is_a_plain_one(
    blob: tuple[int, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    fd, values = blob
    monkeypatch.setattr(pieceio, "NOWAIT", None)
    where, into, nbytes, want = _plan(values, 50)
    _evict(fd)
    out = np.zeros(want.size, np.uint8)
    assert read_pieces(out, [fd] * len(where), where, into, nbytes)
    assert np.array_equal(out, want)


@pytest.mark.parametrize("cold", [False, True])
def test_a_read_past_the_end_or_a_bad_descriptor_is_false(
    blob: tuple[int, np.ndarray], cold: bool
) -> None:
    fd, values = blob
    if cold:
        _evict(fd)
    out = np.zeros(64, np.uint8)
    assert not read_pieces(out, [fd, fd], [0, values.size - 10], [0, 32], [32, 32])
    assert not read_pieces(out, [fd, 10**6], [0, 0], [0, 32], [32, 32])
