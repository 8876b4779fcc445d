"""Every exception and warning class loaderkit defines, and the helpers that raise them.

Every error loaderkit raises on purpose derives from ``LoaderkitError``, so callers can catch
all of them with one ``except``; each is also the builtin type that code written for torch
expects, so ``except ValueError`` / ``except TypeError`` / ``except OSError`` keep working::

    Exception
    ├── LoaderkitError
    │   ├── ConfigError          (also ValueError)  an argument that cannot work
    │   │   └── ArgumentTypeError (also TypeError)  ... because it has the wrong type
    │   ├── HDF5FileError        (also OSError)     an HDF5 file that cannot be opened or read
    │   ├── MissingKeyError      (also KeyError)    a dataset the HDF5 file does not have
    │   ├── RaggedBatchError     (also RuntimeError) rows of different lengths in one batch
    │   ├── ResourceLeakError                      LeakCheck(raise_on_leak=True) found growth
    │   ├── ShortRead            (also OSError)     a table read the file could not complete
    │   └── StorageError         (also OSError)     the session cache or an object store failed
    │       ├── StorageAccessError (also PermissionError) the store refused the credentials
    │       └── CacheDamageError                   a cached copy damaged again after a re-fetch
    UserWarning
    └── LoaderkitWarning                            works, but not the way you probably want
        ├── PerformanceHint                         works correctly, only slower than it could
        ├── CacheRepairWarning                      a damaged cached copy was fetched again
        └── LoaderkitDeprecationWarning             an old name that still works: use the new one

Protocol errors keep torch's and Python's types and are documented where they are raised:
``IndexError`` for an index out of range, ``KeyError`` for a missing HDF5 key (raised as
``MissingKeyError``, so a key that is missing is told apart from one HDF5 cannot open),
``FileNotFoundError`` for a missing session file (a missing remote object or bucket too).

Filter warnings as a group (``warnings.simplefilter("ignore", LoaderkitWarning)``), or only
the performance advice (``warnings.simplefilter("ignore", PerformanceHint)``) while keeping
the correctness warnings.

Released names that moved answer for one release through one mechanism, here: a ``Moved``
entry (the new name and the release), read by ``MovedAttribute`` (a name on a class) or by
``moved_module_getattr`` (a module's ``__getattr__``), with one
``LoaderkitDeprecationWarning`` message naming the new name.
"""

from __future__ import annotations

import numbers
import os
import sys
import warnings
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any, NamedTuple

__all__ = [
    "ArgumentTypeError",
    "CacheDamageError",
    "CacheRepairWarning",
    "ConfigError",
    "HDF5FileError",
    "LoaderkitDeprecationWarning",
    "LoaderkitError",
    "LoaderkitWarning",
    "MissingKeyError",
    "Moved",
    "MovedAttribute",
    "PerformanceHint",
    "RaggedBatchError",
    "ResourceLeakError",
    "ShortRead",
    "StorageAccessError",
    "StorageError",
    "add_note",
    "check_int",
    "moved_module_getattr",
    "warn",
]


class LoaderkitError(Exception):
    """Base class of every error raised by loaderkit.

    Examples:
        >>> try:
        ...     raise ConfigError("num_workers must be >= 0")
        ... except LoaderkitError as exc:
        ...     print(type(exc).__name__)
        ConfigError
    """


class ConfigError(LoaderkitError, ValueError):
    """An argument or combination of arguments that cannot work.

    The message names the argument (or attribute path), what was expected and how to fix it.
    Being a ``ValueError`` too, it is caught by code written against torch's DataLoader.

    Examples:
        >>> isinstance(ConfigError("bad"), ValueError)
        True
    """


class ArgumentTypeError(ConfigError, TypeError):
    """An argument of the wrong type (``seed=1.5``, ``epoch="3"``).

    A ``TypeError``, as Python's own argument errors are, and a ``ConfigError`` (so also a
    ``ValueError``), so that ``except ConfigError`` catches every bad argument: like numpy's
    ``AxisError``, which is both a ``ValueError`` and an ``IndexError``.

    Examples:
        >>> isinstance(ArgumentTypeError("seed must be an int"), TypeError)
        True
    """


