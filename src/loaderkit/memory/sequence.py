"""``SharedSequence``: a read-only sequence of Python objects kept in one contiguous buffer.

A dataset that keeps its metadata in a Python list (file names, labels, trial tables) grows in
every forked worker: reading an item writes its reference count, so each page of objects a
worker reads becomes that worker's private copy (copy-on-read, PyTorch issue 13246).
``SharedSequence`` stores each item pickled, end to end, in one numpy byte buffer with an array
of offsets. Reading item ``i`` unpickles a fresh object from the buffer and writes nothing the
parent owns but the reference counts of a handful of objects (the sequence and its two views),
so forked workers keep sharing the buffer however much they read. Under spawn and forkserver it
pickles as the two arrays, not as millions of objects.
"""

from __future__ import annotations

import operator
import pickle
from array import array
from collections.abc import Iterable, Iterator, Sequence
from io import BytesIO
from typing import Any, TypeVar, overload

import numpy as np

from loaderkit.errors import ArgumentTypeError

__all__ = ["SharedSequence"]

T_co = TypeVar("T_co", covariant=True)

_PROTOCOL = pickle.HIGHEST_PROTOCOL
#: ``PROTO`` opcode and ``FRAME`` opcode: pickle headers each item would repeat. They are
#: optional for the unpickler (opcodes need no declared protocol, frames are a buffering hint),
#: so they are left out of the buffer.
_PROTO, _FRAME = 0x80, 0x95
_FRAME_HEADER = 9  # FRAME + an 8-byte length
_UINT32_MAX = 2**32 - 1


def _encode(item: Any, index: int) -> memoryview:
    """``item`` pickled, without the protocol and first frame headers."""
    try:
        data = pickle.dumps(item, _PROTOCOL)
    except Exception as exc:
        raise ArgumentTypeError(
            f"SharedSequence: item {index} ({type(item).__module__}.{type(item).__qualname__}) "
            f"cannot be pickled: {type(exc).__name__}: {exc}. Every item is stored pickled; "
            "keep plain data in it (str, bytes, numbers, tuples, dicts, numpy arrays) and "
            "objects that pickle (module-level classes, no open files or locks)."
        ) from exc
    start = 2 if data[0] == _PROTO else 0
    if len(data) > start and data[start] == _FRAME:
        start += _FRAME_HEADER
    return memoryview(data)[start:]


def _offsets_dtype(total: int) -> type[np.unsignedinteger[Any]] | type[np.signedinteger[Any]]:
    return np.uint32 if total <= _UINT32_MAX else np.int64


