"""``HookLock``: the re-entrant lock around reads that run user code or hand out h5py objects.

The file pool (``loaderkit.hdf5.read.handles``) closes retired files only while it can take
this lock, and closes those left waiting when the outermost holder lets go of it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["HookLock"]

_get_ident = threading.get_ident


class HookLock:
    """A re-entrant lock that tells the file pool when its owner lets go of it entirely.

    Held by reads that run user code or use h5py objects handed out; the file pool closes
    retired handles only while it can take this lock (so never under another thread's hook),
    and closes those left waiting when the outermost holder releases it.

    Args:
        on_free: Called (without the lock) when the outermost holder releases it.

    Example:
        >>> freed = []
        >>> lock = HookLock(lambda: freed.append(True))
        >>> with lock:
        ...     with lock:
        ...         pass
        >>> freed
        [True]
    """

    def __init__(self, on_free: Callable[[], None]) -> None:
        self._rlock = threading.RLock()
        self._depth = 0
        self._owner: int | None = None
        self._on_free = on_free

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Take the lock (as ``threading.RLock.acquire``)."""
        got = self._rlock.acquire(blocking, timeout)
        if got:
            self._depth += 1
            self._owner = _get_ident()
        return got

    def release(self, *, notify: bool = True) -> None:
        """Release it once; the outermost release lets the file pool close what waits."""
        self._depth -= 1
        outermost = self._depth == 0
        if outermost:
            self._owner = None
        self._rlock.release()
        if outermost and notify:
            self._on_free()

    def held(self) -> bool:
        """Whether the calling thread holds it: no retired handle is closed meanwhile."""
        return self._owner == _get_ident()

    def __enter__(self) -> bool:  # acquire and release inlined: one per hooked sample
        self._rlock.acquire()
        self._depth += 1
        self._owner = _get_ident()
        return True

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth:
            self._rlock.release()
            return
        self._owner = None
        self._rlock.release()
        self._on_free()
