"""Rows that span many chunks (NSD betas: ``(750, V)`` int16, chunks ``(750, 1)``).

A batch reads each chunk at most once per session; block order reads each session at most
once per pass per process by holding it in memory within ``max_session_bytes`` (fitted by
the loader, in its plan); beyond the budget every batch reads its sessions' chunks once.
Bytes read are measured with the kernel's own count (``read_chars``), memory with ``ru_maxrss``,
in the main process and inside fork and spawn workers.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import psutil
import pytest
import torch

from loaderkit import (
    BlockShuffleSampler,
    ConfigError,
    DataLoader,
    HDF5FileError,
    HDF5SessionDataset,
    LoaderkitWarning,
    PerformanceHint,
)
from loaderkit.hdf5.meta.columnblocks import chunks_per_row, column_blocks
from loaderkit.hdf5.read import widerows
from loaderkit.hdf5.read.rawio import chunk_map
from loaderkit.hdf5.read.widerows import BLOCK_BYTES, read_rows_raw
from loaderkit.policy.budgets import check_session_memory
from loaderkit.policy.held import fit_session_bytes
from tests.conftest import fake_platform
from tests.hdf5.helpers import record_worker_start, report_collate, write_wide
from tests.helpers import tiered

pytestmark = pytest.mark.filterwarnings("ignore::loaderkit.errors.PerformanceHint")

MIB = 1 << 20
HAS_IO = sys.platform.startswith("linux") and hasattr(psutil.Process(), "io_counters")


def _read_chars() -> int:
    return int(psutil.Process().io_counters().read_chars)


def _check(ds: HDF5SessionDataset, arrays: list[np.ndarray], indices: Any, got: Any) -> None:
    for i, sample in zip(indices, got, strict=True):
        session, row = ds.locate(int(i))
        want = arrays[int(session)][row]
        assert np.asarray(sample).dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(sample), want)


LAYOUTS = {
    "nsd": dict(rows=40, row_shape=(300,)),
    "big_endian": dict(rows=40, row_shape=(300,), dtype=">i2"),
    "float32": dict(rows=40, row_shape=(300,), dtype="<f4"),
    "volume": dict(rows=30, row_shape=(5, 6, 4)),
    "bands": dict(rows=40, row_shape=(200,), chunk_rows=16),  # 3 bands, the last partial
    "gzip": dict(rows=40, row_shape=(300,), compression="gzip"),  # HDF5 reads it
    "unwritten_chunk": dict(rows=40, row_shape=(120,), skip_chunk=True),  # fill value
}


@pytest.mark.parametrize("held", [None, 0], ids=["held", "batch-wide"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_read_path_returns_the_stored_rows(tmp_path: Path, layout: str, held: Any) -> None:
    paths, arrays = write_wide(tmp_path, 3, **LAYOUTS[layout])  # type: ignore[arg-type]
    ds = HDF5SessionDataset(paths, key="betas", max_session_bytes=held)
    assert ds.budgets.session_memory_bytes == arrays[0].nbytes
    rng = np.random.default_rng(0)
    for _ in range(3):
        indices = rng.integers(0, len(ds), 23).tolist()  # repeats, any order
        _check(ds, arrays, indices, ds.__getitems__(indices))
    _check(ds, arrays, [5, len(ds) - 1, 0], [ds[5], ds[-1], ds[0]])
    _check(ds, arrays, range(len(ds)), ds.__getitems__(list(range(len(ds)))))
    info = ds.budgets.held_info()
    assert info.loads == (3 if held is None else 0) and info.held_bytes <= info.max_bytes
    ds.close()
    assert ds.budgets.held_info().held == 0  # close() drops what is held


def test_rows_of_one_chunk_each_keep_the_run_reads(tmp_path: Path) -> None:
    """Chunks (1, 64, 64): 16 chunks per row but no chunk shared: nothing is held."""
    path = tmp_path / "s.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.ones((6, 256, 256), "f4"), chunks=(1, 64, 64))
    with pytest.warns(PerformanceHint, match="no more bytes than it returns"):
        ds = HDF5SessionDataset([path], key="x")
    assert ds.budgets.session_memory_bytes == 0 and ds.budgets.held_capacity is None
    assert ds.__getitems__([1, 2])[0].shape == (256, 256)


@pytest.mark.skipif(not HAS_IO, reason="needs the kernel's count of bytes read (Linux)")
def test_a_batch_reads_each_chunk_once_per_session(tmp_path: Path) -> None:
    paths, arrays = write_wide(tmp_path, 4, 40, (2000,))
    session = arrays[0].nbytes  # 160 kB: the chunks of one session
    ds = HDF5SessionDataset(paths, key="betas", max_session_bytes=0)
    rng = np.random.default_rng(1)
    ds.__getitems__([0, 40, 80, 120])  # open the files and index their chunks: not the rows
    for _ in range(3):
        indices = rng.permutation(len(ds))[:32].tolist()
        touched = len({ds.locate(i)[0] for i in indices})
        before = _read_chars()
        got = ds.__getitems__(indices)
        read = _read_chars() - before
        _check(ds, arrays, indices, got)
        # one pass over every chunk of each session the batch touches (32 rows in 4 sessions
        # read one by one would read 8 passes each)
        assert read <= touched * session * 1.1, (read, touched * session)
        assert read >= touched * session  # the rows come from the chunks, every one read
    before = _read_chars()
    ds[3]
    assert _read_chars() - before <= session * 1.1  # one sample: one pass over its session


@pytest.mark.skipif(not HAS_IO, reason="needs the kernel's count of bytes read (Linux)")
def test_block_order_reads_each_session_once_per_pass(tmp_path: Path) -> None:
    paths, arrays = write_wide(tmp_path, 4, 40, (2000,))
    total = sum(a.nbytes for a in arrays)
    for held, window in ((2, 1), (3, 2), (4, 4)):
        ds = HDF5SessionDataset(paths, key="betas", max_session_bytes=held * arrays[0].nbytes)
        assert ds.budgets.held_capacity == held
        sampler = BlockShuffleSampler(ds, block_size=4, seed=0)
        # a spare place when not every session fits: a finished session never pushes out
        # an active one
        assert sampler.window == window
        ds.__getitems__(list(range(0, 160, 40)))  # open and index every file
        for epoch in range(3):
            sampler.set_epoch(epoch)
            ds._reader.files.held.clear()  # what the last pass held is not this pass's
            before, loads = _read_chars(), ds.budgets.held_info().loads
            order = sampler.indices().tolist()
            for k in range(0, len(order), 8):
                _check(ds, arrays, order[k : k + 8], ds.__getitems__(order[k : k + 8]))
            assert ds.budgets.held_info().loads - loads == 4, (held, epoch)  # each session once
            assert _read_chars() - before <= total * 1.05
            assert ds.budgets.held_info().held_bytes <= held * arrays[0].nbytes
        ds.close()


def test_beyond_the_budget_batches_read_their_sessions(tmp_path: Path) -> None:
    paths, arrays = write_wide(tmp_path, 2, 40, (500,))
    ds = HDF5SessionDataset(paths, key="betas", max_session_bytes=arrays[0].nbytes - 1)
    assert ds.budgets.held_capacity == 0
    assert BlockShuffleSampler(ds, seed=0).window == 2  # nothing held: the window is not cut
    _check(ds, arrays, [1, 45, 2], ds.__getitems__([1, 45, 2]))
    assert ds.budgets.held_info().loads == 0


def test_a_session_changed_after_it_was_read_into_memory(tmp_path: Path) -> None:
    paths, arrays = write_wide(tmp_path, 2, 40, (300,))
    ds = HDF5SessionDataset(paths, key="betas")
    _check(ds, arrays, [1, 2], ds.__getitems__([1, 2]))
    assert ds.budgets.held_info().held == 1
    rewrite = (  # another process rewrites it in place: same rows, other values
        "import h5py, sys\n"
        "with h5py.File(sys.argv[1], 'r+', locking=False) as f:\n"
        "    f['betas'][0, 0] = 1\n"
    )
    subprocess.run([sys.executable, "-c", rewrite, str(paths[0])], check=True)
    with pytest.raises(HDF5FileError, match="changed after its rows were read into memory"):
        ds.__getitems__([3])
    ds.close()


def test_bad_budgets_are_refused(tmp_path: Path) -> None:
    paths, _ = write_wide(tmp_path, 1, 10, (100,))
    with pytest.raises(ConfigError, match="max_session_bytes must be >= 0"):
        HDF5SessionDataset(paths, key="betas", max_session_bytes=-1)
    with pytest.raises(ConfigError, match="max_session_bytes must be an int"):
        HDF5SessionDataset(paths, key="betas", max_session_bytes=1.5)  # type: ignore[arg-type]


def test_the_hint_states_what_it_measured_and_the_remedies_in_order(tmp_path: Path) -> None:
    paths, _ = write_wide(tmp_path, 3, 750, (2000,))
    with pytest.warns(PerformanceHint) as record:
        HDF5SessionDataset(paths, key="betas")
    hints = [str(w.message) for w in record if issubclass(w.category, PerformanceHint)]
    assert len(hints) == 1, hints  # once for the dataset, not once per session
    text = hints[0]
    assert "one row spans 2,000 chunks (chunk shape 750x1, 1,500 bytes each)" in text
    assert "in 3 of 3 sessions" in text
    assert "reads 3.0 MB of chunks to return 4.0 kB: 750x read amplification" in text
    block = text.index('shuffle="block"')
    assert block < text.index("loaderkit rechunk --key betas --out DIR FILE")
    assert "probably h5py auto-chunking" not in text


# ------------------------------------------------------------------ the arithmetic


def test_session_budget_fits_whole_sessions_in_a_share_of_memory() -> None:
    session = 30 * MIB
    every = fit_session_bytes(session, 4, 2, 24 << 30)
    assert (every.bytes, every.sessions) == (4 * session, 4)
    assert every.reason.startswith("all 4 sessions per process (4 x 30.0 MiB): 3 processes x")
    assert "<= 6.00 GiB (0.25 of 24.00 GiB)" in every.reason
    some = fit_session_bytes(1 << 30, 37, 2, 24 << 30)
    assert (some.bytes, some.sessions) == (2 << 30, 2)
    assert some.reason.startswith("2 of 37 sessions per process")
    none = fit_session_bytes(1 << 30, 37, 8, 16 << 30)
    assert (none.bytes, none.sessions) == (0, 0) and "do not fit" in none.reason
    assert fit_session_bytes(0, 4, 2, 24 << 30).bytes == 0  # nothing spans chunks
    assert fit_session_bytes(session, 4, 2, None).bytes == 0  # memory unknown: hold nothing
    assert check_session_memory(2, 4 << 30, 24 << 30).level == "ok"
    assert check_session_memory(5, 4 << 30, 24 << 30).level == "warn"  # 24 GiB of 24

    # the block order's rule: one session a process within a third, leaving room for each
    job = 1536 * MIB
    quarter = fit_session_bytes(450_000_000, 6, 0, job, block_order=True)
    assert (quarter.bytes, quarter.sessions) == (450_000_000, 1)
    assert quarter.reason.startswith("block order: 1 session per process (429.2 MiB)")
    assert "<= 512.0 MiB (0.333 of 1.50 GiB; a quarter holds none)" in quarter.reason
    assert fit_session_bytes(300 * MIB, 6, 0, job, block_order=True).sessions == 1  # a quarter
    assert fit_session_bytes(300 * MIB, 6, 0, job).reason.startswith("1 of 6 sessions")
    assert fit_session_bytes(450_000_000, 6, 2, job, block_order=True).bytes == 0
    assert fit_session_bytes(600 * MIB, 6, 0, job, block_order=True).bytes == 0  # over a third
    no_room = fit_session_bytes(170 * MIB, 6, 0, 512 * MIB, block_order=True)
    assert no_room.bytes == 0 and "do not fit" in no_room.reason
    assert "worker_method" not in no_room.reason  # one process holds none either
    processes = fit_session_bytes(429 * MIB, 6, 2, 1536 * MIB, block_order=True)
    assert processes.bytes == 0 and "worker_method='thread'" in processes.reason
    assert "worker_method" not in fit_session_bytes(429 * MIB, 6, 2, 1536 * MIB).reason


def test_raw_reads_join_runs_split_in_the_file_but_adjacent_in_columns(tmp_path: Path) -> None:
    # written in slabs, HDF5 places its chunk index between stretches of chunks: runs of
    # adjacent columns split by a gap in the file, staged back to back and copied as one
    data = np.arange(40 * 3000, dtype="<i2").reshape(40, 3000)
    path = tmp_path / "slabs.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset("x", shape=data.shape, dtype="<i2", chunks=(40, 1))
        for c in range(0, 3000, 500):
            d[:, c : c + 500] = data[:, c : c + 500]
    rng = np.random.default_rng(0)
    with h5py.File(path, "r") as f:
        cmap = chunk_map(f, f["x"])
        assert cmap is not None and len(cmap.lengths) > 6  # split runs
        assert np.all(np.diff(cmap.columns) == cmap.lengths[:-1])  # adjacent columns
        for rows in (np.arange(40), np.sort(rng.choice(40, 9, replace=False))):
            for stage in (BLOCK_BYTES, 80 * 700, 80 * 7):  # one piece; pieces cutting runs
                out = np.zeros((rows.shape[0], 3000), "<i2")
                assert read_rows_raw(cmap, rows, out, stage_bytes=stage) == 3000 * 80
                np.testing.assert_array_equal(out, data[rows])


def _reading_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == "loaderkit-widerows"]


def test_pieces_are_read_a_stage_ahead_and_a_failed_read_stops_both(tmp_path: Path) -> None:
    # many staged pieces: each read by the reading thread while the one before is copied
    data = np.arange(30 * 2000, dtype="<i2").reshape(30, 2000)
    path = tmp_path / "x.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=(30, 1))
    rows = np.array([0, 3, 3, 17, 29])
    with h5py.File(path, "r") as f:
        cmap = chunk_map(f, f["x"])
        assert cmap is not None
        out = np.zeros((rows.size, 2000), "<i2")
        assert read_rows_raw(cmap, rows, out, stage_bytes=60 * 37) == data.nbytes  # 55 pieces
        np.testing.assert_array_equal(out, data[rows])
        assert not _reading_threads()
        # the file cut after the 20th piece's chunks: the error is raised here, the thread ends
        with open(path, "r+b") as raw:
            raw.truncate(int(np.sort(cmap.offsets)[0]) + 20 * 37 * 60)
        with pytest.raises(OSError) as failed:
            read_rows_raw(cmap, rows, np.zeros_like(out), stage_bytes=60 * 37)
        assert "the row data" in str(failed.value)
        assert not _reading_threads()


def test_a_failed_copy_stops_the_reading_thread(tmp_path: Path, monkeypatch: Any) -> None:
    data = np.arange(30 * 2000, dtype="<i2").reshape(30, 2000)
    path = tmp_path / "x.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=(30, 1))
    copied: list[int] = []

    def scatter(target: Any, picked: Any, piece: Any) -> None:
        copied.append(len(piece))
        if len(copied) == 3:
            raise MemoryError("a copy failed")

    monkeypatch.setattr(widerows, "_scatter", scatter)
    with h5py.File(path, "r") as f:
        cmap = chunk_map(f, f["x"])
        assert cmap is not None
        with pytest.raises(MemoryError, match="a copy failed"):
            read_rows_raw(cmap, np.arange(30), np.zeros((30, 2000), "<i2"), stage_bytes=60 * 37)
    assert len(copied) == 3 and not _reading_threads()


def test_column_blocks_cover_every_element_once_within_the_bounds() -> None:
    for shape, chunks, max_bytes, max_chunks in [
        ((750, 1000), (750, 1), 750 * 2 * 64, None),
        ((30, 5, 6, 4), (30, 1, 1, 1), 30 * 2 * 7, None),
        ((40, 9, 7), (16, 2, 3), 1 << 20, 10),
        ((12, 0), (12, 1), 100, None),
    ]:
        seen = np.zeros(shape, np.int64)
        for box in column_blocks(shape, chunks, 2, max_bytes=max_bytes, max_chunks=max_chunks):
            seen[box] += 1
            assert box[0] == slice(0, shape[0])  # every row
            for axis, part in enumerate(box[1:], 1):  # whole chunks (or the dataset's edge)
                assert part.start % chunks[axis] == 0
                assert part.stop % chunks[axis] == 0 or part.stop == shape[axis]
            sizes = [p.stop - p.start for p in box[1:]]
            one_column = all(size <= c for size, c in zip(sizes, chunks[1:], strict=True))
            assert one_column or shape[0] * int(np.prod(sizes)) * 2 <= max_bytes
            touched = int(np.prod([-(-n // c) for n, c in zip(sizes, chunks[1:], strict=True)]))
            assert max_chunks is None or one_column or touched * 3 <= max_chunks
        assert np.all(seen == 1), shape
    assert chunks_per_row((750, 81, 104, 83), (750, 1, 1, 1)) == 81 * 104 * 83


# ------------------------------------------------------------------ loaders, plans, workers


def test_the_plan_states_the_budget_and_its_reason(tmp_path: Path) -> None:
    paths, arrays = write_wide(tmp_path, 4, 40, (2000,))
    session = arrays[0].nbytes
    platform = fake_platform(memory_bytes=12 * session * 4)  # a quarter: 12 sessions
    loader = DataLoader(
        HDF5SessionDataset(paths, key="betas"),
        batch_size=8,
        shuffle="block",
        num_workers=2,
        seed=0,
        platform=platform,
    )
    entry = loader.plan["max_session_bytes"]
    assert entry.value == loader.dataset.max_session_bytes == 4 * session
    assert entry.reason.startswith("fits: all 4 sessions per process")
    assert "3 processes x" in entry.reason
    loader.close()

    tight = fake_platform(memory_bytes=3 * session * 4)  # 3 processes, one session each
    loader = DataLoader(
        HDF5SessionDataset(paths, key="betas"),
        batch_size=8,
        shuffle="block",
        num_workers=2,
        seed=0,
        platform=tight,
    )
    assert loader.plan["max_session_bytes"].value == session
    assert loader.dataset.budgets.held_capacity == 1 and loader.sampler.window == 1
    loader.close()

    none = fake_platform(memory_bytes=session)
    loader = DataLoader(HDF5SessionDataset(paths, key="betas"), num_workers=2, platform=none)
    entry = loader.plan["max_session_bytes"]
    assert entry.value == 0 and "do not fit" in entry.reason
    loader.close()


def _big_sessions(root: Path, sessions: int, voxels: int) -> list[Path]:
    """NSD's layout at 750 trials: betas[t, v] = (7 t + v + s) % 32000, chunks (750, 1)."""
    paths = []
    trial = np.arange(750, dtype=np.int32)[:, None]
    for s in range(sessions):
        data = ((trial * 7 + np.arange(voxels, dtype=np.int32) + s) % 32000).astype(np.int16)
        path = root / f"betas_session{s + 1:02d}.hdf5"
        with h5py.File(path, "w") as f:
            f.create_dataset("betas", data=data, chunks=(750, 1))
        paths.append(path)
    return paths


