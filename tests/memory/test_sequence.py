"""SharedSequence: round trips, indexing, slicing, pickling, and reads that copy nothing."""

from __future__ import annotations

import collections.abc
import pickle
import sys

import numpy as np
import pytest
from torch.utils.data import DataLoader

from loaderkit import ArgumentTypeError, SharedSequence, create_dataloader
from tests.helpers import START_METHODS, tiered
from tests.memory.helpers import ItemsDataset, ReadEverything, trial_items

ITEMS = [
    "plain",
    "",
    "unicode: é漢字🙂",
    b"\x00\xffbytes",
    ("a.png", 3, 0.25),
    {"path": "b.png", "label": 7, "tags": ["x", "y"]},
    [1, [2, [3]]],
    np.float32(1.5),
    np.int64(-7),
    np.bool_(True),
    np.arange(6, dtype=np.int16).reshape(2, 3),
    None,
    12345678901234567890,
    3.5,
    frozenset({1, 2}),
]


def _same(a: object, b: object) -> bool:
    if isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return type(a) is type(b) and a == b


def test_items_round_trip_with_their_types() -> None:
    seq = SharedSequence(ITEMS)
    assert len(seq) == len(ITEMS)
    for i, item in enumerate(ITEMS):
        assert _same(seq[i], item), (i, seq[i], item)
    assert all(_same(a, b) for a, b in zip(seq, ITEMS, strict=True))


def test_empty_and_generator_input() -> None:
    empty = SharedSequence([])
    assert len(empty) == 0 and list(empty) == [] and empty.nbytes >= 0
    with pytest.raises(IndexError, match="index 0 is out of range for length 0"):
        empty[0]
    assert list(SharedSequence(i * i for i in range(5))) == [0, 1, 4, 9, 16]


def test_large_items_span_many_pickle_frames() -> None:
    big = [b"x" * (3 * 2**20), "é" * 300_000, list(range(100_000)), np.ones(200_000)]
    seq = SharedSequence(big)
    assert seq[0] == big[0] and seq[1] == big[1] and seq[2] == big[2]
    assert np.array_equal(seq[3], big[3])
    assert seq.nbytes > 3 * 2**20


def test_indexing_follows_list() -> None:
    items = list(range(10))
    seq = SharedSequence(items)
    for i in [*range(-10, 10), np.int64(4), np.int32(-2)]:
        assert seq[i] == items[i]
    assert seq[True] == items[True]
    for bad in (10, -11, 2**70):
        with pytest.raises(IndexError) as info:
            seq[bad]
        assert str(info.value) == f"SharedSequence index {bad} is out of range for length 10"
    with pytest.raises(TypeError, match="integers or slices, not str"):
        seq["1"]  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="not float"):
        seq[1.0]  # type: ignore[call-overload]


@pytest.mark.parametrize(
    "index",
    [
        slice(None),
        slice(2, 7),
        slice(-3, None),
        slice(7, 2),
        slice(None, None, 2),
        slice(None, None, -1),
        slice(8, 1, -3),
        slice(100, 200),
        slice(-100, 3),
    ],
)
def test_slices_follow_list(index: slice) -> None:
    items = [f"item {i}" for i in range(10)]
    seq = SharedSequence(items)
    part = seq[index]
    assert isinstance(part, SharedSequence)
    assert list(part) == items[index]
    assert [part[i] for i in range(-len(part), len(part))] == items[index] * 2
    assert list(part[1:]) == items[index][1:]  # a slice of a slice
    assert list(pickle.loads(pickle.dumps(part))) == items[index]


def test_step_one_slices_share_the_buffer() -> None:
    seq = SharedSequence(trial_items(1000))
    view = seq[100:200]
    assert np.shares_memory(view._data, seq._data)
    assert view.nbytes < seq.nbytes / 5
    assert not np.shares_memory(seq[::2]._data, seq._data)


def test_it_is_a_read_only_sequence() -> None:
    seq = SharedSequence([("a", [1]), ("b", [2]), ("a", [1])])
    assert isinstance(seq, collections.abc.Sequence)
    assert ("b", [2]) in seq and seq.index(("b", [2])) == 1 and seq.count(("a", [1])) == 2
    assert list(reversed(seq)) == [("a", [1]), ("b", [2]), ("a", [1])]
    item = seq[0]
    item[1].append(99)  # a fresh object every read: the stored item is unchanged
    assert seq[0] == ("a", [1])
    with pytest.raises(ValueError, match="read-only"):
        seq._data[0] = 1
    with pytest.raises(AttributeError):
        seq.extra = 1  # type: ignore[attr-defined]
    assert repr(seq).startswith("<SharedSequence 3 items, ")


def test_an_unpicklable_item_is_named() -> None:
    with pytest.raises(ArgumentTypeError, match=r"item 2 \(builtins.function\) cannot be pickled"):
        SharedSequence([1, 2, lambda: 3])
    with pytest.raises(TypeError, match=r"item 1 .*generator"):  # also a TypeError
        SharedSequence([1, (i for i in range(3))])


def test_it_pickles_as_one_buffer() -> None:
    items = trial_items(50_000)
    seq = SharedSequence(items)
    data = pickle.dumps(seq, protocol=5)
    assert len(data) <= seq.nbytes + 1024
    copy = pickle.loads(data)
    assert list(copy) == items
    # about ten opcodes, not one per item: pickle stores the two arrays, not the objects
    assert len(pickle.dumps(seq, protocol=4)) <= seq.nbytes + 1024
    view = seq[10:20]
    assert len(pickle.dumps(view)) < 2048  # only the span of a view travels
    assert list(pickle.loads(pickle.dumps(view))) == items[10:20]


def test_it_is_smaller_than_the_objects() -> None:
    items = trial_items(100_000)
    objects = sum(sys.getsizeof(t) + sum(sys.getsizeof(x) for x in t) for t in items)
    assert SharedSequence(items).nbytes < objects / 3


# fork: inherited pages; spawn: the buffer re-attached from a pickled handle (forkserver: the same)
@pytest.mark.parametrize("context", tiered(START_METHODS, {"fork", "spawn"}))
def test_workers_read_it_under_every_start_method(context: str) -> None:
    items = trial_items(2000)
    dataset = ItemsDataset(SharedSequence(items))
    loader = DataLoader(
        dataset, batch_size=None, num_workers=2, multiprocessing_context=context, shuffle=False
    )
    assert [tuple(sample) for sample in loader] == items  # default_convert makes lists
    if context != "fork":
        return  # loaderkit's workers receive the dataset as torch's do: pickled, as above
    with create_dataloader(
        dataset, batch_size=500, num_workers=2, multiprocessing_context=context
    ) as ours:
        names = [name for batch in ours for name in batch[0]]
    assert names == [name for name, _, _ in items]


def _growth_in_a_forked_worker(items: object) -> int:
    loader = DataLoader(
        ReadEverything(items), batch_size=None, num_workers=1, multiprocessing_context="fork"
    )
    (result,) = list(loader)
    return int(result["growth"])


def test_reading_every_item_in_a_forked_worker_copies_nothing() -> None:
    items = trial_items(300_000)  # ~55 MiB of objects
    objects = sum(sys.getsizeof(t) + sum(sys.getsizeof(x) for x in t) for t in items)
    seq = SharedSequence(items)
    list_growth = _growth_in_a_forked_worker(items)
    seq_growth = _growth_in_a_forked_worker(seq)
    # the list's pages are copied as the worker reads them; the buffer's never are
    assert list_growth > 0.5 * objects, (list_growth, objects)
    assert seq_growth < 0.05 * objects, (seq_growth, objects)
