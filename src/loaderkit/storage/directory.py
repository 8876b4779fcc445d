"""The cache directory's safety: made private, refused when others can write it.

Whoever can write in a cache directory decides what every job reading it gets (an object's
bytes, its metadata records), so ``SessionCache`` makes its directory with mode 0700 and
refuses one that is group- or world-writable or owned by another user, unless the caller
says it is shared on purpose (``SessionCache(shared=True)``). A sticky world-writable parent
such as ``/tmp`` is fine: only the cache directory itself is checked. *Main process and
workers alike*, when a ``SessionCache`` is made (pickled copies do not check again).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from loaderkit.errors import ConfigError

__all__ = ["private_directory", "stat_mode", "user_name"]


def private_directory(directory: Path, shared: bool = False) -> None:
    """Make ``directory`` (mode 0700) if missing; refuse one others can write unless ``shared``.

    Raises:
        ConfigError: ``directory`` is group- or world-writable or another user owns it; the
            message names it, its owner and mode, and the way out.
    """
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.stat(directory)
    if shared or not hasattr(os, "geteuid"):
        return
    me = os.geteuid()
    problems = []
    if st.st_uid != me:
        problems.append(f"owned by {user_name(st.st_uid)}, not by you ({user_name(me)})")
    if st.st_mode & 0o022:
        who = " and ".join(
            name for bit, name in ((0o020, "its group"), (0o002, "every user")) if st.st_mode & bit
        )
        problems.append(f"writable by {who}")
    if problems:
        raise ConfigError(
            f"the cache directory {directory} (owner {user_name(st.st_uid)}, mode "
            f"{stat_mode(st.st_mode)}) is {' and '.join(problems)}: whoever can write there "
            "decides what every job reading the cache gets. Use a private directory (the "
            f"default ~/.cache/loaderkit is made 0700), `chmod go-w {directory}`, or pass "
            "SessionCache(..., shared=True) for a directory shared on purpose"
        )


def stat_mode(mode: int) -> str:
    """A directory's permission bits as ``0755 (rwxr-xr-x)``.

    Examples:
        >>> stat_mode(0o40755)
        '0755 (rwxr-xr-x)'
    """
    return f"{stat.S_IMODE(mode):04o} ({stat.filemode(mode)[1:]})"


def user_name(uid: int) -> str:
    """``name (uid N)``, or ``uid N`` for a uid the system does not name.

    Examples:
        >>> user_name(0)
        'root (uid 0)'
    """
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"
