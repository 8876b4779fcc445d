"""Rows that span many chunks, inside a job's memory limit: bounded, not killed.

The seeds' NSD layout, scaled: 6 session files of 400 trials x 50,000 int16 voxels in
``(400, 1)`` chunks (38 MiB each, 229 MiB in all), read by a fresh interpreter in a child
memory cgroup of 320 MiB (``tests.cgroups``; skipped where it cannot be made). Seeing the
machine's memory, loaderkit would hold every session in each process (the kernel kills it:
the contrast test holds them by hand); seeing the job's, it holds what fits a quarter of
the limit and says so in the plan. Every sample of the epoch is checked (voxel 0 holds the
trial, voxel 1 the session).
"""

from __future__ import annotations

import json
import sys

import h5py
import numpy as np
import pytest

from tests.cgroups import child_cgroup

MIB = 1 << 20
LIMIT = 320 * MIB
TRIALS, VOXELS, SESSIONS = 400, 50_000, 6

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


def _epoch(paths: list[str], workers: int, shuffle: object, held: int | None = None):
    with child_cgroup(memory_bytes=LIMIT) as group:
        args = json.dumps([paths, workers, shuffle, held])
        run = group.run([sys.executable, "-c", EPOCH, args], timeout=600)
    return run, group


def _completes(paths: list[str], workers: int, shuffle: object) -> None:
    run, group = _epoch(paths, workers, shuffle)
    assert run.returncode == 0, f"exit {run.returncode}: {run.stderr[-2000:]}"
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert sorted(map(tuple, found["seen"])) == [
        (s, t) for s in range(SESSIONS) for t in range(TRIALS)
    ]  # every trial once
    memory, held = found["plan"]["memory"], found["plan"]["max_session_bytes"]
    assert memory[0] == "320.0 MiB" and f"/{group.memory.name} memory.limit_in_bytes" in memory[1]
    assert int(held[0]) * (workers + 1) <= LIMIT // 4  # the stated share
    assert "320.0 MiB (cgroup v1 " in held[1]
    assert run.peak_anon < LIMIT  # the kernel reclaimed page cache only, killed nothing


def test_block_order_in_a_job_limit_completes_within_its_share(sessions: list[str]) -> None:
    _completes(sessions, 0, "block")


def test_sessions_held_past_the_limit_are_killed_by_the_kernel(sessions: list[str]) -> None:
    # what seeing the machine's memory did: every session held (the contrast that shows the
    # child cgroup bounds the process)
    run, _ = _epoch(sessions, 0, "block", held=SESSIONS * TRIALS * VOXELS * 2)
    assert run.returncode in (137, -9), run.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize(("workers", "shuffle"), [(2, "block"), (0, True), (2, True)])
def test_every_order_in_a_job_limit_completes(
    sessions: list[str], workers: int, shuffle: object
) -> None:
    _completes(sessions, workers, shuffle)