@pytest.mark.slow
def test_block_order_holds_one_session_where_a_quarter_holds_none(tmp_path: Path) -> None:
    # sessions of 200 MiB with 720 MiB of memory: a quarter (180 MiB) holds none; the block
    # order holds one (a third: 240 MiB, leaving 520 MiB), so each session is read once
    voxels = 140_000
    paths = _big_sessions(tmp_path, 2, voxels)
    session = 750 * voxels * 2
    job = fake_platform(memory_bytes=720 * MIB, memory_source="cgroup v1 /job memory.limit")
    loader = DataLoader(
        HDF5SessionDataset(paths, key="betas"),
        batch_size=100,
        shuffle="block",
        seed=0,
        platform=job,
    )
    with loader:
        entry = loader.plan["max_session_bytes"]
        assert entry.value == loader.dataset.max_session_bytes == session
        assert entry.reason.startswith("fits: block order: 1 session per process (200.3 MiB)")
        assert "0.333 of 720.0 MiB (cgroup v1 /job memory.limit)" in entry.reason
        assert loader.sampler.window == 1
        seen = []
        for batch in loader:
            first = batch[:, 0].numpy().astype(np.int64)  # 7 t + s, below 32000
            trials, session_of = first // 7, first % 7
            seen.extend(zip(session_of.tolist(), trials.tolist(), strict=True))
            want = (7 * trials + session_of)[:, None] + np.arange(voxels)
            np.testing.assert_array_equal(batch.numpy(), want % 32000)  # every voxel
        assert sorted(seen) == [(s, t) for s in range(2) for t in range(750)]
        assert loader.dataset._reader.files.held.info().loads == 2  # each session once

    # the same job with a uniform shuffle, or with worker processes: nothing held
    for shuffle, workers in ((True, 0), ("block", 2)):
        loader = DataLoader(
            HDF5SessionDataset(paths, key="betas"),
            batch_size=8,
            shuffle=shuffle,
            num_workers=workers,
            seed=0,
            platform=job,
        )
        entry = loader.plan["max_session_bytes"]
        assert entry.value == 0 and "do not fit" in entry.reason, (shuffle, workers)
        loader.close()


