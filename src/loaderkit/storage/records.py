"""What the cache hands out and counts: leases, per-process statistics, listings.

``CachedFile`` belongs to the process that took it (a ``flock`` lease on the entry); the
counters behind ``CacheStats`` are per process, shared by that process's fetcher threads.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loaderkit.storage.locks import Lease
from loaderkit.storage.objects import ObjectInfo

__all__ = ["CacheEntry", "CacheStats", "CachedFile", "ClearResult", "Counters"]


@dataclass(frozen=True)
class CacheStats:
    """What this process's leases did: hits, misses, bytes fetched, waiting, evictions.

    Attributes:
        hits: Leases served from the directory (including after waiting for another process).
        misses: Leases that downloaded the object.
        bytes_fetched: Bytes this process downloaded.
        seconds_waiting: Time spent waiting for another process's download or for room.
        evictions: Entries this process evicted.
        free_bytes: Free bytes on the cache's disk now.
    """

    hits: int = 0
    misses: int = 0
    bytes_fetched: int = 0
    seconds_waiting: float = 0.0
    evictions: int = 0
    free_bytes: int = 0


@dataclass(frozen=True)
class CacheEntry:
    """One complete entry, for ``ls()`` and the CLI."""

    url: str
    size: int
    path: Path
    last_used: float
    in_use: bool
    layout: str
    etag: str | None


@dataclass(frozen=True)
class ClearResult:
    """What ``clear()`` did: entries removed, bytes freed, URLs skipped because in use."""

    removed: int
    freed_bytes: int
    in_use: tuple[str, ...]


class CachedFile:
    """A leased local copy: ``path`` stays on disk until ``close()`` (or the ``with`` block ends).

    Not picklable: a lease belongs to the process that took it.
    """

    def __init__(self, path: Path, info: ObjectInfo, lease: Lease) -> None:
        self.path = path
        self.info = info
        self._lease = lease

    @property
    def closed(self) -> bool:
        """Whether the lease was released."""
        return not self._lease.held

    def close(self) -> None:
        """Release the lease; the entry may be evicted from now on. Idempotent."""
        self._lease.close()

    def __enter__(self) -> CachedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> Any:
        raise TypeError("a CachedFile (a lease on a cache entry) belongs to its process")

    def __repr__(self) -> str:
        state = "released" if self.closed else "leased"
        return f"<CachedFile {self.info.url} -> {self.path} ({state})>"


class Counters:
    """This process's statistics (the fetcher's threads add to them too)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.values = {"hits": 0, "misses": 0, "bytes_fetched": 0, "evictions": 0}
        self.waiting = 0.0
        self.warned: set[str] = set()

    def add(self, name: str, amount: int = 1, waiting: float = 0.0) -> None:
        """Add ``amount`` to the counter ``name`` and ``waiting`` seconds to the time waited."""
        with self.lock:
            self.values[name] += amount
            self.waiting += waiting

    def wait(self, seconds: float) -> None:
        """Add ``seconds`` to the time waited."""
        with self.lock:
            self.waiting += seconds
