"""Importable helpers for the storage tests (spawned processes import them by name)."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

from loaderkit.storage import ObjectInfo, SessionCache


def payload(index: int, size: int) -> bytes:
    """Deterministic bytes, different for each index."""
    return random.Random(index).randbytes(size)


def lease_all(
    cache: SessionCache, infos: list[ObjectInfo], options: dict[str, Any], start: float
) -> list[tuple[str, int]]:
    """In a child process: wait for ``start`` (a wall-clock time), lease each object, read it."""
    time.sleep(max(0.0, start - time.time()))
    sizes = []
    for info in infos:
        with cache.lease(info, options) as cached:
            sizes.append((info.url, len(Path(cached.path).read_bytes())))
    return sizes


def hold_lease(
    cache: SessionCache, info: ObjectInfo, options: dict[str, Any], ready: Any, release: Any
) -> None:
    """In a child process: hold a lease on ``info`` until ``release`` is set."""
    with cache.lease(info, options):
        ready.set()
        release.wait(30)


def download_forever(cache: SessionCache, info: ObjectInfo, options: dict[str, Any]) -> None:
    """In a child process: a (throttled) download that the test kills with SIGKILL."""
    cache.lease(info, options)
    os._exit(3)  # pragma: no cover - the test kills it first
