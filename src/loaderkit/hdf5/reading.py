"""Read strategies of ``HDF5SessionDataset``: which one a class gets, and the batched readers.

A dataset reads in one of three ``ReadMode``s, fixed by what its class overrides
(``read_mode``): ``FAST`` (the default ``read``: coalesced slab reads straight into the batch
tensor, ``os.preadv`` or a memory map on contiguous data; ``transform`` may follow per sample),
``ROWS`` (``read_rows`` overridden: coalesced runs through that hook) or ``ITEM`` (``read`` or
``__getitem__`` overridden: one ``self[i]`` per item). ``plan_runs`` groups a batch's packed
keys into runs of consecutive rows; ``read_mapped``, ``read_each``, ``read_runs`` and
``read_runs_hook`` read them. The per-item fast path is ``HDF5SessionDataset._read_one``.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Sequence
from typing import Any, Protocol

import numpy as np

from loaderkit.errors import ConfigError
from loaderkit.hdf5.handles import HandleCache
from loaderkit.hdf5.index import _ROW_BITS, _ROW_MASK
from loaderkit.hdf5.layout import _add_note
from loaderkit.hdf5.rawio import pread, read_direct

__all__ = [
    "ReadMode",
    "overrides",
    "plan_runs",
    "read_each",
    "read_mapped",
    "read_mode",
    "read_runs",
    "read_runs_hook",
    "uses_default_read",
]

#: Slabs at least this large are read straight into the batch buffer (``H5Dread`` into the
#: destination); smaller ones go through h5py's Cython fast path and one copy, which has less
#: per-call overhead. Measured with ``benchmarks/hdf5_read.py`` (see docs/hdf5.md).
_DIRECT_READ_BYTES = 256 * 1024


class ReadMode(enum.Enum):
    """How ``__getitems__`` reads a batch.

    Attributes:
        FAST: Default ``read``: coalesced slab reads (``preadv`` where possible).
        ROWS: The subclass overrides ``read_rows``: coalesced runs through that hook.
        ITEM: The subclass overrides ``read`` or ``__getitem__`` only: one ``self[i]`` per item.

    Example:
        >>> ReadMode.FAST.name
        'FAST'
    """

    FAST = "fast"
    ROWS = "rows"
    ITEM = "item"


def overrides(cls: type, base: type, name: str) -> bool:
    """Whether ``cls`` replaces ``base``'s attribute ``name``.

    Example:
        >>> class A:
        ...     def f(self): ...
        >>> class B(A):
        ...     def f(self): ...
        >>> overrides(B, A, "f"), overrides(A, A, "f")
        (True, False)
    """
    return getattr(cls, name) is not getattr(base, name)


def uses_default_read(cls: type, base: type) -> bool:
    """Whether ``cls`` keeps ``base.read``, so loaderkit may read rows itself (fast paths).

    Example:
        >>> class A:
        ...     def read(self): ...
        >>> uses_default_read(A, A)
        True
    """
    return not overrides(cls, base, "read")


def read_mode(cls: type, base: type) -> ReadMode:
    """The ``ReadMode`` of a dataset class ``cls`` derived from ``base``.

    A subclass that overrides ``read`` or ``__getitem__`` (say, to add a transform) gets one
    ``self[i]`` per item, so batched loading returns exactly what indexing does, unless it
    opts into batching by overriding ``read_rows``.

    Args:
        cls: The dataset's class.
        base: ``HDF5SessionDataset``.

    Returns:
        The read mode.

    Example:
        >>> class Base:
        ...     def read(self): ...
        ...     def read_rows(self): ...
        ...     def __getitem__(self, i): ...
        >>> class Custom(Base):
        ...     def read(self): ...
        >>> read_mode(Base, Base), read_mode(Custom, Base)
        (<ReadMode.FAST: 'fast'>, <ReadMode.ITEM: 'item'>)
    """
    if overrides(cls, base, "read_rows"):
        return ReadMode.ROWS
    if overrides(cls, base, "read") or overrides(cls, base, "__getitem__"):
        return ReadMode.ITEM
    return ReadMode.FAST


class _Source(Protocol):
    """What the batched readers use of ``HDF5SessionDataset``."""

    _cache: HandleCache
    _ids: list[Hashable]
    _row_shape: tuple[int, ...]
    _row_dtype: np.dtype | None
    _row_bytes: int
    _direct_ok: bool

    def _context(self, pos: int, row: int, index: int) -> str: ...

    def _read_error(self, exc: Exception, pos: int, rows: str, index: int) -> Exception: ...

    def read_rows(self, session: Hashable, start: int, stop: int) -> Sequence[Any]: ...


def plan_runs(
    keys: np.ndarray, *, sort: bool, always: bool
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Choose how to read a batch given its packed (session, row) keys.

    Returns ``(order, starts)``: ``order`` is the permutation to read in (``None``: request
    order) and ``starts`` the offsets, in that order, where a new run of consecutive rows of one
    session begins (consecutive keys differ by exactly 1). ``starts`` is ``None`` when
    per-sample reads in request order are best (nothing to coalesce through HDF5). On chunked
    data a sorted order is always used, so rows sharing a chunk are read one after another and
    the chunk is decompressed once. With ``always`` (contiguous data read with ``preadv``) runs
    in request order are always used: one system call per run, however short.

    Args:
        keys: Packed keys of the batch, in request order.
        sort: Read in sorted order (chunked data).
        always: Read runs in request order (contiguous data).

    Returns:
        ``(order, starts)`` as described above.

    Example:
        >>> order, starts = plan_runs(np.array([5, 6, 7, 1, 2]), sort=False, always=False)
        >>> order is None, starts.tolist()
        (True, [0, 3])
    """
    n = keys.shape[0]
    brk = np.flatnonzero(np.diff(keys) != 1)
    if (brk.size + 1) * 2 <= n or always:
        return None, np.concatenate(([0], brk + 1))
    order = np.argsort(keys, kind="stable")
    brk2 = np.flatnonzero(np.diff(keys[order]) != 1)
    if (brk2.size + 1) * 2 <= n or sort:
        return order, np.concatenate(([0], brk2 + 1))
    return None, None


