"""``WeightedSampler``: weighted draws from ``(seed, epoch)``, every worker method, ranks, resume.

A sample of ``Indices`` is its own index, so a loader's batches are exactly the sampler's
draws. Distributed runs are real gloo groups (``tests.dist_utils``); the global batch of step
``k`` is what all ranks receive at step ``k``, concatenated in rank order.
"""

from __future__ import annotations

import inspect
import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, DistributedSampler, WeightedRandomSampler

from loaderkit import ArgumentTypeError, ConfigError, DataLoader, WeightedSampler
from loaderkit.order.weighted import weighted_draws
from tests.dist_utils import run_distributed
from tests.helpers import tiered

#: 60 samples, 50 draws an epoch, global batches of 8 (the last global batch has 2 draws).
N, DRAWS, GLOBAL, SEED, EPOCHS, STOP = 60, 50, 8, 11, 2, 3
WEIGHTS = np.linspace(0.0, 3.0, N)  # sample 0 never drawn

Batches = list[list[int]]


class Indices(Dataset[int]):
    """Sample ``i`` is ``i``."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> int:
        return index


def make(world: int = 1, num_workers: int = 0, **kwargs: Any) -> DataLoader:
    weights = kwargs.pop("weights", WEIGHTS)
    replacement = kwargs.pop("replacement", True)
    sampler = WeightedSampler(weights, DRAWS, replacement=replacement, seed=kwargs.pop("s", None))
    kwargs.setdefault("seed", SEED)
    return DataLoader(
        Indices(), batch_size=GLOBAL // world, sampler=sampler, num_workers=num_workers, **kwargs
    )


def passes(loader: DataLoader, count: int = EPOCHS) -> list[Batches]:
    return [[b.tolist() for b in loader] for _ in range(count)]


def interrupted(loader: DataLoader, stop: int = STOP) -> dict[str, Any]:
    iterator = iter(loader)
    for _ in range(stop):
        next(iterator)
    state = loader.state_dict()
    del iterator
    return state


def through_disk(state: dict[str, Any]) -> dict[str, Any]:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded: dict[str, Any] = torch.load(buffer, weights_only=True)
    return loaded


@pytest.fixture(scope="module")
def reference() -> list[Batches]:
    with make() as loader:
        return passes(loader)


# ---------------------------------------------------------------- the draws


def test_balanced_weights_balance_a_90_9_1_split() -> None:
    labels = np.repeat([0, 1, 2], [900, 90, 10])
    counts = np.bincount(labels)
    sampler = WeightedSampler(1.0 / (3 * counts[labels]), num_samples=30_000, seed=0)
    drawn = np.bincount(labels[np.fromiter(sampler, np.int64)], minlength=3) / 30_000
    assert np.all(np.abs(drawn - 1 / 3) < 0.03), drawn  # unweighted: 0.9 / 0.09 / 0.01


def test_draws_follow_the_weights_like_torch() -> None:
    """The frequency of each index is its weight's share (as WeightedRandomSampler's)."""
    weights = np.array([1.0, 2.0, 0.0, 7.0])
    ours = np.bincount(np.fromiter(WeightedSampler(weights, 20_000, seed=1), np.int64), None, 4)
    theirs = np.bincount(list(WeightedRandomSampler(weights.tolist(), 20_000)), minlength=4)
    share = weights / weights.sum()
    assert np.all(np.abs(ours / 20_000 - share) < 0.015), ours
    assert np.all(np.abs(theirs / 20_000 - share) < 0.015), theirs
    assert ours[2] == 0


def test_new_draws_every_epoch_the_same_for_a_seed() -> None:
    a, b = WeightedSampler(WEIGHTS, DRAWS, seed=3), WeightedSampler(WEIGHTS, DRAWS, seed=3)
    first = list(a)
    assert first == list(b) == list(a)  # reproducible from (seed, epoch) alone
    a.set_epoch(1)
    assert list(a) != first
    b.set_epoch(1)
    assert list(a) == list(b)
    assert list(WeightedSampler(WEIGHTS, DRAWS, seed=4)) != first


def test_without_replacement_no_index_repeats() -> None:
    weights = np.array([0.0, 1.0, 5.0, 0.5, 2.0, 0.0, 1.0])
    for epoch in range(5):
        sampler = WeightedSampler(weights, 5, replacement=False, seed=epoch)
        drawn = list(sampler)
        assert sorted(drawn) == [1, 2, 3, 4, 6]  # every index with a weight, once
    firsts = [next(iter(WeightedSampler(weights, 2, False, seed=s))) for s in range(400)]
    assert np.bincount(firsts, minlength=7)[2] > 400 * 0.45  # 5 / 9.5 of the first draws


def test_seed_none_takes_the_loaders_seed(reference: list[Batches]) -> None:
    with make(seed=SEED) as loader:
        assert loader.sampler.seed == SEED
        assert passes(loader) == reference
    with make(seed=SEED + 1) as loader:
        assert passes(loader) != reference
    with make(seed=SEED + 1, s=SEED) as loader:  # the sampler's own seed wins
        assert loader.sampler.seed == SEED
        assert passes(loader) == reference
    flat = [i for batch in reference[0] for i in batch]
    assert flat == weighted_draws(WEIGHTS, DRAWS, True, SEED, 0).tolist()


def test_the_plan_shows_the_sampler() -> None:
    with make() as loader:
        entry = loader.plan["sampler"]
        assert entry.value is loader.sampler
        assert f"seed {SEED} (the loader's seed)" in entry.reason
        assert "WeightedSampler" in loader.describe()


# ---------------------------------------------------------------- workers and resume


# against 0 workers (the caller's thread): fork workers, worker threads; spawn (slow tier)
# sends the dataset pickled, the sampler stays in the main process all the same
@pytest.mark.parametrize(
    ("method", "context"),
    tiered(
        [("process", "fork"), ("thread", None), ("process", "spawn")],
        {("process", "fork"), ("thread", None)},
    ),
)
def test_the_same_batches_for_every_worker_method(
    reference: list[Batches], method: str, context: str | None
) -> None:
    with make(num_workers=2, worker_method=method, multiprocessing_context=context) as loader:
        assert passes(loader) == reference


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch_is_exact(reference: list[Batches], workers: int) -> None:
    with make() as loader:
        state = through_disk(interrupted(loader))
    assert state["start"]["sampler"]["weights"] == WeightedSampler(WEIGHTS, DRAWS).digest
    context = "fork" if workers else None
    with make(num_workers=workers, multiprocessing_context=context) as resumed:
        resumed.load_state_dict(state)
        assert passes(resumed) == [reference[0][STOP:], reference[1]]


def test_resume_keeps_a_seed_drawn_from_torch() -> None:
    """No seed anywhere: the seed drawn from torch's RNG travels in the state."""
    torch.manual_seed(0)
    with make(seed=None) as loader:
        first = passes(loader, 1)[0]
        between = loader.state_dict()  # before epoch 1
        second = passes(loader, 1)[0]
    torch.manual_seed(0)
    with make(seed=None) as loader:
        state = interrupted(loader)
    torch.manual_seed(99)  # the resumed process's RNG is another
    with make(seed=None) as resumed:
        resumed.load_state_dict(state)
        assert passes(resumed, 1)[0] == first[STOP:]
    with make(seed=None) as resumed:
        resumed.load_state_dict(between)
        assert passes(resumed, 1)[0] == second


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"weights": WEIGHTS[::-1].copy()}, "the WeightedSampler's weights differ"),
        ({"replacement": False}, "the WeightedSampler's replacement is False here"),
        ({"s": 5}, "the WeightedSampler's seed is 5 here and 11"),
    ],
)
def test_a_state_of_other_draws_is_refused_by_name(change: dict[str, Any], match: str) -> None:
    with make() as loader:
        state = interrupted(loader)
    with make(**change) as other, pytest.raises(ConfigError, match=match):
        other.load_state_dict(state)


