"""The sample index: dataset index -> (session position, row), packed into one int64 array.

``build_index`` returns a ``SampleIndex`` (or pairs, or an ``(n, 2)`` array); ``pack_index``
validates it and packs every entry as ``position << ROW_BITS | row``, so locating a sample is
one array lookup and two bit operations. ``encode_index``/``decode_index`` run-length encode
the packed array for pickling, so a million samples ship in a few kilobytes to spawn workers.
"""

from __future__ import annotations

import operator
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from loaderkit.errors import ConfigError

__all__ = [
    "ROW_BITS",
    "ROW_MASK",
    "SampleIndex",
    "check_index",
    "decode_index",
    "default_index",
    "encode_index",
    "lookup",
    "pack_index",
    "unpack_index",
]

#: The index is one int64 array: session position in the high bits, row in the low bits
#: (``key >> ROW_BITS`` is the position, ``key & ROW_MASK`` the row).
ROW_BITS = 36
_ROW_LIMIT = 1 << ROW_BITS
ROW_MASK = _ROW_LIMIT - 1


class SampleIndex(NamedTuple):
    """What ``HDF5SessionDataset.build_index`` may return: two equal-length 1-D arrays.

    Attributes:
        sessions: Session id of every sample (ids as in ``dataset.files``).
        rows: Row of every sample inside its session's file.

    Example:
        >>> import numpy as np
        >>> SampleIndex(np.array([0, 0, 1]), np.array([0, 1, 0])).rows.tolist()
        [0, 1, 0]
    """

    sessions: Any
    rows: Any


def default_index(ids: Sequence[Hashable], counts: np.ndarray) -> SampleIndex:
    """Every row of every session, sessions in order, rows in file order.

    Args:
        ids: Session ids.
        counts: Rows per session (int64, same length as ``ids``).

    Returns:
        The index.

    Example:
        >>> idx = default_index(["a", "b"], np.array([2, 1]))
        >>> idx.sessions.tolist(), idx.rows.tolist()
        (['a', 'a', 'b'], [0, 1, 0])
    """
    id_array = np.asarray(ids)
    if id_array.ndim != 1 or id_array.dtype.kind not in "iuU":
        id_array = np.empty(len(ids), dtype=object)
        id_array[:] = ids
    session_ids = np.repeat(id_array, counts)
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    rows = np.arange(int(counts.sum()), dtype=np.int64) - starts
    return SampleIndex(session_ids, rows)


