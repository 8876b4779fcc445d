"""``BlockShuffleSampler``: blocks of consecutive rows, epoch- and rank-aware, reproducible."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from loaderkit.errors import ConfigError
from loaderkit.hdf5 import DEFAULT_BLOCK_SIZE, BlockShuffleSampler, HDF5SessionDataset
from tests.hdf5.helpers import EveryOther, write_sessions

ROWS = [53, 0, 40, 71, 29, 64, 16, 45]


@pytest.fixture(scope="module")
def ds(tmp_path_factory: pytest.TempPathFactory) -> HDF5SessionDataset:
    return HDF5SessionDataset(write_sessions(tmp_path_factory.mktemp("s"), ROWS), key="betas")


@pytest.fixture(scope="module")
def chunked(tmp_path_factory: pytest.TempPathFactory) -> HDF5SessionDataset:
    root = tmp_path_factory.mktemp("c")
    return HDF5SessionDataset(write_sessions(root, ROWS, chunks=5, compression="gzip"), key="betas")


def runs(ds: HDF5SessionDataset, order: list[int]) -> list[tuple[int, int, int]]:
    """Maximal runs (session, first row, length) of consecutive rows in ``order``."""
    out: list[tuple[int, int, int]] = []
    for i in order:
        s, r = ds.locate(i)
        if out and out[-1][0] == s and out[-1][1] + out[-1][2] == r:
            out[-1] = (s, out[-1][1], out[-1][2] + 1)
        else:
            out.append((s, r, 1))
    return out


def test_single_rank_is_a_permutation_of_blocks(ds: HDF5SessionDataset) -> None:
    sampler = BlockShuffleSampler(ds, seed=0, block_size=8)
    order = list(sampler)
    assert len(order) == len(sampler) == len(ds)
    assert sorted(order) == list(range(len(ds)))
    assert order != list(range(len(ds)))
    found = runs(ds, order)
    assert all(n <= 16 for _, _, n in found)  # at most two adjacent blocks happen to merge
    assert sampler.num_blocks // 2 <= len(found) <= sampler.num_blocks


def test_blocks_are_whole_aligned_blocks(ds: HDF5SessionDataset) -> None:
    order = BlockShuffleSampler(ds, seed=1, block_size=8).indices().tolist()
    # Split the order into the sampler's blocks: each chunk of consecutive rows that starts at
    # a multiple of 8 (or a session's first row) and stops at the next multiple or the end.
    pos = 0
    while pos < len(order):
        s, r = ds.locate(order[pos])
        assert r % 8 == 0
        end = min((r // 8 + 1) * 8, ROWS[s])
        assert [ds.locate(i) for i in order[pos : pos + end - r]] == [
            (s, row) for row in range(r, end)
        ]
        pos += end - r


def test_default_block_size_is_whole_chunks(chunked: HDF5SessionDataset) -> None:
    sampler = BlockShuffleSampler(chunked, seed=2)
    assert sampler.block_size == DEFAULT_BLOCK_SIZE
    size = -(-DEFAULT_BLOCK_SIZE // 5) * 5  # 16 rounded up to whole chunks of 5 rows: 20
    order = sampler.indices().tolist()
    pos = 0
    while pos < len(order):
        s, r = chunked.locate(order[pos])
        assert r % size == 0  # every block starts on a chunk boundary ...
        end = min(r + size, ROWS[s])  # ... and covers whole chunks
        assert [chunked.locate(i) for i in order[pos : pos + end - r]] == [
            (s, row) for row in range(r, end)
        ]
        pos += end - r


def test_epochs_and_seeds(ds: HDF5SessionDataset) -> None:
    a = BlockShuffleSampler(ds, seed=5)
    b = BlockShuffleSampler(ds, seed=5)
    first = list(a)
    assert first == list(b)
    a.set_epoch(1)
    second = list(a)
    assert second != first and sorted(second) == sorted(first)
    a.set_epoch(0)
    assert list(a) == first
    assert list(BlockShuffleSampler(ds, seed=6)) != first
    torch.manual_seed(123)
    c = list(BlockShuffleSampler(ds))
    torch.manual_seed(123)
    assert list(BlockShuffleSampler(ds)) == c


def test_window_bounds_active_sessions(ds: HDF5SessionDataset) -> None:
    for window in (1, 2, 3):
        order = BlockShuffleSampler(ds, seed=7, window=window, block_size=4).indices()
        sess = np.array([ds.locate(int(i))[0] for i in order])
        first = {s: int(np.argmax(sess == s)) for s in set(sess.tolist())}
        last = {s: len(sess) - 1 - int(np.argmax(sess[::-1] == s)) for s in first}
        for t in range(len(sess)):
            active = sum(1 for s in first if first[s] <= t <= last[s])
            assert active <= window
    # Default window: the dataset's max_open_files (8), here all 7 non-empty sessions.
    assert BlockShuffleSampler(ds, seed=0).window == 7


def test_uniform_special_case_mixes_sessions(ds: HDF5SessionDataset) -> None:
    order = BlockShuffleSampler(ds, seed=0, block_size=1, window=len(ROWS)).indices()
    assert sorted(order.tolist()) == list(range(len(ds)))
    sessions_per_batch = [
        len({ds.locate(int(i))[0] for i in order[k : k + 32]}) for k in range(0, len(order), 32)
    ]
    assert np.mean(sessions_per_batch) > 5


@pytest.mark.parametrize("partition", ["block", "session"])
@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_are_disjoint_equal_and_cover(
    ds: HDF5SessionDataset, partition: str, drop_last: bool
) -> None:
    n = len(ds)
    for replicas in (2, 3, 5):
        shares = []
        for rank in range(replicas):
            s = BlockShuffleSampler(
                ds,
                seed=11,
                num_replicas=replicas,
                rank=rank,
                drop_last=drop_last,
                partition=partition,
            )
            s.set_epoch(3)
            shares.append(s.indices().tolist())
            assert len(shares[-1]) == len(s)
        lengths = {len(x) for x in shares}
        assert len(lengths) == 1  # equal counts: DDP would hang otherwise
        every = [i for share in shares for i in share]
        if drop_last:
            assert len(every) == (n // replicas) * replicas
            assert len(set(every)) == len(every)  # disjoint
        else:
            assert len(every) == -(-n // replicas) * replicas
            assert set(every) == set(range(n))  # covers everything
            assert len(every) - len(set(every)) == len(every) - n  # only padding repeats
        if partition == "session":
            # Whole sessions per rank: each rank touches about sessions / replicas files.
            for share in shares:
                touched = {ds.locate(i)[0] for i in share}
                assert len(touched) <= -(-7 // replicas) + 2


def test_session_partition_is_fixed_across_epochs(ds: HDF5SessionDataset) -> None:
    s = BlockShuffleSampler(ds, seed=4, num_replicas=3, rank=1, partition="session")
    s.set_epoch(0)
    a = s.indices()
    s.set_epoch(1)
    b = s.indices()
    assert sorted(a.tolist()) == sorted(b.tolist()) and a.tolist() != b.tolist()


def test_custom_index_and_loader(tmp_path: Path) -> None:
    ds = EveryOther(write_sessions(tmp_path, [30, 20]), key="betas")
    sampler = BlockShuffleSampler(ds, seed=0, block_size=4)
    order = sampler.indices().tolist()
    assert sorted(order) == list(range(len(ds)))
    # Even rows are not contiguous on disk: every block is a single row.
    assert all(n == 1 for _, _, n in runs(ds, order))
    batches = list(DataLoader(ds, batch_size=6, sampler=sampler))
    assert sum(len(b) for b in batches) == len(ds)


def test_errors(ds: HDF5SessionDataset) -> None:
    with pytest.raises(TypeError, match="HDF5SessionDataset"):
        BlockShuffleSampler(TensorDataset(torch.zeros(3)))
    with pytest.raises(ConfigError, match="partition"):
        BlockShuffleSampler(ds, partition="file")
    with pytest.raises(ConfigError, match="rank"):
        BlockShuffleSampler(ds, num_replicas=2, rank=2)
    with pytest.raises(ConfigError, match="block_size"):
        BlockShuffleSampler(ds, block_size=0)
    with pytest.raises(ConfigError, match="window"):
        BlockShuffleSampler(ds, window=0)
    with pytest.raises(TypeError, match="seed"):
        BlockShuffleSampler(ds, seed=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seed"):
        BlockShuffleSampler(ds, seed=-1)
    s = BlockShuffleSampler(ds, seed=0)
    assert (s.num_replicas, s.rank) == (1, 0)  # from dist_info() outside torch.distributed
    with pytest.raises(ConfigError, match="epoch"):
        s.set_epoch(-1)


# ---------------------------------------------------------------- elastic order (batch_size)


def _global_batches(ds: HDF5SessionDataset, world: int, epoch: int, drop_last: bool) -> list:
    """What all ranks read at each step, in rank order, with a global batch of 12."""
    per_rank = []
    for rank in range(world):
        sampler = BlockShuffleSampler(
            ds,
            seed=5,
            block_size=4,
            window=3,
            num_replicas=world,
            rank=rank,
            batch_size=12 // world,
            drop_last=drop_last,
        )
        sampler.set_epoch(epoch)
        order = sampler.indices().tolist()
        assert order == list(sampler) and len(order) == len(sampler)
        per_rank.append([order[k : k + 12 // world] for k in range(0, len(order), 12 // world)])
    assert len({len(batches) for batches in per_rank}) == 1  # every rank takes as many steps
    return [[i for batches in per_rank for i in batches[k]] for k in range(len(per_rank[0]))]


@pytest.mark.parametrize("drop_last", [False, True])
def test_elastic_global_batches_do_not_depend_on_the_ranks(
    ds: HDF5SessionDataset, drop_last: bool
) -> None:
    n = len(ds)  # 318 rows: 26 global batches of 12 and a last one of 6
    for epoch in range(2):
        one = _global_batches(ds, 1, epoch, drop_last)
        single = BlockShuffleSampler(ds, seed=5, block_size=4, window=3)  # no batch_size
        single.set_epoch(epoch)
        flat = [i for batch in one for i in batch]
        if drop_last:
            assert flat == single.indices().tolist()[: n // 12 * 12]
        else:
            assert flat == single.indices().tolist()  # one rank: the non-elastic order
        for world in (2, 3, 4, 6):
            assert _global_batches(ds, world, epoch, drop_last) == one, world


def test_elastic_ranks_read_runs_of_their_global_batch(ds: HDF5SessionDataset) -> None:
    sampler = BlockShuffleSampler(ds, seed=5, block_size=8, num_replicas=2, rank=1, batch_size=8)
    order = sampler.indices().tolist()
    batches = [order[k : k + 8] for k in range(0, len(order), 8)]
    assert np.mean([len(runs(ds, b)) for b in batches]) < 2.5  # blocks of 8: 1 or 2 runs
    assert sampler.global_batch_size == 16 and sampler.elastic
    key = sampler.order_key()
    assert key["kind"] == "block" and key["window"] == sampler.window


def test_elastic_needs_the_block_partition(ds: HDF5SessionDataset) -> None:
    with pytest.raises(ConfigError, match="partition='block'"):
        BlockShuffleSampler(ds, seed=0, partition="session", batch_size=4)
    with pytest.raises(ConfigError, match="batch_size"):
        BlockShuffleSampler(ds, seed=0, batch_size=0)
    assert BlockShuffleSampler(ds, seed=0).global_batch_size is None


# ------------------------------------------------------------------ buffered block shuffle


def _fetches(order: list[int], size: int) -> list[set[int]]:
    return [set(order[k : k + size]) for k in range(0, len(order), size)]


def test_a_fetch_holds_exactly_its_blocks_rows_permuted(ds: HDF5SessionDataset) -> None:
    plain = BlockShuffleSampler(ds, seed=3, block_size=4, batch_size=8)
    mixed = BlockShuffleSampler(ds, seed=3, block_size=4, batch_size=8, fetch_factor=5)
    for epoch in range(2):
        plain.set_epoch(epoch)
        mixed.set_epoch(epoch)
        before, after = plain.indices().tolist(), mixed.indices().tolist()
        assert sorted(after) == list(range(len(ds)))  # every row once
        assert _fetches(after, 40) == _fetches(before, 40)  # no row leaves its fetch
        assert after != before
        batches = [after[k : k + 8] for k in range(0, len(after), 8)]
        assert np.mean([len(runs(ds, b)) for b in batches]) > 4  # a batch: many blocks
    again = BlockShuffleSampler(ds, seed=3, block_size=4, batch_size=8, fetch_factor=5)
    again.set_epoch(1)
    assert again.indices().tolist() == after  # a pure function of (seed, epoch)
    assert again.order_key()["fetch_factor"] == 5


def test_a_buffered_order_splits_between_ranks_as_its_global_batches_say(
    ds: HDF5SessionDataset,
) -> None:
    one = BlockShuffleSampler(ds, seed=1, block_size=4, batch_size=12, fetch_factor=3)
    whole = one.indices().tolist()
    for world in (2, 3):
        parts = [
            BlockShuffleSampler(
                ds,
                seed=1,
                block_size=4,
                batch_size=12 // world,
                fetch_factor=3,
                num_replicas=world,
                rank=r,
            )
            .indices()
            .tolist()
            for r in range(world)
        ]
        step = 12 // world
        rebuilt = [
            i
            for k in range(len(parts[0]) // step + 1)
            for part in parts
            for i in part[k * step : (k + 1) * step]
        ]
        assert rebuilt == whole, world  # the same global batches on any number of ranks


def test_a_buffered_block_shuffle_mixes_like_a_full_shuffle(tmp_path: Path) -> None:
    from loaderkit import order_mix

    with HDF5SessionDataset(write_sessions(tmp_path, [2048] * 8), key="betas") as files:
        full = order_mix(
            files, torch.randperm(len(files), generator=torch.Generator().manual_seed(0)), 64
        )
        blocks = BlockShuffleSampler(files, seed=0, block_size=16)
        buffered = BlockShuffleSampler(files, seed=0, block_size=16, batch_size=64, fetch_factor=16)
        mix_blocks = order_mix(files, blocks.indices(), 64)
        mix_buffered = order_mix(files, buffered.indices(), 64)
    assert mix_blocks < 0.6 * full  # runs of 16-row blocks: a few files a batch
    assert mix_buffered >= 0.95 * full


def test_fetch_factor_needs_a_batch_size(ds: HDF5SessionDataset) -> None:
    with pytest.raises(ConfigError, match="pass batch_size= too"):
        BlockShuffleSampler(ds, seed=0, fetch_factor=4)
    with pytest.raises(ConfigError, match="fetch_factor"):
        BlockShuffleSampler(ds, seed=0, batch_size=4, fetch_factor=0)


@pytest.mark.parametrize("workers", [(0, "process"), (2, "process"), (2, "thread")])
def test_a_buffered_block_shuffle_resumes_mid_epoch_exactly(
    ds: HDF5SessionDataset, workers: tuple[int, str]
) -> None:
    import pickle

    from loaderkit import DataLoader as Loader

    num_workers, method = workers

    def make() -> Loader:
        sampler = BlockShuffleSampler(ds, seed=7, block_size=4, batch_size=8, fetch_factor=4)
        return Loader(
            ds, batch_size=8, sampler=sampler, num_workers=num_workers, worker_method=method
        )

    def rows(batch: torch.Tensor) -> list[float]:
        return batch[:, 0].tolist()

    with make() as loader:
        whole = [rows(b) for b in loader]
    with make() as first:
        it = iter(first)
        seen = [rows(next(it)) for _ in range(11)]
        state = pickle.loads(pickle.dumps(first.state_dict()))
    with make() as second:
        second.load_state_dict(state)
        rest = [rows(b) for b in second]
    assert seen + rest == whole
