"""Damaged cache entries: found by comparing a file with its sidecar, discarded, fetched again.

An entry's sidecar records the data file as it was written (size, modification time, MD5 when
known; ``entries.write_sidecar``). A truncation, bytes overwritten or a file replaced changes
what ``os.stat`` says, so ``damage`` finds it with one ``stat`` and the sidecar's read at every
lease; a damaged copy that kept its size and time is found by its MD5 when h5py fails to open
it (``SessionCache.repair``). ``discard`` removes the copy under the entry's download mutex, at
most once per process and entry: a copy damaged again after its re-fetch is a
``CacheDamageError`` (something on the node keeps damaging it). *Any process that leases.*
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

from loaderkit.errors import CacheDamageError, CacheRepairWarning, warn
from loaderkit.storage import entries
from loaderkit.storage.download import file_md5, fsync_directory
from loaderkit.storage.entries import EntryFiles
from loaderkit.storage.locks import mutex
from loaderkit.storage.objects import ObjectInfo

__all__ = ["damage", "discard", "inode"]

logger = logging.getLogger(__name__)


def inode(path: Path) -> tuple[int, int, int, int] | None:
    """What tells one file at ``path`` from the next (``None`` when it is gone).

    Device and inode number, and the change time and size: a file written in place of a
    deleted one often gets the same inode number, never the same change time.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns, st.st_size)


def damage(
    files: EntryFiles,
    info: ObjectInfo,
    layout: str,
    verified: set[tuple[str, int, int]] | None = None,
) -> str:
    """What no longer matches between the entry's data file and its sidecar (``""``: nothing).

    Args:
        files: The entry's files (a missing data file is ``""``: nothing to check).
        info: The object as listed.
        layout: The cache's layout (``stored``: the file is the object's bytes).
        verified: For a shared directory, whose sidecars anyone may have written: the files
            (key, inode, mtime) this process checked against the store's size and MD5 ETag;
            ``None``: the sidecar is trusted.
    """
    try:
        data = os.stat(files.data)
    except FileNotFoundError:
        return ""
    found = entries.check(entries.read_sidecar(files), data, info)
    if found or verified is None:
        return found
    mark = (files.key, data.st_ino, data.st_mtime_ns)
    if mark in verified:
        return ""
    if layout == "stored" and data.st_size != info.size:
        return f"its size is {data.st_size} bytes, the store lists {info.size}"
    if layout == "stored" and info.md5 is not None:
        actual = file_md5(files.data)
        if actual != info.md5:
            return f"its MD5 is {actual}, the store's ETag is {info.md5}"
    verified.add(mark)
    return ""


def discard(
    files: EntryFiles,
    info: ObjectInfo,
    found: str,
    seen: tuple[int, ...] | None,
    repaired: set[str],
    directory: Path,
) -> None:
    """Delete a damaged complete entry, with a ``CacheRepairWarning``; the caller fetches it.

    Args:
        files: The entry's files.
        info: The object.
        found: What no longer matches (``damage``'s answer, or the MD5 found at a failed open).
        seen: The data file's ``inode`` when it was found damaged: a file replaced meanwhile
            (another process repaired it) is left alone.
        repaired: The entries this process discarded before (this one is added).
        directory: The cache directory, for the message.

    Raises:
        CacheDamageError: This process discarded the entry before.
    """
    with mutex(files.lock):
        if seen is None or inode(files.data) != seen:
            return  # discarded or fetched again by another process meanwhile
        if found == entries.NO_RECORD:  # an older loaderkit's entry (or a deleted sidecar)
            files.data.unlink(missing_ok=True)
            logger.info("%s: the cache's copy %s has no record: fetched again", info.url, files)
            return
        if files.key in repaired:
            raise CacheDamageError(
                errno.EIO,
                f"{info.url}: the cache's copy {files.data} no longer matches its record "
                f"({found}) although it was fetched again in this process (process "
                f"{os.getpid()}): something on this node damages files in {directory} (a "
                "failing or full disk, another program). Check that disk; `loaderkit cache "
                "verify` lists and removes damaged entries",
            )
        repaired.add(files.key)
        files.data.unlink(missing_ok=True)
        files.sidecar.unlink(missing_ok=True)
        fsync_directory(files.objects)
    warn(
        f"{info.url}: the cache's copy {files.data} was damaged ({found}); discarded, fetching "
        "it again from the store",
        CacheRepairWarning,
    )
