"""Drawing a pass's indices a little ahead of torch, for a dataset that fetches what comes next.

A dataset read through a node cache (``HDF5SessionDataset`` over remote files) fetches its
next sessions in the background while the current ones are read. It learns which come next
from the loader: ``PassIndices`` (main process) wraps the sampler's iterator in
``look_ahead`` when the dataset offers a watcher (``dataset.prefetch_watcher()``), draws up to
``watcher.horizon`` samples ahead of what torch asks for, and yields the same items in the same
order. Nothing else changes: the order, the batches, what resume records (the state is taken
before the first draw; only batches handed to the caller are counted).

Examples:
    >>> class Watcher:
    ...     horizon = 4
    ...     def drawn(self, items): print("drawn", items)
    ...     def reading(self): print("reading")
    >>> items = look_ahead([0, 1], iter([[2, 3], [4, 5]]), Watcher())
    >>> next(items)
    drawn [[0, 1], [2, 3]]
    reading
    [0, 1]
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator
from typing import Any

__all__ = ["look_ahead"]

logger = logging.getLogger(__name__)

_END = object()


def _size(item: Any) -> int:
    try:
        return max(1, len(item))
    except TypeError:
        return 1


def look_ahead(first: Any, rest: Iterator[Any], watcher: Any) -> Iterator[Any]:
    """``first`` then ``rest``, drawn up to ``watcher.horizon`` samples ahead.

    The watcher sees the items drawn since it was last told, in order (``drawn(items)``: one
    call for a burst of draws, such as the whole horizon at the start of a pass), and is told
    when the next one is handed on (``reading()``); its errors are logged and ignored (a hint
    never fails a pass). At least the item after the one handed on is drawn, whatever the
    horizon: a batch larger than the horizon still has its successor seen ahead.

    Example:
        >>> class Small:
        ...     horizon = 2
        ...     def drawn(self, items): pass
        ...     def reading(self): pass
        >>> list(look_ahead([0, 1, 2], iter([[3, 4, 5], [6]]), Small()))  # batches of 3
        [[0, 1, 2], [3, 4, 5], [6]]
    """
    horizon = int(getattr(watcher, "horizon", 1))
    pending: deque[tuple[Any, int]] = deque()
    count = 0
    exhausted = False

    def tell(name: str, *args: Any) -> None:
        try:
            getattr(watcher, name)(*args)
        except Exception:
            logger.debug("the prefetch watcher's %s failed", name, exc_info=True)

    pending.append((first, _size(first)))
    count += pending[-1][1]
    new = [first]
    while pending:
        while not exhausted and (count < horizon or len(pending) < 2):
            item = next(rest, _END)
            if item is _END:
                exhausted = True
                break
            pending.append((item, _size(item)))
            count += pending[-1][1]
            new.append(item)
        if new:
            tell("drawn", new)
            new = []
        item, size = pending.popleft()
        count -= size
        tell("reading")
        yield item
