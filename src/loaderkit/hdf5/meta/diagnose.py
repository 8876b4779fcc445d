"""Why an HDF5 file failed: causes established by checking, never guessed from message text.

A hint is added to an error only when a check confirms its cause: the file's identity
(``Identity``: device, inode, size, modification time) compared with what it was, a probe
``open`` (permission), the HDF5 signature in the file's first bytes, a probe lock (locking), or
a re-read chunk by chunk (checksums). Message text, which holds user paths, is never searched.

Damaged metadata: everything loaderkit reads of a file's metadata (opening objects, walking the
file's tree, reading shapes, types and filters) runs inside ``metadata_errors``, which turns
whatever HDF5 raises there (h5py raises ``RuntimeError``, ``KeyError``, ``OSError``,
``ValueError``, ``TypeError``) into an ``HDF5FileError`` naming the session, the file, the object
and HDF5's message, with the original as its cause and ``repair_advice``. loaderkit's own
errors (``LoaderkitError``: ``MissingKeyError`` for a key the file does not have,
``ConfigError``, ``HDF5FileError``) pass unchanged: ``dataset_at`` tells a missing key from one
HDF5 cannot open by looking the name up (``key in file`` and the file's list of datasets).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from h5py import h5t

from loaderkit.errors import HDF5FileError, LoaderkitError

__all__ = [
    "Identity",
    "changes",
    "damaged",
    "hdf5_message",
    "identity_of",
    "metadata_errors",
    "missing_sources",
    "open_diagnosis",
    "open_failure",
    "other_format",
    "repair_advice",
    "signature_found",
    "type_damage",
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


#: Other formats' first bytes, and what a message calls them.
_OTHER_FORMATS: tuple[tuple[bytes, str], ...] = (
    (b"PK\x03\x04", "a zip archive (.zip, .npz, a zipped zarr store)"),
    (b"\x1f\x8b", "a gzip stream (.gz): decompress it first"),
    (b"CDF\x01", "a netCDF-3 (classic) file, which is not HDF5: netCDF-4 files are"),
    (b"CDF\x02", "a netCDF-3 (64-bit offset) file, which is not HDF5: netCDF-4 files are"),
    (b"\x93NUMPY", "a numpy .npy array"),
    (b"PAR1", "a Parquet file"),
    (b"\x80\x04", "a Python pickle"),
    (b"\x80\x05", "a Python pickle"),
    (b"%PDF", "a PDF document"),
    (b"\x89PNG", "a PNG image"),
)
#: Bytes of a file's start looked at to tell another format (HDF5's first signature place
#: and its first block).
_FIRST_BLOCK = 4096


def other_format(path: str) -> str | None:
    """What a file without HDF5's signature is instead, where its first block says so.

    Known formats by their first bytes, or text (the first block decodes as UTF-8 without NUL
    or other control bytes). ``None``: nothing recognised (binary: possibly an HDF5 file whose
    start is damaged) or unreadable.

    Example:
        >>> import tempfile
        >>> with tempfile.NamedTemporaryFile(suffix=".h5") as tmp:
        ...     _ = tmp.write(b"cell,gene,count" + bytes([10]) + b"1,2,3")
        ...     tmp.flush()
        ...     other_format(tmp.name)
        'text (the first lines: cell,gene,count / 1,2,3)'
    """
    try:
        with open(path, "rb") as fh:
            head = fh.read(_FIRST_BLOCK)
    except OSError:
        return None
    for magic, name in _OTHER_FORMATS:
        if head.startswith(magic):
            return name
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:  # a block cut inside a character still counts as text
        if exc.start < len(head) - 3:
            return None
        text = head[: exc.start].decode("utf-8")
    if not text or any(ord(c) < 32 and c not in "\t\n\r\f" for c in text):
        return None
    lines = [line.strip()[:40] for line in text.splitlines() if line.strip()][:2]
    return f"text (the first lines: {' / '.join(lines)})" if lines else "text (blank)"


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
    hint, os_error, _ = open_diagnosis(path, locking=locking)
    return hint, os_error


def open_diagnosis(path: str, *, locking: bool = True) -> tuple[str, OSError | None, str]:
    """``open_failure``'s findings and what to do when the file itself is bad.

    Returns:
        ``(hint, os_error, advice)``: ``advice`` is empty where the hint already says what to
        do (permission, a lock); otherwise the file's bytes are bad (empty, no signature, a
        superblock or size HDF5 refuses) and it says so, with ``repair_advice``.

    Example:
        >>> open_diagnosis("/nonexistent/file.h5")[2]
        ''
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError as exc:
        return "the file does not exist", exc, ""
    except PermissionError as exc:
        return (
            (
                f"this process may not read it (errno {exc.errno}, permission denied): fix the "
                "file's permissions or run as a user who can read it"
            ),
            exc,
            "",
        )
    except OSError as exc:
        return (
            f"the operating system refuses to open it (errno {exc.errno}: {exc.strerror})",
            exc,
            "",
        )
    try:
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    advice = (
        "The file is damaged or truncated where HDF5 starts reading it (its superblock, the "
        f"metadata every read goes through), so none of it can be read. {repair_advice(path)}."
    )
    if size == 0:
        return "the file is empty (0 bytes)", None, advice
    found = signature_found(path)
    kind = other_format(path) if found is False else None
    if kind is not None:  # nothing was HDF5 here: no repair can help
        return (
            f"it is not an HDF5 file: it is {kind}, with no HDF5 signature",
            None,
            "Pass the session's HDF5 file (.h5, .hdf5, .h5ad, a netCDF-4 .nc).",
        )
    if found is False:
        return (
            (
                "it has no HDF5 signature: it is not an HDF5 file, or its start is damaged "
                "or was truncated"
            ),
            None,
            advice,
        )
    if locking:
        problem = _lock_problem(path)
        if problem:
            return problem, None, ""
    return "", None, advice


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


