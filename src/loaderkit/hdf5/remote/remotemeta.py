"""What remote session files hold, read with range requests and kept in the cache directory.

Runs in the process that constructs the dataset (the main process), once per object version:

- ``inspect_remote`` opens each object with h5py through an fsspec file (small blocks, block
  cache: only the superblock, object headers, B-trees and attributes are fetched, never the
  rows), runs the same inspection as for a local file (``inventory.inspect_session``) and the row
  types (``types.row_type``), several objects at once in a small thread pool;
- a key naming a CSR group (AnnData ``.h5ad``) is inspected as ``anndata.sessions.csr_sessions``
  inspects a local file (its ``indptr`` checked, its ``var`` index read): a ``RemoteRecord``
  whose ``group`` is that group;
- the result is kept in ``<cache dir>/meta/<key>.json``, ``<key>`` a hash of the URL, the
  object's identity (ETag, or size and mtime) and what was asked (keys, axis, fields), written
  under a temporary name and renamed, under a per-record file lock: ranks constructing at once
  on one node read each object's metadata once. A later construction over unchanged objects
  reads these files and sends no request per object (only ``stat_objects``' listing).

The records are data (``loaderkit.storage.datarecords``: versioned JSON that decodes to the
record classes below and nothing else): a file someone else wrote there, damaged, of another
version or of another format (an older loaderkit's ``.pkl``) is never executed; it is ignored
and the record rebuilt. What depends on the local copy (raw offsets, chunk maps, memory maps)
is found when the cached file is opened by a reading process, never here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import logging
import os
import secrets
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import torch

from loaderkit.errors import ConfigError, HDF5FileError, LoaderkitError, MissingKeyError
from loaderkit.hdf5.anndata import CSRGroup, csr_sessions
from loaderkit.hdf5.convert.rowcache import cached_record
from loaderkit.hdf5.meta.diagnose import Identity
from loaderkit.hdf5.meta.filters import Filter, check_available, needed_filters
from loaderkit.hdf5.meta.inventory import inspect_session
from loaderkit.hdf5.meta.keyspecs import KeySpec, SessionRecord
from loaderkit.hdf5.meta.layout import SessionLayout, dataset_names
from loaderkit.hdf5.meta.types import Kind, RowType, row_type, where
from loaderkit.storage import ObjectInfo
from loaderkit.storage.datarecords import RecordCodec, RecordError
from loaderkit.storage.filesystems import filesystem_for, strip
from loaderkit.storage.locks import mutex

__all__ = [
    "META_BLOCK",
    "MetaStore",
    "RemoteRecord",
    "inspect_remote",
    "open_remote",
    "tree_names",
]

logger = logging.getLogger(__name__)

#: Bytes per range request while reading an object's metadata (fsspec's block cache).
META_BLOCK = 256 * 1024
#: Objects inspected at once.
META_THREADS = 4
_FORMAT = 3  # 2: the filters each key needs; 3: JSON records


@dataclass(frozen=True)
class RemoteRecord:
    """What one remote session file holds of the keys (``inventory.inspect_session``'s result).

    A key naming a CSR group (``.h5ad``) is held as the group's ``data`` and ``indices``, two
    keys (``resolved``), with the group itself (``group``) and its var names (``var``); for
    other keys ``group`` is ``None``.

    Attributes:
        record: The ``SessionRecord`` (its identity is ``None``: the store's keys the copy).
        resolved: The keys as resolved for this file.
        uneven: Per key, whether a group's datasets differ in shape.
        types: Per key, the ``RowType`` of its rows, or the error finding it raised.
        filters: Per key, its dataset's name and the filters its rows need: checked again in
            every construction that uses the record (a plugin may be missing there).
        group: The ``CSRGroup`` (path, rows, columns) the key names; ``None``: not a CSR group.
        var: A CSR group's var names (``None``: the file has no var index, or no CSR group).

    Example:
        >>> RemoteRecord.__dataclass_fields__["group"].default is None
        True
    """

    record: SessionRecord
    resolved: tuple[KeySpec, ...]
    uneven: tuple[bool, ...]
    types: tuple[RowType | Exception, ...]
    filters: tuple[tuple[str, tuple[Filter, ...]], ...] = ()
    group: CSRGroup | None = None
    var: tuple[str, ...] | None = None

    def check_filters(self, session: Hashable, url: str) -> None:
        """``HDF5FileError`` when a filter some key needs is not available in this process."""
        for key, needed in self.filters:
            check_available(needed, key=key, session=session, path=url)


def _torch_dtype(name: str) -> torch.dtype:
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise RecordError(f"not a torch dtype: {name!r}")
    return value


#: What a metadata record may hold: these classes and plain data, nothing else.
CODEC = RecordCodec(
    "loaderkit-remote-meta",
    _FORMAT,
    classes=(
        RemoteRecord,
        CSRGroup,
        SessionRecord,
        SessionLayout,
        Identity,
        KeySpec,
        RowType,
        Kind,
        Filter,
        ConfigError,
        HDF5FileError,
        MissingKeyError,
    ),
    atoms={"torch.dtype": (torch.dtype, lambda d: str(d).removeprefix("torch."), _torch_dtype)},
)


class MetaStore:
    """Inspection results in ``<cache dir>/meta/<key>.json`` (data only), written atomically.

    Examples:
        >>> import tempfile
        >>> store = MetaStore(Path(tempfile.mkdtemp()))
        >>> info = ObjectInfo("s3://b/s1.h5", 10, "abc")
        >>> store.put(store.key(info, "names"), ["x"])
        >>> store.get(store.key(info, "names"))
        ['x']
    """

    def __init__(self, cache_dir: Path) -> None:
        self.dir = Path(cache_dir) / "meta"

    @staticmethod
    def key(info: ObjectInfo, what: str) -> str:
        """The file stem for ``what`` of this object version."""
        text = f"{_FORMAT}\n{h5py.version.version}\n{info.url}\n{info.identity}\n{what}"
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def get(self, key: str) -> Any:
        """The stored value, or ``None`` when there is none (or it is not a record of ours)."""
        try:
            text = (self.dir / f"{key}.json").read_bytes()
        except OSError:
            return None
        try:
            return CODEC.loads(key, text)
        except (RecordError, RecursionError):  # damaged, foreign or older: inspect again
            logger.debug("metadata record %s is not readable; rebuilt", key, exc_info=True)
            return None

    def get_or_make(self, key: str, make: Callable[[], Any], valid: Callable[[Any], bool]) -> Any:
        """The stored value if ``valid``, else ``make()``'s, stored: once per node.

        The first process to ask holds the record's lock (``<key>.lock``, an inter-process
        file lock the operating system releases if the process dies) while it reads the
        object; the node's other processes (ranks building the same dataset at once) wait
        for it and then read the record it kept, so each object's metadata is read once per
        node, not once per rank. A directory that takes no lock (read-only) falls back to
        reading unlocked.
        """
        value = self.get(key)
        if valid(value):
            return value
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            lock = mutex(self.dir / f"{key}.lock")
            lock.acquire()
        except OSError:
            logger.debug("no lock for metadata record %s; reading unlocked", key, exc_info=True)
            value = make()
            self.put(key, value)
            return value
        try:
            value = self.get(key)  # kept by another process meanwhile
            if not valid(value):
                value = make()
                self.put(key, value)
            return value
        finally:
            lock.release()

    def put(self, key: str, value: Any) -> None:
        """Store ``value`` (nothing when it holds what a record cannot keep)."""
        try:
            text = CODEC.dumps(key, value)
        except (RecordError, RecursionError):
            logger.debug("metadata record %s cannot be kept as data", key, exc_info=True)
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        temporary = self.dir / f"{key}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            temporary.write_text(text)
            os.replace(temporary, self.dir / f"{key}.json")
        except OSError:  # a full or read-only disk: the next construction inspects again
            logger.debug("could not keep metadata record %s", key, exc_info=True)
            temporary.unlink(missing_ok=True)


@contextlib.contextmanager
def open_remote(
    info: ObjectInfo, session: Hashable, storage_options: Mapping[str, Any] | None
) -> Iterator[h5py.File]:
    """``info.url`` opened by h5py through fsspec: range reads of ``META_BLOCK`` bytes.

    Raises:
        HDF5FileError: The object is not readable HDF5 (the message names session and URL).
        StorageAccessError: The store refused the credentials.
    """
    fs = filesystem_for(info.url, storage_options)
    path = strip(fs, info.url)
    try:
        raw = fs.open(path, "rb", block_size=META_BLOCK, cache_type="blockcache", size=info.size)
    except TypeError:  # a filesystem whose files take no ``size``
        raw = fs.open(path, "rb", block_size=META_BLOCK, cache_type="blockcache")
    try:
        try:
            f = h5py.File(raw, "r")
        except (OSError, ValueError) as exc:
            if isinstance(exc, PermissionError | FileNotFoundError | LoaderkitError):
                raise
            raise HDF5FileError(
                f"session {session!r}: cannot open {info.url} as HDF5 ({exc}). Check that the "
                "object is an HDF5 file and that it was uploaded whole"
            ) from exc
        try:
            yield f
        finally:
            f.close()
    finally:
        raw.close()


def tree_names(
    info: ObjectInfo,
    session: Hashable,
    storage_options: Mapping[str, Any] | None,
    store: MetaStore,
) -> list[str]:
    """Every dataset's path in the object (for ``key=None``), kept in ``store``."""

    def read() -> list[str]:
        with _gc_paused(), open_remote(info, session, storage_options) as f:
            return dataset_names(f, limit=10**9)

    names = store.get_or_make(store.key(info, "names"), read, lambda v: isinstance(v, list))
    return list(names)


def inspect_remote(
    infos: Mapping[int, ObjectInfo],
    ids: Sequence[Hashable],
    specs: Sequence[KeySpec],
    fields: Sequence[str] | None,
    storage_options: Mapping[str, Any] | None,
    store: MetaStore,
    layout: str = "stored",
) -> dict[int, RemoteRecord]:
    """Each object's record: from ``store``, else read through fsspec and kept.

    Where the key names a CSR group (``anndata.csrmatrix``), the record's ``group`` is that group.

    Args:
        infos: Position -> the object as listed.
        ids: Session ids, by position (for messages).
        specs: The keys (as ``inventory.parse_keys`` gives them).
        fields: Compound fields to read.
        storage_options: For the fsspec filesystem.
        store: Where records are kept.
        layout: The cache's layout (``"rows"``: the first key as its row-wise copy stores it).

    Returns:
        Position -> record, for every position of ``infos``.

    Raises:
        MissingKeyError, ConfigError, HDF5FileError: As for local files, naming the URL (a
            damaged CSR group: the row and what is wrong).
    """
    what = repr((tuple(specs), None if fields is None else tuple(fields), layout))
    found: dict[int, RemoteRecord] = {}
    todo: list[int] = []
    for pos, info in infos.items():
        record = store.get(store.key(info, what))
        if isinstance(record, RemoteRecord):
            record.check_filters(ids[pos], info.url)  # no file read: the kept filter ids
            found[pos] = record
        else:
            todo.append(pos)
    if not todo:
        return found

    def one(pos: int) -> RemoteRecord:
        info = infos[pos]

        def read() -> RemoteRecord:
            with open_remote(info, ids[pos], storage_options) as f:
                csr = _inspect_csr(f, specs, ids[pos], info.url, layout)
                if csr is not None:
                    return csr
                return _inspect(f, specs, fields, ids[pos], info.url, layout)

        record = store.get_or_make(
            store.key(info, what), read, lambda v: isinstance(v, RemoteRecord)
        )
        record.check_filters(ids[pos], info.url)  # kept by another process: checked here
        return record

    with _gc_paused(), ThreadPoolExecutor(min(META_THREADS, len(todo))) as pool:
        for pos, record in zip(todo, pool.map(one, todo), strict=True):
            found[pos] = record
    logger.debug("inspected %d remote session(s), %d from the cache", len(todo), len(found))
    return found


def _inspect(
    f: h5py.File,
    specs: Sequence[KeySpec],
    fields: Sequence[str] | None,
    session: Hashable,
    url: str,
    layout: str,
) -> RemoteRecord:
    record, resolved, uneven = inspect_session(f, specs, session, url, identity=False)
    record = cached_record(record, f, resolved, layout)
    types: list[RowType | Exception] = []
    filters: list[tuple[str, tuple[Filter, ...]]] = []
    for k, spec in enumerate(resolved):
        obj = f[spec.path]
        names = record.members[k]
        key = spec.path
        if spec.members and names:
            obj, key = obj[names[0]], f"{spec.path}/{names[0]}"
        if isinstance(obj, h5py.Dataset):
            filters.append((key, needed_filters(obj)))
        try:
            types.append(
                row_type(
                    obj,
                    fields=fields if len(resolved) == 1 else None,
                    row_shape=record.layouts[k].row_shape,
                    where=where(spec.path, session, url),
                    path=url,
                )
            )
        except (ConfigError, HDF5FileError) as exc:
            types.append(exc)
    return RemoteRecord(record, tuple(resolved), tuple(uneven), tuple(types), tuple(filters))


def _inspect_csr(
    f: h5py.File, specs: Sequence[KeySpec], session: Hashable, url: str, layout: str
) -> RemoteRecord | None:
    """The record of ``f`` when the key names a CSR group (its ``group`` set), else ``None``."""
    found = csr_sessions(
        lambda _: contextlib.nullcontext(f), [session], [url], specs, identity=False
    )
    if found is None:
        return None
    parts, (group,), var = found.specs, found.groups, found.var
    remote = _inspect(f, parts, None, session, url, layout)
    return dataclasses.replace(remote, group=group, var=None if var is None else tuple(var))


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No garbage collection while h5py reads through Python file objects.

    A collection on fsspec's IO thread that finalises an h5py object needs h5py's global lock,
    which the thread waiting for that IO holds (h5py issue 2019, dask 7547).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
