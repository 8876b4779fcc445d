"""The constructor arguments of ``HDF5SessionDataset``, checked and normalised once.

``normalize_files`` turns ``files`` into session id -> absolute path, ``check_options`` checks
``h5py_options`` (always read-only), ``check_max_open_files`` the handle budget and
``check_max_session_bytes`` the budget of sessions held in memory.
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

from loaderkit.errors import ConfigError, warn
from loaderkit.storage.urls import is_url, local_path

__all__ = ["check_max_open_files", "check_max_session_bytes", "check_options", "normalize_files"]


def check_max_open_files(max_open_files: Any) -> None:
    """``ConfigError`` unless ``max_open_files`` is an int >= 1.

    Example:
        >>> check_max_open_files(8)
    """
    if isinstance(max_open_files, bool) or not isinstance(max_open_files, int):
        raise ConfigError(
            f"max_open_files must be an int >= 1, got {max_open_files!r}; it bounds the "
            "HDF5 files each process keeps open."
        )
    if max_open_files < 1:
        raise ConfigError(
            f"max_open_files must be >= 1, got {max_open_files}: every read needs one open "
            "file. Use a small number such as 8 (the default)."
        )


def check_max_session_bytes(max_session_bytes: Any) -> None:
    """``ConfigError`` unless ``max_session_bytes`` is an int >= 0.

    Example:
        >>> check_max_session_bytes(1 << 30)
    """
    if isinstance(max_session_bytes, bool) or not isinstance(max_session_bytes, int):
        raise ConfigError(
            f"max_session_bytes must be an int >= 0 (bytes), got {max_session_bytes!r}; it "
            "bounds the rows of whole sessions each process holds in memory (0: none; "
            "None: fitted to the machine)."
        )
    if max_session_bytes < 0:
        raise ConfigError(
            f"max_session_bytes must be >= 0, got {max_session_bytes}: pass 0 to hold no "
            "session in memory, or leave it unset (None) to let loaderkit fit it."
        )


def normalize_files(files: Any) -> dict[Hashable, Path | str]:
    """``files`` (a mapping id -> name or a sequence of names) as id -> absolute ``Path``.

    A URL (``s3://...``; ``loaderkit.storage.is_url``) stays the ``str`` it is (a ``Path``
    would fold its ``//``); a ``file://`` URL becomes the local ``Path`` it names.

    Example:
        >>> normalize_files(["a.h5", "s3://bucket/b.h5"])[1]
        's3://bucket/b.h5'
    """
    if isinstance(files, (str, bytes, os.PathLike)):
        raise ConfigError(
            "files must be a mapping session id -> path or a sequence of paths, got a single "
            f"path {files!r}; wrap it in a list: files=[{files!r}]."
        )
    if isinstance(files, Mapping):
        items = list(files.items())
    elif isinstance(files, Sequence) or hasattr(files, "__iter__"):
        items = list(enumerate(files))
    else:
        raise ConfigError(
            f"files must be a mapping session id -> path or a sequence of paths, got "
            f"{type(files).__name__}."
        )
    if not items:
        raise ConfigError("files is empty: pass at least one session file.")
    out: dict[Hashable, Path | str] = {}
    for sid, path in items:
        if not isinstance(path, (str, os.PathLike)):
            raise ConfigError(
                f"session {sid!r}: expected a path (str or os.PathLike), got {type(path).__name__}."
            )
        if is_url(path):
            out[sid] = os.fspath(path)
            continue
        out[sid] = Path(os.path.abspath(os.path.expanduser(local_path(path))))
    return out


def check_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``h5py_options`` checked: read-only mode only; a warning for the ``stdio`` driver.

    Example:
        >>> check_options({"locking": False})
        {'locking': False}
    """
    opts = dict(options or {})
    mode = opts.pop("mode", "r")
    if mode != "r":
        raise ConfigError(
            f"h5py_options['mode']={mode!r}: HDF5SessionDataset always opens files "
            "read-only ('r'); remove 'mode'."
        )
    if opts.get("driver") == "stdio":
        warn(
            "h5py_options['driver']='stdio' buffers reads in the C library and has returned "
            "wrong rows after fork; use the default driver (sec2) unless you must."
        )
    return opts
