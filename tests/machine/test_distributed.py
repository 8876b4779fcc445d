"""Distributed sharding on a real torch.distributed (gloo) group of 2 and 3 processes."""

from __future__ import annotations

import itertools
import warnings
from collections import Counter
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DistributedSampler, SequentialSampler

from loaderkit import LoaderkitWarning, create_dataloader
from loaderkit.order.samplers import ShardedBatchSampler, ShardSampler
from tests.dist_utils import run_distributed
from tests.helpers import ReverseSampler, SquareDataset

pytestmark = pytest.mark.distributed


def _indices(loader: Any) -> list[int]:
    return [int(i) for batch in loader for i in batch[0]]


def _training_epochs(rank: int, world: int, n: int, seed: int | None) -> dict[str, Any]:
    loader = create_dataloader(
        SquareDataset(n), batch_size=2, training=True, seed=seed, num_workers=1
    )
    epochs = [_indices(loader) for _ in range(3)]
    loader.close()
    return {
        "sampler": type(loader.sampler).__name__,
        "epochs": epochs,
        "reason": loader.plan["sampler"].reason,
        "len": len(loader),
    }


def test_training_with_a_seed_uses_the_elastic_sampler(tmp_path) -> None:
    ranks = run_distributed(_training_epochs, 2, tmp_path, 10, 7)
    again = run_distributed(_training_epochs, 2, tmp_path, 10, 7)
    assert ranks == again  # the same across runs
    for r in ranks:
        assert r["sampler"] == "ElasticSampler"  # tests/order/test_elastic.py: across world sizes
        assert "rank" in r["reason"] and "seed" in r["reason"]
        assert "global batches" in r["reason"]
        assert r["len"] == 3
    for epoch in range(3):
        a, b = ranks[0]["epochs"][epoch], ranks[1]["epochs"][epoch]
        assert not set(a) & set(b)  # disjoint
        assert sorted(a + b) == list(range(10))  # complete
    # The order changes every epoch (loaderkit calls set_epoch on the sampler each pass).
    assert len({tuple(e) for e in ranks[0]["epochs"]}) == 3


def test_training_pads_like_distributed_sampler_when_uneven(tmp_path) -> None:
    ranks = run_distributed(_training_epochs, 3, tmp_path, 10, None)
    assert {r["sampler"] for r in ranks} == {"DistributedSampler"}  # no seed: torch's
    counts = Counter(i for r in ranks for i in r["epochs"][0])
    assert set(counts) == set(range(10))
    assert sum(counts.values()) == 12  # padded to 3 x 4: ranks must step together under DDP
    assert {len(r["epochs"][0]) for r in ranks} == {4}


def _evaluation(rank: int, world: int, n: int) -> dict[str, Any]:
    loader = create_dataloader(SquareDataset(n), batch_size=3, training=False, num_workers=2)
    out = {
        "sampler": type(loader.sampler).__name__,
        "indices": _indices(loader),
        "again": _indices(loader),
    }
    loader.close()
    return out


def test_evaluation_sees_every_sample_exactly_once(tmp_path) -> None:
    ranks = run_distributed(_evaluation, 3, tmp_path, 11)
    assert {r["sampler"] for r in ranks} == {"ShardSampler"}
    everything = [i for r in ranks for i in r["indices"]]
    assert sorted(everything) == list(range(11))  # no padded duplicates, nothing missing
    assert everything == list(range(11))  # contiguous shards in rank order
    assert all(r["indices"] == r["again"] for r in ranks)


def _disabled(rank: int, world: int) -> list[int]:
    loader = create_dataloader(
        SquareDataset(6), batch_size=3, training=True, seed=0, distributed=False
    )
    return sorted(_indices(loader))


def test_distributed_false_reads_everything_on_every_rank(tmp_path) -> None:
    assert run_distributed(_disabled, 2, tmp_path) == [list(range(6))] * 2