def read_each(ds: _Source, idx: np.ndarray, keys: np.ndarray, out: np.ndarray) -> None:
    """One read per sample into ``out[j]`` (nothing to coalesce); caller holds the lock.

    Args:
        ds: The dataset.
        idx: Dataset indices of the batch (for messages).
        keys: Their packed keys.
        out: The batch buffer, ``(len(keys), *row_shape)``, filled in request order.
    """
    cache = ds._cache
    last = -1
    dset: Any = None
    for j, key in enumerate(keys.tolist()):
        pos, row = key >> _ROW_BITS, key & _ROW_MASK
        if pos != last:
            try:
                dset = cache.get(pos).dataset
            except Exception as exc:
                _add_note(exc, ds._context(pos, row, int(idx[j])))
                raise
            last = pos
        try:
            out[j] = dset[row]
        except MemoryError:
            raise
        except Exception as exc:
            raise ds._read_error(exc, pos, f"row {row}", int(idx[j])) from exc


def read_runs(
    ds: _Source,
    idx: np.ndarray,
    keys: np.ndarray,
    order: np.ndarray | None,
    starts: np.ndarray,
    out: np.ndarray,
) -> None:
    """Coalesced slab reads into the batch buffer ``out``, in request order.

    Runs in request order (``order is None``) are read straight into their rows of ``out``
    (a copy out of the memory map or ``preadv`` on contiguous data, ``H5Dread`` into the
    destination for large slabs). Runs
    read in sorted order (chunked data: each chunk decompressed once) go through one sorted
    buffer and are scattered into ``out`` with one copy. The caller holds the handle lock.

    Args:
        ds: The dataset.
        idx: Dataset indices of the batch (for messages).
        keys: Their packed keys.
        order: Read order from ``plan_runs``.
        starts: Run starts from ``plan_runs``.
        out: The batch buffer, ``(len(keys), *row_shape)``.
    """
    n = idx.size
    row_bytes = ds._row_bytes
    buf = out if order is None else np.empty_like(out)
    run_keys = (keys[starts] if order is None else keys[order[starts]]).tolist()
    bounds = starts.tolist()
    bounds.append(n)
    cache = ds._cache
    direct = ds._direct_ok
    last = -1
    dset: Any = None
    raw: tuple[int, int] | None = None
    mapped: np.ndarray | None = None
    for r, key in enumerate(run_keys):
        pos, a = key >> _ROW_BITS, key & _ROW_MASK
        k, k2 = bounds[r], bounds[r + 1]
        length = k2 - k
        if pos != last:
            mapped = None  # let go of the last map: opening this file may close that one
            try:
                handle = cache.get(pos)
            except Exception as exc:
                j = k if order is None else int(order[k])
                _add_note(exc, ds._context(pos, a, int(idx[j])))
                raise
            dset, raw, mapped = handle.dataset, handle.raw, handle.rows
            last = pos
        try:
            target = buf[k:k2]
            if mapped is not None:
                if a + length > mapped.shape[0]:
                    raise IndexError(f"the file has {mapped.shape[0]} rows")
                target[:] = mapped[a : a + length]
            elif raw is not None:
                pread(raw, a * row_bytes, target, length * row_bytes)
            elif direct and length * row_bytes >= _DIRECT_READ_BYTES:
                read_direct(dset, a, length, target)
            elif length == 1:
                target[0] = dset[a]
            else:
                target[:] = dset[a : a + length]
        except MemoryError:
            raise
        except Exception as exc:
            j = k if order is None else int(order[k])
            what = f"rows {a}..{a + length - 1}"
            raise ds._read_error(exc, pos, what, int(idx[j])) from exc
    if order is not None:
        out[order] = buf