def test_an_explicit_budget_wins_and_is_checked_against_memory(tmp_path: Path) -> None:
    paths, _ = write_wide(tmp_path, 2, 40, (2000,))
    platform = fake_platform(memory_bytes=64 * MIB)
    with pytest.warns(LoaderkitWarning, match="max_session_bytes.*over half of it"):
        loader = DataLoader(
            HDF5SessionDataset(paths, key="betas", max_session_bytes=32 * MIB),
            num_workers=2,
            platform=platform,
        )
    entry = loader.plan["max_session_bytes"]
    assert (entry.requested, entry.value) == (32 * MIB, 32 * MIB)
    assert entry.reason.startswith("as given (unset would give")
    loader.close()


def test_datasets_without_such_rows_have_no_plan_row(tmp_path: Path) -> None:
    path = tmp_path / "c.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("betas", data=np.zeros((10, 4), "f4"))
    loader = DataLoader(HDF5SessionDataset([path], key="betas"), num_workers=0)
    assert "max_session_bytes" not in loader.plan
    loader.close()


@pytest.fixture(scope="module")
def large_sessions(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], list[Any]]:
    """4 sessions of 64 MB, rows of 40,000 int16 in chunks of one column (800 rows)."""
    return write_wide(tmp_path_factory.mktemp("large"), 4, 800, (40000,))


