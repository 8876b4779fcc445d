"""Mid-epoch resume: ``state_dict`` / ``load_state_dict`` with real workers and real samplers.

The reference is always the uninterrupted run of the same loader: a run stopped after ``k``
batches of pass ``e``, saved (through ``torch.save`` and ``torch.load(weights_only=True)``),
and resumed by a freshly built loader must yield exactly the rest of that run.
"""

from __future__ import annotations

import io
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DistributedSampler, RandomSampler, SequentialSampler

from loaderkit import ConfigError, DataLoader, HDF5SessionDataset, LoaderSupport
from loaderkit.hdf5 import BlockShuffleSampler
from loaderkit.order.samplers import ShardSampler
from tests.dist_utils import run_distributed
from tests.hdf5.helpers import write_sessions
from tests.helpers import (
    AugmentDataset,
    CountingIterable,
    GlobalRandomSampler,
    StatefulIterable,
    StatefulSampler,
    fetched_indices,
    needs_in_order,
    tiered,
)

Factory = Callable[..., DataLoader]
EPOCHS = 3


def roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    """Through a checkpoint file, read back as plain data only."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def flat(batch: Any) -> Any:
    """A batch as nested python values (tensors to lists), compared with ==."""
    if isinstance(batch, torch.Tensor):
        return batch.tolist()
    if isinstance(batch, list | tuple):
        return [flat(b) for b in batch]
    if isinstance(batch, dict):
        return {k: flat(v) for k, v in batch.items()}
    return batch


def uninterrupted(make: Factory, epochs: int = EPOCHS, **kwargs: Any) -> list[list[Any]]:
    with make(**kwargs) as loader:
        return [[flat(b) for b in loader] for _ in range(epochs)]


def interrupted(
    make: Factory,
    epoch: int,
    k: int,
    before: dict[str, Any],
    after: dict[str, Any],
    epochs: int = EPOCHS,
) -> tuple[list[list[Any]], list[list[Any]]]:
    """Stop after ``k`` batches of pass ``epoch``; resume in a new loader for the rest.

    Returns (batches the first run yielded per pass, batches the resumed run yielded per pass).
    """
    seen: list[list[Any]] = []
    with make(**before) as first:
        for _ in range(epoch):
            seen.append([flat(b) for b in first])
        got: list[Any] = []
        if k:
            iterator = iter(first)
            for batch in iterator:
                got.append(flat(batch))
                if len(got) == k:
                    break
        seen.append(got)
        state = roundtrip(first.state_dict())
    rest: list[list[Any]] = []
    with make(**after) as second:
        second.load_state_dict(state)
        for _ in range(epoch, epochs):
            rest.append([flat(b) for b in second])
    return seen, rest


def assert_resumes(
    make: Factory,
    epoch: int,
    k: int,
    before: dict[str, Any],
    after: dict[str, Any],
    key: Callable[[Any], Any] = lambda b: b,
) -> None:
    reference = uninterrupted(make, **before)
    seen, rest = interrupted(make, epoch, k, before, after)
    assert [key(b) for b in seen[epoch]] == [key(b) for b in reference[epoch][:k]]
    assert [key(b) for b in rest[0]] == [key(b) for b in reference[epoch][k:]]
    for got, want in zip(rest[1:], reference[epoch + 1 :], strict=True):
        assert [key(b) for b in got] == [key(b) for b in want]


def augment_loader(**kwargs: Any) -> DataLoader:
    options: dict[str, Any] = dict(batch_size=4, training=True, seed=11, sample_seeding=True)
    options.update(kwargs)
    n = options.pop("n", 29)
    log_dir = options.pop("log_dir", None)
    return DataLoader(AugmentDataset(n, log_dir=log_dir), **options)


def indices_of(batch: Any) -> Any:
    return batch[0]


# ------------------------------------------------------------------ exact for any num_workers


WORKER_CHANGES = [(0, 0), (2, 0), (0, 3), (3, 1), (1, 2)]


@pytest.mark.parametrize(("before", "after"), WORKER_CHANGES)
@pytest.mark.parametrize("persistent", [False, True])
def test_sample_seeded_resume_is_bit_identical_across_worker_counts(
    before: int, after: int, persistent: bool
) -> None:
    def opts(workers: int) -> dict[str, Any]:
        return {"num_workers": workers, "persistent_workers": persistent and workers > 0}

    assert_resumes(augment_loader, 1, 3, opts(before), opts(after))


# fast: resumed into 3 spawned workers (seeds derived in fresh interpreters); the other cells
# take the same path (spawn's pickling is forkserver's; 2 -> 0 resumes in this process)
@pytest.mark.parametrize(
    ("context", "before", "after"),
    tiered(
        [("spawn", 0, 3), ("spawn", 2, 0), ("forkserver", 2, 0), ("forkserver", 0, 3)],
        {("spawn", 0, 3)},
    ),
)
def test_sample_seeded_resume_under_spawn_and_forkserver(
    context: str, before: int, after: int
) -> None:
    def opts(workers: int) -> dict[str, Any]:
        return {"num_workers": workers, "multiprocessing_context": context if workers else None}

    assert_resumes(augment_loader, 1, 5, opts(before), opts(after))


@pytest.mark.parametrize(("before", "after"), [(2, 0), (0, 3), (2, 2)])
def test_without_sample_seeding_the_same_indices_come_in_the_same_batches(
    before: int, after: int
) -> None:
    assert_resumes(
        augment_loader,
        1,
        3,
        {"num_workers": before, "sample_seeding": False},
        {"num_workers": after, "sample_seeding": False},
        key=indices_of,
    )


def test_prefetched_batches_do_not_count(tmp_path: Path) -> None:
    loader = augment_loader(num_workers=2, prefetch_factor=4)
    iterator = iter(loader)
    next(iterator)
    assert loader.state_dict()["batches_yielded"] == 1
    loader.close()


@pytest.mark.parametrize(("k", "epoch_after", "position_after"), [(0, 1, 0), (8, 2, 0)])
def test_boundaries(k: int, epoch_after: int, position_after: int) -> None:
    """A state before any pass starts at pass 0; after a complete pass e, at e + 1."""
    fresh = augment_loader()
    assert (fresh.state_dict()["epoch"], fresh.state_dict()["batches_yielded"]) == (0, 0)
    with augment_loader() as loader:  # 29 samples, batch 4: 8 batches a pass
        list(loader)
        iterator = iter(loader)
        for _ in range(k):
            next(iterator)
        state = loader.state_dict()
    assert (state["epoch"], state["batches_yielded"]) == (epoch_after, position_after)


def test_a_pass_consumed_exactly_to_its_length_is_complete() -> None:
    """Lightning stops at len(loader) without asking for one more batch."""
    with augment_loader() as loader:
        iterator = iter(loader)
        for _ in range(len(loader)):
            next(iterator)
        assert loader.state_dict()["epoch"] == 1
        assert loader.state_dict()["batches_yielded"] == 0


def test_state_of_a_loaded_loader_before_iterating_is_the_loaded_one() -> None:
    with augment_loader() as loader:
        it = iter(loader)
        next(it), next(it)
        state = loader.state_dict()
    again = augment_loader()
    again.load_state_dict(roundtrip(state))
    assert again.state_dict()["batches_yielded"] == 2
    # chained: resume, take a batch, save, resume again: still the uninterrupted run
    it2 = iter(again)
    next(it2)
    third = augment_loader()
    third.load_state_dict(roundtrip(again.state_dict()))
    reference = uninterrupted(augment_loader, epochs=1)[0]
    assert [flat(b) for b in third] == reference[3:]


# ------------------------------------------------------------------ skipping reads nothing


@pytest.mark.parametrize(("workers", "method"), [(0, None), (2, "process"), (2, "thread")])
def test_skipped_batches_are_not_read(tmp_path: Path, workers: int, method: str | None) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    total = augment_loader(n=400)
    k = int(0.9 * len(total))
    state = {**total.state_dict(), "batches_yielded": k}
    loader = augment_loader(n=400, num_workers=workers, worker_method=method, log_dir=str(logs))
    loader.load_state_dict(state)
    batches = [flat(b) for b in loader]
    loader.close()
    assert len(batches) == len(total) - k
    fetched = fetched_indices(str(logs))
    assert sorted(fetched) == sorted(i for b in batches for i in b[0])


# ------------------------------------------------------------------ every sampler kind


def test_sequential() -> None:
    def make(**kwargs: Any) -> DataLoader:
        return augment_loader(training=False, **kwargs)

    assert_resumes(make, 1, 2, {"num_workers": 2}, {})


def test_unseeded_shuffle_resumes_the_interrupted_pass_and_leaves_global_rng_alone() -> None:
    """No seed, no generator: the pass's order came from torch's global RNG; it is replayed."""

    def make(**kwargs: Any) -> DataLoader:
        return DataLoader(list(range(30)), batch_size=4, shuffle=True, **kwargs)

    torch.manual_seed(5)
    with make(num_workers=2) as first:
        it = iter(first)
        head = [next(it).tolist() for _ in range(3)]
        rest_of_pass = [b.tolist() for b in it]
        state = roundtrip(first.state_dict())
        # taken after the pass ended: points at the next pass
        assert state["epoch"] == 1
        it = iter(first)
        head2 = [next(it).tolist() for _ in range(3)]
        state = roundtrip(first.state_dict())
        rest2 = [b.tolist() for b in it]
    torch.manual_seed(99)
    before = torch.get_rng_state()
    with make() as second:
        second.load_state_dict(state)
        assert torch.equal(torch.get_rng_state(), before)
        resumed = [b.tolist() for b in second]
    assert resumed == rest2
    got = sorted(i for b in head2 + resumed for i in b)
    assert got == list(range(30))
    assert head + rest_of_pass != head2 + rest2  # two passes, two orders: the RNG was used


@pytest.mark.parametrize("persistent", [False, True])
def test_user_generator_resumes_exactly_including_later_passes(persistent: bool) -> None:
    def make(**kwargs: Any) -> DataLoader:
        workers = kwargs.pop("num_workers", 0)
        return DataLoader(
            list(range(30)),
            batch_size=4,
            shuffle=True,
            generator=torch.Generator().manual_seed(3),
            num_workers=workers,
            persistent_workers=persistent and workers > 0,
            # fork: a dozen passes that each start workers (forkserver would start each anew)
            multiprocessing_context="fork" if workers else None,
        )

    # torch draws the workers' base seed from the generator for each new iterator (a
    # persistent one is reused and draws nothing), so later passes match when both runs
    # create their iterators the same way; the resumed pass itself matches regardless.
    assert_resumes(make, 1, 3, {"num_workers": 2}, {"num_workers": 2})
    assert_resumes(make, 2, 0, {"num_workers": 2}, {"num_workers": 2})
    assert_resumes(make, 1, 0, {}, {"num_workers": 0 if persistent else 2})


def test_user_sampler_is_fast_forwarded_by_index() -> None:
    """Its order came from torch's global RNG: the interrupted pass is replayed exactly."""

    def make(**kwargs: Any) -> DataLoader:
        torch.manual_seed(0)  # the same global stream for the reference and the first run
        return DataLoader(list(range(23)), batch_size=3, sampler=GlobalRandomSampler(23), **kwargs)

    reference = uninterrupted(make, epochs=1, num_workers=2)
    seen, rest = interrupted(make, 0, 4, {"num_workers": 2}, {}, epochs=1)
    assert seen[0] + rest[0] == reference[0]


