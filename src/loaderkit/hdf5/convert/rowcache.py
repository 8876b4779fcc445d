"""``SessionCache(layout="rows")``: the cache keeps a row-chunked copy (``loaderkit rechunk``).

Two halves that must agree:

- ``RowsTransform(key)``: what the cache runs on a fetched file before it renames it into
  place (``SessionCache.lease(transform=...)``): ``rechunk.rechunk`` (``layout="auto"``:
  contiguous rows, or chunks of whole rows for compressed data), verified value for value,
  written under the cache's temporary name. It runs in whichever process or fetcher thread
  downloads the entry.
- ``cached_record``: the ``SessionRecord`` a dataset keeps for a session read through the
  cache: no local identity (the cache keys the copy by the store's), and for the ``rows``
  layout the first key's storage as the copy will have it, so that the reader takes the
  row-wise fast path (``os.preadv`` of contiguous rows) from the start.

Fork safety: the transform runs h5py in a prefetch thread of the main process, and the loader
forks non-persistent workers at every pass while that thread may be inside h5py. A child forked
then inherits h5py's global lock held by a thread that does not exist in it (h5py < 3.14
deadlocks at the child's first h5py call; h5py#2584) and HDF5's state mid-write. So every
transform holds ``FORK_GUARD`` and an ``os.register_at_fork(before=...)`` hook takes it too: a
fork waits until no transform runs (the hook runs before h5py's own, registered at its import:
Python calls ``before`` hooks last-registered first), and a transform waits until the fork is
done. The child gets a fresh guard.

Example:
    >>> RowsTransform("betas").key
    'betas'
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path

import h5py
import numpy as np

from loaderkit.hdf5.convert.rechunk import CHUNK_BYTES, choose_layout, rechunk
from loaderkit.hdf5.meta.keyspecs import KeySpec, SessionRecord

__all__ = ["FORK_GUARD", "RowsTransform", "cached_record", "rows_key"]

#: Held by every running ``RowsTransform`` and across every ``os.fork`` of this process.
FORK_GUARD = threading.RLock()


def rows_key(specs: Sequence[KeySpec]) -> KeySpec | None:
    """The key the ``rows`` layout rewrites: the first, when it is a dataset along axis 0."""
    if not specs or specs[0].members or specs[0].axis != 0:
        return None
    return specs[0]


class RowsTransform:
    """``transform(src, dst)``: ``dst`` is ``src`` with ``key`` stored row by row, verified.

    Picklable (spawned workers lease with it too).
    """

    def __init__(self, key: str) -> None:
        self.key = key

    def __call__(self, src: Path, dst: Path) -> None:
        """Write ``dst`` from ``src`` (a scratch directory beside ``dst``, removed after).

        Holds ``FORK_GUARD`` throughout: this process does not fork while it runs.
        """
        with FORK_GUARD:
            out = Path(f"{dst}.d")
            out.mkdir()
            try:
                (result,) = rechunk([src], self.key, out, layout="auto")
                os.replace(result.target, dst)
            finally:
                shutil.rmtree(out, ignore_errors=True)

    def __repr__(self) -> str:
        return f"RowsTransform({self.key!r})"


def cached_record(
    record: SessionRecord, f: h5py.File, specs: Sequence[KeySpec], layout: str
) -> SessionRecord:
    """``record`` as it holds for the cache's copy of the file ``f`` (see the module doc)."""
    record = record._replace(identity=None)
    spec = rows_key(specs)
    if layout != "rows" or spec is None or not record.layouts:
        return record
    dset = f[spec.path]
    chunks = choose_layout(dset, "auto", CHUNK_BYTES)
    first = record.layouts[0]
    if chunks is None:
        stored = first._replace(chunk_rows=None, chunk_bytes=None, chunk_shape=None)
    else:
        nbytes = int(np.prod(chunks, dtype=np.int64)) * dset.dtype.itemsize
        stored = first._replace(
            chunk_rows=int(chunks[0]), chunk_bytes=nbytes, chunk_shape=tuple(map(int, chunks))
        )
    return record._replace(layouts=(stored, *record.layouts[1:]))


def _before_fork() -> None:
    FORK_GUARD.acquire()


def _after_fork_in_parent() -> None:
    FORK_GUARD.release()


def _after_fork_in_child() -> None:
    global FORK_GUARD
    FORK_GUARD = threading.RLock()  # the parent's is held by the forking thread


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )
