"""The cache directory on disk: names of an entry's files, its sidecar, and a scan of them all.

Layout (shared by every process on the node; nothing else is shared)::

    <dir>/CACHEDIR.TAG               marks a cache (backup tools skip it; clear() requires it)
    <dir>/accounting.lock            filelock: one process at a time decides what to evict
    <dir>/objects/<key>.data         the object, complete and verified (never partial)
    <dir>/objects/<key>.json         its sidecar: url, size, etag, mtime, layout, fetched
    <dir>/objects/<key>.lock         filelock: the object's download mutex (while downloading)
    <dir>/objects/<key>.lease        flock(LOCK_SH) by each process using it; mtime = last use
    <dir>/objects/<key>.<n>.<pid>.<token>.part   a download in flight, n bytes reserved
    <dir>/objects/<key>.<n>.<pid>.<token>.part.d a transform's scratch directory (``rows``)

``<key>`` is a hash of the URL, the object's identity and the layout, then the file's name
(``3f2a...-betas_session01_hdf5``): a changed object gets a new entry, never a file replaced
under a reader.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loaderkit.storage.objects import ObjectInfo

__all__ = [
    "EntryFiles",
    "Part",
    "Stored",
    "entry_key",
    "read_sidecar",
    "remove_part",
    "scan",
    "write_sidecar",
]

TAG = "CACHEDIR.TAG"
TAG_TEXT = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# loaderkit's session cache (loaderkit.SessionCache). Safe to delete when no job runs.\n"
)
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


def entry_key(info: ObjectInfo, layout: str) -> str:
    """The entry's file stem: a hash of URL, identity and layout, then the object's name.

    Examples:
        >>> entry_key(ObjectInfo("s3://b/betas_session01.hdf5", 10, "abc"), "stored")[-21:]
        '-betas_session01_hdf5'
    """
    digest = hashlib.sha256(f"{info.url}\n{info.identity}\n{layout}".encode()).hexdigest()[:24]
    name = _UNSAFE.sub("_", info.url.rstrip("/").rsplit("/", 1)[-1])[-60:]
    return f"{digest}-{name}"


@dataclass(frozen=True)
class EntryFiles:
    """The paths of one entry's files in ``objects``."""

    objects: Path
    key: str

    @functools.cached_property
    def data(self) -> Path:
        """The complete object."""
        return self.objects / f"{self.key}.data"

    @functools.cached_property
    def sidecar(self) -> Path:
        """Its JSON sidecar."""
        return self.objects / f"{self.key}.json"

    @functools.cached_property
    def lock(self) -> Path:
        """Its download mutex."""
        return self.objects / f"{self.key}.lock"

    @functools.cached_property
    def lease(self) -> Path:
        """Its lease file."""
        return self.objects / f"{self.key}.lease"

    def part(self, reserved: int) -> Path:
        """A new temporary name that reserves ``reserved`` bytes."""
        return self.objects / f"{self.key}.{reserved}.{os.getpid()}.{secrets.token_hex(4)}.part"


@dataclass(frozen=True)
class Stored:
    """A complete entry as a scan found it."""

    files: EntryFiles
    size: int
    last_used: float
    sidecar: dict[str, Any]

    @property
    def url(self) -> str:
        """The URL it holds (empty when its sidecar is missing)."""
        return str(self.sidecar.get("url", ""))


@dataclass(frozen=True)
class Part:
    """A download in flight (or a dead one's leftover)."""

    path: Path
    key: str
    reserved: int
    size: int


def write_sidecar(files: EntryFiles, info: ObjectInfo, layout: str, fetched: float) -> None:
    """Write the sidecar under a temporary name, then rename it into place."""
    record = {
        "url": info.url,
        "size": info.size,
        "etag": info.etag,
        "mtime": info.mtime,
        "identity": info.identity,
        "layout": layout,
        "fetched": fetched,
    }
    temporary = files.part(0)
    temporary.write_text(json.dumps(record, indent=1))
    os.replace(temporary, files.sidecar)


def read_sidecar(files: EntryFiles) -> dict[str, Any]:
    """The sidecar's record; ``{}`` when it is missing or unreadable."""
    try:
        record = json.loads(files.sidecar.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def scan(objects: Path) -> tuple[list[Stored], list[Part]]:
    """Every complete entry and every ``.part`` file (and ``.part.d`` directory) in ``objects``."""
    stored: list[Stored] = []
    parts: list[Part] = []
    names: list[str] = []
    with contextlib.suppress(FileNotFoundError), os.scandir(objects) as listing:
        names = [entry.name for entry in listing]
    for name in names:
        path = objects / name
        try:
            if name.endswith(".data"):
                files = EntryFiles(objects, name[: -len(".data")])
                size = path.stat().st_size
                stored.append(Stored(files, size, _last_used(files), read_sidecar(files)))
            elif name.endswith(".part"):
                pieces = name.split(".")
                parts.append(Part(path, pieces[0], int(pieces[1]), path.stat().st_size))
            elif name.endswith(".part.d"):  # a transform's scratch directory: bytes, no reserve
                parts.append(Part(path, name.split(".")[0], 0, _tree_bytes(path)))
        except (FileNotFoundError, ValueError, IndexError):
            continue  # evicted or finished meanwhile, or not one of ours
    return stored, parts


def remove_part(path: Path) -> None:
    """Delete a ``.part`` file or a ``.part.d`` scratch directory (gone already: fine)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _tree_bytes(directory: Path) -> int:
    total = 0
    for root, _, names in os.walk(directory):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def _last_used(files: EntryFiles) -> float:
    for path in (files.lease, files.data):
        with contextlib.suppress(FileNotFoundError):
            return path.stat().st_mtime
    return 0.0