def test_user_sampler_with_its_own_state_is_asked_for_it() -> None:
    def make(**kwargs: Any) -> DataLoader:
        return DataLoader(list(range(23)), batch_size=3, sampler=StatefulSampler(23), **kwargs)

    assert_resumes(make, 1, 4, {"num_workers": 2}, {})
    loader = make()
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    assert "sampler" in state["start"]
    resumed = make()
    resumed.load_state_dict(state)
    list(resumed)
    assert len(resumed.sampler.loaded) == 1  # type: ignore[attr-defined]


def test_user_batch_sampler() -> None:
    def make(**kwargs: Any) -> DataLoader:
        sampler = BatchSampler(
            RandomSampler(range(20), generator=torch.Generator().manual_seed(1)), 3, False
        )
        return DataLoader(list(range(20)), batch_sampler=sampler, **kwargs)

    assert_resumes(make, 1, 2, {"num_workers": 2}, {"num_workers": 1})


def test_block_shuffle_over_hdf5(tmp_path: Path) -> None:
    paths = write_sessions(tmp_path, [13, 7, 11], chunks=4)

    def make(**kwargs: Any) -> DataLoader:
        ds = HDF5SessionDataset(paths, key="betas")
        return DataLoader(ds, batch_size=4, shuffle="block", seed=2, **kwargs)

    with make() as loader:
        assert isinstance(loader.sampler, BlockShuffleSampler)
    assert_resumes(make, 1, 3, {"num_workers": 2}, {"num_workers": 0})


