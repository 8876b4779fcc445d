"""Seeding: validated seeds, per-worker/rank/epoch streams, per-sample seeding, determinism."""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import pytest
import torch

from loaderkit import (
    check_determinism,
    create_dataloader,
    make_generator,
    seed_everything,
    seed_worker,
    worker_rng,
)
from loaderkit.order.seeding import SampleSeeder, epoch_seed, validate_seed
from tests.dist_utils import run_distributed
from tests.helpers import ClosableDataset, FlagDataset, RandomDataset, set_worker_flag, tiered

BAD_SEEDS = [
    (True, TypeError),
    (3.0, TypeError),
    ("3", TypeError),
    (None, TypeError),
    (-1, ValueError),
    (2**64, ValueError),
]


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(("seed", "error"), BAD_SEEDS)
def test_bad_seeds_are_rejected_everywhere(seed: Any, error: type[Exception]) -> None:
    for call in (seed_everything, make_generator, validate_seed):
        with pytest.raises(error, match=r"\[0, 2\*\*64 - 1\]"):
            call(seed)
    if seed is not None:
        with pytest.raises(error, match="seed"):
            create_dataloader(RandomDataset(), seed=seed)


def test_accepted_seeds() -> None:
    assert validate_seed(0) == 0
    assert validate_seed(2**64 - 1) == 2**64 - 1
    assert validate_seed(np.int64(5)) == 5
    assert isinstance(validate_seed(np.uint32(5)), int)


# ---------------------------------------------------------------- seed_everything


def _draws() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), float(torch.rand(1))


@pytest.mark.parametrize("seed", [0, 12345, 2**40 + 3, 2**64 - 1])
def test_seed_everything_reproduces_every_global_rng(seed: int) -> None:
    assert seed_everything(seed) == seed
    first = _draws()
    seed_everything(seed)
    assert _draws() == first
    seed_everything(seed + 1 if seed < 2**64 - 1 else 0)
    assert _draws() != first


def test_seed_everything_matches_the_individual_seeders() -> None:
    seed_everything(7)
    ours = _draws()
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    assert _draws() == ours


def test_deterministic_mode_sets_process_global_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    saved = (
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    try:
        seed_everything(1, deterministic=True)
        assert torch.backends.cudnn.benchmark is False
        assert torch.backends.cudnn.deterministic is True
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved[:2]
        torch.use_deterministic_algorithms(saved[2], warn_only=saved[3])


def test_make_generator_is_reproducible() -> None:
    a = torch.randperm(20, generator=make_generator(3))
    assert torch.equal(a, torch.randperm(20, generator=make_generator(3)))
    assert not torch.equal(a, torch.randperm(20, generator=make_generator(4)))


def test_epoch_seed() -> None:
    assert epoch_seed(9, 0) == 9
    assert len({epoch_seed(9, e) for e in range(100)}) == 100
    assert epoch_seed(9, 3) == epoch_seed(9, 3)


# ---------------------------------------------------------------- worker streams


def _rows(loader: Any, epochs: int = 2) -> list[torch.Tensor]:
    """Per epoch, the (index, random, numpy, torch, worker_rng, worker id) rows by index."""
    out = []
    for _ in range(epochs):
        rows = torch.cat(list(loader))
        out.append(rows[rows[:, 0].argsort()])
    return out


# fast: forked workers, persistent or not; spawned workers seed the same way (seed_worker in
# the worker; spawned seeding is also checked by the fast sample-seeded resume under spawn)
@pytest.mark.parametrize(
    ("context", "persistent"),
    tiered([("fork", False), ("fork", True), ("spawn", True)], {("fork", False), ("fork", True)}),
)
def test_worker_streams(context: str, persistent: bool) -> None:
    def build(seed: int) -> Any:
        return create_dataloader(
            RandomDataset(8),
            batch_size=2,
            num_workers=2,
            seed=seed,
            multiprocessing_context=context,
            persistent_workers=persistent,
        )

    loader_a, loader_b, loader_c = build(0), build(0), build(1)
    a, b, c = _rows(loader_a), _rows(loader_b), _rows(loader_c)
    for loader in (loader_a, loader_b, loader_c):
        loader.close()
    # Same seed: identical; different seed: different.
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0][:, 1:5], c[0][:, 1:5])
    # Streams differ between the two workers (batch 0 -> worker 0, batch 1 -> worker 1).
    epoch0 = a[0]
    assert set(epoch0[:, 5].tolist()) == {0.0, 1.0}
    by_worker = {w: epoch0[epoch0[:, 5] == w][:, 1:5] for w in (0.0, 1.0)}
    first0, first1 = by_worker[0.0][0], by_worker[1.0][0]
    assert (first0 != first1).all(), "random, numpy, torch and worker_rng must all differ"
    # Epochs differ.
    assert (a[0][:, 1:5] != a[1][:, 1:5]).all()


