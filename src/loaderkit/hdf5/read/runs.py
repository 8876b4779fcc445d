"""How a batch of packed (session, row) keys is cut into runs of consecutive rows.

Pure: ``plan_runs`` decides the read order and where each run starts; the readers
(``loaderkit.hdf5.read.reader``) do the reading.
"""

from __future__ import annotations

import numpy as np

__all__ = ["plan_runs"]


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