def _user_samplers(rank: int, world: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plain = create_dataloader(SquareDataset(4), sampler=ReverseSampler(4))
    out["plain_warning"] = [str(w.message) for w in caught if w.category is LoaderkitWarning]
    out["plain"] = _indices(plain)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sharded = create_dataloader(
            SquareDataset(4), sampler=DistributedSampler(SquareDataset(4), shuffle=False)
        )
    out["sharded_warning"] = [str(w.message) for w in caught if w.category is LoaderkitWarning]
    out["sharded"] = _indices(sharded)
    batches = create_dataloader(
        SquareDataset(10),
        training=True,
        batch_sampler=BatchSampler(SequentialSampler(range(10)), 3, False),
    )
    out["batch_sampler"] = type(batches.batch_sampler).__name__
    out["batches"] = [b[0].tolist() for b in batches]
    evaluation = create_dataloader(
        SquareDataset(10),
        training=False,
        batch_sampler=BatchSampler(SequentialSampler(range(10)), 3, False),
    )
    out["eval_batches"] = [b[0].tolist() for b in evaluation]
    return out


def test_user_samplers_and_batch_samplers(tmp_path) -> None:
    r0, r1 = run_distributed(_user_samplers, 2, tmp_path)
    # A sampler that does not shard is kept, with a warning naming the problem.
    assert r0["plain"] == r1["plain"] == [3, 2, 1, 0]
    assert any("does not split data between ranks" in w for w in r0["plain_warning"])
    # A distributed sampler is kept, silently.
    assert r0["sharded_warning"] == [] and sorted(r0["sharded"] + r1["sharded"]) == [0, 1, 2, 3]
    # A user batch_sampler is dealt to ranks: training pads to equal counts ...
    assert r0["batch_sampler"] == "ShardedBatchSampler"
    assert r0["batches"] == [[0, 1, 2], [6, 7, 8]]
    assert r1["batches"] == [[3, 4, 5], [9]]
    # ... evaluation never repeats a batch.
    assert sorted(i for b in r0["eval_batches"] + r1["eval_batches"] for i in b) == list(range(10))


def _seed_must_match(rank: int, world: int) -> list[int]:
    # Without a seed loaderkit uses DistributedSampler's default seed (0) on every rank, so the
    # shards stay disjoint even though the ranks' torch RNGs differ.
    torch.manual_seed(1000 + rank)
    loader = create_dataloader(SquareDataset(8), batch_size=4, training=True)
    return _indices(loader)


def test_no_seed_still_gives_disjoint_shards(tmp_path) -> None:
    a, b = run_distributed(_seed_must_match, 2, tmp_path)
    assert sorted(a + b) == list(range(8))


def _world_info(rank: int, world: int) -> tuple[int, int, bool]:
    from loaderkit.machine.distributed import dist_info

    info = dist_info()
    return info.rank, info.world_size, info.is_distributed and dist.is_initialized()


def test_dist_info_reads_the_group(tmp_path) -> None:
    assert run_distributed(_world_info, 2, tmp_path) == [(0, 2, True), (1, 2, True)]


# ---------------------------------------------------------------- samplers without a group


def test_shard_sampler_is_exact_and_contiguous() -> None:
    for n in range(0, 13):
        for world in (1, 2, 3, 5):
            shards = [
                list(ShardSampler(range(n), num_replicas=world, rank=r)) for r in range(world)
            ]
            assert [i for s in shards for i in s] == list(range(n))
            assert max(map(len, shards)) - min(map(len, shards)) <= 1
            assert [
                len(ShardSampler(range(n), num_replicas=world, rank=r)) for r in range(world)
            ] == list(map(len, shards))


def test_shard_sampler_shuffles_consistently() -> None:
    shards = []
    for rank in range(3):
        sampler = ShardSampler(range(20), num_replicas=3, rank=rank, shuffle=True, seed=4)
        sampler.set_epoch(2)
        shards.append(list(sampler))
    assert sorted(i for s in shards for i in s) == list(range(20))
    assert [i for s in shards for i in s] != list(range(20))


@pytest.mark.parametrize("even", [True, False])
def test_sharded_batch_sampler_counts(even: bool) -> None:
    for total in range(0, 12):
        batches = [[i] for i in range(total)]
        for world in (1, 2, 3, 4):
            shards = [
                list(ShardedBatchSampler(batches, num_replicas=world, rank=r, even=even))
                for r in range(world)
            ]
            for r, shard in enumerate(shards):
                assert len(shard) == len(
                    ShardedBatchSampler(batches, num_replicas=world, rank=r, even=even)
                )
            flat = sorted(b[0] for s in shards for b in s)
            if even:
                assert len({len(s) for s in shards}) == 1
                assert set(flat) == set(range(total))
            else:
                assert flat == list(range(total))


def test_sharded_batch_sampler_rejects_bad_ranks() -> None:
    from loaderkit import ConfigError

    with pytest.raises(ConfigError, match="rank"):
        ShardedBatchSampler([[0]], num_replicas=2, rank=2)
    with pytest.raises(ConfigError, match="num_replicas"):
        ShardSampler(range(3), num_replicas=0, rank=0)


# ---------------------------------------------------------------- HDF5 sessions across ranks


def _hdf5_rank(rank: int, world: int, paths: list[str], partition: str) -> dict[str, Any]:
    from loaderkit import BlockShuffleSampler, HDF5SessionDataset

    dataset = HDF5SessionDataset(paths, key="betas", max_open_files=len(paths))
    if partition == "auto":  # what create_dataloader(shuffle="block") builds
        loader = create_dataloader(dataset, batch_size=8, shuffle="block", seed=3)
    else:
        sampler = BlockShuffleSampler(dataset, seed=3, partition=partition)
        loader = create_dataloader(dataset, batch_size=8, sampler=sampler)
    planned = dataset.handles.file_pool_info().opens  # the plan row hdf5_reads opened session 0
    indices = [int(x) for batch in loader for x in batch[:, 0]]  # column 0 = s * 1000 + row
    opens = (
        dataset.handles.file_pool_info().opens - planned
    )  # files opened to read the rank's share
    dataset.close()
    return {"values": indices, "opens": opens, "sampler": type(loader.sampler).__name__}


@pytest.mark.parametrize("partition", ["auto", "session"])
def test_hdf5_block_shards_and_session_partition(tmp_path, partition) -> None:
    from tests.helpers import write_h5_sessions

    paths = write_h5_sessions(tmp_path, sessions=6, rows=48)
    ranks = run_distributed(_hdf5_rank, 2, tmp_path, paths, partition)
    values = [set(r["values"]) for r in ranks]
    everything = {s * 1000 + row for s in range(6) for row in range(48)}
    assert not values[0] & values[1]  # disjoint
    assert values[0] | values[1] == everything  # complete
    assert {r["sampler"] for r in ranks} == {"BlockShuffleSampler"}
    for r in ranks:  # each rank reads runs of consecutive rows of one session
        sequence = r["values"]
        consecutive = sum(b - a == 1 for a, b in itertools.pairwise(sequence))
        assert consecutive >= len(sequence) * 0.8
    opens = [r["opens"] for r in ranks]
    print(f"\nfiles opened per rank ({partition}): {opens}")
    if partition == "session":
        assert opens == [3, 3]  # whole sessions per rank: each opens only its own files
        sessions = [{v // 1000 for v in r["values"]} for r in ranks]
        assert not sessions[0] & sessions[1]
    else:
        assert opens == [6, 6]  # blocks from every session on every rank


# ---------------------------------------------------------------- the helper on CUDA hosts


@pytest.mark.slow  # launches ranks in fresh interpreters
def test_ranks_are_spawned_once_cuda_is_initialised(monkeypatch, tmp_path) -> None:
    from tests import dist_utils

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert dist_utils.rank_start_method() == "fork"
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert dist_utils.rank_start_method() == "spawn"
    # A real spawned group: the functions these tests run are importable by the children.
    assert run_distributed(_world_info, 2, tmp_path) == [(0, 2, True), (1, 2, True)]