class HDF5FileError(LoaderkitError, OSError):
    """An HDF5 file could not be opened or read; the message names session, path and the fix.

    Also an ``OSError``, so code that catches h5py's own I/O errors keeps working.

    Examples:
        >>> isinstance(HDF5FileError("session 3 (/data/s3.h5): not an HDF5 file"), OSError)
        True
    """


class MissingKeyError(LoaderkitError, KeyError):
    """A dataset path the session file does not have; the message lists the datasets it has.

    A ``KeyError``, as h5py's own lookups raise, so ``except KeyError`` keeps working; a
    ``LoaderkitError`` too, which tells it apart from the ``KeyError`` h5py raises when the
    file's metadata is damaged ("Unable to synchronously open object (...)"): loaderkit turns
    that one into an ``HDF5FileError`` naming the file.

    Examples:
        >>> isinstance(MissingKeyError("session 0: s0.h5 has no dataset 'x'"), KeyError)
        True
    """


class RaggedBatchError(LoaderkitError, RuntimeError):
    """Samples of different lengths (variable-length HDF5 rows) cannot be stacked into a batch.

    The message names the dataset and the ways out (``collate_fn=loaderkit.pad_collate``, a
    ``transform`` that crops or pads, or ``batch_size=None``). A ``RuntimeError`` too, as
    torch's own ``stack expects each tensor to be equal size`` is.

    Examples:
        >>> isinstance(RaggedBatchError("rows of 'spikes' are ragged"), RuntimeError)
        True
    """


class ResourceLeakError(LoaderkitError):
    """Raised by ``LeakCheck`` (``raise_on_leak=True``) when resources did not come back.

    Examples:
        >>> issubclass(ResourceLeakError, LoaderkitError)
        True
    """


class ShortRead(LoaderkitError, OSError):
    """A read of a table (``loaderkit.hdf5.read.readtable``) that could not be completed.

    The file ended before the read's last byte (truncated under the reader), or the system
    call failed (``errno`` then says how). Readers turn it into an ``HDF5FileError`` naming
    the file, key and rows: they know them, the table does not.

    Attributes:
        row: The read's row in the table.
        fd: The file descriptor read.
        offset: The read's first byte in the file.
        wanted: The bytes it asked for.
        got: The bytes it had read when it stopped.
        errno: The system call's error number, or ``None`` where the file ended.

    Examples:
        >>> error = ShortRead(3, 7, 4096, 64, 16, None, "the row data")
        >>> str(error).split(" (")[0]
        'file ends 48 bytes short of the row data'
        >>> isinstance(error, OSError), error.errno is None
        (True, True)
    """

    def __init__(
        self,
        row: int,
        fd: int,
        offset: int,
        wanted: int,
        got: int,
        code: int | None = None,
        what: str = "the read",
    ) -> None:
        where = f"read {row}: {wanted} bytes at {offset} of fd {fd}"
        if code is None:
            message = (
                f"file ends {wanted - got} bytes short of {what} ({where}; truncated while open?)"
            )
        else:
            message = f"[Errno {code}] {os.strerror(code)}: reading {what} failed ({where})"
        super().__init__(message)
        self.errno = code
        self.row, self.fd, self.offset, self.wanted, self.got, self.what = (
            row,
            fd,
            offset,
            wanted,
            got,
            what,
        )

    def __reduce__(self) -> Any:
        args = (self.row, self.fd, self.offset, self.wanted, self.got, self.errno, self.what)
        return (ShortRead, args)


class StorageError(LoaderkitError, OSError):
    """The session cache or an object store failed: a full disk, no room within ``max_bytes``.

    The message names the URL, the cache directory, the sizes involved and what to do. An
    ``OSError`` too, built as ``StorageError(errno, message)`` where the cause has one (a full
    disk keeps ``errno.ENOSPC``), so code that checks ``exc.errno`` keeps working.

    Examples:
        >>> import errno
        >>> error = StorageError(errno.ENOSPC, "s3://b/s1.h5: the cache's disk is full")
        >>> isinstance(error, OSError), error.errno == errno.ENOSPC
        (True, True)
    """


class StorageAccessError(StorageError, PermissionError):
    """An object store refused the request (HTTP 403, missing or wrong credentials).

    The message names the URL and the fix: ``storage_options={"anon": True}`` for a public
    bucket, or credentials for a private one. A ``PermissionError`` too, as fsspec raises.

    Examples:
        >>> isinstance(StorageAccessError("s3://b/s1.h5: access denied"), PermissionError)
        True
    """


