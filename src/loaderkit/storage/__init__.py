"""Session files where users keep them: URLs, one bounded cache per node, fetching ahead.

This layer knows nothing of HDF5 or torch: it turns URLs into verified local files. ``hdf5/``
asks it for a local path (``SessionCache.lease``) and says what it will need soon
(``Prefetcher.ahead``); nothing else crosses the boundary. fsspec, s3fs and filelock are
imported inside functions only (``import loaderkit`` imports none of them).

Imports go down only, to ``loaderkit.errors`` and ``loaderkit.plan`` (``CacheLimit`` is a
``Decision``): the layer sits below ``hdf5/`` and beside everything else.

Modules, and where each runs:

- ``urls``: which names are URLs or globs, the ``remote`` extra: pure functions of the names.
- ``objects``: ``expand`` (one listing per glob), ``ObjectInfo`` (size, ETag, mtime) and
  ``stat_objects`` (one listing per prefix). *Main process*, once, when the dataset is built;
  the infos travel to workers by pickling.
- ``filesystems``: fsspec filesystems made lazily *in each process* that uses them, forgotten
  at a fork (async filesystems are not fork-safe).
- ``limits``: the cache's defaults fitted to the disk (pure) and the checks that refuse
  impossible limits. *Main process*, at construction.
- ``records``: what ``lease`` hands out (``CachedFile``) and the per-process ``CacheStats``.
- ``cache``: ``SessionCache``: ``lease`` in *any process* (main, workers, ranks, fetcher
  threads); holds only its configuration, so it pickles to spawned workers.
- ``entries``: the layout on disk, *shared by every process on the node*: complete files,
  sidecars, ``.part`` downloads in flight, lock and lease files, metadata records, counters;
  ``LAYOUT``, the table of them all, and ``check``, whether a file still matches its sidecar.
- ``healing``: a complete entry compared with its sidecar at every lease; a damaged one
  discarded (once per process and entry) and fetched again. *Any process that leases.*
- ``directory``: the cache directory made private (0700) and refused when others can write it
  (unless ``shared=True``). *Any process* that makes a ``SessionCache``.
- ``datarecords``: records kept as versioned JSON that decodes to data and registered classes
  only, never code (``hdf5/remotemeta``'s metadata records).
- ``maintenance``: ``ls``, ``usage``, ``clear`` and ``verify`` walking ``entries.LAYOUT``;
  *any process*, usually the CLI's while jobs run.
- ``locks``: file locks (``filelock`` mutexes, ``flock`` leases), released by the OS when a
  process dies, so nothing stale ever blocks a restart.
- ``download``: one object to one file, verified; *in the process or fetcher thread* that
  holds the entry's download lock.
- ``fetcher``: ``Prefetcher``: *background threads in the reading process*, started on first
  use; ``fetch_many`` for the CLI.
"""

from __future__ import annotations

from loaderkit.storage.cache import SessionCache, Transform
from loaderkit.storage.fetcher import Prefetcher, fetch_many
from loaderkit.storage.limits import CacheLimit, CacheLimits, DiskUsage, fit_cache_limits
from loaderkit.storage.objects import ObjectInfo, expand, stat_objects
from loaderkit.storage.records import (
    CachedFile,
    CacheEntry,
    CacheStats,
    ClearResult,
    VerifyResult,
)
from loaderkit.storage.urls import REMOTE_EXTRA, is_url, local_path, require_remote

__all__ = [
    "REMOTE_EXTRA",
    "CacheEntry",
    "CacheLimit",
    "CacheLimits",
    "CacheStats",
    "CachedFile",
    "ClearResult",
    "DiskUsage",
    "ObjectInfo",
    "Prefetcher",
    "SessionCache",
    "Transform",
    "VerifyResult",
    "expand",
    "fetch_many",
    "fit_cache_limits",
    "is_url",
    "local_path",
    "require_remote",
    "stat_objects",
]