def _dist_resume(rank: int, world_size: int, training: bool, k: int) -> dict[str, Any]:
    def make(**kwargs: Any) -> DataLoader:
        return augment_loader(n=31, training=training, **kwargs)

    with make() as loader:
        kind = type(loader.sampler).__name__
    reference = uninterrupted(make, epochs=2)
    seen, rest = interrupted(make, 1, k, {"num_workers": 1}, {}, epochs=2)
    # Lightning writes rank 0's checkpoint only: every rank resumes from rank 0's state
    with make() as loader:
        it = iter(loader)
        for _ in range(k):
            next(it)
        state = loader.state_dict()
    states: list[Any] = [None] * world_size
    torch.distributed.all_gather_object(states, state)
    with make() as from_rank0:
        from_rank0.load_state_dict(roundtrip(states[0]))
        rank0_rest = [flat(b) for b in from_rank0]
    return {
        "kind": kind,
        "ok": seen[1] + rest[0] == reference[1] and len(rest) == 1,
        "rank0_ok": rank0_rest == reference[0][k:],
        "ranks": [s["loader"]["rank"] for s in states],
    }


@pytest.mark.parametrize(("training", "kind"), [(True, "ElasticSampler"), (False, "ShardSampler")])
def test_distributed_samplers_resume_per_rank(tmp_path: Path, training: bool, kind: str) -> None:
    results = run_distributed(_dist_resume, 2, tmp_path, training, 2)
    assert [r["kind"] for r in results] == [kind, kind]
    assert all(r["ok"] for r in results), results
    assert all(r["rank0_ok"] for r in results), results
    assert results[0]["ranks"] == [0, 1]


