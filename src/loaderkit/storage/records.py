"""What the cache hands out and counts: leases, statistics, listings.

``CachedFile`` belongs to the process that took it (a ``flock`` lease on the entry). The
counters behind ``CacheStats`` are kept twice: per process (``Counters``, shared by that
process's fetcher threads) and summed over every process that uses one ``SessionCache``
object (``Totals``: a 40-byte file in the cache directory updated under ``flock``, so that
DataLoader workers' leases and waits reach the main process's ``describe()`` under fork, spawn
and forkserver alike, and a killed worker leaves no lock held).
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loaderkit.storage.locks import Lease
from loaderkit.storage.objects import ObjectInfo

__all__ = [
    "CacheEntry",
    "CacheStats",
    "CachedFile",
    "ClearResult",
    "Counters",
    "Totals",
    "VerifyResult",
]

logger = logging.getLogger(__name__)

_FIELDS = ("hits", "misses", "bytes_fetched", "evictions")
_RECORD = struct.Struct("<4qd")  # the four counters, then seconds waiting
#: Totals files not touched for this long are a dead job's: removed when a cache is made.
STALE_TOTALS = 7 * 24 * 3600.0


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
    """What ``clear()`` did: entries removed, bytes freed, URLs skipped because in use.

    Attributes:
        removed: Complete entries removed.
        freed_bytes: Bytes freed in all (entries, downloads, records, counters).
        in_use: URLs of the entries kept because a process leases them.
        other: Other files removed, per ``entries.LAYOUT`` group (``meta``, ``stats``...).
    """

    removed: int
    freed_bytes: int
    in_use: tuple[str, ...]
    other: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class VerifyResult:
    """What ``verify()`` found: entries checked, and what it removed and why.

    Attributes:
        checked: Complete entries checked.
        damaged: ``(url, path, what no longer matches)`` of each entry removed.
        records: Metadata records removed (not this loaderkit's data).
    """

    checked: int
    damaged: tuple[tuple[str, str, str], ...]
    records: tuple[str, ...]


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


class Totals:
    """Counters summed over the processes that use one ``SessionCache`` object.

    The process that makes the cache owns a small file (``<dir>/stats/<pid>-<token>.bin``);
    the cache travels to DataLoader workers (forked, or pickled for spawn) with the file's
    path, and every process adds to it under an exclusive ``flock`` (opened per update and
    closed after it: no descriptor is held, and the lock of a process killed mid-update goes
    with it). The owner removes the file when its cache object goes; a dead job's file is
    removed by the next cache made in that directory after ``STALE_TOTALS`` seconds.

    Args:
        path: The file.

    Examples:
        >>> import tempfile, pathlib
        >>> totals = Totals(pathlib.Path(tempfile.mkdtemp()) / "t.bin")
        >>> totals.add("hits", 2); totals.add("misses", 1, waiting=0.5)
        >>> totals.read()
        ({'hits': 2, 'misses': 1, 'bytes_fetched': 0, 'evictions': 0}, 0.5)
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, directory: Path) -> Totals:
        """A new file in ``directory``, removed when the returned object is collected here."""
        import secrets

        with contextlib.suppress(OSError):
            directory.mkdir(parents=True, exist_ok=True)  # inside the cache directory
            cutoff = time.time() - STALE_TOTALS
            for old in directory.glob("*.bin"):
                with contextlib.suppress(OSError):
                    if old.stat().st_mtime < cutoff:
                        old.unlink()
        totals = cls(directory / f"{os.getpid()}-{secrets.token_hex(8)}.bin")
        weakref.finalize(totals, _remove_owned, totals.path, os.getpid())
        return totals

    def __reduce__(self) -> Any:
        return (Totals, (self.path,))  # a copy (a worker's) adds to the same file, owns none

    def add(self, name: str, amount: int = 1, waiting: float = 0.0) -> None:
        """Add to one counter (and to the seconds waited); a file that fails counts nothing."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError:
            logger.debug("cache totals %s: not counted", self.path, exc_info=True)
            return
        try:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX)
            values, seconds = self._unpack(os.read(fd, _RECORD.size))  # just opened: at 0
            values[name] += amount
            os.pwrite(fd, _RECORD.pack(*values.values(), seconds + waiting), 0)
        except OSError:
            logger.debug("cache totals %s: not counted", self.path, exc_info=True)
        finally:
            os.close(fd)  # releases the lock

    def read(self) -> tuple[dict[str, int], float]:
        """The counters and seconds waited, summed over the processes (zeros: none yet)."""
        try:
            with open(self.path, "rb") as f:
                return self._unpack(f.read(_RECORD.size))
        except OSError:
            return self._unpack(b"")

    @staticmethod
    def _unpack(data: bytes) -> tuple[dict[str, int], float]:
        if len(data) != _RECORD.size:
            return dict.fromkeys(_FIELDS, 0), 0.0
        *counts, seconds = _RECORD.unpack(data)
        return dict(zip(_FIELDS, counts, strict=True)), float(seconds)


def _remove_owned(path: Path, owner: int) -> None:
    if os.getpid() == owner:  # never a forked child's inherited finalizer
        with contextlib.suppress(OSError):
            path.unlink()


class Counters:
    """This process's statistics (the fetcher's threads add to them too).

    Args:
        totals: Where every process using the same cache object also adds (``None``: here
            only).
    """

    def __init__(self, totals: Totals | None = None) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.values = dict.fromkeys(_FIELDS, 0)
        self.waiting = 0.0
        self.warned: set[str] = set()
        #: Entries (keys) this process discarded as damaged and fetched again.
        self.repaired: set[str] = set()
        #: ``(key, inode, mtime_ns)`` of entries checked against the store (``shared=True``).
        self.verified: set[tuple[str, int, int]] = set()
        self.totals = totals

    def add(self, name: str, amount: int = 1, waiting: float = 0.0) -> None:
        """Add ``amount`` to the counter ``name`` and ``waiting`` seconds to the time waited."""
        with self.lock:
            self.values[name] += amount
            self.waiting += waiting
        if self.totals is not None:
            self.totals.add(name, amount, waiting)

    def wait(self, seconds: float) -> None:
        """Add ``seconds`` to the time waited."""
        with self.lock:
            self.waiting += seconds
        if self.totals is not None:
            self.totals.add("hits", 0, seconds)