class CacheDamageError(StorageError):
    """A cached copy no longer matched its record again after it was discarded and re-fetched.

    Something on the node keeps damaging files in the cache directory (a failing or full disk,
    another program): the message names the URL, the copy and what no longer matches.
    ``errno`` is ``EIO``.

    Examples:
        >>> import errno
        >>> CacheDamageError(errno.EIO, "s3://b/s1.h5: damaged again").errno == errno.EIO
        True
    """


class LoaderkitWarning(UserWarning):
    """A warning issued by loaderkit: something works, but not the way you probably want.

    Examples:
        >>> import warnings
        >>> warnings.simplefilter("ignore", LoaderkitWarning)
    """


class PerformanceHint(LoaderkitWarning):
    """Advice about speed: the result is correct, only slower than it could be.

    Silence it alone with ``warnings.simplefilter("ignore", PerformanceHint)``; correctness
    warnings (plain ``LoaderkitWarning``) stay on.

    Examples:
        >>> issubclass(PerformanceHint, LoaderkitWarning)
        True
    """


class CacheRepairWarning(LoaderkitWarning):
    """A cached copy no longer matched its record: it was discarded and fetched again.

    The samples read are right (they come from the fresh copy); the warning says which copy
    was damaged and how, once per entry and process.

    Examples:
        >>> issubclass(CacheRepairWarning, LoaderkitWarning)
        True
    """


class LoaderkitDeprecationWarning(LoaderkitWarning):
    """An old public name that still works; the message names the one to use instead.

    Examples:
        >>> issubclass(LoaderkitDeprecationWarning, LoaderkitWarning)
        True
    """