def test_a_distributed_sampler_of_another_world_size_is_refused() -> None:
    def make(replicas: int) -> DataLoader:
        sampler = DistributedSampler(range(20), num_replicas=replicas, rank=0, seed=1)
        return DataLoader(list(range(20)), batch_size=2, sampler=sampler)

    state = make(2).state_dict()
    with pytest.raises(ConfigError, match=r"world size .* is 2 in the state and 4 here"):
        make(4).load_state_dict(state)


def test_shard_sampler_resumes_without_torch_distributed() -> None:
    def make(**kwargs: Any) -> DataLoader:
        return DataLoader(
            list(range(21)), batch_size=2, sampler=ShardSampler(range(21), num_replicas=2, rank=1)
        )

    assert_resumes(make, 0, 2, {}, {})


# ------------------------------------------------------------------ iterable datasets


def test_iterable_dataset_with_state_delegates() -> None:
    loader = DataLoader(StatefulIterable(10), batch_size=3)
    it = iter(loader)
    next(it), next(it)
    state = roundtrip(loader.state_dict())
    rest = [b.tolist() for b in it]
    resumed = DataLoader(StatefulIterable(10), batch_size=3)
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == rest == [[6, 7, 8], [9]]


def test_iterable_dataset_without_state_cannot_resume_mid_pass() -> None:
    loader = DataLoader(CountingIterable(7), batch_size=2)
    it = iter(loader)
    next(it)
    state = loader.state_dict()  # taking a state never fails (Lightning takes one per checkpoint)
    with pytest.raises(ConfigError, match=r"CountingIterable.*state_dict\(\).*load_state_dict"):
        DataLoader(CountingIterable(7), batch_size=2).load_state_dict(state)
    list(it)
    between = DataLoader(CountingIterable(7), batch_size=2)
    between.load_state_dict(loader.state_dict())  # between passes: fine
    assert between.epoch == 1