def _as_arrays(index: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(sessions, rows)`` arrays of what ``build_index`` returned, validated."""
    if isinstance(index, SampleIndex):
        sessions = np.asarray(index.sessions)
        rows = np.asarray(index.rows)
    elif isinstance(index, np.ndarray):
        if index.size == 0:
            sessions = rows = np.zeros(0, np.int64)
        elif index.ndim == 2 and index.shape[1] == 2:
            sessions, rows = index[:, 0], index[:, 1]
        else:
            raise ConfigError(
                "build_index() must return a SampleIndex(sessions, rows), an (n, 2) array "
                f"or a sequence of (session, row) pairs; got an array of shape {index.shape}."
            )
    else:
        pairs = list(index)
        try:
            sess_list = [pair[0] for pair in pairs]
            rows = np.array([operator.index(pair[1]) for pair in pairs], dtype=np.int64)
            if any(len(pair) != 2 for pair in pairs):
                raise ValueError
        except (TypeError, ValueError, IndexError):
            raise ConfigError(
                "build_index() must return a SampleIndex(sessions, rows), an (n, 2) array "
                "or a sequence of (session, row) pairs with integer rows."
            ) from None
        sessions = np.empty(len(sess_list), dtype=object)
        sessions[:] = sess_list
    if sessions.ndim != 1 or rows.ndim != 1 or sessions.shape != rows.shape:
        raise ConfigError(
            "build_index(): sessions and rows must be 1-D arrays of equal length, got "
            f"shapes {sessions.shape} and {rows.shape}."
        )
    if rows.size and not np.issubdtype(rows.dtype, np.integer):
        raise ConfigError(f"build_index(): rows must be integers, got dtype {rows.dtype}.")
    if rows.size and rows.min() < 0:
        raise ConfigError("build_index(): rows must be >= 0.")
    if rows.size and rows.max() >= _ROW_LIMIT:
        raise ConfigError(f"build_index(): rows must be < 2**{ROW_BITS}.")
    return sessions, rows


def _positions_of(
    sessions: np.ndarray, position: Mapping[Hashable, int], ids: Sequence[Hashable]
) -> np.ndarray:
    """Position in ``files`` of every session id (``ConfigError`` for an unknown id)."""
    if sessions.size == 0:
        return np.zeros(0, np.int32)
    try:
        uniq, inverse = np.unique(sessions, return_inverse=True)
    except TypeError:  # ids that do not sort: map one by one
        uniq = None
    try:
        if uniq is None:
            return np.fromiter((position[s] for s in sessions), np.int32, count=sessions.size)
        lookup = np.array(
            [position[u.item() if isinstance(u, np.generic) else u] for u in uniq],
            dtype=np.int32,
        )
    except KeyError as exc:
        raise ConfigError(
            f"build_index() returned session {exc.args[0]!r}, which is not in files "
            f"(sessions: {list(ids)[:20]})."
        ) from None
    return lookup[inverse.reshape(-1)]


def pack_index(
    index: Any,
    ids: Sequence[Hashable],
    *,
    row_counts: Sequence[int] | None = None,
    paths: Sequence[str] = (),
    key: str | None = None,
) -> np.ndarray:
    """Validate what ``build_index`` returned and pack it into one int64 key per sample.

    Args:
        index: A ``SampleIndex``, an ``(n, 2)`` array or a sequence of ``(session, row)``.
        ids: Session ids in the order of ``files`` (position ``p`` is ``ids[p]``).
        row_counts: Rows of every session, to reject rows past the end (``None``: unchecked).
        paths: File paths in the order of ``ids`` (for messages).
        key: Name of the dataset (for messages).

    Returns:
        ``position << ROW_BITS | row`` for every sample (int64, writable).

    Raises:
        ConfigError: Malformed index, unknown session or a row out of range.

    Example:
        >>> keys = pack_index([("b", 2), ("a", 0)], ["a", "b"])
        >>> [tuple(int(v) for v in pair) for pair in zip(*unpack_index(keys))]
        [(1, 2), (0, 0)]
    """
    sessions, rows = _as_arrays(index)
    position = {sid: p for p, sid in enumerate(ids)}
    pos = _positions_of(sessions, position, ids).astype(np.int64)
    rows = rows.astype(np.int64)
    if row_counts is not None and rows.size:
        limits = np.asarray(row_counts, np.int64)
        bad = np.flatnonzero(rows >= limits[pos])
        if bad.size:
            k = int(bad[0])
            p = int(pos[k])
            raise ConfigError(
                f"build_index() entry {k} asks for row {int(rows[k])} of session "
                f"{ids[p]!r}, but {key!r} in {paths[p]} has {int(limits[p])} rows."
            )
    return (pos << ROW_BITS) | rows


def lookup(keys: np.ndarray, indices: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """``(indices, keys[indices])`` as arrays, for a batch of dataset indices.

    Args:
        keys: Packed keys of the whole dataset.
        indices: Dataset indices (negative ones count from the end).

    Returns:
        The indices as a 1-D integer array and their packed keys.

    Raises:
        IndexError: An index is out of range.
        TypeError: An index is not an integer.

    Example:
        >>> idx, sel = lookup(np.array([10, 11, 12]), [2, 0])
        >>> sel.tolist()
        [12, 10]
    """
    idx = np.asarray(indices)
    if idx.dtype.kind not in "iu":
        if idx.size == 0:
            idx = np.zeros(0, np.int64)
        else:
            try:
                idx = np.fromiter((operator.index(i) for i in indices), np.int64)
            except TypeError:
                raise TypeError(
                    f"dataset indices must be integers, got {idx.dtype} values"
                ) from None
    if idx.ndim != 1:
        idx = idx.reshape(-1)
    try:
        return idx, keys[idx]  # numpy checks the bounds (and wraps negatives)
    except IndexError:
        n = keys.shape[0]
        bad = int(idx[(idx >= n) | (idx < -n)][0])
        raise IndexError(f"index {bad} is out of range for a dataset of {n} samples") from None


def unpack_index(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Split packed keys into read-only ``(session_positions, rows)`` arrays.

    Args:
        keys: Packed keys from ``pack_index``.

    Returns:
        ``(positions as int32, rows as int64)``, both read-only.

    Example:
        >>> pos, rows = unpack_index(pack_index([(0, 5)], [0]))
        >>> int(pos[0]), int(rows[0])
        (0, 5)
    """
    pos = (keys >> ROW_BITS).astype(np.int32)
    rows = keys & ROW_MASK
    pos.setflags(write=False)
    rows.setflags(write=False)
    return pos, rows


def encode_index(keys: np.ndarray) -> tuple[Any, ...]:
    """Run-length encode the packed index for pickling when that is smaller.

    Args:
        keys: Packed keys.

    Returns:
        ``("raw", keys)`` or ``("rle", n, run_keys, run_starts)``.

    Example:
        >>> encode_index(np.arange(100, dtype=np.int64))[:2]
        ('rle', 100)
    """
    n = keys.shape[0]
    if n == 0:
        return ("raw", keys)
    starts = np.concatenate(([0], np.flatnonzero(np.diff(keys) != 1) + 1))
    if starts.size * 2 >= n:
        return ("raw", keys)
    return ("rle", n, keys[starts], starts)


def decode_index(packed: tuple[Any, ...]) -> np.ndarray:
    """Inverse of ``encode_index``: a fresh, read-only int64 array.

    Args:
        packed: What ``encode_index`` returned.

    Returns:
        The packed keys.

    Example:
        >>> decode_index(encode_index(np.array([3, 4, 5, 9], np.int64))).tolist()
        [3, 4, 5, 9]
    """
    if packed[0] == "raw":
        keys = np.array(packed[1], dtype=np.int64, copy=True)
    else:
        _, n, run_key, starts = packed
        lengths = np.diff(np.append(starts, n))
        keys = np.arange(n, dtype=np.int64) + np.repeat(run_key - starts, lengths)
    keys.setflags(write=False)
    return keys


def check_index(index: Any, n: int) -> int:
    """``index`` as a position in ``0..n-1`` (negative ones count from the end).

    Raises:
        TypeError: ``index`` is not an integer.
        IndexError: ``index`` is out of range.

    Example:
        >>> check_index(-1, 5)
        4
    """
    try:
        i = operator.index(index)
    except TypeError:
        raise TypeError(f"dataset indices must be integers, got {type(index).__name__}") from None
    if i < 0:
        i += n
    if i < 0 or i >= n:
        raise IndexError(f"index {index} is out of range for a dataset of {n} samples")
    return i
