"""``loaderkit fetch`` and ``loaderkit cache ls|du|clear``: a node's session cache from the shell.

Prints (like ``loaderkit.cli``, which registers these commands); the work is the storage
layer's: ``expand`` + ``stat_objects`` + ``fetch_many`` warm a cache before a job (one tqdm bar
over the bytes), ``SessionCache.ls/du/clear`` show and empty it.

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
        cache = _cache(args.cache)
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


def _cmd_cache(args: argparse.Namespace) -> int:
    try:
        cache = _cache(args.dir)
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
    elif args.action == "du":
        print(f"{cache.du()}\t{_size(cache.du())}\t{cache.dir}")
        print(cache.describe())
    else:
        result = cache.clear()
        meta = cache.dir / "meta"
        removed_meta = 0
        if meta.is_dir():
            for record in meta.glob("*.pkl"):
                record.unlink(missing_ok=True)
                removed_meta += 1
        kept = f", {len(result.in_use)} in use kept" if result.in_use else ""
        print(
            f"removed {result.removed} entr{'y' if result.removed == 1 else 'ies'} "
            f"({_size(result.freed_bytes)}) and {removed_meta} metadata record(s) from "
            f"{cache.dir}{kept}"
        )
    return 0


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
    fetch.set_defaults(run=_cmd_fetch)

    cache = commands.add_parser(
        "cache",
        help="list, size or empty a node's session cache",
        description=(
            "ls: every entry (size, last use, layout, URL, in use); du: bytes held, limits and "
            "free disk; clear: remove every entry no process uses, and the kept metadata."
        ),
    )
    cache.add_argument("action", choices=("ls", "du", "clear"))
    cache.add_argument(
        "dir",
        nargs="?",
        metavar="DIR",
        help="the cache directory (default: $LOADERKIT_CACHE, else ~/.cache/loaderkit)",
    )
    cache.set_defaults(run=_cmd_cache)
