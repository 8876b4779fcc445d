"""The order watcher: which sessions come next, from bursts of drawn items (no files needed)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from loaderkit.hdf5.remote.sources import OrderWatcher
from loaderkit.order.lookahead import look_ahead

ROWS = 10  # index i lies in session i // ROWS


def _positions(indices: Any) -> np.ndarray:
    idx = np.asarray(indices).reshape(-1)
    if idx.dtype.kind not in "iu":
        return np.full(idx.size, -1)
    return np.where((idx >= 0) & (idx < 50), idx // ROWS, -1)


class _Sources:
    """Records the windows the watcher sends."""

    class cache:  # stands for the SessionCache
        prefetch = 1

    def __init__(self) -> None:
        self.windows: list[list[int]] = []

    def cached(self, pos: int) -> bool:
        return True

    def ahead(self, window: list[int]) -> None:
        self.windows.append(list(window))


def _one_by_one(items: list[Any]) -> list[tuple[int, int]]:
    """The runs as item-by-item reasoning gives them: (item number, session) at each change."""
    runs, last = [], None
    for number, item in enumerate(items):
        for pos in _positions(np.asarray(item)).tolist():
            if pos >= 0 and pos != last:
                runs.append((number, pos))
                last = pos
    return runs


@pytest.mark.parametrize(
    "items",
    [
        [[0, 1, 2], [3, 4, 5], [10, 11, 12], [13, 20, 21], [22, 1, 2]],  # equal batches
        [[0, 1, 2, 3], [4, 30], [31], [32, 33, 5]],  # ragged: a short last batch, custom sizes
        [0, 1, 12, 13, 2, 40],  # single indices (batch_size=None)
        [[0, 1], [99, 12], [-7, 13], [14, 1000]],  # indices that are not the dataset's
        [np.array([0, 1]), np.array([12, 13]), np.array([20])],  # arrays (a custom sampler)
        [["a", "b"], ["c"]],  # keys, not indices: no session
    ],
    ids=["batches", "ragged", "indices", "out-of-range", "arrays", "keys"],
)
def test_a_burst_gives_the_runs_one_by_one_does(items: list[Any]) -> None:
    burst = OrderWatcher(None, _positions, 1000)
    burst.drawn(items)
    split = OrderWatcher(None, _positions, 1000)
    for k in range(0, len(items), 2):  # the same items told two at a time
        split.drawn(items[k : k + 2])
    expected = _one_by_one(items)
    assert list(burst._runs) == expected and list(split._runs) == expected


def test_look_ahead_tells_a_burst_then_moves_the_window_per_session() -> None:
    sources = _Sources()
    watcher = OrderWatcher(sources, _positions, horizon=6)
    batches = [[0, 1], [2, 3], [10, 11], [12, 13], [20, 21], [30, 31]]
    calls: list[int] = []
    drawn = watcher.drawn
    watcher.drawn = lambda items: (calls.append(len(items)), drawn(items))[1]  # type: ignore[method-assign]
    got = list(look_ahead(batches[0], iter(batches[1:]), watcher))
    assert got == batches  # the same items, in the same order
    assert calls[0] == 3 and sum(calls) == len(batches)  # a burst of the horizon (6 samples)
    assert sources.windows == [[0, 1], [1, 2], [2, 3], [3]]  # read session + prefetch=1
