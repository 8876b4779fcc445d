"""Elastic order: the same global batches on 1, 2 or 4 gloo ranks, and resume across them.

Every scenario uses ``seed=11``, a global batch of 8 (``batch_size = 8 // world_size``),
``training=True``, ``sample_seeding=True`` and 96 samples, for ``shuffle=True`` over a map
dataset and ``shuffle="block"`` over an ``HDF5SessionDataset`` of one file of 96 rows. A sample
is ``(index, draw)``: the draw is taken from torch's RNG while the sample is produced, so equal
samples mean equal seeded draws too. The global batch of step ``k`` is what all ranks receive
at step ``k``, concatenated in rank order.

The ranks are real ``torch.distributed`` gloo groups (``tests.dist_utils``). One group per
world size produces its global batches and its rank-0 states and resumes the states of the
world size before it (2 -> 4); the single process resumes 4 -> 1 and 2 -> 1.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from loaderkit import ConfigError, DataLoader, HDF5SessionDataset
from loaderkit.order.samplers import ElasticSampler, ShardedBatchSampler, global_batch_positions
from tests.dist_utils import run_distributed

pytestmark = pytest.mark.distributed

N, GLOBAL, SEED, EPOCHS = 96, 8, 11, 2
#: Batches (per rank, i.e. global batches) of epoch 0 read before the state is taken.
STOP = 5

Sample = tuple[int, float]
Batches = list[list[Sample]]


class Draws(Dataset[torch.Tensor]):
    """Sample ``i`` is ``[i, u]`` with ``u`` drawn from torch's RNG (seeded per sample)."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([float(index), torch.rand(()).item()], dtype=torch.float64)


class DrawSessions(HDF5SessionDataset):
    """Rows of one session file; each sample is ``[row value, u]`` with ``u`` from torch."""

    def transform(self, sample: Any, index: int) -> Any:
        return np.array([float(sample[0]), torch.rand(()).item()])


def write_file(root: Path) -> str:
    import h5py

    path = root / "session.h5"
    if not path.exists():
        with h5py.File(path, "w") as f:
            f["x"] = np.repeat(np.arange(N, dtype=np.float32)[:, None], 4, axis=1)
    return str(path)


def make(kind: str, world: int, path: str, num_workers: int = 0) -> DataLoader:
    common: dict[str, Any] = {
        "batch_size": GLOBAL // world,
        "training": True,
        "seed": SEED,
        "sample_seeding": True,
        "num_workers": num_workers,
    }
    if kind == "block":
        dataset = DrawSessions([path], key="x", max_open_files=1)
        return DataLoader(dataset, shuffle="block", **common)
    return DataLoader(Draws(), **common)


def samples(batch: torch.Tensor) -> list[Sample]:
    return [(int(i), float(u)) for i, u in batch.tolist()]


def passes(loader: DataLoader, count: int) -> list[Batches]:
    return [[samples(b) for b in loader] for _ in range(count)]


def merge(per_rank: list[Batches]) -> Batches:
    """Global batches from each rank's batches of one pass (rank order within a step)."""
    steps = {len(batches) for batches in per_rank}
    assert len(steps) == 1, f"ranks took {steps} steps"  # DDP needs the same count
    return [[s for batches in per_rank for s in batches[k]] for k in range(steps.pop())]


def interrupted_state(loader: DataLoader) -> dict[str, Any]:
    """The state after STOP batches of epoch 0 (as rank 0 would checkpoint it)."""
    iterator = iter(loader)
    for _ in range(STOP):
        next(iterator)
    state = loader.state_dict()
    del iterator
    return state


