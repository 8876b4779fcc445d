"""The file locks the cache directory is shared through; the OS drops a dead process's locks.

Three kinds, all on files in the cache directory, none of them state that outlives a crash:

- ``mutex(path)``: a ``filelock.FileLock``, exclusive between processes (and between threads,
  each call being a new lock object). Per entry, it serialises the download of one object; for
  the directory, it serialises the accounting that decides what to evict.
- ``Lease(path)``: ``fcntl.flock(LOCK_SH)`` held while a process uses an entry; many processes
  hold it at once.
- ``try_exclusive(path)``: ``flock(LOCK_EX | LOCK_NB)``, which the evictor takes before it
  deletes an entry; it fails while any lease is held, so an entry in use is never deleted.

Lock files may be deleted while locked (filelock deletes its own on release; the evictor
deletes a lease file while it holds it exclusively): every lock is taken, then checked to be on
the file that the path still names, and taken again if not, so two processes never hold "the"
lock on two different files. ``flock`` locks belong to an open file description: a forked
child shares its parent's, so the lease lasts until both have closed it. A forked child
therefore closes its copies of every lease at once (``os.register_at_fork``): a lease belongs
to the process that took it, and a worker forked while its parent held leases (the
prefetcher's window, open session files) must not keep those entries pinned after the parent
lets them go.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from loaderkit.errors import ConfigError

__all__ = ["Lease", "mutex", "try_exclusive"]

_LIVE_LEASES: weakref.WeakSet[Lease] = weakref.WeakSet()


def _fcntl() -> Any:
    try:
        import fcntl
    except ImportError as exc:  # pragma: no cover - Windows
        raise ConfigError(
            "SessionCache needs POSIX file locks (fcntl.flock: Linux, macOS); this platform "
            "has none. Copy the files to a local disk and pass local paths instead"
        ) from exc
    return fcntl


def mutex(path: Path, timeout: float = -1) -> Any:
    """An exclusive inter-process lock on ``path`` (``filelock.FileLock``; -1: wait forever).

    Examples:
        >>> import tempfile, pathlib
        >>> with mutex(pathlib.Path(tempfile.mkdtemp()) / "x.lock"):
        ...     pass
    """
    import filelock

    return filelock.FileLock(str(path), timeout=timeout, thread_local=False)


class Lease:
    """A shared ``flock`` on ``path``: "this process uses the entry" until ``close()``.

    Examples:
        >>> import tempfile, pathlib
        >>> lease = Lease(pathlib.Path(tempfile.mkdtemp()) / "x.lease")
        >>> lease.close()
    """

    def __init__(self, path: Path) -> None:
        fcntl = _fcntl()
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)
            except BaseException:
                os.close(fd)
                raise
            if _names(path, fd):
                self._fd: int | None = fd
                _LIVE_LEASES.add(self)
                return
            os.close(fd)  # the evictor deleted the file meanwhile: lock the new one

    @property
    def held(self) -> bool:
        """Whether the lease is still held."""
        return self._fd is not None

    def touch(self) -> None:
        """Mark the entry as used now (its lease file's mtime: the LRU clock)."""
        if self._fd is not None:
            os.utime(self._fd)

    def close(self) -> None:
        """Release the lease (closing the file releases the lock); idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


@contextlib.contextmanager
def try_exclusive(path: Path) -> Iterator[bool]:
    """Hold ``flock(LOCK_EX | LOCK_NB)`` on ``path``; yields ``False`` when a lease holds it.

    Examples:
        >>> import tempfile, pathlib
        >>> with try_exclusive(pathlib.Path(tempfile.mkdtemp()) / "x.lease") as free:
        ...     free
        True
    """
    fcntl = _fcntl()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield _names(path, fd)  # a file deleted meanwhile is not the entry's: treat as busy
    finally:
        os.close(fd)


def _after_fork_in_child() -> None:
    for lease in list(_LIVE_LEASES):
        lease.close()  # this child's copy: the parent's lease stays until the parent closes


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _names(path: Path, fd: int) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        on_disk = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (on_disk.st_dev, on_disk.st_ino) == (held.st_dev, held.st_ino)
