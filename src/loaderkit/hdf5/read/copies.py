"""``SessionCopies``: what a session reader needs of sessions read from a local copy.

A reader opens most sessions in place. Sessions read through a ``SessionCache`` (remote URLs,
or local paths with ``cache=``) are opened from the cache's local copy instead: the reader
asks whether a session is one of them (``cached``), leases its copy (``lease``), asks for a
fresh copy when the leased one fails to open (``repair``) and names the object in messages
(``infos``). ``loaderkit.hdf5.remote.sources.SessionSources`` provides all four; the reader
knows only this protocol, so the read stage imports nothing of the remote stage.

Example:
    >>> sorted(name for name in vars(SessionCopies) if not name.startswith("_"))
    ['cached', 'infos', 'lease', 'repair']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from loaderkit.storage import CachedFile, ObjectInfo

__all__ = ["SessionCopies"]


class SessionCopies(Protocol):
    """Sessions a reader opens from a leased local copy (a ``SessionCache`` entry)."""

    @property
    def infos(self) -> Mapping[int, ObjectInfo]:
        """Position -> the object (or local file) as listed at construction."""
        ...

    def cached(self, pos: int) -> bool:
        """Whether session ``pos`` is read from a local copy."""
        ...

    def lease(self, pos: int) -> CachedFile:
        """A lease on session ``pos``'s local copy (fetched first when needed)."""
        ...

    def repair(self, pos: int, cached: CachedFile, error: BaseException) -> CachedFile:
        """After ``cached`` failed to open: the same lease, or one on a fresh copy."""
        ...
