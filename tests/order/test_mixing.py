"""``batch_mix`` and ``order_mix``: the mean per-batch entropy of a label over the corpus's own.

Checked against the entropy computed sample by sample with the standard library, on the
orders loaderkit and torch give real session files: file order mixes 0, a full shuffle close
to 1, blocks of consecutive rows in between (the smaller the blocks, the more).
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import RandomSampler, SequentialSampler

from loaderkit import BlockShuffleSampler, ConfigError, HDF5SessionDataset, batch_mix, order_mix
from loaderkit.order.mixing import shuffle_mix
from tests.hdf5.helpers import write_sessions


def _by_hand(labels: list[object], batch_size: int) -> float:
    """The same measure, one batch at a time with ``collections.Counter``."""

    def entropy(values: list[object]) -> float:
        counts = Counter(values)
        total = len(values)
        return -sum(c / total * math.log(c / total) for c in counts.values())

    batches = [labels[i : i + batch_size] for i in range(0, len(labels), batch_size)]
    return sum(entropy(b) for b in batches) / len(batches) / entropy(labels)


@pytest.mark.parametrize("batch_size", [1, 7, 64, 1000])
def test_the_measure_is_the_mean_batch_entropy_over_the_whole_orders(batch_size: int) -> None:
    rng = np.random.default_rng(batch_size)
    labels = rng.choice(["plate1", "plate2", "plate3", "dmso"], 999, p=[0.5, 0.2, 0.2, 0.1])
    got = batch_mix(labels, batch_size)
    assert got == pytest.approx(_by_hand(labels.tolist(), batch_size), rel=1e-12)
    assert batch_mix(np.unique(labels, return_inverse=True)[1] - 5, batch_size) == pytest.approx(
        got
    )


def test_file_order_is_0_a_shuffle_near_1_and_nothing_to_mix_is_1() -> None:
    files = np.repeat(np.arange(8), 1000)
    assert batch_mix(files, 64) == pytest.approx(0.0, abs=0.02)  # 7 batches across two files
    shuffled = batch_mix(files[np.random.default_rng(0).permutation(files.size)], 64)
    assert 0.9 < shuffled < 1.0
    assert batch_mix(np.zeros(100, np.int64), 10) == 1.0 and batch_mix([], 4) == 1.0
    with pytest.raises(ConfigError, match="batch_size"):
        batch_mix(files, 0)


def test_orders_of_real_session_files_mix_as_their_blocks_say(tmp_path: Path) -> None:
    paths = write_sessions(tmp_path, [512] * 8)
    with HDF5SessionDataset(paths, key="betas") as ds:
        plain = order_mix(ds, list(SequentialSampler(ds)), 64)
        shuffled = order_mix(ds, list(RandomSampler(ds, generator=_gen(0))), 64)
        blocks = {
            size: order_mix(ds, BlockShuffleSampler(ds, block_size=size, seed=0).indices(), 64)
            for size in (4, 16, 64)
        }
        assert plain == pytest.approx(0.0, abs=1e-9)
        assert 0.9 < shuffled < 1.0
        assert shuffled > blocks[4] > blocks[16] > blocks[64] >= 0.0
        # by an obs-like label instead of the file: every sample's own parity
        parity = np.arange(len(ds)) % 2
        assert order_mix(ds, list(SequentialSampler(ds)), 64, labels=parity) == 1.0


def test_order_mix_says_what_it_needs(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no sessions to take each sample's file from"):
        order_mix(list(range(10)), range(10), 2)
    with pytest.raises(ConfigError, match=r"outside 0\.\.2"):
        order_mix(list(range(10)), [0, 5], 2, labels=[0, 1, 0])


def _gen(seed: int) -> object:
    import torch

    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("counts", [[1000] * 8, [5000, 200, 50], [3, 3000]])
def test_a_full_shuffles_mix_from_the_counts_is_what_real_shuffles_give(
    counts: list[int],
) -> None:
    def entropy(values: list[int]) -> float:
        total = len(values)
        return -sum(c / total * math.log(c / total) for c in Counter(values).values())

    files = np.repeat(np.arange(len(counts)), counts)
    rng = np.random.default_rng(1)
    # real shuffles' whole batches, each batch's entropy by hand over the corpus's (the last,
    # partial batch of a real order is the one thing the estimate leaves out)
    whole = files.size // 64 * 64
    corpus = entropy(files.tolist())
    real = [
        entropy(batch) / corpus
        for _ in range(100)
        for batch in files[rng.permutation(files.size)][:whole].reshape(-1, 64).tolist()
    ]
    assert shuffle_mix(counts, 64) == pytest.approx(float(np.mean(real)), abs=0.02)
    assert shuffle_mix([0, 300, 0], 64) == 1.0 and shuffle_mix([], 64) == 1.0
    assert shuffle_mix([10, 10], 1000) == 1.0  # a batch of everything holds the corpus


def _mix_row(loader: object) -> tuple[object, str] | None:
    entry = loader.plan.get("mix")  # type: ignore[attr-defined]
    return None if entry is None else (entry.value, entry.reason)


def test_the_plan_says_how_the_loaders_order_mixes_the_files(tmp_path: Path) -> None:
    import torch

    from loaderkit import create_dataloader

    paths = write_sessions(tmp_path, [512] * 8)
    with HDF5SessionDataset(paths, key="betas") as ds:
        with create_dataloader(ds, batch_size=64, shuffle=True) as loader:
            value, reason = _mix_row(loader)
            assert 0.9 < value < 1.0, reason
            assert reason.endswith("a uniform shuffle, expected from the files' sizes")
            assert "mix" in loader.describe() and "terms:" in loader.describe()
        with create_dataloader(ds, batch_size=64, shuffle=False) as loader:
            assert _mix_row(loader) == (0.0, _mix_row(loader)[1])
            assert _mix_row(loader)[1].endswith("file order (shuffle=False)")
        sampler = BlockShuffleSampler(ds, block_size=16, seed=3, batch_size=64, fetch_factor=4)
        with create_dataloader(ds, batch_size=64, sampler=sampler) as loader:
            value, reason = _mix_row(loader)
            assert value == round(order_mix(ds, sampler.global_indices(), 64), 2)
            assert reason.endswith("epoch 0 of the block order (block 16, fetch 4)")
        with create_dataloader(ds, batch_size=64, shuffle="block", seed=0) as loader:
            value, reason = _mix_row(loader)
            assert 0.0 <= value < 0.9 and "of the block order (block " in reason
        with create_dataloader(ds, batch_size=None) as loader:
            assert _mix_row(loader) is None  # no batches to mix
        # the figure draws nothing from torch's generator: the shuffle is torch's own
        torch.manual_seed(7)
        with create_dataloader(ds, batch_size=64, shuffle=True) as loader:
            ours = [b.clone() for b in loader]
        torch.manual_seed(7)
        theirs = list(torch.utils.data.DataLoader(ds, batch_size=64, shuffle=True))
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
    with HDF5SessionDataset(paths[:1], key="betas") as one:
        with create_dataloader(one, batch_size=64, shuffle=True) as loader:
            assert _mix_row(loader) is None  # one file: nothing to mix
    with create_dataloader(list(range(100)), batch_size=8, shuffle=True) as loader:
        assert _mix_row(loader) is None  # no sessions to say it for
