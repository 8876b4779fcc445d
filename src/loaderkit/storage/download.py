"""One object to one local file: fetch, verify, fsync. The cache decides where and when.

Runs in whichever process or fetcher thread holds the entry's download lock. The object is
fetched with the filesystem's own whole-object path (``fs.get_file``: one streamed GET on s3fs
and http, parallel ranges for s3fs objects over its block size), checked against the size the
listing gave and, when the ETag is a plain MD5 (no ``-``), against it; then flushed to disk.
A failure removes nothing itself: the caller owns the temporary file and deletes it.
"""

from __future__ import annotations

import errno
import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loaderkit.errors import StorageError
from loaderkit.storage.filesystems import strip
from loaderkit.storage.limits import format_bytes
from loaderkit.storage.objects import ObjectInfo, access_error, refused

__all__ = ["Cancelled", "download", "file_md5", "fsync_directory", "is_disk_full"]

_HASH_BLOCK = 8 * 2**20


class Cancelled(Exception):
    """A download stopped because its ``cancel`` event was set (a closing prefetcher)."""


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the disk (or the user's quota) is full.

    Examples:
        >>> is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
        True
    """
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def download(
    fs: Any,
    info: ObjectInfo,
    target: Path,
    progress: Callable[[int], None] | None = None,
    cancel: threading.Event | None = None,
) -> None:
    """Fetch ``info.url`` into ``target``, check its size (and MD5 ETag), fsync it.

    Args:
        fs: The URL's fsspec filesystem.
        info: The object as listed (its size and ETag are what the file must match).
        target: The local file to write (a temporary name; the caller renames it).
        progress: Called with each block's byte count as it arrives.
        cancel: When set, the download stops at the next block with ``Cancelled``.

    Raises:
        FileNotFoundError: The object is gone (the message names the URL).
        StorageAccessError: The store refused the credentials.
        StorageError: The bytes do not match the listing (the object changed meanwhile).
        OSError: A local write failed (a full disk keeps ``errno.ENOSPC``: the cache names it).
        Cancelled: ``cancel`` was set.

    Examples:
        >>> download(fs, info, Path("/cache/objects/x.part"))  # doctest: +SKIP
    """
    import fsspec.callbacks

    reported = [0]

    class _Progress(fsspec.callbacks.Callback):
        def relative_update(self, inc: int = 1) -> None:
            if cancel is not None and cancel.is_set():
                raise Cancelled(info.url)
            reported[0] += inc
            if progress is not None:
                progress(inc)

    try:
        fs.get_file(strip(fs, info.url), str(target), callback=_Progress())
    except PermissionError as exc:
        raise access_error(info.url, exc) from exc
    except FileNotFoundError as exc:
        if exc.filename == str(target):
            raise
        if refused(exc):
            raise access_error(info.url, exc) from exc
        raise FileNotFoundError(f"{info.url}: no such object in the store (anymore)") from exc
    if cancel is not None and cancel.is_set():
        raise Cancelled(info.url)
    got = target.stat().st_size
    if not reported[0] and progress is not None:
        progress(got)  # a filesystem that copies without reporting (fsspec's local one)
    if got != info.size:
        raise StorageError(
            errno.EIO,
            f"{info.url}: downloaded {got} bytes, the store listed {info.size} "
            f"({format_bytes(info.size)}): the object changed during the download? Run again",
        )
    expected = info.md5
    if expected is not None:
        actual = _md5(target, cancel)
        if actual != expected:
            raise StorageError(
                errno.EIO,
                f"{info.url}: the downloaded bytes have MD5 {actual}, the store's ETag is "
                f"{expected}: the object changed during the download, or the transfer was "
                "corrupted. Run again",
            )
    with open(target, "rb+") as handle:
        os.fsync(handle.fileno())


def fsync_directory(directory: Path) -> None:
    """Flush a directory's entries (a rename) to disk, where the OS allows it."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def file_md5(path: Path) -> str:
    """The MD5 of a file's bytes, in hex (the form of a single-part upload's ETag)."""
    return _md5(path, None)


def _md5(path: Path, cancel: threading.Event | None) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as handle:
        while block := handle.read(_HASH_BLOCK):
            if cancel is not None and cancel.is_set():
                raise Cancelled(str(path))
            digest.update(block)
    return digest.hexdigest()
