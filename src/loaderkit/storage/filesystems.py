"""fsspec filesystems, made lazily in the process that uses them and forgotten at a fork.

fsspec's async filesystems (s3fs, gcsfs, http) hold an event loop, a thread and open
connections that do not survive ``fork`` (s3fs issue 914, fsspec 835 and 755). So a
filesystem is made on first use in each process (``filesystem_for``), kept for that process,
keyed by its protocol chain and the frozen ``storage_options``, and made with
``skip_instance_cache=True`` so that fsspec's own instance cache never hands a parent's
instance to a child. An ``os.register_at_fork(after_in_child=...)`` hook (and a pid check, for
a child that forked from a thread the hook missed) forgets the parent's instances; fsspec
itself resets its IO loop in the child.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from typing import Any

from loaderkit.errors import ConfigError
from loaderkit.storage.urls import REMOTE_EXTRA, require_remote

__all__ = ["filesystem_for", "freeze_options", "protocol_of", "reset", "strip"]

_lock = threading.Lock()
_filesystems: dict[tuple[str, str], Any] = {}
_pid = os.getpid()


def protocol_of(url: str) -> str:
    """The protocol chain of a URL: ``"s3"``, ``"https"``, ``"simplecache::s3"``.

    A plain local path (no ``://``) is ``"file"``: the cache can front a shared filesystem.

    Examples:
        >>> protocol_of("s3://bucket/key.h5"), protocol_of("simplecache::s3://b/k")
        ('s3', 'simplecache::s3')
        >>> protocol_of("/lustre/nsd/betas_session01.hdf5")
        'file'
    """
    if "://" not in url:
        return "file"
    return url.split("://", 1)[0].lower()


def freeze_options(storage_options: Mapping[str, Any] | None) -> str:
    """A stable text key for ``storage_options`` (sorted JSON; ``repr`` for other values).

    Examples:
        >>> freeze_options({"anon": True}) == freeze_options({"anon": True})
        True
    """
    return json.dumps(dict(storage_options or {}), sort_keys=True, default=repr)


def filesystem_for(url: str, storage_options: Mapping[str, Any] | None = None) -> Any:
    """This process's fsspec filesystem for ``url``'s protocol and ``storage_options``.

    Args:
        url: A URL (only its protocol chain matters), or a local path (fsspec's local
            filesystem: the cache copies shared-filesystem files with it).
        storage_options: Keyword arguments for the filesystem, passed to fsspec unchanged.

    Returns:
        An ``fsspec.AbstractFileSystem``.

    Raises:
        ConfigError: fsspec, filelock or the protocol's backend (s3fs, gcsfs...) is missing.

    Examples:
        >>> fs = filesystem_for("memory://x")
        >>> fs is filesystem_for("memory://y")
        True
    """
    global _pid
    key = (protocol_of(url), freeze_options(storage_options))
    with _lock:
        if _pid != os.getpid():
            _filesystems.clear()
            _pid = os.getpid()
        fs = _filesystems.get(key)
        if fs is None:
            fs = _make(url, storage_options)
            _filesystems[key] = fs
        return fs


def strip(fs: Any, url: str) -> str:
    """``url`` as ``fs`` names it (no protocol for object stores; whole for http).

    Examples:
        >>> strip(filesystem_for("memory://x"), "memory://bucket/key.h5")
        '/bucket/key.h5'
    """
    return str(fs._strip_protocol(url.split("::")[-1]))


def reset() -> None:
    """Forget every filesystem of this process (the fork hook; tests).

    Examples:
        >>> reset()
    """
    with _lock:
        _filesystems.clear()


def _make(url: str, storage_options: Mapping[str, Any] | None) -> Any:
    require_remote(url)
    import fsspec.core

    try:
        fs, _ = fsspec.core.url_to_fs(
            protocol_of(url) + "://", skip_instance_cache=True, **dict(storage_options or {})
        )
    except ImportError as exc:
        raise ConfigError(
            f"{url}: the fsspec backend for {protocol_of(url)!r} is not installed ({exc}); "
            f"for s3:// {REMOTE_EXTRA}, for gs:// pip install gcsfs, for az:// pip install adlfs"
        ) from exc
    except ValueError as exc:
        raise ConfigError(f"{url}: fsspec does not know this protocol ({exc})") from exc
    return fs


def _after_fork_in_child() -> None:
    global _lock, _pid
    _lock = threading.Lock()
    _filesystems.clear()
    _pid = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
