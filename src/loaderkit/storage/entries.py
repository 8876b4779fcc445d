"""The cache directory on disk: every file it holds (``LAYOUT``), an entry's files, a scan.

Layout (shared by every process on the node; nothing else is shared). ``LAYOUT`` is this
table as data: ``loaderkit cache ls|du|clear|verify`` walk it, and a file the cache writes
that no row names is a bug::

    CACHEDIR.TAG                     marks a cache (backup tools skip it)
    accounting.lock                  filelock: one process at a time decides what to evict
    objects/<key>.data               the object, complete and verified (never partial)
    objects/<key>.json               its sidecar: url, size, etag, mtime, layout, fetched, and
                                     the data file's size, mtime and MD5 (when known) as written
    objects/<key>.lock               filelock: the object's download mutex (while downloading)
    objects/<key>.lease              flock(LOCK_SH) by each process using it; mtime = last use
    objects/<key>.<n>.<pid>.<token>.part    a download in flight, n bytes reserved
    objects/<key>.<n>.<pid>.<token>.part.d  a transform's scratch directory (``rows``)
    meta/<key>.json                  an object's HDF5 metadata record (versioned JSON data)
    meta/<key>.lock                  filelock: the record is being made (once per node)
    meta/<key>.<pid>.<token>.tmp     a record being written
    meta/<key>.pkl                   an older loaderkit's record: never read
    stats/<pid>-<token>.bin          counters summed over one cache object's processes

``<key>`` is a hash of the URL, the object's identity and the layout, then the file's name
(``3f2a...-betas_session01_hdf5``): a changed object gets a new entry, never a file replaced
under a reader. A complete entry whose data file no longer matches its sidecar (``check``)
is damaged: the cache discards it and fetches the object again.
"""

from __future__ import annotations

import contextlib
import fnmatch
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
    "LAYOUT",
    "NO_RECORD",
    "SIDECAR_VERSION",
    "EntryFiles",
    "FileKind",
    "Part",
    "Stored",
    "check",
    "classify",
    "entry_key",
    "read_sidecar",
    "remove_part",
    "scan",
    "walk",
    "write_sidecar",
]

TAG = "CACHEDIR.TAG"
TAG_TEXT = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# loaderkit's session cache (loaderkit.SessionCache). Safe to delete when no job runs.\n"
)
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
#: The sidecar's version: 2 records the data file as written (size, mtime, MD5).
SIDECAR_VERSION = 2
#: ``check``'s answer for an entry without a sidecar of this version (an older loaderkit's).
NO_RECORD = "it has no record of this loaderkit's version"


@dataclass(frozen=True)
class FileKind:
    """One row of the cache directory's layout.

    Attributes:
        pattern: A glob relative to the cache directory.
        group: ``"entries"`` (complete objects and sidecars), ``"downloads"`` (in flight),
            ``"locks"``, ``"meta"`` (metadata records), ``"stats"`` or ``"marker"``.
        what: What the file is, for ``loaderkit cache ls``.
    """

    pattern: str
    group: str
    what: str


LAYOUT: tuple[FileKind, ...] = (
    FileKind(TAG, "marker", "marks a cache (backup tools skip it)"),
    FileKind("accounting.lock", "locks", "one process at a time decides what to evict"),
    FileKind("objects/*.data", "entries", "a complete, verified object"),
    FileKind("objects/*.json", "entries", "an object's sidecar record"),
    FileKind("objects/*.lock", "locks", "an object's download mutex"),
    FileKind("objects/*.lease", "locks", "an object's lease file (mtime: last use)"),
    FileKind("objects/*.part", "downloads", "a download in flight, or a dead one's"),
    FileKind("objects/*.part.d", "downloads", "a transform's scratch directory"),
    FileKind("meta/*.json", "meta", "an object's HDF5 metadata record"),
    FileKind("meta/*.lock", "meta", "a metadata record being made"),
    FileKind("meta/*.tmp", "meta", "a metadata record being written"),
    FileKind("meta/*.pkl", "meta", "an older loaderkit's metadata record (never read)"),
    FileKind("stats/*.bin", "stats", "counters of one cache object's processes"),
)