class SharedSequence(Sequence[T_co]):
    """A read-only sequence whose items live pickled in one buffer, shared by forked workers.

    Use it for a dataset's large lists of Python objects (paths, labels, tuples, dicts): forked
    workers then share the buffer instead of each copying the objects as it reads them, and
    spawn/forkserver workers receive one buffer instead of millions of objects to unpickle.

    Each item is pickled once, when the sequence is built; ``seq[i]`` unpickles a new object
    every time (about a microsecond for a small tuple), so mutating what it returns changes
    nothing stored. Items must be picklable. The buffer takes about the pickled size of the
    items (for ``(str, int, float)`` tuples a fifth of the memory of the objects).

    Args:
        items: Any iterable of picklable objects (read once).

    Raises:
        ArgumentTypeError: An item cannot be pickled (also a ``TypeError``); the message
            names its position and type.

    Indexing follows ``list``: an ``int`` (negative counts from the end) returns the item, an
    index out of range raises ``IndexError`` naming the index and the length, and a slice
    returns a ``SharedSequence`` (a step of 1 shares the buffer; other steps copy the
    selected items' bytes). Iteration decodes the items in order.

    Examples:
        >>> seq = SharedSequence([("a.png", 0, 0.5), ("b.png", 1, 1.5), ("c.png", 2, 2.5)])
        >>> len(seq), seq[1], seq[-1][0]
        (3, ('b.png', 1, 1.5), 'c.png')
        >>> list(seq[:2])
        [('a.png', 0, 0.5), ('b.png', 1, 1.5)]
        >>> seq[3]
        Traceback (most recent call last):
        ...
        IndexError: SharedSequence index 3 is out of range for length 3
    """

    __slots__ = ("_buffer", "_data", "_offsets", "_starts")

    _data: np.ndarray
    _offsets: np.ndarray
    _buffer: memoryview
    _starts: memoryview

    def __init__(self, items: Iterable[T_co]) -> None:
        out = BytesIO()
        ends = array("q")
        position = 0
        for index, item in enumerate(items):
            position += out.write(_encode(item, index))
            ends.append(position)
        offsets = np.zeros(len(ends) + 1, dtype=_offsets_dtype(position))
        offsets[1:] = ends
        self._set(np.frombuffer(out.getvalue(), dtype=np.uint8), offsets)

    def _set(self, data: np.ndarray, offsets: np.ndarray) -> None:
        """Install the buffer and offsets: item ``i`` is ``data[offsets[i]:offsets[i + 1]]``."""
        data.flags.writeable = False
        offsets.flags.writeable = False
        self._data = data
        self._offsets = offsets
        self._buffer = data.data
        self._starts = offsets.data

    # ------------------------------------------------------------------ sequence protocol

    def __len__(self) -> int:
        return len(self._starts) - 1

    @overload
    def __getitem__(self, index: int) -> T_co: ...

    @overload
    def __getitem__(self, index: slice) -> SharedSequence[T_co]: ...

    def __getitem__(self, index: int | slice) -> T_co | SharedSequence[T_co]:
        starts = self._starts
        if type(index) is not int:
            if isinstance(index, slice):
                return self._slice(index)
            try:
                index = operator.index(index)
            except TypeError:
                raise TypeError(
                    f"SharedSequence indices must be integers or slices, not {type(index).__name__}"
                ) from None
        i = index
        length = len(starts) - 1
        if i < 0:
            i += length
        if not 0 <= i < length:
            raise IndexError(f"SharedSequence index {index} is out of range for length {length}")
        result: T_co = pickle.loads(self._buffer[starts[i] : starts[i + 1]])
        return result

    def __iter__(self) -> Iterator[T_co]:
        loads, buffer, starts = pickle.loads, self._buffer, self._starts
        start = starts[0]
        for i in range(1, len(starts)):
            end = starts[i]
            yield loads(buffer[start:end])
            start = end

    def _slice(self, index: slice) -> SharedSequence[T_co]:
        start, stop, step = index.indices(len(self))
        if step == 1:  # a view: the same buffer, a window of the offsets
            stop = max(start, stop)
            return _rebuild(self._data, self._offsets[start : stop + 1])
        chosen = range(start, stop, step)
        starts = self._offsets[:-1][index].astype(np.int64)
        lengths = self._offsets[1:][index].astype(np.int64) - starts
        offsets = np.zeros(len(chosen) + 1, dtype=_offsets_dtype(int(lengths.sum())))
        np.cumsum(lengths, out=offsets[1:])
        buffer = self._buffer
        data = b"".join(
            buffer[s : s + n] for s, n in zip(starts.tolist(), lengths.tolist(), strict=True)
        )
        return _rebuild(np.frombuffer(data, dtype=np.uint8), offsets)

    # ------------------------------------------------------------------ size, pickling

    @property
    def nbytes(self) -> int:
        """Bytes of the buffer this sequence spans plus its offsets.

        Examples:
            >>> SharedSequence(["x"] * 10).nbytes > 0
            True
        """
        starts = self._starts
        return int(starts[len(starts) - 1] - starts[0]) + self._offsets.nbytes

    def __repr__(self) -> str:
        return f"<SharedSequence {len(self):,} items, {self.nbytes / 2**20:.1f} MiB in one buffer>"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as the two arrays (only the span of a slice view)."""
        first, last = int(self._offsets[0]), int(self._offsets[-1])
        offsets = self._offsets
        if first:
            offsets = (offsets - first).astype(_offsets_dtype(last - first))
        return (_rebuild, (self._data[first:last], offsets))


def _rebuild(data: np.ndarray, offsets: np.ndarray) -> SharedSequence[Any]:
    """A ``SharedSequence`` over existing arrays (slices, unpickling)."""
    seq: SharedSequence[Any] = SharedSequence.__new__(SharedSequence)
    seq._set(data, offsets)
    return seq
