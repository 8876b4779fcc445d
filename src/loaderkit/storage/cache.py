"""``SessionCache``: one bounded directory of whole files per node, shared through file locks.

Any process (main, DataLoader workers, other ranks on the node, the fetcher's threads) calls
``lease(url, info)`` and gets a ``CachedFile``: a local path that stays on disk until the lease
is closed. The ``SessionCache`` object itself holds only its configuration (picklable, sent to
spawned workers as is); each process keeps its own counters and adds them to the totals of
every process using the same cache object (``stats()``; ``records.Totals``). Everything shared
lives in the directory (see ``loaderkit.storage.entries`` for the layout):

- a hit takes the entry's lease (``flock(LOCK_SH)``) and touches its LRU time;
- a miss takes the entry's download mutex; a second process wanting the same object waits on
  it and then finds the file, so each object is fetched once per node. The downloader removes
  a dead download's ``.part`` leftovers, makes room under the directory's accounting lock
  (evicting least recently used entries that no process leases, until the cache's bytes plus
  the reserved in-flight bytes plus this object fit ``max_bytes`` and the disk keeps
  ``min_free``; if only leased entries are left, it waits with backoff up to ``room_timeout``),
  downloads to a ``.part`` name, verifies size and MD5 ETag, applies ``transform``, fsyncs,
  writes the sidecar and renames: no process ever sees a partial file under the final name;
- an object whose identity (ETag or size + mtime) changed gets a new entry: the old one is
  evicted at once if no process uses it, else left to its readers (POSIX keeps their open file
  intact) and evicted by LRU later; the change is warned about once per process.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from loaderkit.errors import ConfigError, StorageError, warn
from loaderkit.storage import entries, healing, maintenance
from loaderkit.storage.directory import private_directory
from loaderkit.storage.download import download, file_md5, fsync_directory, is_disk_full
from loaderkit.storage.entries import EntryFiles, Stored
from loaderkit.storage.filesystems import filesystem_for
from loaderkit.storage.limits import (
    CacheLimits,
    DiskUsage,
    check_limits,
    fit_cache_limits,
    format_bytes,
)
from loaderkit.storage.locks import Lease, mutex, try_exclusive
from loaderkit.storage.objects import ObjectInfo
from loaderkit.storage.records import (
    CachedFile,
    CacheEntry,
    CacheStats,
    ClearResult,
    Counters,
    Totals,
    VerifyResult,
)
from loaderkit.storage.urls import require_remote

__all__ = ["SessionCache", "Transform"]

logger = logging.getLogger(__name__)

Transform = Callable[[Path, Path], None]
"""``transform(src, dst)``: writes the entry's stored form (``layout="rows"``) from the download."""

Layout = Literal["stored", "rows"]

_COUNTERS_LOCK = threading.Lock()