def repair_advice(path: str) -> str:
    """What to do about a damaged file: get it again, check it, see how far it reads.

    Example:
        >>> repair_advice("s1.h5").split(";")[0]
        'Re-download the file or restore it from a good copy'
    """
    return (
        "Re-download the file or restore it from a good copy; `h5check "
        f"{path}` checks its structure and `h5dump -H {path}` shows how far its "
        "metadata reads"
    )


def hdf5_message(exc: BaseException) -> str:
    """HDF5's own words in ``exc`` (a ``KeyError``'s text without the quotes it adds).

    Example:
        >>> hdf5_message(KeyError("Unable to synchronously open object (bad heap)"))
        'Unable to synchronously open object (bad heap)'
    """
    if isinstance(exc, KeyError) and len(exc.args) == 1 and isinstance(exc.args[0], str):
        return exc.args[0]
    return str(exc) or type(exc).__name__


def damaged(
    exc: BaseException, *, session: Hashable, path: str, what: str, process: bool = False
) -> HDF5FileError:
    """An ``HDF5FileError``: HDF5 could not read ``what`` of the file's metadata.

    Raise it ``from exc``: the original stays the cause.

    Args:
        exc: What h5py raised.
        session: The session id.
        path: The file.
        what: The object being read, in words ("dataset 'betas'").
        process: Name this process too (reads in workers).

    Example:
        >>> error = damaged(RuntimeError("wrong B-tree signature"), session=3, path="s3.h5",
        ...                 what="dataset 'betas'")
        >>> str(error).split(":")[0], "no read" in str(error)
        ('session 3', True)
    """
    where = f" in process {os.getpid()}" if process else ""
    return HDF5FileError(
        f"session {session!r}: {path} is damaged: HDF5 cannot read the metadata of {what}"
        f"{where} (HDF5: {hdf5_message(exc)}). The damage is in the file's metadata (object "
        "headers, B-trees, heaps), which no read of this file can get past: none of its rows "
        f"can be read. {repair_advice(path)}."
    )


@contextmanager
def metadata_errors(
    session: Hashable, path: str, what: str, *, process: bool = False
) -> Iterator[None]:
    """Turn what h5py raises while reading ``what``'s metadata into ``damaged(...)``.

    loaderkit's own errors (``LoaderkitError``), ``MemoryError`` and a missing file pass
    unchanged.

    Args:
        session: The session id.
        path: The file.
        what: The object being read, in words ("dataset 'betas'").
        process: Name this process in the message (reads in workers).

    Example:
        >>> with metadata_errors(0, "s0.h5", "dataset 'x'"):
        ...     pass
    """
    try:
        yield
    except (LoaderkitError, MemoryError, FileNotFoundError):
        raise
    except Exception as exc:
        raise damaged(exc, session=session, path=path, what=what, process=process) from exc


def type_damage(tid: Any) -> str:
    """What is inconsistent in an HDF5 type that numpy cannot represent ("" when nothing is).

    HDF5 refuses to build a compound whose members reach past its size, so a stored one that
    does is damaged metadata, not a type loaderkit does not support.

    Args:
        tid: The HDF5 type (``dset.id.get_type()``).

    Example:
        >>> import h5py, numpy as np
        >>> type_damage(h5py.h5t.py_create(np.dtype([("a", "<i4"), ("b", "<f8")])))
        ''
    """
    try:
        if tid.get_class() != h5t.COMPOUND:
            return ""
        size = tid.get_size()
        for k in range(tid.get_nmembers()):
            offset, member = tid.get_member_offset(k), tid.get_member_type(k).get_size()
            if offset + member > size:
                name = tid.get_member_name(k).decode(errors="replace")
                return (
                    f"member {name!r} of its compound type lies at bytes {offset}..."
                    f"{offset + member} of a {size}-byte type"
                )
    except Exception as exc:  # a type HDF5 cannot even describe
        return f"HDF5 cannot describe its type ({hdf5_message(exc)})"
    return ""