def test_single_process_keeps_torchs_own_worker_seeds() -> None:
    """Drop-in: a dataset drawing from random/numpy/torch gets exactly torch's batches."""
    ours = create_dataloader(
        RandomDataset(8), batch_size=2, num_workers=2, generator=torch.Generator().manual_seed(11)
    )
    theirs = torch.utils.data.DataLoader(
        RandomDataset(8), batch_size=2, num_workers=2, generator=torch.Generator().manual_seed(11)
    )
    assert all(torch.equal(x, y) for x, y in zip(_rows(ours), _rows(theirs), strict=True))
    ours.close()


def test_user_worker_init_fn_still_runs_after_seeding() -> None:
    loader = create_dataloader(
        FlagDataset(), batch_size=1, num_workers=2, worker_init_fn=set_worker_flag
    )
    assert sorted(int(b) for b in loader) == [100, 100, 101, 101]
    assert "then set_worker_flag" in loader.plan["worker_init_fn"].value
    loader.close()


def test_no_environment_variables_carry_seeds() -> None:
    before = dict(os.environ)
    loader = create_dataloader(RandomDataset(4), num_workers=2, seed=3, sample_seeding=True)
    list(loader)
    loader.close()
    assert dict(os.environ) == before


def test_seed_worker_with_plain_torch_dataloader() -> None:
    seed_worker(0)  # outside a worker: a no-op
    loader = torch.utils.data.DataLoader(
        RandomDataset(4), batch_size=2, num_workers=2, worker_init_fn=seed_worker
    )
    rows = _rows(loader, epochs=1)[0]
    assert rows[0, 4] != rows[2, 4]  # worker_rng differs between workers


def test_worker_rng_in_the_main_process_follows_seed_everything() -> None:
    seed_everything(5)
    a = worker_rng().random(3)
    seed_everything(5)
    assert np.array_equal(worker_rng().random(3), a)
    seed_everything(6)
    assert not np.array_equal(worker_rng().random(3), a)


def _rank_streams(rank: int, world_size: int) -> list[list[float]]:
    seed_everything(0)  # every rank seeded alike: the classic duplicate-augmentation setup
    loader = create_dataloader(
        RandomDataset(4), batch_size=2, num_workers=2, seed=0, distributed=False
    )
    rows = torch.cat(list(loader))
    loader.close()
    plain = torch.utils.data.DataLoader(
        RandomDataset(4),
        batch_size=2,
        num_workers=2,
        worker_init_fn=seed_worker,
        generator=torch.Generator().manual_seed(0),
    )
    plain_rows = torch.cat(list(plain))
    return [rows.tolist(), plain_rows.tolist(), [float(worker_rng().random())]]


@pytest.mark.distributed
def test_streams_differ_between_ranks(tmp_path) -> None:
    rank0, rank1 = run_distributed(_rank_streams, 2, tmp_path)
    for kind in (0, 1):  # loaderkit loader; plain torch loader with seed_worker
        a, b = torch.tensor(rank0[kind]), torch.tensor(rank1[kind])
        assert torch.equal(a[:, 0], b[:, 0])  # same indices on both ranks
        assert (a[:, 1:5] != b[:, 1:5]).all(), "random streams must differ between ranks"
    assert rank0[2] != rank1[2]  # worker_rng in the main process too