@pytest.mark.skipif(not HAS_IO, reason="needs the kernel's count of bytes read (Linux)")
# spawn reads as fork does once the dataset is unpickled
# (tests/hdf5/dataset/test_workers.py); slow tier
@pytest.mark.parametrize("context", tiered(["fork", "spawn"], {"fork"}))
def test_workers_read_each_session_once_and_stay_within_the_budget(
    large_sessions: tuple[list[Path], list[np.ndarray]], context: str
) -> None:
    """Block order, 2 workers: per worker, each session read once per pass, peak RSS growth
    within the budget the plan states plus the open files' own memory, every row correct.

    Holding every session (256 MB) instead of the budget (128 MB) would exceed the bound.
    """
    paths, arrays = large_sessions
    session = arrays[0].nbytes
    budget = 2 * session
    ds = HDF5SessionDataset(paths, key="betas", max_session_bytes=budget)
    loader = DataLoader(
        ds,
        batch_size=50,
        shuffle="block",
        num_workers=2,
        seed=0,
        multiprocessing_context=context,
        worker_init_fn=record_worker_start,
        collate_fn=report_collate,
        persistent_workers=True,
    )
    assert loader.plan["max_session_bytes"].value == budget
    assert loader.sampler.window == 1  # 2 held, one of them spare
    files = sum(p.stat().st_size for p in paths)  # rows and the chunk index
    others = ds.max_open_files * ds.budgets.file_memory_bytes + BLOCK_BYTES + 32 * MIB
    for epoch in range(2):
        seen = []
        reports: dict[int, dict[str, Any]] = {}
        order = loader.sampler.indices() if epoch == 0 else None
        for batch in loader:
            reports[batch["pid"]] = batch  # the last report of each worker (cumulative)
            seen.append(batch["rows"])
        if order is not None:  # the rows came back in the sampler's order, each correct
            rows = torch.cat(seen).numpy()
            for k in range(0, len(order), 97):
                session_id, row = ds.locate(int(order[k]))
                np.testing.assert_array_equal(rows[k], arrays[int(session_id)][row])
        assert len(reports) == 2
        for report in reports.values():
            passes = epoch + 1  # each worker reads each session at most once per pass
            assert report["held"].loads <= passes * len(arrays)
            assert report["read"] <= passes * files * 1.05
            assert report["held"].held_bytes <= budget
            grown = report["peak_rss"] - report["start_rss"]
            assert grown <= budget + others, (grown, budget, others)
    loader.close()


