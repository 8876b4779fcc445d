"""``loaderkit fetch`` and ``loaderkit cache ls|du|clear|verify``: a node's cache from the shell.

Prints (like ``loaderkit.cli``, which registers these commands); the work is the storage
layer's: ``expand`` + ``stat_objects`` + ``fetch_many`` warm a cache before a job (one tqdm bar
over the bytes), ``SessionCache.ls/usage/clear/verify`` show, empty and check it, walking the
table of every file the cache keeps (``loaderkit.storage.entries.LAYOUT``).

Exit status: 0 done (``verify``: every entry matches its record); 1 the cache could not be
opened or used (the message says why); 2 a usage error; 3 (``verify`` only) damaged entries
or foreign metadata records were found and removed.

Examples:
    >>> parser = argparse.ArgumentParser()
    >>> add_commands(parser.add_subparsers())
    >>> parser.parse_args(["cache", "du", "/tmp/c"]).action
    'du'
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from loaderkit.errors import LoaderkitError
from loaderkit.plan import counted

__all__ = ["add_commands"]


def _cache(directory: str | None, **limits: Any) -> Any:
    from loaderkit.storage import SessionCache

    return SessionCache(directory, **limits)


def _size(nbytes: float) -> str:
    from loaderkit.storage.limits import format_bytes

    return format_bytes(nbytes)


def _cmd_fetch(args: argparse.Namespace) -> int:
    from loaderkit.storage import expand, fetch_many, stat_objects

    options: dict[str, Any] = {}
    if args.anon:
        options["anon"] = True
    if args.storage_options:
        options.update(json.loads(args.storage_options))
    try:
        cache = _cache(args.cache, shared=args.shared)
        urls = expand(args.urls, options)
        infos = list(stat_objects(urls, options).values())
        cache.check_limits([info.size for info in infos])
    except (LoaderkitError, OSError, ValueError) as exc:
        print(f"loaderkit fetch: {exc}", file=sys.stderr)
        return 1
    total = sum(info.size for info in infos)
    bar = None
    if not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="B", unit_scale=True, desc="fetch", leave=False)
    started = time.monotonic()
    try:
        paths = fetch_many(
            cache,
            infos,
            options,
            threads=args.threads,
            progress=None if bar is None else bar.update,
        )
    except (LoaderkitError, OSError) as exc:
        print(f"loaderkit fetch: {exc}", file=sys.stderr)
        return 1
    finally:
        if bar is not None:
            bar.close()
    stats = cache.stats()
    for info, path in zip(infos, paths, strict=True):
        print(f"{info.url} -> {path}")
    print(
        f"{len(infos)} object(s), {_size(total)} in {cache.dir}: {stats.misses} fetched "
        f"({_size(stats.bytes_fetched)}), {stats.hits} already cached, "
        f"{time.monotonic() - started:.1f} s; {_size(stats.free_bytes)} free"
    )
    return 0


_SHARED = (
    "the directory is shared on purpose (group-writable, or another user's): "
    "SessionCache(shared=True); without it such a directory is refused"
)

#: ``loaderkit cache verify``'s exit status when it removed something.
VERIFY_REMOVED = 3


def _cmd_cache(args: argparse.Namespace) -> int:
    try:
        cache = _cache(args.dir, shared=args.shared)
    except (LoaderkitError, OSError) as exc:
        print(f"loaderkit cache: {exc}", file=sys.stderr)
        return 1
    if args.action == "ls":
        entries = cache.ls()
        for entry in entries:
            used = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.last_used))
            flag = " (in use)" if entry.in_use else ""
            print(f"{_size(entry.size):>10}  {used}  {entry.layout:<6}  {entry.url}{flag}")
        print(f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'} in {cache.dir}")
        _print_groups(cache)
    elif args.action == "du":
        print(f"{cache.du()}\t{_size(cache.du())}\t{cache.dir}")
        usage = cache.usage()
        for group, nbytes in usage.items():
            print(f"  {group}: {nbytes} bytes ({_size(nbytes)})")
        print(f"  all files: {sum(usage.values())} bytes")
        print(cache.describe())
    elif args.action == "verify":
        return _verify(cache)
    else:
        result = cache.clear()
        kept = f", {len(result.in_use)} in use kept" if result.in_use else ""
        other = dict(result.other)
        print(
            f"removed {result.removed} entr{'y' if result.removed == 1 else 'ies'} "
            f"({_size(result.freed_bytes)} in all), {other.get('meta', 0)} metadata record "
            f"file(s), {other.get('stats', 0)} dead counters file(s), "
            f"{other.get('downloads', 0)} dead download(s) from {cache.dir}{kept}"
        )
    return 0


def _print_groups(cache: Any) -> None:
    from loaderkit.storage.entries import walk

    groups, unknown = walk(cache.dir)
    names = {"meta": "metadata records", "stats": "counters files", "downloads": "downloads"}
    parts = [
        f"{len(groups[group])} {label} ({_size(sum(size for _, size in groups[group]))})"
        for group, label in names.items()
    ]
    if unknown:
        parts.append(f"{counted(len(unknown), 'file')} loaderkit does not know (left alone)")
    print("also: " + ", ".join(parts))


def _verify(cache: Any) -> int:
    result = cache.verify()
    for url, path, why in result.damaged:
        print(f"removed {url} ({path}): {why}")
    for path in result.records:
        print(f"removed the metadata record {path}: not this loaderkit's data")
    good = result.checked - len(result.damaged)
    print(
        f"{good} entr{'y' if good == 1 else 'ies'} match their records, "
        f"{len(result.damaged)} damaged removed, {len(result.records)} metadata record(s) "
        f"removed in {cache.dir}"
    )
    return VERIFY_REMOVED if result.damaged or result.records else 0


def add_commands(commands: Any) -> None:
    """Register ``fetch`` and ``cache`` on ``loaderkit``'s subcommand parser."""
    fetch = commands.add_parser(
        "fetch",
        help="warm this node's session cache with remote files before a job",
        description=(
            "Fetch every URL (globs expanded, e.g. s3://bucket/betas_session*.hdf5) whole into "
            "the node's session cache, verified, as HDF5SessionDataset would: a job started "
            "afterwards finds them there."
        ),
    )
    fetch.add_argument("urls", nargs="+", metavar="URL", help="URLs or URL globs")
    fetch.add_argument(
        "--cache",
        metavar="DIR",
        help="the cache directory (default: $LOADERKIT_CACHE, else ~/.cache/loaderkit)",
    )
    fetch.add_argument("--anon", action="store_true", help="anonymous access (public buckets)")
    fetch.add_argument(
        "--storage-options", metavar="JSON", help='more fsspec options, e.g. {"endpoint_url": ...}'
    )
    fetch.add_argument("--threads", type=int, default=4, help="downloads at once (default 4)")
    fetch.add_argument("--no-progress", action="store_true", help="no progress bar")
    fetch.add_argument("--shared", action="store_true", help=_SHARED)
    fetch.set_defaults(run=_cmd_fetch)

    cache = commands.add_parser(
        "cache",
        help="list, size, empty or verify a node's session cache",
        description=(
            "ls: every entry (size, last use, layout, URL, in use) and the other files; du: "
            "bytes held per kind of file, limits and free disk; clear: remove every entry no "
            "process uses, the metadata records and dead processes' files; verify: check every "
            "complete entry against its record (size, mtime, MD5 when known), remove the "
            "damaged ones and foreign metadata records, and say what it removed. Exit status: "
            "0 nothing wrong, 1 the cache could not be used, 3 verify removed something."
        ),
    )
    cache.add_argument("action", choices=("ls", "du", "clear", "verify"))
    cache.add_argument(
        "dir",
        nargs="?",
        metavar="DIR",
        help="the cache directory (default: $LOADERKIT_CACHE, else ~/.cache/loaderkit)",
    )
    cache.add_argument("--shared", action="store_true", help=_SHARED)
    cache.set_defaults(run=_cmd_cache)