class SessionCache:
    """One bounded cache directory per node, shared by every process on it through file locks.

    Args:
        dir: The directory (made if missing); default ``$LOADERKIT_CACHE``, else
            ``~/.cache/loaderkit``. Put it on the node's local disk (NVMe), not a shared one.
        max_bytes: Bound on the cached bytes; default 80 % of what the disk offers it.
        min_free: Free bytes the disk keeps; default 5 % of the disk, at least 1 GiB, lowered
            (not below 1 GiB) when the disk has less free than that and one session per reader
            (``check_limits``).
        prefetch: Sessions fetched ahead of the reader; default 2, lowered to what ``max_bytes``
            holds once the sessions are known (``check_limits``; the plan's ``prefetch`` row
            says why). An explicit value that cannot fit is a ``ConfigError``.
        layout: ``"stored"`` keeps the bytes as stored; ``"rows"`` keeps what the lease's
            ``transform`` writes (the HDF5 layer's row-chunked copy).
        room_timeout: Seconds a download waits for leased entries to be released when nothing
            else can be evicted, before ``StorageError``.
        shared: The directory is shared on purpose (a team's scratch area): it may be owned
            by another user or writable by others. Records stay data only, and every process
            checks each entry against the store's listing (size, and MD5 where the ETag is
            one) before its first use. Default ``False``: such a directory is refused.

    The directory is created private (mode 0700). A directory others can write (group- or
    world-writable) or another user owns is refused unless ``shared=True``: whoever can write
    there decides what every job reading the cache gets. A sticky world-writable parent such
    as ``/tmp`` is fine; the cache directory itself must be private.

    A complete entry whose file no longer matches its sidecar (size or modification time since
    it was written; its MD5 when an open fails) is discarded and fetched again, with a
    ``CacheRepairWarning``; damaged again in the same process, it is a ``CacheDamageError``.

    Raises:
        ConfigError: A bad ``layout`` or limit, a directory others can write or another user
            owns (without ``shared=True``), or the ``remote`` extra is not installed.

    Examples:
        >>> cache = SessionCache("/tmp/loaderkit-doc", max_bytes=2**30)  # doctest: +SKIP
        >>> with cache.lease(url, info, {"anon": True}) as cached:  # doctest: +SKIP
        ...     h5py.File(cached.path)
    """

    def __init__(
        self,
        dir: str | os.PathLike[str] | None = None,
        max_bytes: int | None = None,
        min_free: int | None = None,
        prefetch: int | None = None,
        layout: Layout = "stored",
        *,
        room_timeout: float = 600.0,
        shared: bool = False,
    ) -> None:
        require_remote("SessionCache")
        if layout not in ("stored", "rows"):
            raise ConfigError(f"layout must be 'stored' or 'rows', got {layout!r}")
        if not room_timeout >= 0:
            raise ConfigError(f"room_timeout must be a number of seconds >= 0, got {room_timeout}")
        default = os.environ.get("LOADERKIT_CACHE") or Path.home() / ".cache" / "loaderkit"
        self.dir = Path(dir if dir is not None else default).expanduser().absolute()
        self.layout: Layout = layout
        self.room_timeout = float(room_timeout)
        self.shared = bool(shared)
        private_directory(self.dir, self.shared)
        self.objects.mkdir(mode=0o777 if self.shared else 0o700, exist_ok=True)
        tag = self.dir / entries.TAG
        if not tag.exists():
            tag.write_text(entries.TAG_TEXT)
        self._defaults = fit_cache_limits(self.disk(), max_bytes, min_free, prefetch)
        self.limits: CacheLimits = self._defaults
        #: The limits fitted to the sessions (``check_limits``), before a loader's readers.
        self.session_limits: CacheLimits = self._defaults
        self._totals = Totals.create(self.dir / "stats")
        self._counters: Counters | None = None
        self._known: dict[ObjectInfo, EntryFiles] = {}

    @property
    def max_bytes(self) -> int:
        """Bound on the cached bytes."""
        return self.limits.max_bytes.value

    @property
    def min_free(self) -> int:
        """Free bytes the disk keeps."""
        return self.limits.min_free.value

    @property
    def prefetch(self) -> int:
        """Sessions fetched ahead of the reader."""
        return self.limits.prefetch.value

    @property
    def objects(self) -> Path:
        """The folder of complete entries, sidecars, leases and downloads."""
        return self.dir / "objects"

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_counters"] = None  # counters are per process
        state["_known"] = {}
        return state

    def __repr__(self) -> str:
        return (
            f"SessionCache(dir={str(self.dir)!r}, max_bytes={self.max_bytes}, "
            f"min_free={self.min_free}, prefetch={self.prefetch}, layout={self.layout!r}"
            f"{', shared=True' if self.shared else ''})"
        )

    def disk(self) -> DiskUsage:
        """The cache's disk now: total, free, and the bytes the cache holds."""
        return DiskUsage.detect(self.dir, cached=self.du())

    def check_limits(self, sizes: list[int], readers: int = 1) -> CacheLimits:
        """Fit the unset limits to these objects; ``ConfigError`` when they cannot hold them.

        What the caller left unset (``prefetch``, ``max_bytes``) is fitted again from the
        construction's defaults on every call (``limits.fit_to_sessions``): the cache's limits
        are those of the sessions it was last fitted to. Explicit values are only checked.

        Returns:
            The limits now in use (also ``self.limits``).
        """
        disk = self.disk()
        self.limits = self.session_limits = check_limits(self._defaults, disk, sizes, readers)
        return self.limits

    def stats(self, *, this_process: bool = False) -> CacheStats:
        """The counters now, and the disk's free bytes.

        Args:
            this_process: Only this process's counters. Default: summed over every process
                that uses this cache object: the one that made it and those it reached by
                fork or pickling (DataLoader workers, fetcher threads included).

        Examples:
            >>> SessionCache("/tmp/loaderkit-doc").stats().hits  # doctest: +SKIP
            0
        """
        if this_process:
            counters = self._state()
            with counters.lock:
                values = dict(counters.values)
                waiting = counters.waiting
        else:
            values, waiting = self._totals.read()
        return CacheStats(seconds_waiting=waiting, free_bytes=self._free(), **values)

    def lease(
        self,
        info: ObjectInfo,
        storage_options: Mapping[str, Any] | None = None,
        *,
        transform: Transform | None = None,
        progress: Callable[[int], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> CachedFile:
        """A local copy of ``info.url``, fetched if missing; kept on disk until closed.

        Args:
            info: The object as ``stat_objects`` listed it.
            storage_options: Keyword arguments for the fsspec filesystem.
            transform: ``transform(src, dst)`` writing the stored form (``layout="rows"``).
            progress: Called with each downloaded block's byte count.
            cancel: When set, a download in progress stops (``download.Cancelled``).

        Returns:
            The leased ``CachedFile``.

        Raises:
            FileNotFoundError: The object or its bucket does not exist.
            StorageAccessError: The store refused the credentials.
            StorageError: The disk filled up, no room came free within ``room_timeout``, or
                the bytes did not verify.
            ConfigError: The object is larger than ``max_bytes``.
        """
        counters = self._state()
        files = self._files(info)
        lease = Lease(files.lease)
        try:
            seen = healing.inode(files.data)
            damage = self.check_entry(info, files)
            if damage:
                self._discard(info, files, damage, seen)
            if not files.data.exists():
                started = time.monotonic()
                with mutex(files.lock):
                    waited = time.monotonic() - started
                    if files.data.exists():
                        counters.add("hits", waiting=waited)
                    else:
                        self._fetch(info, storage_options, files, transform, progress, cancel)
                        counters.add("misses")
            else:
                counters.add("hits")
            lease.touch()
            return CachedFile(files.data, info, lease)
        except BaseException:
            lease.close()
            raise

    def check_entry(self, info: ObjectInfo, files: EntryFiles | None = None) -> str:
        """What no longer matches between ``info``'s complete entry and its record (``""``: ok).

        ``healing.damage``: one ``stat`` and the sidecar's read; with ``shared=True``, also the
        store's size and MD5 (once per process and file). A missing entry is ``""``.
        """
        files = self._files(info) if files is None else files
        verified = self._state().verified if self.shared else None
        return healing.damage(files, info, self.layout, verified)

    def repair(
        self,
        cached: CachedFile,
        why: str,
        storage_options: Mapping[str, Any] | None = None,
        *,
        transform: Transform | None = None,
    ) -> CachedFile:
        """After ``cached`` failed to open: check it, and if damaged discard it and lease anew.

        The copy is checked against its record, then against the MD5 it was written with
        (or the store's ETag); a copy that matches is the object's own bytes, so ``cached``
        is returned as it is (the caller reports the object). A copy that does not match, or
        one whose checksum is unknown, is discarded and fetched again (``lease``) once per
        process and entry, with a ``CacheRepairWarning``.

        Args:
            cached: The lease whose file failed to open (released here when replaced).
            why: What failed, for the warning.
            storage_options: As for ``lease``.
            transform: As for ``lease``.

        Returns:
            ``cached`` unchanged (its copy is intact), or a new lease on a fresh copy.

        Raises:
            CacheDamageError: The entry was repaired in this process before.
        """
        info = cached.info
        files = self._files(info)
        seen = healing.inode(files.data)
        damage = self.check_entry(info, files)
        if not damage:
            record = entries.read_sidecar(files)
            known = record.get("md5") or (info.md5 if self.layout == "stored" else None)
            if known is not None:
                try:
                    actual = file_md5(files.data)
                except FileNotFoundError:
                    actual = None
                if actual == known:
                    return cached
                damage = f"its MD5 is {actual}, its record says {known}"
            elif files.key in self._state().repaired:
                return cached  # fetched afresh already: the object itself fails
            else:
                damage = f"it failed to open ({why}) and has no checksum to tell why"
        self._discard(info, files, damage, seen)
        cached.close()
        return self.lease(info, storage_options, transform=transform)

    def _discard(
        self, info: ObjectInfo, files: EntryFiles, damage: str, seen: tuple[int, ...] | None
    ) -> None:
        healing.discard(files, info, damage, seen, self._state().repaired, self.dir)

    def lease_cached(self, info: ObjectInfo) -> CachedFile | None:
        """``info.url``'s entry leased if it is complete in the cache now; ``None`` otherwise.

        The hit path of ``lease`` alone (a few system calls, no download, no waiting on
        another process's download): the ``Prefetcher`` takes warm entries this way in the
        caller's thread instead of waking a download thread for each.
        """
        files = self._files(info)
        lease = Lease(files.lease)
        try:
            if not files.data.exists() or self.check_entry(info, files):
                lease.close()  # missing, or damaged: ``lease`` repairs it
                return None
            self._state().add("hits")
            lease.touch()
            return CachedFile(files.data, info, lease)
        except BaseException:
            lease.close()
            raise

    def _fetch(
        self,
        info: ObjectInfo,
        storage_options: Mapping[str, Any] | None,
        files: EntryFiles,
        transform: Transform | None,
        progress: Callable[[int], None] | None,
        cancel: threading.Event | None,
    ) -> None:
        """Download into ``files`` (the caller holds the entry's mutex)."""
        if info.size > self.max_bytes:
            raise ConfigError(
                f"{info.url} ({format_bytes(info.size)}, {info.size} bytes) is larger than "
                f"SessionCache(max_bytes={self.max_bytes}): raise max_bytes"
            )
        for leftover in self.objects.glob(f"{files.key}.*.part*"):
            entries.remove_part(leftover)  # a dead process's download or scratch: we hold the mutex
        fs = filesystem_for(info.url, storage_options)
        part = self._reserve(info, files)
        written = [part]
        counters = self._state()

        def counted(amount: int) -> None:
            counters.add("bytes_fetched", amount)
            if progress is not None:
                progress(amount)

        try:
            download(fs, info, part, counted, cancel)
            final = part
            if transform is not None:
                final = files.part(info.size)
                written.append(final)
                transform(part, final)
                with open(final, "rb+") as handle:
                    os.fsync(handle.fileno())
                part.unlink()
            md5 = info.md5 if transform is None else None  # the download verified it
            entries.write_sidecar(files, info, self.layout, time.time(), os.stat(final), md5)
            os.replace(final, files.data)
            fsync_directory(self.objects)
            logger.debug("cached %s as %s", info.url, files.data)
        except OSError as exc:
            if is_disk_full(exc):
                raise self._disk_full(info, exc) from exc
            raise
        finally:
            for path in written:
                path.unlink(missing_ok=True)

    def _reserve(self, info: ObjectInfo, files: EntryFiles) -> Path:
        """Make room for ``info.size`` bytes and create the ``.part`` file that reserves them."""
        counters = self._state()
        deadline = time.monotonic() + self.room_timeout
        delay = 0.05
        while True:
            with mutex(self.dir / "accounting.lock"):
                stored, parts = entries.scan(self.objects)
                blocked = self._make_room(info, files, stored, parts)
                if not blocked:
                    part = files.part(info.size)
                    part.touch(exist_ok=False)
                    return part
            now = time.monotonic()
            if now >= deadline or blocked == "never":
                raise StorageError(
                    errno.ENOSPC,
                    f"{info.url} ({format_bytes(info.size)}) does not fit the cache {self.dir}: "
                    f"max_bytes={format_bytes(self.max_bytes)}, min_free="
                    f"{format_bytes(self.min_free)}, {format_bytes(self._free())} free, and "
                    f"every entry left is in use (waited {self.room_timeout:.0f} s). Raise "
                    "max_bytes, lower prefetch or the number of readers, or free disk space",
                )
            pause = min(delay, deadline - now)
            time.sleep(pause)
            counters.wait(pause)
            delay = min(delay * 2, 1.0)

    def _make_room(
        self, info: ObjectInfo, files: EntryFiles, stored: list[Stored], parts: list[entries.Part]
    ) -> str:
        """Evict until ``info`` fits; ``""`` when it does, ``"wait"`` or ``"never"`` if not."""
        counters = self._state()
        foreign = [part for part in parts if not self.clean_leftover(part)]
        stale = [entry for entry in stored if entry.url == info.url and entry.files != files]
        if stale and info.url not in counters.warned:
            counters.warned.add(info.url)
            old = stale[0].sidecar.get("identity", "?")
            warn(
                f"{info.url} changed in the store since it was cached ({old} -> "
                f"{info.identity}): fetching it again"
            )
        total = sum(entry.size for entry in stored) + sum(
            max(part.reserved, part.size) for part in foreign
        )
        pending = sum(max(part.reserved - part.size, 0) for part in foreign)
        free = self._free() - pending
        order = stale + sorted(
            (entry for entry in stored if entry not in stale), key=lambda entry: entry.last_used
        )
        busy = False
        for entry in order:
            if self._fits(info.size, total, free) and entry not in stale:
                break
            if self.evict(entry):
                total -= entry.size
                free += entry.size
            else:
                busy = True
        if self._fits(info.size, total, free):
            return ""
        return "wait" if busy or foreign else "never"

    def _fits(self, size: int, total: int, free: int) -> bool:
        return total + size <= self.max_bytes and free - size >= self.min_free

    def evict(self, entry: Stored) -> bool:
        """Delete ``entry`` if no process leases it; whether it was deleted."""
        with try_exclusive(entry.files.lease) as free:
            if not free:
                return False
            entry.files.data.unlink(missing_ok=True)
            entry.files.sidecar.unlink(missing_ok=True)
            entry.files.lease.unlink(missing_ok=True)
        self._state().add("evictions")
        logger.debug("evicted %s (%d bytes)", entry.url, entry.size)
        return True

    def clean_leftover(self, part: entries.Part) -> bool:
        """Remove ``part`` (a file, or a ``.part.d`` scratch) if no process downloads its entry."""
        import filelock

        lock = mutex(self.objects / f"{part.key}.lock", timeout=0)
        try:
            lock.acquire()
        except filelock.Timeout:  # its download is alive
            return False
        try:
            entries.remove_part(part.path)
            return True
        finally:
            lock.release()

    def _disk_full(self, info: ObjectInfo, exc: OSError) -> StorageError:
        return StorageError(
            errno.ENOSPC,
            f"{info.url}: the disk of the cache {self.dir} filled up while downloading "
            f"{format_bytes(info.size)} ({format_bytes(self._free())} free, min_free="
            f"{format_bytes(self.min_free)}, max_bytes={format_bytes(self.max_bytes)}): nothing "
            "was kept. Free space on that disk, lower max_bytes, or point SessionCache(dir=...) "
            f"or $LOADERKIT_CACHE at a larger disk ({exc.strerror})",
        )

    def _free(self) -> int:
        return shutil.disk_usage(self.dir).free

    def _files(self, info: ObjectInfo) -> EntryFiles:
        """The entry's paths for this object version (made once per process and version)."""
        known = self._known
        files = known.get(info)
        if files is None:
            if len(known) >= 4096:  # a bound, not an LRU: datasets hold far fewer sessions
                known.clear()
            files = known[info] = EntryFiles(self.objects, entries.entry_key(info, self.layout))
        return files

    def _state(self) -> Counters:
        counters = self._counters
        if counters is None or counters.pid != os.getpid():
            with _COUNTERS_LOCK:
                counters = self._counters
                if counters is None or counters.pid != os.getpid():
                    counters = self._counters = Counters(self._totals)
        return counters

    def ls(self) -> list[CacheEntry]:
        """Every complete entry, least recently used first, with whether a process uses it."""
        return maintenance.listing(self)

    def du(self) -> int:
        """Bytes the cache holds: complete entries and downloads in flight."""
        stored, parts = entries.scan(self.objects)
        return sum(entry.size for entry in stored) + sum(part.size for part in parts)

    def usage(self) -> dict[str, int]:
        """Bytes per group of ``entries.LAYOUT`` (entries, downloads, meta, stats, locks...)."""
        return maintenance.usage(self)

    def clear(self) -> ClearResult:
        """Remove every entry no process uses, dead downloads, metadata records, dead stats.

        Walks ``entries.LAYOUT``: entries in use, live downloads, records being made, and this
        and other live processes' counters stay; so do files no row of the layout names.
        """
        return maintenance.clear(self)

    def verify(self) -> VerifyResult:
        """Check every complete entry against its record (size, mtime, MD5); remove the damaged.

        Also removes metadata records that are not this loaderkit's data (damaged, foreign,
        or an older version's ``.pkl``). A damaged entry is removed even while a process
        leases it (its open file stays readable to it; its next lease fetches it again).
        """
        return maintenance.verify(self)

    def describe(self) -> str:
        """A few lines for the CLI and ``loaderkit doctor``: limits, usage, the counters."""
        stats = self.stats()
        lines = [
            f"cache {self.dir} ({self.layout}): {format_bytes(self.du())} of max_bytes "
            f"{format_bytes(self.max_bytes)}, {format_bytes(stats.free_bytes)} free",
            f"  max_bytes: {self.limits.max_bytes.reason}",
            f"  min_free={format_bytes(self.min_free)}: {self.limits.min_free.reason}",
            f"  prefetch={self.prefetch}: {self.limits.prefetch.reason}",
            f"  this cache's processes: {stats.hits} hits, {stats.misses} misses, "
            f"{format_bytes(stats.bytes_fetched)} fetched, {stats.seconds_waiting:.1f} s "
            f"waiting, {stats.evictions} evictions",
        ]
        return "\n".join(lines)


def _after_fork_in_child() -> None:
    global _COUNTERS_LOCK
    _COUNTERS_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
