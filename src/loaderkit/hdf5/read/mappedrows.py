"""Rows of a batch gathered from memory maps: one ``np.take`` per session.

``take_mapped`` reads a batch of a key whose files ``SessionFiles`` opened memory-mapped
(``memory_map=True``, contiguous numbers). Block-shuffled batches come in a few stretches of
one session each: each stretch is taken straight into the batch. Where sessions interleave
(uniform shuffling), the rows are taken session by session into a scratch batch and put in
request order with one scatter. Either way the batch is copied at memory speed by a handful of
C calls that release the GIL (threads copy in parallel). The file is checked (``verify``)
before every copy: a truncated file is an error, not ``SIGBUS``.

Example:
    >>> take_mapped.__name__
    'take_mapped'
"""

from __future__ import annotations

import numpy as np

from loaderkit.hdf5.meta.index import ROW_BITS, ROW_MASK
from loaderkit.hdf5.read.scratch import ScratchRows
from loaderkit.hdf5.read.sessionfiles import SessionFiles

__all__ = ["take_mapped"]


def take_mapped(
    files: SessionFiles,
    k: int,
    idx: np.ndarray,
    keys: np.ndarray,
    out: np.ndarray,
    scratch: ScratchRows,
) -> bool:
    """Gather the rows ``keys`` of key ``k`` (dataset indices ``idx``) into ``out``.

    Returns ``False`` (nothing read) when a session is not mapped (any more): the caller
    reads the whole batch another way.
    """
    n = keys.shape[0]
    pos = keys >> ROW_BITS
    cuts = np.flatnonzero(pos[1:] != pos[:-1]) + 1
    order: np.ndarray | None = None
    target = out
    if (cuts.size + 1) * 4 > n:  # interleaved sessions: gather by session, then scatter
        order = np.argsort(pos, kind="stable")
        keys, idx, pos = keys[order], idx[order], pos[order]
        cuts = np.flatnonzero(pos[1:] != pos[:-1]) + 1
        rt = files.types[k]  # the thread's scratch, unless ``out`` is that scratch already
        target = np.empty_like(out) if rt.swap else scratch.rows(n, rt.read_dtype, rt.row_shape)
    rows = keys & ROW_MASK
    starts = np.concatenate(([0], cuts))
    bounds = [*starts.tolist(), n]
    checked: set[int] = set()
    for s, p in enumerate(pos[starts].tolist()):
        k0, k1 = bounds[s], bounds[s + 1]
        handle = files.leased(p, int(rows[k0]), int(idx[k0]))
        try:
            mapped = handle.maps[k]
            if mapped is None:
                return False  # not mapped (any more): _fill reads the whole batch again
            if p not in checked:  # never fault on a truncated map: once per file and batch
                files.verify(handle, p, "rows", int(idx[k0]))
                checked.add(p)
            segment = target[k0:k1]
            # rows were checked against the file when it was opened (its record);
            # mode="clip" because numpy buffers ``out`` for mode="raise"
            np.take(mapped, rows[k0:k1], axis=0, out=segment, mode="clip")
        finally:
            mapped = None  # no view left: a retired handle's map closes at release
            files.file_pool.release(handle)
    if order is not None:
        out[order] = target
    return True
