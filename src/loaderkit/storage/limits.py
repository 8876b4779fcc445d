"""The cache's limits: defaults fitted to the disk (a pure function) and the checks on them.

``DiskUsage.detect(dir)`` is the only place that reads the disk; ``fit_cache_limits`` and
``check_limits`` are arithmetic on what it read, each value with its reason (the loader's
own ``Decision(value, reason)``, as ``CacheLimit = Decision[int]``), so that the plan can show why.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from loaderkit.errors import ConfigError, check_int
from loaderkit.plan import Decision, counted

__all__ = [
    "CacheLimit",
    "CacheLimits",
    "DiskUsage",
    "check_limits",
    "fit_cache_limits",
    "fit_min_free",
    "fit_to_readers",
    "fit_to_sessions",
    "fit_to_workers",
    "format_bytes",
    "min_free_floor",
    "window_bytes",
]

GiB = 2**30
DEFAULT_PREFETCH = 2
MIN_FREE_FRACTION = 0.05
MAX_BYTES_FRACTION = 0.8
#: The reason of a value the caller set.
CALLER = "set by the caller"


#: One limit's value and the one-line reason for it: the loader's own ``Decision``.
CacheLimit = Decision[int]


@dataclass(frozen=True)
class CacheLimits:
    """The three limits of a ``SessionCache``, each with its reason.

    Attributes:
        given: The names of the limits the caller set (the others are loaderkit's to fit).
    """

    max_bytes: CacheLimit
    min_free: CacheLimit
    prefetch: CacheLimit
    given: frozenset[str] = frozenset()


@dataclass(frozen=True)
class DiskUsage:
    """What the cache's disk holds: total and free bytes, and the bytes already cached."""

    total: int
    free: int
    cached: int

    @classmethod
    def detect(cls, directory: Path, cached: int = 0) -> DiskUsage:
        """Read the disk under ``directory`` (which must exist)."""
        usage = shutil.disk_usage(directory)
        return cls(total=usage.total, free=usage.free, cached=cached)


def format_bytes(count: float) -> str:
    """Bytes for a message: ``'1.5 GiB'``.

    Examples:
        >>> format_bytes(3 * 2**30 // 2), format_bytes(512)
        ('1.5 GiB', '512 B')
    """
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(count) >= size:
            return f"{count / size:.1f} {unit}"
    return f"{int(count)} B"


def fit_cache_limits(
    disk: DiskUsage,
    max_bytes: int | None = None,
    min_free: int | None = None,
    prefetch: int | None = None,
) -> CacheLimits:
    """The limits: the caller's values kept, the unset ones fitted to ``disk``.

    - ``min_free``: 5 % of the disk, at least 1 GiB (and at most the disk): the node's other
      programs keep room to write (lowered on a fuller disk once the sessions are known:
      ``fit_min_free``).
    - ``max_bytes``: 80 % of what the cache could use (free space plus what it already holds),
      less ``min_free``.
    - ``prefetch``: 2 sessions ahead: reading one while the next ones arrive (lowered to what
      ``max_bytes`` holds once the sessions are known: ``fit_to_sessions``).

    Args:
        disk: The disk's sizes (``DiskUsage.detect``).
        max_bytes: The caller's bound on the cache's size, if any.
        min_free: The caller's bound on the disk's free space, if any.
        prefetch: The caller's number of sessions to fetch ahead, if any.

    Returns:
        The three limits with their reasons.

    Raises:
        ConfigError: A value out of range (``max_bytes`` < 1, ``min_free`` or ``prefetch`` < 0).

    Examples:
        >>> limits = fit_cache_limits(DiskUsage(total=100 * GiB, free=50 * GiB, cached=0))
        >>> format_bytes(limits.min_free.value), format_bytes(limits.max_bytes.value)
        ('5.0 GiB', '36.0 GiB')
        >>> limits.max_bytes.reason
        '80 % of the 50.0 GiB the cache can use (50.0 GiB free + 0 B cached) less min_free'
    """
    if min_free is not None:
        free_limit = CacheLimit(check_int("min_free", min_free, minimum=0), CALLER)
    else:
        value = min(max(int(disk.total * MIN_FREE_FRACTION), GiB), disk.total)
        free_limit = CacheLimit(
            value, f"5 % of the {format_bytes(disk.total)} disk, at least 1 GiB: room for others"
        )
    if max_bytes is not None:
        max_limit = CacheLimit(check_int("max_bytes", max_bytes, minimum=1), CALLER)
    else:
        usable = disk.free + disk.cached
        value = max(int(MAX_BYTES_FRACTION * (usable - free_limit.value)), 0)
        max_limit = CacheLimit(
            value,
            f"80 % of the {format_bytes(usable)} the cache can use ({format_bytes(disk.free)} "
            f"free + {format_bytes(disk.cached)} cached) less min_free",
        )
    if prefetch is not None:
        ahead = CacheLimit(check_int("prefetch", prefetch, minimum=0), CALLER)
    else:
        ahead = CacheLimit(DEFAULT_PREFETCH, "2 sessions ahead: one is read while the next arrive")
    given = frozenset(
        name
        for name, value in zip(
            ("max_bytes", "min_free", "prefetch"), (max_bytes, min_free, prefetch), strict=True
        )
        if value is not None
    )
    return CacheLimits(max_bytes=max_limit, min_free=free_limit, prefetch=ahead, given=given)


def window_bytes(sizes: Sequence[int], sessions: int) -> int:
    """The most bytes ``sessions`` sessions at once can take: the largest ``sessions`` sizes.

    Examples:
        >>> window_bytes([5, 1, 9, 3], 2)
        14
    """
    return sum(sorted(sizes, reverse=True)[: max(sessions, 0)])


def min_free_floor(disk: DiskUsage) -> int:
    """The least an unset ``min_free`` is lowered to: 1 GiB, or 5 % of a disk under 20 GiB.

    Examples:
        >>> format_bytes(min_free_floor(DiskUsage(252 * GiB, 0, 0)))
        '1.0 GiB'
        >>> format_bytes(min_free_floor(DiskUsage(2 * GiB, 0, 0)))
        '102.4 MiB'
    """
    return min(GiB, int(disk.total * MIN_FREE_FRACTION))


def fit_min_free(limits: CacheLimits, disk: DiskUsage, needed: int, sessions: str) -> CacheLimits:
    """An unset ``min_free`` lowered so that the disk has room for ``needed`` bytes.

    A ``min_free`` the caller set is returned as it is (``fit_to_sessions`` checks it).

    The default (5 % of the disk, at least 1 GiB) can be more than a busy disk has free; the
    cache then takes only the room it needs (one session per reader), down to
    ``min_free_floor``: a disk fuller than that is refused by ``fit_to_sessions``.

    Args:
        limits: The limits.
        disk: The disk's sizes now.
        needed: The bytes the cache needs room for: one session per reader.
        sessions: Those sessions for the reason: ``'2 x up to 1.0 GiB'``.

    Examples:
        >>> disk = DiskUsage(total=100 * GiB, free=3 * GiB, cached=0)
        >>> fitted = fit_min_free(fit_cache_limits(disk), disk, GiB, "1 x up to 1.0 GiB")
        >>> format_bytes(fitted.min_free.value)
        '2.0 GiB'
    """
    usable = disk.free + disk.cached
    current = limits.min_free.value
    if "min_free" in limits.given or usable - current >= needed:
        return limits
    floor = min_free_floor(disk)
    lowered = max(floor, usable - needed)
    if lowered >= current:
        return limits
    reason = (
        f"lowered from {format_bytes(current)} ({limits.min_free.reason}) to leave room for one "
        f"session per reader ({sessions}): {format_bytes(disk.free)} free + "
        f"{format_bytes(disk.cached)} cached; at least {format_bytes(floor)} stays free"
    )
    return replace(limits, min_free=CacheLimit(lowered, reason))


def _room_for(
    limits: CacheLimits, disk: DiskUsage, needed: int, sessions: str
) -> tuple[CacheLimits, int]:
    """``min_free`` fitted to ``needed`` (``fit_min_free``), and the room the disk leaves then."""
    limits = fit_min_free(limits, disk, needed, sessions)
    return limits, disk.free + disk.cached - limits.min_free.value


def _raised_max_bytes(limits: CacheLimits, bytes_: int, per: str) -> CacheLimits:
    """``max_bytes`` raised to ``bytes_``, one session per ``per`` (the reason's end)."""
    reason = (
        f"raised from {format_bytes(limits.max_bytes.value)} ({limits.max_bytes.reason}) to one "
        f"session per {per}"
    )
    return replace(limits, max_bytes=CacheLimit(bytes_, reason))


def _no_room(
    limits: CacheLimits, disk: DiskUsage, room: int, what: str, advice: str
) -> ConfigError:
    """The error for a disk whose ``room`` is less than ``what`` the cache needs."""
    return ConfigError(
        f"the cache's disk has room for {format_bytes(max(room, 0))} ({format_bytes(disk.free)} "
        f"free + {format_bytes(disk.cached)} cached - min_free="
        f"{format_bytes(limits.min_free.value)}), less than {what}: {advice}, lower min_free or "
        "use another dir"
    )


def fit_to_sessions(
    limits: CacheLimits, disk: DiskUsage, sizes: Sequence[int], readers: int = 1
) -> CacheLimits:
    """The limits fitted to objects of these ``sizes`` read by ``readers``; refused if impossible.

    Each reader (a rank on the node) holds the session it reads and ``prefetch`` more: the
    window is the largest ``readers * (1 + prefetch)`` sessions. What the caller left unset is
    fitted, what the caller set is checked:

    - ``min_free`` unset and more than the disk leaves for one session per reader: lowered to
      what leaves that room, not below ``min_free_floor`` (``fit_min_free``);
    - ``max_bytes`` unset and smaller than one session per reader: raised to that, as far as the
      disk allows (free space plus what the cache holds, less ``min_free``);
    - ``prefetch`` unset: the most sessions ahead (at most 2) whose window fits ``max_bytes``,
      with the sizes that decided it in its reason;
    - a ``max_bytes`` smaller than the largest session or than one session per reader, a
      ``prefetch`` the caller set whose window does not fit, and a disk without room for the
      largest session are a ``ConfigError`` naming both sizes and what to change.

    Args:
        limits: The cache's limits (``fit_cache_limits``).
        disk: The disk's sizes now.
        sizes: Every object's size in bytes (stored size; the ``rows`` layout is about the same).
        readers: Processes on the node that read at the same time, each with its prefetch
            window (the ranks on the node: ``loaderkit.machine.distributed.local_world_size``).

    Returns:
        The limits to use for these sessions.

    Raises:
        ConfigError: A limit that cannot work; the message names both sizes.

    Examples:
        >>> disk = DiskUsage(100 * GiB, 50 * GiB, 0)
        >>> fitted = fit_to_sessions(fit_cache_limits(disk, max_bytes=2 * GiB), disk, [GiB] * 8)
        >>> fitted.prefetch.value
        1
        >>> fit_to_sessions(fit_cache_limits(disk, max_bytes=GiB), disk, [2 * GiB])
        Traceback (most recent call last):
        ...
        loaderkit.errors.ConfigError: SessionCache(max_bytes=1.0 GiB) is smaller than the ...
    """
    if not sizes:
        return limits
    largest = max(sizes)
    readers = max(readers, 1)
    one_each = window_bytes(sizes, readers)
    limits, room = _room_for(limits, disk, one_each, f"{readers} x up to {format_bytes(largest)}")
    if room < largest:
        raise _no_room(
            limits, disk, room, f"the largest session ({format_bytes(largest)})", "free space"
        )
    max_bytes = limits.max_bytes.value
    if max_bytes < one_each and "max_bytes" not in limits.given and one_each <= room:
        limits = _raised_max_bytes(
            limits, one_each, f"reader: {readers} x up to {format_bytes(largest)}"
        )
        max_bytes = one_each
    if max_bytes < largest:
        raise ConfigError(
            f"SessionCache(max_bytes={format_bytes(max_bytes)}) is smaller than the largest "
            f"session ({format_bytes(largest)}, {largest} bytes): raise max_bytes to at least "
            f"{largest} bytes"
        )
    if max_bytes < one_each:
        raise ConfigError(
            f"SessionCache(max_bytes={format_bytes(max_bytes)}) is smaller than one session per "
            f"reader ({format_bytes(one_each)}, {one_each} bytes: {counted(readers, 'reader')} on "
            "this "
            f"node (ranks sharing the cache), sessions of up to {format_bytes(largest)}): raise "
            f"max_bytes to at least {one_each} bytes"
        )
    ahead = limits.prefetch.value
    if "prefetch" in limits.given:
        window = window_bytes(sizes, readers * (1 + ahead))
        if max_bytes < window:
            raise ConfigError(
                f"SessionCache(max_bytes={format_bytes(max_bytes)}) is smaller than the prefetch "
                f"window ({format_bytes(window)}, {window} bytes: {counted(readers, 'reader')} on "
                "this node "
                f"(ranks sharing the cache) x (1 open + prefetch={ahead}) sessions "
                f"of up to {format_bytes(largest)}): raise max_bytes to at least {window} bytes "
                "or lower prefetch"
            )
        return limits
    fitted = ahead
    while fitted > 0 and window_bytes(sizes, readers * (1 + fitted)) > max_bytes:
        fitted -= 1
    if fitted == ahead:
        return limits
    wanted = window_bytes(sizes, readers * (1 + ahead))
    reason = (
        f"fitted to max_bytes {format_bytes(max_bytes)}: {ahead} ahead would need "
        f"{format_bytes(wanted)} ({counted(readers, 'reader')} x {1 + ahead} sessions of up to "
        f"{format_bytes(largest)}); {fitted} ahead "
        + ("fits" if fitted else "leaves room for the session read only")
    )
    return replace(limits, prefetch=CacheLimit(fitted, reason))


def window_sessions(prefetch: int, workers: int) -> int:
    """Sessions one rank's prefetcher leases besides its workers' open files.

    The session read and ``prefetch`` ahead; none without a prefetcher (``prefetch=0``) when
    workers read, one (the session open in the main process) when it reads itself.

    Examples:
        >>> window_sessions(2, 4), window_sessions(0, 4), window_sessions(0, 0)
        (3, 0, 1)
    """
    if prefetch > 0:
        return 1 + prefetch
    return 0 if workers > 0 else 1


def fit_to_workers(
    limits: CacheLimits, disk: DiskUsage, ranks: int, workers: int, largest: int
) -> CacheLimits:
    """``max_bytes`` that holds one open session for every process that reads at once.

    Each of ``ranks`` ranks reads with ``workers`` worker processes (the main process when 0),
    and each holds the session it reads open, its cache entry leased: fewer sessions than
    that, and a process waits for room until ``room_timeout``. An unset ``max_bytes`` below it
    is raised to it as far as the disk allows (an unset ``min_free`` is lowered for it, as in
    ``fit_to_sessions``); a ``max_bytes`` the caller set below it, or a disk without room for
    it, is a ``ConfigError`` naming both sizes.

    Args:
        limits: The limits fitted to the sessions (``fit_to_sessions``).
        disk: The disk's sizes now.
        ranks: Ranks on the node sharing the cache.
        workers: Each rank's worker processes (0: the main process reads; thread workers are
            one process).
        largest: The largest session's size in bytes.

    Raises:
        ConfigError: ``max_bytes`` set below one session per reading process, or no room.

    Examples:
        >>> disk = DiskUsage(100 * GiB, 7 * GiB, 0)  # min_free 5 GiB: max_bytes 1.6 GiB
        >>> fitted = fit_to_workers(fit_cache_limits(disk), disk, ranks=1, workers=4, largest=GiB)
        >>> format_bytes(fitted.max_bytes.value), format_bytes(fitted.min_free.value)
        ('4.0 GiB', '3.0 GiB')
        >>> fit_to_workers(fit_cache_limits(disk, max_bytes=GiB), disk, 1, 2, GiB)
        Traceback (most recent call last):
        ...
        loaderkit.errors.ConfigError: SessionCache(max_bytes=1.0 GiB) holds 1 session of ...
    """
    processes = max(ranks, 1) * max(workers, 1)
    need = processes * largest
    max_bytes = limits.max_bytes.value
    if largest <= 0 or max_bytes >= need:
        return limits
    readers = f"{counted(max(ranks, 1), 'rank')} on this node x " + (
        counted(workers, "worker process", "worker processes")
        if workers > 0
        else "the main process"
    )
    if "max_bytes" in limits.given:
        raise ConfigError(
            f"SessionCache(max_bytes={format_bytes(max_bytes)}) holds "
            f"{counted(max_bytes // largest, 'session')} of up to {format_bytes(largest)}, "
            "fewer than the processes that read "
            f"at once, each holding the session it reads ({processes}: {readers}): raise "
            f"max_bytes to at least {need} bytes or use fewer workers"
        )
    limits, room = _room_for(limits, disk, need, f"{readers}, up to {format_bytes(largest)} each")
    if room < need:
        what = (
            f"one session of up to {format_bytes(largest)} for each of the {processes} "
            f"processes that read at once ({readers})"
        )
        raise _no_room(limits, disk, room, what, "free space, use fewer workers")
    return _raised_max_bytes(
        limits, need, f"reading process: {readers}, up to {format_bytes(largest)} each"
    )


def fit_to_readers(
    limits: CacheLimits, capacity: int, ranks: int, workers: int, largest: int
) -> CacheLimits:
    """An unset ``prefetch`` lowered until every process's leases fit ``capacity`` sessions.

    Each of ``ranks`` ranks holds one open session per worker (``workers``; the main process
    when 0) and its prefetch window (``window_sessions``): a window that leaves no room for
    the workers' files would block their downloads until ``room_timeout``. A ``prefetch`` the
    caller set is kept (``max_open_files`` is fitted to it instead).

    Examples:
        >>> disk = DiskUsage(100 * GiB, 50 * GiB, 0)
        >>> limits = fit_cache_limits(disk, max_bytes=2 * GiB)
        >>> fit_to_readers(limits, 2, ranks=1, workers=0, largest=GiB).prefetch.value
        1
        >>> fit_to_readers(limits, 2, ranks=1, workers=2, largest=GiB).prefetch.reason[:40]
        'fitted to max_bytes 2.0 GiB (2 sessions '
    """
    ahead = limits.prefetch.value
    if "prefetch" in limits.given or ahead <= 0:
        return limits
    readers = max(workers, 1)

    def need(prefetch: int) -> int:
        return ranks * ((readers if workers > 0 else 0) + window_sessions(prefetch, workers))

    fitted = ahead
    while fitted > 0 and need(fitted) > capacity:
        fitted -= 1
    if fitted == ahead:
        return limits
    held = f"{counted(workers, 'worker')} each holding a session open + " if workers > 0 else ""
    reason = (
        f"fitted to max_bytes {format_bytes(limits.max_bytes.value)} "
        f"({counted(capacity, 'session')} of up "
        f"to {format_bytes(largest)}): {ahead} ahead would need {counted(ranks, 'rank')} x ({held}"
        f"{window_sessions(ahead, workers)} in the prefetch window) = "
        f"{counted(need(ahead), 'session')}; "
        f"{fitted} ahead fits" + ("" if fitted else " (each session fetched when first opened)")
    )
    return replace(limits, prefetch=CacheLimit(fitted, reason))


def check_limits(
    limits: CacheLimits, disk: DiskUsage, sizes: Sequence[int], readers: int = 1
) -> CacheLimits:
    """``fit_to_sessions``: the limits fitted to these sessions; ``ConfigError`` if impossible.

    Examples:
        >>> limits = fit_cache_limits(DiskUsage(100 * GiB, 50 * GiB, 0), max_bytes=GiB)
        >>> check_limits(limits, DiskUsage(100 * GiB, 50 * GiB, 0), [2 * GiB])
        Traceback (most recent call last):
        ...
        loaderkit.errors.ConfigError: SessionCache(max_bytes=1.0 GiB) is smaller than the ...
    """
    return fit_to_sessions(limits, disk, sizes, readers)
