"""How a batch of packed (session, row) keys is cut into runs of consecutive rows.

``plan_runs`` (pure) decides the read order and where each run starts; the readers
(``loaderkit.hdf5.read.reader``) read the runs, or ``read_runs`` reads them through a
dataset's ``read_rows`` hook.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from loaderkit.errors import ConfigError
from loaderkit.hdf5.meta.index import ROW_BITS, ROW_MASK
from loaderkit.hdf5.read.sessionfiles import SessionFiles

__all__ = ["plan_runs", "read_runs"]


def plan_runs(
    keys: np.ndarray, *, sort: bool, always: bool
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Choose how to read a batch given its packed (session, row) keys.

    Returns ``(order, starts)``: ``order`` is the permutation to read in (``None``: request
    order) and ``starts`` the offsets, in that order, where a new run of consecutive rows of one
    session begins (consecutive keys differ by exactly 1). ``starts`` is ``None`` when
    per-sample reads in request order are best (nothing to coalesce through HDF5). On chunked
    data a sorted order is always used, so rows sharing a chunk are read one after another and
    the chunk is decompressed once. With ``always`` (contiguous data read with ``preadv``) runs
    in request order are always used: one system call per run, however short.

    Args:
        keys: Packed keys of the batch, in request order.
        sort: Read in sorted order (chunked data).
        always: Read runs in request order (contiguous data).

    Returns:
        ``(order, starts)`` as described above.

    Example:
        >>> order, starts = plan_runs(np.array([5, 6, 7, 1, 2]), sort=False, always=False)
        >>> order is None, starts.tolist()
        (True, [0, 3])
    """
    n = keys.shape[0]
    brk = _breaks(keys)
    if (brk.size + 1) * 2 <= n or always:
        return None, _starts(brk)
    order = np.argsort(keys, kind="stable")
    brk2 = _breaks(keys[order])
    if (brk2.size + 1) * 2 <= n or sort:
        return order, _starts(brk2)
    return None, None


# A handful of numpy calls on small arrays (``np.diff`` and ``np.concatenate`` of a list cost
# several times as much): every batch plans its runs, and holds the GIL while it does.
def _breaks(keys: np.ndarray) -> np.ndarray:
    """Where key ``i + 1`` does not follow key ``i``."""
    return (keys[1:] - keys[:-1] != 1).nonzero()[0]  # np.flatnonzero: two Python wrappers more


def _starts(brk: np.ndarray) -> np.ndarray:
    """Run starts from ``_breaks``: 0, then every break plus one."""
    starts = np.zeros(brk.size + 1, np.intp)
    np.add(brk, 1, out=starts[1:])
    return starts


def read_runs(
    files: SessionFiles,
    read_rows: Callable[[Hashable, int, int], Sequence[Any]],
    idx: np.ndarray,
    keys: np.ndarray,
    order: np.ndarray | None,
    starts: np.ndarray | None,
) -> list[Any]:
    """Coalesced reads through a subclass's ``read_rows``; caller holds the handle lock.

    Args:
        files: The reader's files (ids for the hook, handles discarded and errors noted).
        read_rows: The subclass's hook.
        idx: Dataset indices of the batch (for messages).
        keys: Their packed keys.
        order: Read order from ``plan_runs``.
        starts: Run starts from ``plan_runs`` (``None``: one run per sample).

    Returns:
        One sample per key, in request order.

    Raises:
        ConfigError: ``read_rows`` returned the wrong number of samples.
    """
    n = idx.size
    if starts is None:
        starts = np.arange(n)
    run_keys = (keys[starts] if order is None else keys[order[starts]]).tolist()
    bounds = starts.tolist()
    bounds.append(n)
    result: list[Any] = [None] * n
    targets = list(range(n)) if order is None else order.tolist()
    ids = files.ids
    for r, key in enumerate(run_keys):
        pos, a = key >> ROW_BITS, key & ROW_MASK
        k, k2 = bounds[r], bounds[r + 1]
        try:
            samples = read_rows(ids[pos], a, a + (k2 - k))
            if len(samples) != k2 - k:
                raise ConfigError(
                    f"read_rows({ids[pos]!r}, {a}, {a + k2 - k}) returned {len(samples)} "
                    f"samples, expected {k2 - k}."
                )
        except Exception as exc:
            files.file_pool.discard(files.canonical[pos])
            files.note(exc, pos, a, int(idx[targets[k]]))
            raise
        for t, sample in zip(targets[k:k2], samples, strict=True):
            result[t] = sample
    return result
