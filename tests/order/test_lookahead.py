"""``look_ahead``: every item of a pass, in order, whatever the horizon against the batches."""

from __future__ import annotations

from typing import Any

import pytest

from loaderkit.order.lookahead import look_ahead


class _Watcher:
    def __init__(self, horizon: int) -> None:
        self.horizon = horizon
        self.seen: list[Any] = []
        self.handed = 0

    def drawn(self, items: list[Any]) -> None:
        self.seen.extend(items)

    def reading(self) -> None:
        self.handed += 1
        # the item after the one handed on is always known ahead (unless the pass ends)
        assert len(self.seen) >= min(self.handed + 1, 20)


@pytest.mark.parametrize("horizon", [1, 3, 64, 4096, 10**6])
def test_every_batch_comes_whatever_the_horizon(horizon: int) -> None:
    batches = [list(range(i * 64, i * 64 + 64)) for i in range(20)]
    watcher = _Watcher(horizon)
    got = list(look_ahead(batches[0], iter(batches[1:]), watcher))
    assert got == batches
    assert watcher.seen == batches and watcher.handed == 20
