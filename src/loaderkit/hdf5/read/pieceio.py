"""Many small reads at once: from the page cache first, what the disk holds requested together.

A batch of CSR rows is a few hundred reads of some kilobytes at scattered offsets
(``csrplan.plan_pieces``). Read one after another, every read the page cache misses waits
for the disk alone (queue depth 1). ``read_pieces`` first copies what the page cache holds
(``os.preadv`` with ``RWF_NOWAIT``, which returns at once where a page would have to come
from the disk), asks the kernel for every missing range at once (``posix_fadvise``
``WILLNEED``: it queues the reads and returns), and then reads those: the disk serves them
together. Where the platform or the file's filesystem has no ``RWF_NOWAIT``, every read is
a plain ``os.preadv``.

``refuses_nowait`` and ``refused_nowait`` keep, per process, which open files' filesystems
refused ``RWF_NOWAIT`` (``rawio.pread_cached`` asks them too).

Example:
    >>> import numpy as np, os, tempfile
    >>> fd, path = tempfile.mkstemp()
    >>> _ = os.write(fd, bytes(range(32)))
    >>> out = np.zeros(6, np.uint8)
    >>> read_pieces(out, [fd, fd], [4, 20], [0, 3], [3, 3])
    True
    >>> out.tolist()
    [4, 5, 6, 20, 21, 22]
    >>> os.close(fd); os.unlink(path)
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence

import numpy as np

__all__ = ["NOWAIT", "read_pieces", "refused_nowait", "refuses_nowait"]

#: ``os.preadv`` with ``RWF_NOWAIT`` where this platform has it (Linux).
NOWAIT: int | None = getattr(os, "RWF_NOWAIT", None)
_WILLNEED: int | None = getattr(os, "POSIX_FADV_WILLNEED", None)
#: Files whose filesystem refused ``RWF_NOWAIT``: their descriptor -> ``(st_dev, st_ino)``,
#: so that a later file given the same number is asked again.
_NO_NOWAIT: dict[int, tuple[int, int]] = {}


def _file_of(fd: int) -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` of the file open as ``fd``, or ``None`` if it cannot be read."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def refuses_nowait(fd: int) -> bool:
    """Whether the file open as ``fd`` is one whose filesystem refused ``RWF_NOWAIT``.

    Example:
        >>> refuses_nowait(-1)
        False
    """
    known = _NO_NOWAIT.get(fd)
    if known is None:
        return False
    if _file_of(fd) == known:
        return True
    _NO_NOWAIT.pop(fd, None)  # the number names another file now
    return False


def refused_nowait(fd: int) -> None:
    """Remember that the file open as ``fd`` refused ``RWF_NOWAIT`` (``EOPNOTSUPP``/``EINVAL``).

    Example:
        >>> refused_nowait(-1)  # a descriptor that names no file is not remembered
    """
    file = _file_of(fd)
    if file is not None:
        _NO_NOWAIT[fd] = file


def read_pieces(
    out: np.ndarray,
    fds: Sequence[int],
    where: Sequence[int],
    into: Sequence[int],
    nbytes: Sequence[int],
    around: int = 0,
) -> bool:
    """Read ``nbytes[i]`` bytes at ``where[i]`` of file ``fds[i]`` into byte ``into[i]`` of ``out``.

    Args:
        out: The C-contiguous destination (its bytes).
        fds: Per read, the file descriptor.
        where: Per read, the file offset.
        into: Per read, the byte offset in ``out``.
        nbytes: Per read, its length.
        around: Where the page cache misses a read, ask for the aligned ``around`` bytes
            that hold it (and its neighbours: what a memory map's fault reads) rather than
            its bytes alone; 0: its bytes alone.

    Returns:
        ``True`` when every read got all its bytes; ``False`` at the first that failed or came
        back short (a truncated file, an I/O error), the rest not read: the caller reads the
        batch again by a path that names what failed.
    """
    missing: list[int] = []
    with out.reshape(-1).view(np.uint8).data as flat:
        reads = zip(fds, where, into, nbytes, strict=True)
        if NOWAIT is None or (_NO_NOWAIT and any(refuses_nowait(f) for f in set(fds))):
            return all(_read(f, flat[o : o + b], w, b) for f, w, o, b in reads)
        for i, (f, w, o, b) in enumerate(reads):
            try:
                got = os.preadv(f, [flat[o : o + b]], w, NOWAIT)
            except BlockingIOError:
                missing.append(i)  # not in the page cache: asked for below, with the others
                continue
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    return False
                refused_nowait(f)
                got = 0
            if got < b:  # part of it not in the page cache, or the file's end: read below
                missing.append(i)
        if not missing:
            return True
        if _WILLNEED is not None and (len(missing) > 1 or around):
            asked: set[tuple[int, int]] = set()
            for i in missing:  # queued together: the disk serves them at once
                w, b = where[i], nbytes[i]
                if around:
                    first, b = w - w % around, -(-(w + b) // around) * around
                    w, b = first, b - first
                if (fds[i], w) in asked:
                    continue
                asked.add((fds[i], w))
                try:
                    os.posix_fadvise(fds[i], w, b, _WILLNEED)
                except OSError:
                    break  # only advice: the reads below wait for each
        for i in missing:
            o, b = into[i], nbytes[i]
            if not _read(fds[i], flat[o : o + b], where[i], b):
                return False
    return True


def _read(fd: int, view: memoryview, offset: int, nbytes: int) -> bool:
    """One ``os.preadv`` of ``nbytes`` into ``view``; ``False`` if it failed or came back short."""
    try:
        return os.preadv(fd, [view], offset) == nbytes
    except OSError:
        return False
