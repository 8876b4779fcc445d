"""HDF5 session files for PyTorch: a leak-free dataset, batched reads and a block sampler.

``HDF5SessionDataset`` reads samples from many per-session HDF5 files through a bounded,
fork-safe, thread-safe per-process cache of open files; ``BlockShuffleSampler`` shuffles
blocks of consecutive rows so that batched reads stay sequential. See ``docs/hdf5.md``.

Modules: ``dataset`` (the dataset class: hooks, reading, pickling) with its bases ``access``
(accessors), ``budgeting`` (open-file and held-session budgets) and ``inspection`` (what the
files hold, read once at construction); ``arguments`` (its constructor arguments), ``keys``
(what each file holds of the keys), ``records`` (``KeySpec``, ``SessionRecord``), ``reader``
(``SessionReader``: default reads) with its bases ``sessionfiles`` (state, handles, the checks
that a file did not change, error context) and ``widereads`` (keys whose rows span many
chunks); ``types`` (HDF5 type -> sample), ``reading`` (which read strategy), ``runs`` (a batch
cut into runs of consecutive rows), ``filters`` (compression filters available?), ``diagnose``
(causes established by checks), ``handles`` (per-process file cache), ``index`` (packed sample
index), ``layout`` (per-session layout, chunk cache, hints), ``rawio`` (``os.preadv`` reads,
maps, chunk maps), ``chunkio`` (chunked rows read raw outside h5py, ``ReadPath``), ``codecs``
(filters decoded in the reading thread), ``blocks`` (boxes of whole chunks), ``wide`` (rows
that span many chunks, each chunk read once), ``held`` (sessions held in memory); ``sampler``
stands apart (it reads the dataset's public accessors only), and ``rechunk`` rewrites files row
by row (``loaderkit rechunk``). Sessions read through a node cache (remote URLs, or local paths
with ``cache=``): ``sources`` (which sessions, leases, the prefetch window and the
``OrderWatcher`` the loader feeds), ``remotemeta`` (their metadata by range reads, kept in the
cache directory), ``cached`` (fetch order, budgets and plan rows of the dataset) and
``rowcache`` (``SessionCache(layout="rows")``); ``loaderkit.storage`` below does the fetching
and knows nothing of HDF5.

Imports go down only: to ``loaderkit.storage``, ``loaderkit.policy.budgets``,
``loaderkit.order`` (seeds, global batches), ``loaderkit.workers`` (batch buffers),
``loaderkit.machine`` and ``loaderkit.errors``; ``planning`` and the command line use it.

Example:
    >>> from loaderkit.hdf5 import BlockShuffleSampler, HDF5SessionDataset
    >>> ds = HDF5SessionDataset(paths, key="betas")  # doctest: +SKIP
    >>> sampler = BlockShuffleSampler(ds, seed=0)  # doctest: +SKIP
"""

from __future__ import annotations

from loaderkit.errors import HDF5FileError
from loaderkit.hdf5.dataset import HDF5SessionDataset
from loaderkit.hdf5.handles import CacheInfo
from loaderkit.hdf5.held import HeldInfo
from loaderkit.hdf5.index import SampleIndex
from loaderkit.hdf5.layout import SessionLayout, default_chunk_cache
from loaderkit.hdf5.rechunk import RechunkResult, rechunk
from loaderkit.hdf5.sampler import DEFAULT_BLOCK_SIZE, BlockShuffleSampler

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "BlockShuffleSampler",
    "CacheInfo",
    "HDF5FileError",
    "HDF5SessionDataset",
    "HeldInfo",
    "RechunkResult",
    "SampleIndex",
    "SessionLayout",
    "default_chunk_cache",
    "rechunk",
]