def check_int(name: str, value: Any, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an ``int`` when it is an integer (not a bool) within the bounds.

    The one check loaderkit uses for integer arguments: a wrong type raises
    ``ArgumentTypeError`` (a ``TypeError``), a value out of bounds ``ConfigError`` (a
    ``ValueError``); both name the argument and what was expected.

    Args:
        name: The argument's name, for the message.
        value: The value to check (numpy integers are accepted).
        minimum: Smallest allowed value, if any.
        maximum: Largest allowed value, if any.

    Returns:
        ``int(value)``.

    Raises:
        ArgumentTypeError: ``value`` is not an integer, or is a bool.
        ConfigError: ``value`` is out of bounds.

    Examples:
        >>> check_int("num_workers", 2, minimum=0)
        2
        >>> check_int("epoch", -1, minimum=0)
        Traceback (most recent call last):
        ...
        loaderkit.errors.ConfigError: epoch must be an int >= 0, got -1
    """
    if minimum is not None and maximum is not None:
        expected = f"{name} must be an int in [{_bound(minimum)}, {_bound(maximum)}]"
    elif minimum is not None:
        expected = f"{name} must be an int >= {_bound(minimum)}"
    elif maximum is not None:
        expected = f"{name} must be an int <= {_bound(maximum)}"
    else:
        expected = f"{name} must be an int"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ArgumentTypeError(f"{expected}, got {type(value).__name__} {value!r}")
    number = int(value)
    if (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
        raise ConfigError(f"{expected}, got {number}")
    return number


def _bound(number: int) -> str:
    return "2**64 - 1" if number == 2**64 - 1 else str(number)


def warn(message: str, category: type[LoaderkitWarning] = LoaderkitWarning) -> None:
    """Emit a ``LoaderkitWarning`` attributed to the first caller outside loaderkit.

    Examples:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn("careful")
        >>> caught[0].category is LoaderkitWarning
        True
    """
    level = 1
    frame: FrameType | None = sys._getframe(0)
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] == "loaderkit":
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)


class Moved(NamedTuple):
    """A released public name that moved: where it is now and the release it was in.

    The one deprecation mechanism: ``MovedAttribute`` (a name on a class) and
    ``moved_module_getattr`` (a name of a module) both read a ``Moved``, answer with what the
    new name holds and warn once per use with ``LoaderkitDeprecationWarning``, naming the new
    name, through the release after ``since``; the old name goes in the one after that.

    Attributes:
        path: The new name, dotted from the owner (``"handles.file_pool_info"`` from a
            dataset, ``"FilePoolInfo"`` from a module).
        since: The release whose users know the old name.

    Examples:
        >>> Moved("handles.file_pool_info", "0.1.0").path
        'handles.file_pool_info'
    """

    path: str
    since: str


def _release_after(version: str) -> str:
    """The minor release after ``version``: ``"0.1.0"`` -> ``"0.2.0"``."""
    major, minor, *_ = version.split(".")
    return f"{major}.{int(minor) + 1}.0"


def _answer_moved(owner: str, old: str, moved: Moved, start: Any) -> Any:
    """Warn that ``owner.old`` moved, then return ``moved.path`` looked up from ``start``."""
    warn(
        f"{owner}.{old} (loaderkit {moved.since}) is now {owner}.{moved.path}, which answers "
        f"the same; the old name answers through loaderkit {_release_after(moved.since)} and "
        f"goes in {_release_after(_release_after(moved.since))}.",
        LoaderkitDeprecationWarning,
    )
    value = start
    for name in moved.path.split("."):
        value = getattr(value, name)
    return value


class MovedAttribute:
    """A released attribute or method of a class that moved: warns, then answers the same.

    A non-data descriptor: a subclass that assigns or defines the name keeps its own.

    Args:
        path: Where the name lives now, dotted from an instance (``"handles.file_pool_info"``).
        since: The release the old name was in.

    Examples:
        >>> import warnings
        >>> class Part:
        ...     size = 3
        >>> class Owner:
        ...     part = Part()
        ...     size = MovedAttribute("part.size", "0.1.0")
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     Owner().size
        3
        >>> str(caught[0].message).split(",")[0]
        'Owner.size (loaderkit 0.1.0) is now Owner.part.size'
    """

    def __init__(self, path: str, since: str) -> None:
        self.moved = Moved(path, since)
        self.old = path
        self.__doc__ = f"Deprecated (the name loaderkit {since} released): use ``{path}``."

    def __set_name__(self, owner: type, name: str) -> None:
        self.old = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        return _answer_moved(type(obj).__name__, self.old, self.moved, obj)


def moved_module_getattr(module: str, table: Mapping[str, Moved]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that answers the released names in ``table``, with a warning.

    Args:
        module: The module's name (``__name__``); each ``Moved.path`` is looked up in it.
        table: Old name -> where it is now.

    Returns:
        The function to bind as the module's ``__getattr__``; any other missing name raises
        ``AttributeError`` as Python does.

    Examples:
        >>> __getattr__ = moved_module_getattr("loaderkit.errors", {"Warn": Moved("warn", "0.1.0")})
        >>> __getattr__("Nothing")
        Traceback (most recent call last):
        ...
        AttributeError: module 'loaderkit.errors' has no attribute 'Nothing'
    """
    moved = dict(table)

    def __getattr__(name: str) -> Any:
        if name not in moved:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        return _answer_moved(module, name, moved[name], sys.modules[module])

    return __getattr__


def add_note(exc: BaseException, note: str) -> None:
    """Add ``note`` to ``exc`` as Python 3.11+ does; on 3.10, into its message as well.

    Python 3.11's ``BaseException.add_note`` keeps the note in ``exc.__notes__``, and tracebacks
    print it under the message. Python 3.10 has neither, so there the note is kept in
    ``__notes__`` all the same and appended to the message (``str(exc)``: the first string
    argument, or ``strerror`` of an ``OSError``), so the context reaches whoever reads the
    error, a worker's traceback included.

    Args:
        exc: The exception.
        note: One line of context.

    Examples:
        >>> error = ValueError("bad row")
        >>> add_note(error, "in session 3")
        >>> error.__notes__
        ['in session 3']
    """
    if sys.version_info >= (3, 11):
        exc.add_note(note)
        return
    notes = exc.__dict__.setdefault("__notes__", [])  # pragma: no cover - Python 3.10
    notes.append(note)  # pragma: no cover - Python 3.10
    _append_to_message(exc, note)  # pragma: no cover - Python 3.10


def _append_to_message(exc: BaseException, note: str) -> None:
    """Python 3.10: make ``str(exc)`` end with ``note`` (where its message is plain data)."""
    if isinstance(exc, OSError) and isinstance(exc.strerror, str):
        exc.strerror = f"{exc.strerror}\n{note}"
        return
    args = exc.args
    if not args:
        exc.args = (note,)
    elif isinstance(args[0], str) and len(args) == 1:
        exc.args = (f"{args[0]}\n{note}",)