# ------------------------------------------------------------------ the state itself


def test_state_is_plain_data_with_a_version() -> None:
    loader = DataLoader(
        list(range(10)), batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    assert state["format"] == "loaderkit.DataLoader" and state["version"] == 1
    back = roundtrip(state)
    assert back["batches_yielded"] == 1
    assert torch.equal(back["start"]["generator"], state["start"]["generator"])


MISMATCHES: list[tuple[dict[str, Any], str]] = [
    ({"n": 30}, "dataset length is 29 in the state and 30 here"),
    ({"batch_size": 5, "seed": None}, "batch_size is 4 in the state and 5 here"),
    ({"seed": 12}, "seed is 11 in the state and 12 here"),
    ({"shuffle": "block"}, ""),  # not an HDF5 dataset: refused at construction
    ({"training": False}, "sampler is 'torch.utils.data.sampler.RandomSampler' in the state"),
    ({"sample_seeding": False}, "sample_seeding is True in the state and False here"),
    ({"drop_last": True}, "drop_last is False in the state and True here"),
]


@pytest.mark.parametrize(("change", "message"), MISMATCHES)
def test_a_state_that_does_not_fit_is_refused(change: dict[str, Any], message: str) -> None:
    state = augment_loader().state_dict()
    try:
        other = augment_loader(**change)
    except ConfigError:
        return
    with pytest.raises(ConfigError, match=message) as raised:
        other.load_state_dict(state)
    assert "num_workers may differ" in str(raised.value)


class _Keyed(torch.utils.data.Dataset):
    """Ten samples whose ``LoaderSupport.samples_key()`` is ``key`` (which samples they are)."""

    def __init__(self, key: str | None) -> None:
        self.key = key

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> int:
        return index

    def loader_support(self) -> LoaderSupport:
        key = self.key

        class Support(LoaderSupport):
            def samples_key(self) -> str | None:
                return key

        return Support()


def test_a_state_of_other_samples_of_the_same_length_is_refused_by_its_samples_key() -> None:
    def state(key: str | None) -> dict[str, Any]:
        loader = DataLoader(_Keyed(key), batch_size=2, shuffle=True, seed=1)
        next(iter(loader))
        return roundtrip(loader.state_dict())

    saved = state("a1")
    assert saved["loader"]["samples_key"] == "a1"
    with pytest.raises(ConfigError, match="the dataset's chosen samples differ") as raised:
        DataLoader(_Keyed("b2"), batch_size=2, shuffle=True, seed=1).load_state_dict(saved)
    assert "'a1' in the state, 'b2' here" in str(raised.value)
    for key in ("a1", None):  # the same key; a dataset that says nothing
        DataLoader(_Keyed(key), batch_size=2, shuffle=True, seed=1).load_state_dict(saved)
    del saved["loader"]["samples_key"]  # a state saved before the key existed
    DataLoader(_Keyed("b2"), batch_size=2, shuffle=True, seed=1).load_state_dict(saved)


def test_another_batch_size_resumes_where_the_samples_fill_whole_batches() -> None:
    """A seeded training order is one order cut into batches (test_elastic.py for ranks):
    another batch size resumes when the samples read fill whole batches of it."""
    with augment_loader() as loader:
        reference = [s for b in loader for s in zip(*flat(b), strict=True)]
    with augment_loader() as loader:
        iterator = iter(loader)
        next(iterator), next(iterator)  # 8 samples
        state = roundtrip(loader.state_dict())
    with augment_loader(batch_size=8) as wider:
        wider.load_state_dict(state)
        assert [s for b in wider for s in zip(*flat(b), strict=True)] == reference[8:]
    with pytest.raises(ConfigError, match=r"global batch of 4 .* global batch is 5"):
        augment_loader(batch_size=5).load_state_dict(state)


def test_malformed_states_are_refused() -> None:
    loader = augment_loader()
    state = loader.state_dict()
    with pytest.raises(ConfigError, match=r"format=.loaderkit\.DataLoader."):
        loader.load_state_dict({"epoch": 1})
    with pytest.raises(ConfigError, match="version 99"):
        loader.load_state_dict({**state, "version": 99})
    with pytest.raises(ConfigError, match="batch 9 of epoch 0, but a pass of this loader has 8"):
        loader.load_state_dict({**state, "batches_yielded": 9})
    with pytest.raises(ConfigError, match="epoch must be an int >= 0"):
        loader.load_state_dict({**state, "epoch": -1})


def test_resume_keeps_torch_defaults_and_sampler_epochs() -> None:
    """set_epoch reaches a DistributedSampler on resume, as it does in the uninterrupted run."""
    sampler = DistributedSampler(range(12), num_replicas=1, rank=0, seed=4)
    loader = DataLoader(list(range(12)), batch_size=2, sampler=sampler)
    loader.load_state_dict({**loader.state_dict(), "epoch": 5, "batches_yielded": 2})
    rest = [b.tolist() for b in loader]
    assert sampler.epoch == 5
    reference = DistributedSampler(range(12), num_replicas=1, rank=0, seed=4)
    reference.set_epoch(5)
    order = list(reference)
    assert [i for b in rest for i in b] == order[4:]
    assert isinstance(loader.sampler, SequentialSampler | DistributedSampler)


def test_random_module_state_is_not_touched() -> None:
    random.seed(1)
    np.random.seed(1)
    expected = (random.random(), float(np.random.rand()))
    random.seed(1)
    np.random.seed(1)
    loader = augment_loader()
    loader.load_state_dict({**loader.state_dict(), "batches_yielded": 3})
    list(loader)
    assert (random.random(), float(np.random.rand())) == expected


@needs_in_order
def test_out_of_order_batches_cannot_resume_mid_pass() -> None:
    loader = augment_loader(num_workers=2, in_order=False)
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    loader.close()
    with pytest.raises(ConfigError, match="in_order=False"):
        augment_loader().load_state_dict(state)


@pytest.mark.parametrize("persistent", [False, True])
def test_a_used_loader_can_go_back_to_an_earlier_state(persistent: bool) -> None:
    """load_state_dict on the loader itself (its persistent workers kept) rewinds exactly."""
    with augment_loader(num_workers=2, persistent_workers=persistent) as loader:
        list(loader)
        it = iter(loader)
        next(it)
        state = loader.state_dict()
        rest = [flat(b) for b in it]
        after = [flat(b) for b in loader]
        loader.load_state_dict(state)
        assert [flat(b) for b in loader] == rest
        assert [flat(b) for b in loader] == after


class RestartsOnIter:
    """A batch sampler whose __iter__ restarts and returns itself (Lightning's predict wrapper)."""

    def __init__(self, batches: list[list[int]]) -> None:
        self.batches = batches
        self._iterator: Any = None

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> RestartsOnIter:
        self._iterator = iter(self.batches)
        return self

    def __next__(self) -> list[int]:
        return next(self._iterator)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_batch_sampler_that_restarts_in_iter_is_iterated_once(workers: int) -> None:
    batches = [[0, 1], [2, 3], [4]]
    loader = DataLoader(list(range(5)), batch_sampler=RestartsOnIter(batches), num_workers=workers)
    assert [b.tolist() for b in loader] == batches
    loader.load_state_dict({**loader.state_dict(), "batches_yielded": 1})
    assert [b.tolist() for b in loader] == batches[1:]
    loader.close()
