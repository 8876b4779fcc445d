"""HDF5 session files for PyTorch: a leak-free dataset, batched reads and a block sampler.

``HDF5SessionDataset`` reads samples from many per-session HDF5 files through a bounded,
fork-safe, thread-safe per-process pool of open files; ``BlockShuffleSampler`` shuffles
blocks of consecutive rows so that batched reads stay sequential. See ``docs/hdf5.md``.

Stages, each a folder; imports go one way, from the top of this list down:

- ``dataset``: ``HDF5SessionDataset`` and its constructor arguments;
- ``remote``: sessions read through ``loaderkit.storage.SessionCache`` (sources, the order
  watcher, remote metadata);
- ``convert``: files rewritten row by row (``loaderkit rechunk``, the cache's rows layout);
- ``anndata``: AnnData's own: ``.h5ad`` CSR and dense matrices, their genes (``join=``,
  ``genes=``), the per-cell columns beside them, ``cells=``, balanced draws;
- ``read``: handles, raw I/O, runs, the row reader and its contract, held sessions;
- ``meta``: what files hold (types, layouts, filters, the index, diagnoses).

``sampler`` stands apart (it reads the dataset's public accessors only). Each folder's
``__init__`` maps its modules. Below the package, imports go to ``loaderkit.storage``,
``loaderkit.policy.budgets``, ``loaderkit.order`` (seeds, global batches),
``loaderkit.batches`` (the finished-batch contract), ``loaderkit.machine`` and ``loaderkit.errors``;
``planning`` and the command line use it.

Example:
    >>> from loaderkit.hdf5 import BlockShuffleSampler, HDF5SessionDataset
    >>> ds = HDF5SessionDataset(paths, key="betas")  # doctest: +SKIP
    >>> sampler = BlockShuffleSampler(ds, seed=0)  # doctest: +SKIP
"""

from __future__ import annotations

from loaderkit.errors import HDF5FileError, Moved, moved_module_getattr
from loaderkit.hdf5.convert.rechunk import RechunkResult, rechunk
from loaderkit.hdf5.dataset.dataset import HDF5SessionDataset
from loaderkit.hdf5.meta.index import SampleIndex
from loaderkit.hdf5.meta.layout import SessionLayout, default_chunk_buffer
from loaderkit.hdf5.read.handles import FilePoolInfo
from loaderkit.hdf5.read.heldsessions import HeldInfo
from loaderkit.hdf5.sampler import DEFAULT_BLOCK_SIZE, BlockShuffleSampler

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "BlockShuffleSampler",
    "FilePoolInfo",
    "HDF5FileError",
    "HDF5SessionDataset",
    "HeldInfo",
    "RechunkResult",
    "SampleIndex",
    "SessionLayout",
    "default_chunk_buffer",
    "rechunk",
]


#: Released names that moved: each answers the same with a warning for one release.
__getattr__ = moved_module_getattr(
    __name__,
    {
        "CacheInfo": Moved("FilePoolInfo", "0.1.0"),
        "default_chunk_cache": Moved("default_chunk_buffer", "0.1.0"),
    },
)