# ---------------------------------------------------------------- per-sample seeding


def _sample_seeded(num_workers: int, persistent: bool, context: str | None) -> list[torch.Tensor]:
    loader = create_dataloader(
        RandomDataset(10),
        batch_size=3,
        shuffle=True,
        seed=21,
        sample_seeding=True,
        num_workers=num_workers,
        persistent_workers=persistent if num_workers else None,
        multiprocessing_context=context if num_workers else None,
    )
    epochs = [torch.cat(list(loader))[:, :5] for _ in range(2)]  # drop the worker-id column
    loader.close()
    return epochs


def test_sample_seeding_is_invariant_to_workers_under_fork() -> None:
    reference = _sample_seeded(0, False, None)
    assert not torch.equal(reference[0], reference[1])
    for num_workers in (1, 2, 3):
        for persistent in (False, True):
            got = _sample_seeded(num_workers, persistent, "fork")
            assert all(torch.equal(x, y) for x, y in zip(got, reference, strict=True)), (
                num_workers,
                persistent,
            )


@pytest.mark.slow
def test_sample_seeding_is_invariant_to_workers_under_spawn() -> None:
    reference = _sample_seeded(0, False, None)
    for num_workers, persistent in ((1, True), (2, False), (3, True)):
        got = _sample_seeded(num_workers, persistent, "spawn")
        assert all(torch.equal(x, y) for x, y in zip(got, reference, strict=True)), (
            num_workers,
            persistent,
        )


def test_sample_seeding_leaves_the_main_process_rngs_alone() -> None:
    seed_everything(4)
    expected = _draws()
    seed_everything(4)
    loader = create_dataloader(RandomDataset(6), batch_size=2, sample_seeding=True, seed=1)
    list(loader)
    assert _draws() == expected


def test_sample_seeding_same_index_same_values_across_orders() -> None:
    ordered = create_dataloader(RandomDataset(6), batch_size=2, sample_seeding=True, seed=2)
    shuffled = create_dataloader(
        RandomDataset(6), batch_size=4, shuffle=True, sample_seeding=True, seed=2
    )
    a = torch.cat(list(ordered))
    b = torch.cat(list(shuffled))
    assert torch.equal(a[:, :5], b[b[:, 0].argsort()][:, :5])


def test_sample_seeder_context() -> None:
    seeder = SampleSeeder(0)
    with seeder.seeded(1, 2):
        a = (_draws(), worker_rng().random())
    with seeder.seeded(1, 2):
        assert (_draws(), worker_rng().random()) == a
    with seeder.seeded(1, 3):
        assert _draws() != a[0]
    with pytest.raises(TypeError, match="integer dataset indices"), seeder.seeded(0, "key"):
        pass


# ---------------------------------------------------------------- check_determinism


def test_check_determinism_passes_for_a_seeded_loader() -> None:
    dataset = ClosableDataset(8)
    report = check_determinism(
        lambda: create_dataloader(dataset, batch_size=3, shuffle=True, num_workers=2, seed=0),
        epochs=2,
    )
    assert report and report.deterministic and report.batches == 6
    assert "identical" in str(report)
    assert dataset.closed == 2  # both loaders were closed


def test_check_determinism_reports_the_first_difference() -> None:
    seeds = iter([0, 1])

    def make() -> Any:
        return create_dataloader(RandomDataset(6), batch_size=2, num_workers=0, seed=next(seeds))

    report = check_determinism(make, epochs=1)
    assert not report
    assert report.first_difference.startswith("epoch 0, batch 0: batch")
    assert "!=" in str(report)


def test_check_determinism_flags_different_lengths() -> None:
    sizes = iter([4, 6])
    report = check_determinism(
        lambda: create_dataloader(RandomDataset(next(sizes)), batch_size=2, seed=0)
    )
    assert not report
