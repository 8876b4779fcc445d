"""Which names are URLs and hold globs, and the extra that remote files need.

Pure functions of the names (``require_remote`` only tries the imports): nothing here opens a
filesystem. Globs are expanded by ``objects.expand``, in the main process.

A URL here is ``protocol://...`` with a protocol of two or more characters (``s3://``,
``gs://``, ``az://``, ``https://``, ``hf://``, any fsspec protocol), or an fsspec chain such as
``simplecache::s3://...``. Not URLs: local paths, Windows drive letters (``C:/data``, ``C:``
and a backslash) and ``file://`` URLs, which name a local file (``local_path`` strips it).
"""

from __future__ import annotations

import os
import re

from loaderkit.errors import ConfigError

__all__ = ["REMOTE_EXTRA", "has_glob", "is_url", "local_path", "require_remote"]

REMOTE_EXTRA = 'pip install "loaderkit[remote]"'
"""The command that installs what remote session files need (fsspec, s3fs, filelock)."""

_URL = re.compile(r"^(?:[A-Za-z][A-Za-z0-9+.\-]+::)*([A-Za-z][A-Za-z0-9+.\-]+)://")
_GLOB = re.compile(r"[*?\[]")


def is_url(name: object) -> bool:
    """Whether ``name`` (a ``str`` or path-like) is a remote URL that fsspec must open.

    Args:
        name: A session file as the caller gave it.

    Returns:
        ``True`` for ``protocol://...`` with a protocol other than ``file``.

    Examples:
        >>> is_url("s3://natural-scenes-dataset/nsddata_betas/betas_session01.hdf5")
        True
        >>> is_url("C:/data/s1.h5"), is_url("/data/s1.h5"), is_url("file:///data/s1.h5")
        (False, False, False)
    """
    if not isinstance(name, (str, os.PathLike)):
        return False
    text = os.fspath(name)
    if not isinstance(text, str):
        return False
    match = _URL.match(text)
    return match is not None and not (match.group(1).lower() == "file" and "::" not in text)


def local_path(name: str | os.PathLike[str]) -> str:
    """A local name as a plain path: ``file://`` stripped, anything else unchanged.

    Examples:
        >>> local_path("file:///data/s1.h5")
        '/data/s1.h5'
    """
    text = os.fspath(name)
    return text[len("file://") :] if text.lower().startswith("file://") else text


def has_glob(url: str) -> bool:
    """Whether a URL holds glob characters (``*``, ``?``, ``[``) after its protocol.

    Examples:
        >>> has_glob("s3://bucket/betas_session*.hdf5"), has_glob("s3://bucket/s1.h5")
        (True, False)
    """
    return bool(_GLOB.search(url.split("://", 1)[-1]))


def require_remote(what: str) -> None:
    """Raise ``ConfigError`` naming the extra when fsspec or filelock is not installed.

    Args:
        what: What needed them, for the message (a URL, ``"SessionCache"``).

    Raises:
        ConfigError: fsspec or filelock cannot be imported.

    Examples:
        >>> require_remote("s3://bucket/s1.h5")  # doctest: +SKIP
    """
    missing = []
    for module in ("fsspec", "filelock"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise ConfigError(
            f"{what} needs {' and '.join(missing)}, which are not installed: {REMOTE_EXTRA} "
            "(fsspec, s3fs, filelock; gcsfs or adlfs for gs:// or az://)"
        )
