"""Soak: many evaluation loops and persistent training epochs over HDF5 data, nothing grows.

Kept short enough for CI (2 workers, small files); the RSS growth is reported in the test
output (run with -s) and bounded.
"""

from __future__ import annotations

import gc

import pytest

from loaderkit import HDF5SessionDataset, LeakCheck, create_dataloader
from loaderkit.memory.resources import snapshot
from tests.helpers import write_h5_sessions

pytestmark = pytest.mark.slow

MIB = 2**20


def _session_files_open(root) -> int:
    return sum(p.startswith(str(root)) for p in snapshot(children=False).open_files)


def test_fifty_evaluation_loops(tmp_path) -> None:
    paths = write_h5_sessions(tmp_path, sessions=6, rows=120, width=64)
    dataset = HDF5SessionDataset(paths, key="betas", max_open_files=2)

    def evaluate() -> float:
        total = 0.0
        with create_dataloader(dataset, batch_size=32, training=False, num_workers=2) as loader:
            for batch in loader:
                total += float(batch.sum())
        return total

    expected = evaluate()  # warm-up: imports, allocator pools
    gc.collect()
    with LeakCheck(raise_on_leak=True, rss_tolerance=64 * MIB) as check:
        for _ in range(50):
            assert evaluate() == expected
    growth = check.report.rss_growth / MIB
    print(f"\n50 evaluation loops: RSS {growth:+.1f} MiB, fds {check.report.fd_growth:+d}")
    assert check.report.fd_growth <= 0
    assert _session_files_open(tmp_path) == 0


def test_ten_persistent_training_epochs(tmp_path) -> None:
    paths = write_h5_sessions(tmp_path, sessions=6, rows=120, width=64)
    dataset = HDF5SessionDataset(paths, key="betas", max_open_files=2)
    gc.collect()
    with LeakCheck(raise_on_leak=True, rss_tolerance=64 * MIB) as check:
        loader = create_dataloader(
            dataset, batch_size=32, shuffle="block", training=True, num_workers=2, seed=0
        )
        assert loader.persistent_workers
        rss = []
        for _ in range(10):
            seen = sum(len(batch) for batch in loader)
            assert seen == len(dataset)
            rss.append(sum(c.rss for c in snapshot().children if not c.helper))
        loader.close()
    workers_growth = (rss[-1] - rss[1]) / MIB
    print(
        f"\n10 persistent epochs: main RSS {check.report.rss_growth / MIB:+.1f} MiB, "
        f"workers RSS epoch 2 -> 10 {workers_growth:+.1f} MiB"
    )
    assert workers_growth < 32, "persistent workers grow epoch after epoch"
    assert _session_files_open(tmp_path) == 0
