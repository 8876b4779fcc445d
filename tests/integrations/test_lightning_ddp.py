"""loaderkit loaders under Lightning DDP: 2 CPU processes, gloo, Lightning's own launcher.

Each scenario is one ``python -m tests.integrations.lightning_ddp`` run (Lightning re-launches the
script for rank 1); the ranks write what they saw and the parent compares.
"""

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

pytest.importorskip("lightning.pytorch")

from tests.dist_utils import free_port

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def launch(module: str, out: Path, *args: str) -> list[dict[str, Any]]:
    """Run ``python -m module out *args`` (Lightning launches rank 1); read both ranks' JSON."""
    env = dict(os.environ, MASTER_PORT=str(free_port()), PYTHONWARNINGS="ignore")
    proc = subprocess.run(
        [sys.executable, "-m", module, str(out), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def run_ddp(tmp_path: Path, scenario: str, n: int, uds: bool, which: str = "loaderkit"):
    out = Path(tempfile.mkdtemp(prefix=f"{scenario}-{n}-{int(uds)}-{which}-", dir=tmp_path))
    args = (scenario, str(n), "1" if uds else "0", which)
    ranks = launch("tests.integrations.lightning_ddp", out, *args)
    # No worker processes left in either rank (rank 1, a child of rank 0, is not counted).
    assert ranks[0]["children"] == []
    assert ranks[1]["children"] == []
    return ranks


def exact(ranks: list[dict[str, Any]], key: str, n: int) -> None:
    """Every sample exactly once across ranks."""
    counts = Counter(i for r in ranks for i in r["seen"].get(key, []))
    assert sorted(counts) == list(range(n)), f"{key}: missing {set(range(n)) - set(counts)}"
    assert max(counts.values()) == 1, f"{key}: duplicated {[i for i, c in counts.items() if c > 1]}"


def single_process_order(n: int, batch_size: int, seed: int, epochs: int) -> list[list[list[int]]]:
    """The batches of a single-process loader (the elastic reference), per epoch."""
    from loaderkit import create_dataloader
    from tests.integrations.lit import IndexDataset

    with create_dataloader(
        IndexDataset(n), batch_size=batch_size, training=True, seed=seed
    ) as loader:
        return [[[int(i) for i in b[0]] for b in loader] for _ in range(epochs)]


def global_batches(ranks: list[dict[str, Any]], key: str, batch_size: int) -> list[list[int]]:
    """What both ranks trained on at each step, in rank order."""
    shards = [r["seen"][key] for r in ranks]
    steps = len(shards[0]) // batch_size + (len(shards[0]) % batch_size > 0)
    return [
        [i for shard in shards for i in shard[k * batch_size : (k + 1) * batch_size]]
        for k in range(steps)
    ]


def train_shards(
    ranks: list[dict[str, Any]], n: int, epoch: int, padding: int | None = None
) -> list[list[int]]:
    shards = [r["seen"][f"fit:train:{epoch}"] for r in ranks]
    union = set(shards[0]) | set(shards[1])
    assert union == set(range(n))  # covered
    overlap = set(shards[0]) & set(shards[1])
    # disjoint, but for the padding that gives every rank as many steps (DistributedSampler:
    # one sample when n is odd; ShardedBatchSampler: whole batches)
    assert len(overlap) <= (n % 2 if padding is None else padding)
    return shards


@pytest.mark.parametrize("uds", [True, False], ids=["use_distributed_sampler", "own_sampler"])
@pytest.mark.parametrize("n", [40, 41])
def test_ddp_hooks_train_shards_and_exact_evaluation(tmp_path: Path, n: int, uds: bool) -> None:
    ranks = run_ddp(tmp_path, "hooks", n, uds)
    for r in ranks:
        assert "error" not in r, r["error"]
        assert r["used_train"]["sampler"] == "ElasticSampler"  # kept: a DistributedSampler
        assert r["used_val"]["sampler"] == "ShardSampler"  # not re-wrapped by Lightning
        assert r["used_predict"]["type"] == "DataLoader"  # rebuilt, still loaderkit's
    orders = [train_shards(ranks, n, epoch) for epoch in range(2)]
    assert orders[0] != orders[1]  # a new order every epoch
    # Elastic: the global batches of 2 ranks x 4 are those of one process with batches of 8
    # (full ones; n=41 ends with one sample, which both ranks read to step together).
    reference = single_process_order(n, 8, 7, 2)
    for epoch in range(2):
        trained = global_batches(ranks, f"fit:train:{epoch}", 4)
        assert trained[: n // 8] == reference[epoch][: n // 8]
        tail = {i for b in reference[epoch][n // 8 :] for i in b}
        assert {i for b in trained[n // 8 :] for i in b} == tail
    if n == 41 and uds:  # same seed, same orders
        again = run_ddp(tmp_path, "hooks", n, uds)
        assert [r["seen"] for r in ranks] == [r["seen"] for r in again]
    for key in ("fit:val:0", "fit:val:1", "validate:val:0", "test:test:0"):
        exact(ranks, key, n)
    predicted = Counter(i for r in ranks for i in r["predict"])
    assert sorted(predicted) == list(range(n)) and max(predicted.values()) == 1


def test_ddp_block_shuffle_keeps_block_locality(tmp_path: Path) -> None:
    n = 64
    ranks = run_ddp(tmp_path, "block", n, True)
    for r in ranks:
        assert "error" not in r, r["error"]
        assert r["used_train"]["sampler"] == "BlockShuffleSampler"
        for batch in r["batches"]:  # contiguous rows, not reshuffled by a wrapper
            assert batch == list(range(batch[0], batch[0] + len(batch))), batch
        assert r["h5_open"] == []  # LoaderkitCallback closed every session file
    for epoch in range(2):
        exact(ranks, f"fit:train:{epoch}", n)
    for key in ("validate:val:0", "test:test:0"):
        exact(ranks, key, n)
    assert sorted(i for r in ranks for i in r["predict"]) == list(range(n))


def test_ddp_user_batch_sampler(tmp_path: Path) -> None:
    n = 41
    ranks = run_ddp(tmp_path, "batch_sampler", n, False)
    for r in ranks:
        assert "error" not in r, r["error"]
    for epoch in range(2):
        train_shards(ranks, n, epoch, padding=4)  # 11 batches of 4: one batch repeated
    for key in ("validate:val:0", "test:test:0"):
        exact(ranks, key, n)
    # Lightning cannot inject its sampler into a batch sampler loaderkit already sharded; the
    # documented setting is use_distributed_sampler=False. With True, Lightning says so.
    failing = run_ddp(tmp_path, "batch_sampler", n, True)
    for r in failing:
        assert "use_distributed_sampler=False" in r["error"]


def test_ddp_loaders_built_outside_the_hooks(tmp_path: Path) -> None:
    n = 40
    ranks = run_ddp(tmp_path, "outside", n, True)
    for r in ranks:
        assert "error" not in r, r["error"]
        used = r["used_train"]
        assert used["type"] == "DataLoader"
        assert used["sampler"] == "DistributedSampler"  # Lightning's, injected on rebuild
        assert used["seed"] == 7 and used["training"] is True
        assert used["owns_generator"] is True  # still reseeded from (seed, epoch)
        assert used["nested_worker_init"] is False
        assert used["worker_init_rank"] == r["rank"]  # seeded for this rank, not rank 0
    for epoch in range(2):
        train_shards(ranks, n, epoch)
    # worker random streams differ between ranks
    assert not set(ranks[0]["draws"]) & set(ranks[1]["draws"])


def test_ddp_callback_closes_everything_after_an_exception(tmp_path: Path) -> None:
    ranks = run_ddp(tmp_path, "fail", 40, True)
    for r in ranks:
        assert "boom in training_step" in r["error"]
        assert r["h5_open"] == []


def test_fabric_setup_dataloaders_keeps_loaderkit_samplers(tmp_path: Path) -> None:
    n = 41
    ranks = launch("tests.integrations.fabric_run", tmp_path, str(n))
    for r in ranks:
        assert r["train_sampler"] == "ElasticSampler"  # a DistributedSampler: kept by Fabric
        assert r["eval_sampler"] == "ShardSampler"  # not re-wrapped by Fabric
    train = Counter(i for r in ranks for i in r["train"])
    assert sorted(train) == list(range(n)) and sum(train.values()) == n + 1  # one padded
    evaluation = Counter(i for r in ranks for i in r["eval"])
    assert sorted(evaluation) == list(range(n)) and max(evaluation.values()) == 1  # exact
