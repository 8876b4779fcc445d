"""Rows that span many chunks, inside a job's memory limit: bounded, not killed.

The seeds' NSD layout, scaled: 6 session files of 400 trials x 50,000 int16 voxels in
``(400, 1)`` chunks (38 MiB each, 229 MiB in all), read by a fresh interpreter in a child
memory cgroup (``tests.cgroups``; skipped where it cannot be made) whose limit is the
interpreter's own memory with torch and loaderkit imported (``baseline``: measured, as it
differs between torch builds) plus ``ROOM`` (180 MiB), and ``WORKER_ROOM`` more a worker
process. Seeing the machine's memory, loaderkit would hold every session in each process, more
than ``ROOM`` (the kernel kills it: the contrast test holds them by hand); seeing the job's,
it holds what fits a quarter of the limit and says so in the plan. Every sample of the epoch
is checked (voxel 0 holds the trial, voxel 1 the session).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import h5py
import numpy as np
import pytest

from tests.cgroups import child_cgroup

MIB = 1 << 20
#: Room above the interpreter's own memory: less than every session (229 MiB), more than
#: what fits a quarter of the limit plus a batch's reads.
ROOM = 180 * MIB
#: Room for each worker process (a forked interpreter's own pages, its batch slots).
WORKER_ROOM = 120 * MIB
TRIALS, VOXELS, SESSIONS = 400, 50_000, 6

BASELINE = """
import h5py, torch
from loaderkit import create_dataloader
from loaderkit.hdf5 import HDF5SessionDataset
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(sum(int(status[k].split()[0]) for k in ("RssAnon", "RssShmem")) * 1024)
"""

EPOCH = """
import json, sys
from loaderkit import create_dataloader
from loaderkit.hdf5 import HDF5SessionDataset

paths, workers, shuffle, held = json.loads(sys.argv[1])
extra = {} if held is None else {"max_session_bytes": held}
ds = HDF5SessionDataset(paths, key="betas", **extra)
seen = []
with create_dataloader(ds, batch_size=50, shuffle=shuffle, num_workers=workers, seed=0) as loader:
    for batch in loader:
        seen.extend((int(s), int(t)) for t, s in batch[:, :2].tolist())
    plan = {name: [str(loader.plan[name].value), loader.plan[name].reason]
            for name in ("memory", "max_session_bytes")}
print(json.dumps({"seen": seen, "plan": plan}))
"""


@pytest.fixture(scope="module")
def baseline() -> int:
    """This interpreter's own memory with torch and loaderkit imported, in a child cgroup."""
    with child_cgroup(memory_bytes=4 << 30) as group:
        run = group.run([sys.executable, "-c", BASELINE], timeout=120)
    assert run.returncode == 0, run.stderr
    return int(run.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def sessions(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    root = tmp_path_factory.mktemp("nsd")
    paths = []
    for s in range(SESSIONS):
        block = np.random.default_rng(s).integers(-3000, 3000, (TRIALS, VOXELS), np.int16)
        block[:, 0], block[:, 1] = np.arange(TRIALS), s
        path = root / f"betas_session{s + 1:02d}.hdf5"
        with h5py.File(path, "w") as f:
            f.create_dataset("betas", data=block, chunks=(TRIALS, 1))
        paths.append(str(path))
    return paths


def _limit(baseline: int, workers: int) -> int:
    """The child cgroup's limit: the interpreter's memory, ``ROOM``, a worker's room each."""
    return -(-(baseline + ROOM + workers * WORKER_ROOM) // MIB) * MIB


def _epoch(
    paths: list[str], limit: int, workers: int, shuffle: object, held: int | None = None
) -> tuple[Any, Any]:
    with child_cgroup(memory_bytes=limit) as group:
        args = json.dumps([paths, workers, shuffle, held])
        run = group.run([sys.executable, "-c", EPOCH, args], timeout=600)
    return run, group


def _completes(paths: list[str], baseline: int, workers: int, shuffle: object) -> None:
    limit = _limit(baseline, workers)
    run, group = _epoch(paths, limit, workers, shuffle)
    assert run.returncode == 0, (
        f"exit {run.returncode} in {limit / MIB:.0f} MiB (baseline {baseline / MIB:.0f} MiB, "
        f"anonymous peak {run.peak_anon / MIB:.0f} MiB): {run.stderr[-2000:]}"
    )
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert sorted(map(tuple, found["seen"])) == [
        (s, t) for s in range(SESSIONS) for t in range(TRIALS)
    ]  # every trial once
    memory, held = found["plan"]["memory"], found["plan"]["max_session_bytes"]
    words = f"{limit / MIB:.1f} MiB"
    assert memory[0] == words and f"/{group.memory.name} memory.limit_in_bytes" in memory[1]
    assert int(held[0]) * (workers + 1) <= limit // 4  # the stated share
    assert f"{words} (cgroup v1 " in held[1]
    assert run.peak_anon < limit  # the kernel reclaimed page cache only, killed nothing


def test_block_order_in_a_job_limit_completes_within_its_share(
    sessions: list[str], baseline: int
) -> None:
    _completes(sessions, baseline, 0, "block")


def test_sessions_held_past_the_limit_are_killed_by_the_kernel(
    sessions: list[str], baseline: int
) -> None:
    # what seeing the machine's memory did: every session held (the contrast that shows the
    # child cgroup bounds the process)
    every = SESSIONS * TRIALS * VOXELS * 2
    run, _ = _epoch(sessions, _limit(baseline, 0), 0, "block", held=every)
    assert run.returncode in (137, -9), run.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize(("workers", "shuffle"), [(2, "block"), (0, True), (2, True)])
def test_every_order_in_a_job_limit_completes(
    sessions: list[str], baseline: int, workers: int, shuffle: object
) -> None:
    _completes(sessions, baseline, workers, shuffle)