def _world(rank: int, world: int, root: str, earlier: dict[str, Any]) -> dict[str, Any]:
    """One rank of a group: its batches, its state, and the rest resumed from ``earlier``."""
    path = write_file(Path(root)) if rank == 0 else str(Path(root) / "session.h5")
    torch.distributed.barrier()  # the file exists on every rank
    out: dict[str, Any] = {}
    for kind in ("shuffle", "block"):
        workers = 1 if (world == 2 and kind == "shuffle") else 0  # any num_workers
        with make(kind, world, path, workers) as loader:
            out[f"{kind}:sampler"] = type(loader.sampler).__name__
            out[f"{kind}:batches"] = passes(loader, EPOCHS)
        with make(kind, world, path) as loader:
            out[f"{kind}:state"] = interrupted_state(loader)
        if kind in earlier:
            with make(kind, world, path) as loader:
                loader.load_state_dict(earlier[kind])
                out[f"{kind}:resumed"] = passes(loader, EPOCHS)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Any]:
    """Global batches and rank-0 states at world 1 (one process), 1 (group), 2 and 4."""
    root = tmp_path_factory.mktemp("elastic")
    path = write_file(root)
    out: dict[int, Any] = {}
    single: dict[str, Any] = {}
    for kind in ("shuffle", "block"):
        with make(kind, 1, path, num_workers=2) as loader:
            single[f"{kind}:batches"] = passes(loader, EPOCHS)
        with make(kind, 1, path) as loader:
            single[f"{kind}:state"] = interrupted_state(loader)
    out[0] = single  # 0: a plain process, no torch.distributed
    out[1] = run_distributed(_world, 1, root, str(root), {})
    out[2] = run_distributed(_world, 2, root, str(root), {})
    from_2 = {kind: out[2][0][f"{kind}:state"] for kind in ("shuffle", "block")}
    out[4] = run_distributed(_world, 4, root, str(root), from_2)
    out[-1] = path
    return out


def global_batches(run: Any, key: str) -> list[Batches]:
    if isinstance(run, dict):  # the plain process
        return run[key]
    return [merge([rank[key][e] for rank in run]) for e in range(EPOCHS)]