# ---------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    ("weights", "num_samples", "replacement", "error", "match"),
    [
        ([1.0, -0.5], 2, True, ConfigError, r"weights\[1\] is -0.5"),
        ([1.0, float("nan")], 2, True, ConfigError, r"weights\[1\] is nan"),
        ([float("inf"), 1.0], 2, True, ConfigError, r"weights\[0\] is inf"),
        ([0.0, 0.0], 2, True, ConfigError, "all 2 weights are 0"),
        ([[1.0, 2.0]], 2, True, ConfigError, r"weights must be 1-D .* shape \(1, 2\)"),
        ([], 2, True, ConfigError, r"weights must be 1-D .* shape \(0,\)"),
        (["a", "b"], 2, True, ArgumentTypeError, "weights must be a 1-D sequence"),
        ([1.0, 1.0], 0, True, ConfigError, "num_samples"),
        ([1.0, 1.0], True, True, ArgumentTypeError, "num_samples"),
        ([1.0, 1.0], 2, "no", ArgumentTypeError, "replacement must be True or False"),
        ([1.0, 0.0, 2.0], 3, False, ConfigError, r"num_samples=3 .* only 2 of the 3 weights"),
    ],
)
def test_invalid_arguments_are_named(
    weights: Any, num_samples: Any, replacement: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        WeightedSampler(weights, num_samples, replacement=replacement)


@pytest.mark.parametrize("size", [N - 1, N + 1])
def test_weights_of_another_length_than_the_dataset_are_refused(size: int) -> None:
    sampler = WeightedSampler(np.ones(size), DRAWS)
    with pytest.raises(ConfigError, match=f"weights has {size} weights, .* has {N} samples"):
        DataLoader(Indices(), batch_size=4, sampler=sampler)


def test_what_the_caller_set_wins_over_the_loader() -> None:
    sampler = WeightedSampler(WEIGHTS, DRAWS, seed=1, batch_size=3, drop_last=True)
    with DataLoader(Indices(), batch_size=4, sampler=sampler, seed=9) as loader:
        assert (sampler.seed, sampler.batch_size, sampler.drop_last) == (1, 3, True)
        assert len(sampler) == 48  # 16 global batches of 3, the partial one dropped
        assert loader.plan["sampler"].reason.count("seed 1 (as given)") == 1


def test_weights_from_a_tensor_or_array_and_torch_argument_names() -> None:
    assert list(WeightedSampler(torch.tensor([0.0, 1.0]), 3, seed=0)) == [1, 1, 1]
    ours = list(inspect.signature(WeightedSampler).parameters)
    theirs = list(inspect.signature(WeightedRandomSampler).parameters)
    assert ours[:3] == theirs[:3] == ["weights", "num_samples", "replacement"]


# ---------------------------------------------------------------- ranks


def merge(per_rank: list[Batches]) -> Batches:
    steps = {len(batches) for batches in per_rank}
    assert len(steps) == 1, f"ranks took {steps} steps"  # DDP needs the same count
    return [[i for batches in per_rank for i in batches[k]] for k in range(steps.pop())]


def _rank(rank: int, world: int, earlier: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with make(world) as loader:
        sampler = loader.sampler
        kept = isinstance(sampler, DistributedSampler)
        out["place"] = (sampler.num_replicas, sampler.rank, len(sampler), kept)
        out["batches"] = passes(loader)
    with make(world) as loader:
        out["state"] = interrupted(loader)
    if earlier is not None:
        with make(world, num_workers=1, multiprocessing_context="fork") as loader:
            loader.load_state_dict(earlier)
            out["resumed"] = passes(loader)
    return out


@pytest.mark.distributed
def test_two_ranks_read_the_global_batches_of_one_and_resume_across(
    reference: list[Batches], tmp_path: Path
) -> None:
    with make() as loader:
        single_state = interrupted(loader)
    ranks = run_distributed(_rank, 2, tmp_path, single_state)
    # (num_replicas, rank, len): a DistributedSampler that Lightning keeps, not wraps again
    assert [r["place"] for r in ranks] == [(2, 0, 25, True), (2, 1, 25, True)]
    for epoch in range(EPOCHS):
        assert merge([r["batches"][epoch] for r in ranks]) == reference[epoch], epoch
    rest = [reference[0][STOP:], reference[1]]
    # 1 rank -> 2 ranks
    assert [merge([r["resumed"][e] for r in ranks]) for e in range(EPOCHS)] == rest
    # 2 ranks -> 1 rank
    with make() as loader:
        loader.load_state_dict(ranks[0]["state"])
        assert passes(loader) == rest