def read_mapped(ds: _Source, idx: np.ndarray, keys: np.ndarray, out: np.ndarray) -> bool:
    """Gather a batch from memory-mapped sessions with one ``np.take`` per session segment.

    A segment is a stretch of the batch (in request order) whose rows all come from one
    session: block-shuffled batches have a few, so the batch is copied at memory speed with a
    handful of C calls and no per-run bookkeeping. Returns ``False`` (nothing read) when the
    batch has many segments (uniform shuffling: ``read_runs`` copies row by row) or a session
    is not mapped. The caller holds the handle lock.

    Args:
        ds: The dataset.
        idx: Dataset indices of the batch (for messages).
        keys: Their packed keys.
        out: The batch buffer, ``(len(keys), *row_shape)``, filled in request order.

    Returns:
        Whether the batch was read.
    """
    n = keys.shape[0]
    pos = keys >> _ROW_BITS
    cuts = np.flatnonzero(pos[1:] != pos[:-1]) + 1
    if (cuts.size + 1) * 4 > n:
        return False
    rows = keys & _ROW_MASK
    starts = np.concatenate(([0], cuts))
    highest = np.maximum.reduceat(rows, starts).tolist()
    bounds = starts.tolist()
    bounds.append(n)
    sessions = pos[starts].tolist()
    get = ds._cache.get
    mapped: np.ndarray | None = None
    for s, p in enumerate(sessions):
        k, k2 = bounds[s], bounds[s + 1]
        mapped = None  # let go of the last map: opening this file may close that one
        try:
            mapped = get(p).rows
        except Exception as exc:
            _add_note(exc, ds._context(p, int(rows[k]), int(idx[k])))
            raise
        if mapped is None:
            return False  # not mapped (any more): read_runs reads the whole batch again
        if highest[s] >= mapped.shape[0]:
            problem = IndexError(f"row {highest[s]} is past the {mapped.shape[0]} rows of the file")
            raise ds._read_error(problem, p, f"row {highest[s]}", int(idx[k]))
        # mode="clip" after the check above: numpy buffers ``out`` for mode="raise"
        np.take(mapped, rows[k:k2], axis=0, out=out[k:k2], mode="clip")
    return True


def read_runs_hook(
    ds: _Source,
    idx: np.ndarray,
    keys: np.ndarray,
    order: np.ndarray | None,
    starts: np.ndarray | None,
) -> list[Any]:
    """Coalesced reads through the subclass's ``read_rows``; caller holds the handle lock.

    Args:
        ds: The dataset.
        idx: Dataset indices of the batch (for messages).
        keys: Their packed keys.
        order: Read order from ``plan_runs``.
        starts: Run starts from ``plan_runs`` (``None``: one run per sample).

    Returns:
        One sample per key, in request order.

    Raises:
        ConfigError: ``read_rows`` returned the wrong number of samples.
    """
    n = idx.size
    if starts is None:
        starts = np.arange(n)
    run_keys = (keys[starts] if order is None else keys[order[starts]]).tolist()
    bounds = starts.tolist()
    bounds.append(n)
    result: list[Any] = [None] * n
    targets = list(range(n)) if order is None else order.tolist()
    ids = ds._ids
    for r, key in enumerate(run_keys):
        pos, a = key >> _ROW_BITS, key & _ROW_MASK
        k, k2 = bounds[r], bounds[r + 1]
        try:
            samples = ds.read_rows(ids[pos], a, a + (k2 - k))
            if len(samples) != k2 - k:
                raise ConfigError(
                    f"{type(ds).__name__}.read_rows({ids[pos]!r}, {a}, "
                    f"{a + k2 - k}) returned {len(samples)} samples, expected {k2 - k}."
                )
        except Exception as exc:
            ds._cache.discard(pos)
            _add_note(exc, ds._context(pos, a, int(idx[targets[k]])))
            raise
        for t, sample in zip(targets[k:k2], samples, strict=True):
            result[t] = sample
    return result
