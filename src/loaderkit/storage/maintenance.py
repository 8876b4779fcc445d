"""``SessionCache.ls|usage|clear|verify``: the whole cache directory, walked by its layout table.

Every function walks ``entries.LAYOUT`` (never a list of its own), so a file the cache keeps is
listed, counted, cleared and verified in one place. *Any process*, usually the CLI's
(``loaderkit cache ls|du|clear|verify``) while jobs use the cache: entries in use, downloads in
flight, records being made and live processes' counters are left alone.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Protocol

from loaderkit.storage import entries
from loaderkit.storage.download import file_md5, fsync_directory
from loaderkit.storage.locks import mutex, try_exclusive
from loaderkit.storage.records import CacheEntry, ClearResult, VerifyResult

__all__ = ["CacheDirectory", "clear", "listing", "usage", "verify"]


class CacheDirectory(Protocol):
    """What the walks need of a ``SessionCache`` (which calls them with itself)."""

    @property
    def dir(self) -> Path:
        """The cache directory."""

    @property
    def objects(self) -> Path:
        """Its ``objects/`` folder."""

    def evict(self, entry: entries.Stored) -> bool:
        """Delete ``entry`` if no process leases it; whether it was deleted."""

    def clean_leftover(self, part: entries.Part) -> bool:
        """Remove ``part`` if no process downloads its entry; whether it was removed."""


logger = logging.getLogger(__name__)

#: A metadata record's temporary file older than this is a dead writer's.
STALE_TEMPORARY = 600.0


def listing(cache: CacheDirectory) -> list[CacheEntry]:
    """Every complete entry, least recently used first, with whether a process uses it."""
    stored, _ = entries.scan(cache.objects)
    listed = []
    for entry in sorted(stored, key=lambda item: item.last_used):
        with try_exclusive(entry.files.lease) as free:
            in_use = not free
        sidecar = entry.sidecar
        listed.append(
            CacheEntry(
                url=entry.url,
                size=entry.size,
                path=entry.files.data,
                last_used=entry.last_used,
                in_use=in_use,
                layout=str(sidecar.get("layout", "?")),
                etag=sidecar.get("etag"),
            )
        )
    return listed


def usage(cache: CacheDirectory) -> dict[str, int]:
    """Bytes per ``entries.LAYOUT`` group, and ``"unknown"`` for files no row names."""
    groups, unknown = entries.walk(cache.dir)
    out = {group: sum(size for _, size in files) for group, files in groups.items()}
    out["unknown"] = 0
    for path in unknown:
        with contextlib.suppress(OSError):
            out["unknown"] += path.lstat().st_size
    return out


def clear(cache: CacheDirectory) -> ClearResult:
    """Remove what no process uses, group by group of ``entries.LAYOUT`` (see ``SessionCache``)."""
    removed, freed, in_use = 0, 0, []
    other: dict[str, int] = {}
    with mutex(cache.dir / "accounting.lock"):
        stored, parts = entries.scan(cache.objects)
        for part in parts:
            if cache.clean_leftover(part):
                freed += part.size
                other["downloads"] = other.get("downloads", 0) + 1
        for entry in stored:
            if cache.evict(entry):
                removed, freed = removed + 1, freed + entry.size
            else:
                in_use.append(entry.url)
        groups, _ = entries.walk(cache.dir)
        for path, _ in groups["entries"]:  # sidecars left without their data
            if path.suffix == ".json" and not path.with_suffix(".data").exists():
                _remove(path, other, "entries")
        for path, _ in groups["locks"]:  # locks of entries gone, when no one holds them
            if path.suffix == ".lease" and not path.with_suffix(".data").exists():
                with try_exclusive(path) as free:
                    if free:
                        _remove(path, other, "locks")
            elif path.suffix == ".lock" and not path.with_suffix(".data").exists():
                _remove_free_lock(path, other, "locks")
    for path, size in groups["meta"]:
        old = path.suffix == ".tmp" and _age(path) > STALE_TEMPORARY
        if path.suffix == ".lock":
            _remove_free_lock(path, other, "meta")
        elif (path.suffix in (".json", ".pkl") or old) and _remove(path, other, "meta"):
            freed += size
    for path, size in groups["stats"]:
        if not _alive(path) and _remove(path, other, "stats"):
            freed += size
    if in_use:
        logger.info("kept %d cache entries in use: %s", len(in_use), ", ".join(in_use))
    return ClearResult(removed, freed, tuple(in_use), tuple(sorted(other.items())))


def verify(cache: CacheDirectory) -> VerifyResult:
    """Check every complete entry against its record; remove the damaged ones and bad records."""
    stored, _ = entries.scan(cache.objects)
    damaged: list[tuple[str, str, str]] = []
    for entry in stored:
        files = entry.files
        with mutex(files.lock):  # no download of this entry runs meanwhile
            try:
                data = os.stat(files.data)
            except FileNotFoundError:
                continue
            record = entries.read_sidecar(files)
            problem = entries.check(record, data)
            known = record.get("md5")
            if not problem and isinstance(known, str):
                actual = file_md5(files.data)
                if actual != known:
                    problem = f"its MD5 is {actual}, its record says {known}"
            if not problem:
                continue
            files.data.unlink(missing_ok=True)
            files.sidecar.unlink(missing_ok=True)
            fsync_directory(cache.objects)
        damaged.append((entry.url or "?", str(files.data), problem))
        logger.info("removed the damaged cache entry %s (%s)", files.data, problem)
    records: list[str] = []
    groups, _ = entries.walk(cache.dir)
    for path, _ in groups["meta"]:
        if path.suffix in (".pkl", ".json") and not _record_of_ours(path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                records.append(str(path))
    return VerifyResult(len(stored), tuple(damaged), tuple(records))


def _record_of_ours(path: Path) -> bool:
    """Whether ``path`` is a JSON record whose envelope names it (never a pickle: not read)."""
    if path.suffix != ".json":
        return False
    try:
        envelope = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return False
    return (
        isinstance(envelope, dict)
        and envelope.get("key") == path.stem
        and isinstance(envelope.get("format"), str)
        and isinstance(envelope.get("version"), int)
    )


def _remove(path: Path, counts: dict[str, int], group: str) -> bool:
    try:
        path.unlink()
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        return False
    counts[group] = counts.get(group, 0) + 1
    return True


def _remove_free_lock(path: Path, counts: dict[str, int], group: str) -> None:
    """Delete a lock file no process holds now (one that is held stays)."""
    import filelock

    lock = mutex(path, timeout=0)
    try:
        lock.acquire()
    except (filelock.Timeout, OSError):
        return
    try:
        _remove(path, counts, group)
    finally:
        lock.release()


def _age(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return 0.0


def _alive(path: Path) -> bool:
    """Whether the process that owns a counters file (``<pid>-<token>.bin``) still runs here."""
    try:
        pid = int(path.name.split("-", 1)[0])
    except ValueError:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