def test_the_main_process_held_sessions_are_not_a_forked_workers(tmp_path: Path) -> None:
    paths, _ = write_wide(tmp_path, 2, 40, (500,))
    ds = HDF5SessionDataset(paths, key="betas")
    ds.__getitems__([0, 41])
    assert ds.budgets.held_info().held == 2
    loader = DataLoader(
        ds,
        batch_size=10,
        num_workers=1,
        multiprocessing_context="fork",
        collate_fn=report_collate,
    )
    reports = list(loader)
    assert reports[0]["held"].loads == 1 and reports[0]["held"].hits == 0  # read afresh
    assert ds.budgets.held_info().held == 2  # the main process kept its own
    loader.close()


def test_subclass_read_through_super_uses_the_held_session(tmp_path: Path) -> None:
    from tests.hdf5.subclasses import ScaledRead

    paths, arrays = write_wide(tmp_path, 2, 40, (300,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PerformanceHint)
        ds = ScaledRead(paths, key="betas")
    got = ds.__getitems__(list(range(len(ds))))  # per item: read() -> super().read()
    assert ds.budgets.held_info().loads == 2  # one per session, not one pass per sample
    for i, sample in enumerate(got):
        session, row = ds.locate(i)
        want = arrays[int(session)][row].astype("float32") / 300
        np.testing.assert_array_equal(np.asarray(sample), want)