@pytest.mark.parametrize("kind", ["shuffle", "block"])
def test_global_batches_do_not_depend_on_the_world_size(runs: dict[int, Any], kind: str) -> None:
    reference = global_batches(runs[0], f"{kind}:batches")
    assert [len(epoch) for epoch in reference] == [N // GLOBAL] * EPOCHS
    for epoch in reference:  # each epoch is a permutation of the dataset
        assert sorted(i for batch in epoch for i, _ in batch) == list(range(N))
    assert reference[0] != reference[1]  # a new order every epoch
    for world in (1, 2, 4):
        assert global_batches(runs[world], f"{kind}:batches") == reference, f"world {world}"
    samplers = {rank[f"{kind}:sampler"] for rank in runs[4]}
    assert samplers == {"ElasticSampler" if kind == "shuffle" else "BlockShuffleSampler"}


def test_block_ranks_read_contiguous_rows(runs: dict[int, Any]) -> None:
    """A rank's part of a global batch is contiguous in the block order: few runs per batch."""
    for rank in runs[2]:
        for epoch in rank["block:batches"]:
            runs_per_batch = [
                1 + sum(b[0] - a[0] != 1 for a, b in itertools.pairwise(batch)) for batch in epoch
            ]
            assert np.mean(runs_per_batch) <= 1.5, runs_per_batch  # 4 rows, blocks of 16


def _rest(reference: list[Batches]) -> list[Batches]:
    """What the uninterrupted run reads after STOP batches of epoch 0: that epoch's rest,
    then the next epoch (the resumed loader's two passes)."""
    return [reference[0][STOP:], reference[1]]


@pytest.mark.parametrize("kind", ["shuffle", "block"])
def test_resume_from_2_ranks_on_4(runs: dict[int, Any], kind: str) -> None:
    reference = global_batches(runs[0], f"{kind}:batches")
    resumed = global_batches(runs[4], f"{kind}:resumed")
    assert resumed == _rest(reference)


@pytest.mark.parametrize(("kind", "source"), [("shuffle", 4), ("block", 4), ("block", 2)])
def test_resume_on_one_process(runs: dict[int, Any], kind: str, source: int) -> None:
    reference = global_batches(runs[0], f"{kind}:batches")
    state = runs[source][0][f"{kind}:state"]
    assert (state["epoch"], state["batches_yielded"]) == (0, STOP)
    assert state["loader"]["global_batch_size"] == GLOBAL
    with make(kind, 1, runs[-1], num_workers=1) as loader:
        loader.load_state_dict(state)
        assert passes(loader, EPOCHS) == _rest(reference)


def test_states_of_every_world_size_agree(runs: dict[int, Any]) -> None:
    """Rank 0's state at any world size points at the same global batch."""
    for kind in ("shuffle", "block"):
        states = [runs[0][f"{kind}:state"]] + [runs[w][0][f"{kind}:state"] for w in (1, 2, 4)]
        assert {(s["epoch"], s["batches_yielded"]) for s in states} == {(0, STOP)}
        assert {s["loader"]["global_batch_size"] for s in states} == {GLOBAL}
        assert len({repr(s["loader"]["order"]) for s in states}) == 1


# ---------------------------------------------------------------- another global batch


def test_another_global_batch_resumes_where_exact_else_refuses(runs: dict[int, Any]) -> None:
    path = runs[-1]
    state = runs[2][0]["shuffle:state"]  # 5 global batches of 8 = 40 samples read
    reference = [s for batch in global_batches(runs[0], "shuffle:batches")[0] for s in batch]
    common = {"training": True, "seed": SEED, "sample_seeding": True}
    with DataLoader(Draws(), batch_size=4, **common) as loader:  # global batch 4: exact
        loader.load_state_dict(state)
        rest = [s for batch in loader for s in samples(batch)]
    assert rest == reference[40:]
    with pytest.raises(ConfigError, match=r"global batch of 8 .* global batch is 12"):
        DataLoader(Draws(), batch_size=12, **common).load_state_dict(state)
    block = runs[4][0]["block:state"]  # 40 samples read: global batch 16 is not exact
    loader = DataLoader(
        DrawSessions([path], key="x", max_open_files=1), shuffle="block", batch_size=16, **common
    )
    with pytest.raises(ConfigError, match=r"global batch of 8 .* global batch is 16"):
        loader.load_state_dict(block)
    loader.close()


def test_a_state_of_another_order_is_still_refused(runs: dict[int, Any]) -> None:
    """Elastic resume needs the same order: no seed, or another seed, is refused as before."""
    state = runs[2][0]["shuffle:state"]
    with pytest.raises(ConfigError, match="seed is 11 in the state and 12 here"):
        DataLoader(
            Draws(), batch_size=8, training=True, seed=12, sample_seeding=True
        ).load_state_dict(state)
    with pytest.raises(ConfigError, match="world size"):
        DataLoader(Draws(), batch_size=8, shuffle=True, sample_seeding=True).load_state_dict(state)


# ---------------------------------------------------------------- the tail, both ways


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("n", [0, 1, 3, 7, 8, 13, 21, 24])
def test_the_last_partial_global_batch(n: int, drop_last: bool) -> None:
    """drop_last=True drops it; False splits it evenly, padding only a rank left empty."""
    batch_size_of = {1: 8, 2: 4, 4: 2}
    views = {}
    for world, batch in batch_size_of.items():
        ranks = [global_batch_positions(n, batch, world, r, drop_last) for r in range(world)]
        lengths = {
            len(
                ElasticSampler(
                    range(n), batch_size=batch, num_replicas=world, rank=r, drop_last=drop_last
                )
            )
            for r in range(world)
        }
        assert lengths <= {len(p) for p in ranks}
        steps = [-(-len(p) // batch) for p in ranks]
        assert len(set(steps)) == 1  # every rank takes the same number of steps
        full = n // 8
        body = [p[: full * batch].tolist() for p in ranks]
        tail = [p[full * batch :].tolist() for p in ranks]
        merged = [i for k in range(full) for b in body for i in b[k * batch : (k + 1) * batch]]
        assert merged == list(range(full * 8))  # full global batches: the same at every size
        rest = n - full * 8
        if drop_last or rest == 0:
            assert tail == [[]] * world
        else:
            sizes = [len(t) for t in tail]
            assert max(sizes) - min(sizes) <= 1
            distinct = [i for t in tail for i in t]
            if rest >= world:  # split evenly, in order: the same last global batch
                assert distinct == list(range(full * 8, n))
            else:  # fewer samples than ranks: ranks left empty repeat one of them
                assert set(distinct) == set(range(full * 8, n)) and sizes == [1] * world
        views[world] = merged
    assert len(set(map(tuple, views.values()))) == 1


def test_elastic_sampler_single_rank_is_the_single_process_order() -> None:
    for workers in (0, 2):
        with DataLoader(
            list(range(50)), batch_size=4, training=True, seed=3, num_workers=workers
        ) as loader:
            for epoch in range(3):
                sampler = ElasticSampler(range(50), batch_size=4, num_replicas=1, rank=0, seed=3)
                sampler.set_epoch(epoch)
                assert [int(i) for b in loader for i in b] == list(sampler)


def test_user_batch_sampler_full_rounds_are_elastic() -> None:
    """A user batch sampler of G / world batches over one order: full rounds match."""
    order = list(range(37))

    def rounds(world: int) -> list[list[int]]:
        batch = GLOBAL // world
        batches = [order[i : i + batch] for i in range(0, len(order), batch)]
        ranks = [
            list(ShardedBatchSampler(batches, num_replicas=world, rank=r)) for r in range(world)
        ]
        return [[i for r in range(world) for i in ranks[r][k]] for k in range(len(order) // GLOBAL)]

    assert rounds(1) == rounds(2) == rounds(4)


# ---------------------------------------------------------------- block locality


def test_elastic_block_order_keeps_block_locality(tmp_path: Path) -> None:
    """benchmarks/elastic_blocks.py --quick: slab reads and chunks per batch within 1.1x of
    the per-rank block sampler (index-level counts, so exact on any machine)."""
    import json
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "elastic_blocks.py"
    out = tmp_path / "locality.json"
    done = subprocess.run(
        [sys.executable, str(script), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    large = [row for row in rows if row["data"].startswith("40x750")]
    assert large and all(row["reads_ratio"] <= 1.1 for row in large), large
    assert all(row["chunks_ratio"] <= 1.1 for row in large if row["chunks_ratio"] is not None)
    assert all(row["reads_ratio"] <= 1.25 for row in rows), rows  # small files: more noise


# ---------------------------------------------------------------- which loaders are elastic


def test_policy_builds_the_elastic_sampler_for_seeded_training(make_platform: Any) -> None:
    from loaderkit.machine.distributed import DistInfo
    from loaderkit.policy import DatasetFacts, LoaderRequest, resolve

    dist = DistInfo(initialized=True, rank=1, world_size=2)
    platform = make_platform()
    seeded = resolve(LoaderRequest(training=True, seed=3), DatasetFacts(), platform, dist)
    assert seeded.sampler_choice == "elastic" and seeded.sampler_shuffle is True
    unseeded = resolve(LoaderRequest(training=True), DatasetFacts(), platform, dist)
    assert unseeded.sampler_choice == "distributed"  # torch's DistributedSampler, as before
    evaluation = resolve(LoaderRequest(training=False, seed=3), DatasetFacts(), platform, dist)
    assert evaluation.sampler_choice == "exact_shard"  # evaluation keeps its exact shards


def test_elastic_order_of_single_process_loaders() -> None:
    from loaderkit.order.resume import elastic_order

    def order(**kwargs: Any) -> Any:
        found = elastic_order(DataLoader(Draws(), batch_size=4, **kwargs))
        return None if found is None else (found.key["kind"], found.global_batch_size)

    assert order(training=True, seed=1) == ("shuffle", 4)
    assert order(shuffle=False, training=True, seed=1) == ("sequential", 4)
    assert order(training=True) is None  # no seed
    assert order(training=True, seed=1, generator=torch.Generator()) is None  # yours orders it
    assert order(training=False, seed=1) is None  # evaluation