def classify(relative: str) -> FileKind | None:
    """The ``LAYOUT`` row a path (relative to the cache directory) matches, if any.

    Examples:
        >>> classify("meta/0a1b.json").group, classify("objects/x.1.2.ab.part").group
        ('meta', 'downloads')
        >>> classify("notes.txt") is None
        True
    """
    for kind in LAYOUT:
        folder, _, glob = kind.pattern.rpartition("/")
        head, _, name = relative.rpartition("/")
        if head == folder and fnmatch.fnmatchcase(name, glob):
            return kind
    return None


def walk(directory: Path) -> tuple[dict[str, list[tuple[Path, int]]], list[Path]]:
    """Every file (and scratch directory) in the cache by ``LAYOUT`` group, with its bytes.

    Returns:
        ``group -> [(path, bytes)]``, and the paths no row of ``LAYOUT`` names (left alone).
    """
    groups: dict[str, list[tuple[Path, int]]] = {kind.group: [] for kind in LAYOUT}
    unknown: list[Path] = []
    folders = sorted({kind.pattern.rpartition("/")[0] for kind in LAYOUT})
    for folder in folders:
        base = directory / folder if folder else directory
        with contextlib.suppress(FileNotFoundError, NotADirectoryError), os.scandir(base) as it:
            for item in list(it):
                relative = f"{folder}/{item.name}" if folder else item.name
                if not folder and item.name in folders:
                    continue
                kind = classify(relative)
                path = base / item.name
                if kind is None:
                    unknown.append(path)
                    continue
                try:
                    size = (
                        _tree_bytes(path)
                        if item.is_dir(follow_symlinks=False)
                        else item.stat(follow_symlinks=False).st_size
                    )
                except FileNotFoundError:
                    continue
                groups[kind.group].append((path, size))
    return groups, unknown


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


def write_sidecar(
    files: EntryFiles,
    info: ObjectInfo,
    layout: str,
    fetched: float,
    data: os.stat_result | None = None,
    md5: str | None = None,
) -> None:
    """Write the sidecar under a temporary name, then rename it into place.

    Args:
        files: The entry's files.
        info: The object as listed.
        layout: The cache's layout.
        fetched: When it was fetched (seconds since the epoch).
        data: The data file's ``stat`` as written (before its rename): ``check`` compares.
        md5: The data file's MD5, when known (the store's ETag it was verified against).
    """
    record = {
        "version": SIDECAR_VERSION,
        "file_size": None if data is None else data.st_size,
        "file_mtime_ns": None if data is None else data.st_mtime_ns,
        "md5": md5,
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


def check(record: dict[str, Any], data: os.stat_result, info: ObjectInfo | None = None) -> str:
    """What no longer matches between a data file and its sidecar ``record`` (``""``: nothing).

    The size and modification time the file had when it was written (any write since, a
    truncation or bytes overwritten, changes them), and for the ``stored`` layout the size the
    store listed (``info``).

    Examples:
        >>> import os, tempfile
        >>> path = tempfile.mktemp(); open(path, "wb").write(b"abc")
        3
        >>> st = os.stat(path)
        >>> record = {"version": 2, "file_size": 3, "file_mtime_ns": st.st_mtime_ns}
        >>> check(record, st), check(dict(record, file_size=4), st)
        ('', 'its size is 3 bytes, its record says 4')
    """
    if record.get("version") != SIDECAR_VERSION:
        return NO_RECORD
    size, mtime = record.get("file_size"), record.get("file_mtime_ns")
    if size != data.st_size:
        return f"its size is {data.st_size} bytes, its record says {size}"
    if info is not None and record.get("layout") == "stored" and data.st_size != info.size:
        return f"its size is {data.st_size} bytes, the store lists {info.size}"
    if mtime != data.st_mtime_ns:
        return (
            "it was modified after it was fetched (mtime "
            f"{data.st_mtime_ns / 1e9:.3f}, its record says {(mtime or 0) / 1e9:.3f})"
        )
    return ""


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
