"""Why an HDF5 file failed: causes established by checking, never guessed from message text.

A hint is added to an error only when a check confirms its cause: the file's identity
(``Identity``: device, inode, size, modification time) compared with what it was, a probe
``open`` (permission), the HDF5 signature in the file's first bytes, a probe lock (locking), or
a re-read chunk by chunk (checksums). Message text, which holds user paths, is never searched.
"""

from __future__ import annotations

import errno
import os
from typing import Any, NamedTuple

__all__ = [
    "Identity",
    "changes",
    "identity_of",
    "missing_sources",
    "open_failure",
    "signature_found",
]

#: HDF5's file signature; it sits at offset 0, 512, 1024, 2048, ... (after a user block).
_SIGNATURE = b"\x89HDF\r\n\x1a\n"


class Identity(NamedTuple):
    """What identifies a file's contents cheaply: one ``stat``.

    Attributes:
        device: ``st_dev``.
        inode: ``st_ino``.
        size: ``st_size`` in bytes.
        mtime_ns: ``st_mtime_ns``.

    Example:
        >>> Identity(1, 2, 3, 4).size
        3
    """

    device: int
    inode: int
    size: int
    mtime_ns: int


def identity_of(target: int | str) -> Identity:
    """The ``Identity`` of an open descriptor (``fstat``) or a path (``stat``).

    Example:
        >>> import tempfile
        >>> with tempfile.NamedTemporaryFile() as tmp:
        ...     identity_of(tmp.name).size
        0
    """
    st = os.fstat(target) if isinstance(target, int) else os.stat(target)
    return Identity(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def changes(before: Identity, now: Identity) -> list[str]:
    """What differs between two identities of one file, in words (empty: nothing).

    Example:
        >>> changes(Identity(1, 2, 300, 5), Identity(1, 2, 100, 6))
        ['size 300 -> 100 bytes (truncated)', 'modified since']
    """
    out = []
    if (before.device, before.inode) != (now.device, now.inode):
        out.append("replaced by another file (new inode)")
    if before.size != now.size:
        shrunk = " (truncated)" if now.size < before.size else ""
        out.append(f"size {before.size} -> {now.size} bytes{shrunk}")
    if before.mtime_ns != now.mtime_ns:
        out.append("modified since")
    return out


def signature_found(path: str) -> bool | None:
    """Whether the file holds HDF5's signature where HDF5 looks for it (``None``: unreadable).

    Example:
        >>> import tempfile
        >>> with tempfile.NamedTemporaryFile() as tmp:
        ...     signature_found(tmp.name)
        False
    """
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            offset = 0
            while offset + len(_SIGNATURE) <= size:
                fh.seek(offset)
                if fh.read(len(_SIGNATURE)) == _SIGNATURE:
                    return True
                offset = 512 if offset == 0 else offset * 2
    except OSError:
        return None
    return False


def _lock_problem(path: str) -> str | None:
    """A locking failure confirmed by a probe lock, or ``None``."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
            return (
                "another process holds a write lock on it (HDF5 file locking, errno "
                f"{exc.errno}): a writer has it open. Wait for the writer, or pass "
                "h5py_options={'locking': False} if the file does not change while you read"
            )
        if exc.errno in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
            return (
                f"its file system does not support file locks (errno {exc.errno}, common on "
                "NFS/Lustre/GPFS or read-only mounts): pass h5py_options={'locking': False} "
                "or set HDF5_USE_FILE_LOCKING=FALSE"
            )
        return None
    finally:
        os.close(fd)
    return None


def open_failure(path: str, *, locking: bool = True) -> tuple[str, OSError | None]:
    """Why ``path`` cannot be opened as HDF5, as far as checks can establish it.

    Args:
        path: The file.
        locking: Whether HDF5 locks files on open (probe a lock only then).

    Returns:
        ``(hint, os_error)``: a sentence (empty when no check explains the failure) and the
        ``OSError`` a probe ``open`` raised (``PermissionError`` and the like), to chain.

    Example:
        >>> open_failure("/nonexistent/file.h5")[0]
        'the file does not exist'
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError as exc:
        return "the file does not exist", exc
    except PermissionError as exc:
        return (
            f"this process may not read it (errno {exc.errno}, permission denied): fix the "
            "file's permissions or run as a user who can read it"
        ), exc
    except OSError as exc:
        return f"the operating system refuses to open it (errno {exc.errno}: {exc.strerror})", exc
    try:
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if size == 0:
        return "the file is empty (0 bytes)", None
    found = signature_found(path)
    if found is False:
        return (
            "it has no HDF5 signature: it is not an HDF5 file, or its start is damaged "
            "or was truncated"
        ), None
    if locking:
        problem = _lock_problem(path)
        if problem:
            return problem, None
    return "", None


def missing_sources(dset: Any, path: str) -> list[str]:
    """Source files of a virtual dataset that do not exist (HDF5 would read fill values).

    Relative source names are looked up beside the virtual dataset's file (and under
    ``HDF5_VDS_PREFIX`` when set); names with ``%`` patterns are not checked.

    Args:
        dset: An ``h5py.Dataset``.
        path: The file holding it.

    Returns:
        The missing source files (empty for other datasets).

    Example:
        >>> import h5py, numpy as np, tempfile
        >>> with h5py.File(os.path.join(tempfile.mkdtemp(), "p.h5"), "w") as f:
        ...     missing_sources(f.create_dataset("x", data=np.zeros(2)), f.filename)
        []
    """
    if not getattr(dset, "is_virtual", False):
        return []
    roots = [os.path.dirname(os.path.abspath(path))]
    prefix = os.environ.get("HDF5_VDS_PREFIX")
    if prefix:
        roots.insert(0, prefix)
    missing = []
    for source in dset.virtual_sources():
        name = source.file_name
        if name == "." or "%" in name:
            continue
        candidates = [name] if os.path.isabs(name) else [os.path.join(r, name) for r in roots]
        if not any(os.path.exists(c) for c in candidates) and name not in missing:
            missing.append(name)
    return missing
