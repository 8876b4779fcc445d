"""loaderkit loaders under Hugging Face Accelerate: 2 CPU processes launched with torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("accelerate")

from tests.dist_utils import free_port

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
N = 41


def run_accelerate(tmp_path: Path, mode: str) -> list[dict[str, Any]]:
    out = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=tmp_path))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        "-m",
        "tests.integrations.accelerate_run",
        str(out),
        mode,
        str(N),
    ]
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def covered(shards: list[list[int]]) -> Counter[int]:
    counts = Counter(i for shard in shards for i in shard)
    assert sorted(counts) == list(range(N)), f"missing {set(range(N)) - set(counts)}"
    return counts


@pytest.mark.parametrize("mode", ["prepared", "torch"])
def test_prepared_loaders_see_every_sample_every_epoch(tmp_path: Path, mode: str) -> None:
    """Parity with torch's DataLoader under prepare: Accelerate shards, loaderkit does not."""
    ranks = run_accelerate(tmp_path, mode)
    for epoch in range(2):
        counts = covered([r["train"][epoch] for r in ranks])
        # even_batches pads the last round by cycling to the start, as for torch's loader
        assert sum(counts.values()) - N < 2 * 4
    assert ranks[0]["train"][0] != ranks[0]["train"][1]  # a new order every epoch
    covered([r["eval"] for r in ranks])
    assert sorted(ranks[0]["gathered"]) == list(range(N))  # gather_for_metrics drops the pad
    # What survives prepare (documented in docs/frameworks.md): Accelerate's own set_epoch only.
    assert ranks[0]["survives"] == {
        "close": False,
        "plan": False,
        "epoch": False,
        "set_epoch": True,
    }
    if mode == "prepared":
        assert "accelerator.prepare(loader) shards" in ranks[0]["plan"]
        assert ranks[0]["warnings"] == []


def test_distributed_true_gives_loaderkit_shards_without_prepare(tmp_path: Path) -> None:
    ranks = run_accelerate(tmp_path, "own_shards")
    from loaderkit import create_dataloader
    from tests.integrations.lit import IndexDataset

    with create_dataloader(IndexDataset(N), batch_size=8, training=True, seed=3) as single:
        reference = [[int(i) for b in single for i in b[0]] for _ in range(2)]
    for epoch in range(2):
        counts = covered([r["train"][epoch] for r in ranks])
        assert sum(counts.values()) == N + 1  # the last sample, read by both ranks
        # Elastic: 2 ranks x 4 give the global batches of one process with batches of 8.
        shards = [r["train"][epoch] for r in ranks]
        steps = [shards[0][k : k + 4] + shards[1][k : k + 4] for k in range(0, (N - 1) // 2, 4)]
        assert [i for step in steps for i in step] == reference[epoch][: N - 1]
    counts = covered([r["eval"] for r in ranks])
    assert max(counts.values()) == 1  # exact evaluation shards
    assert sorted(ranks[0]["gathered"]) == list(range(N))
    for r in ranks:  # and it says not to prepare it
        assert any("do not pass it to accelerator.prepare" in w for w in r["warnings"])


def test_unprepared_auto_loader_warns_before_the_first_batch(tmp_path: Path) -> None:
    ranks = run_accelerate(tmp_path, "unprepared_auto")
    for r in ranks:
        assert sorted(r["eval"]) == list(range(N))  # every process reads every sample ...
        assert (
            sum("iterated directly: every process reads every sample" in w for w in r["warnings"])
            == 2
        )  # ... and each loader says so, once


def test_sample_seeding_under_prepare_warns(tmp_path: Path) -> None:
    ranks = run_accelerate(tmp_path, "sample_seeding")
    for epoch in range(2):
        covered([r["train"][epoch] for r in ranks])
    for r in ranks:
        assert any("no per-sample seeding" in w for w in r["warnings"])
