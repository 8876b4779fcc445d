"""HDF5 filters decoded in Python, in the reading thread: which ones, and how.

A chunk read raw (``os.pread`` at the offset and size the chunk index gives) holds the bytes
HDF5's filter pipeline wrote; ``decoder`` returns, for one filter of a pipeline, a function
that undoes it, or ``None`` and the reason when this process cannot (the chunk is then read by
h5py). Decoders run outside every loaderkit lock and outside h5py's global lock; the codecs
below release the GIL while they work (CPython's ``zlib``, ``lz4.block``, ``zstandard``,
``blosc2``), so threads decode chunks in parallel.

========  ============  ====================================================================
id        filter        HDF5 framing undone here
========  ============  ====================================================================
1         deflate       one zlib stream (``zlib.decompress``)
2         shuffle       bytes grouped by position in the element: a transpose
                        ``(itemsize, n) -> (n, itemsize)``; trailing bytes kept as they are
3         fletcher32    4 bytes appended (little-endian) to the filtered chunk: checked
                        (HDF5's byte-swapped variant accepted too) and stripped
32004     LZ4           big-endian ``uint64`` size, ``uint32`` block size, then per block a
                        big-endian ``uint32`` length and the block (stored as is when that
                        length equals the block's size) -- ``lz4.block``
32015     Zstandard     one zstd frame -- ``zstandard``
32001     Blosc         one Blosc frame (self-describing) -- ``blosc2``
========  ============  ====================================================================

Example:
    >>> import zlib
    >>> decode, why = decoder(1, (), 4)
    >>> bytes(decode(zlib.compress(b"abcd")))
    b'abcd'
"""

from __future__ import annotations

import importlib
import struct
import threading
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["DECODED_FILTERS", "Decoder", "decoder", "fletcher32", "unshuffle"]

#: A decoder: the filtered bytes in, the bytes before that filter out.
Decoder = Callable[[Any], Any]

#: Filters decoded here (id -> name) and the module each needs (``None``: the standard library).
DECODED_FILTERS: dict[int, tuple[str, str | None]] = {
    1: ("deflate", None),
    2: ("shuffle", None),
    3: ("fletcher32", None),
    32001: ("Blosc", "blosc2"),
    32004: ("LZ4", "lz4.block"),
    32015: ("Zstandard", "zstandard"),
}

_MISSING = object()
_MODULES: dict[str, Any] = {}
_LOCAL = threading.local()


def _module(name: str) -> Any:
    """The module ``name``, or ``None`` when it cannot be imported (looked up once)."""
    found = _MODULES.get(name, _MISSING)
    if found is _MISSING:
        try:
            found = importlib.import_module(name)
        except ImportError:
            found = None
        _MODULES[name] = found
    return found


def unshuffle(data: Any, itemsize: int) -> Any:
    """Undo HDF5's shuffle filter: byte ``j`` of every element was stored together.

    Example:
        >>> bytes(unshuffle(b"acbd", 2))
        b'abcd'
    """
    raw = np.frombuffer(data, np.uint8)
    if itemsize <= 1 or raw.size < itemsize:
        return data
    n = raw.size // itemsize
    out = np.empty(raw.size, np.uint8)
    out[: n * itemsize].reshape(n, itemsize)[...] = raw[: n * itemsize].reshape(itemsize, n).T
    out[n * itemsize :] = raw[n * itemsize :]
    return out


def fletcher32(data: Any) -> int:
    """HDF5's Fletcher-32 checksum of ``data`` (``H5_checksum_fletcher32``).

    Big-endian 16-bit words (an odd last byte is the high byte of a last word), both sums
    reduced modulo 65535 with HDF5's ones'-complement representation (0 only when every
    word is 0).

    Example:
        >>> hex(fletcher32(b"abcde"))
        '0x4ff029c7'
    """
    raw = np.frombuffer(data, np.uint8)
    even = raw.size - raw.size % 2
    words = raw[:even].view(">u2").astype(np.int64)
    if raw.size % 2:
        words = np.append(words, np.int64(int(raw[-1]) << 8))
    n = words.size
    if n == 0:
        return 0
    s1 = int(words.sum())
    weights = np.arange(n, 0, -1, dtype=np.int64) % 65535
    s2 = int((words * weights % 65535).sum())

    def fold(s: int) -> int:
        return 0 if s == 0 else (s - 1) % 65535 + 1

    return (fold(s2) << 16) | fold(s1)


def _check_fletcher32(data: Any) -> Any:
    view = memoryview(data).cast("B")
    if view.nbytes < 4:
        raise OSError("Fletcher-32: a chunk shorter than its checksum")
    body = view[:-4]
    stored = struct.unpack("<I", view[-4:])[0]
    found = fletcher32(body)
    swapped = ((found & 0x00FF00FF) << 8) | ((found >> 8) & 0x00FF00FF)
    if stored not in (found, swapped):
        raise OSError(
            "data error detected by Fletcher-32 checksum (the chunk's bytes differ from "
            "what was written)"
        )
    return body


def _lz4(data: Any) -> Any:
    block = _module("lz4.block")
    view = memoryview(data).cast("B")
    total, size = struct.unpack(">QI", view[:12])
    size = min(size, total) or total
    out = bytearray(total)
    at, done = 12, 0
    while done < total:
        size = min(size, total - done)
        (length,) = struct.unpack(">I", view[at : at + 4])
        at += 4
        piece = view[at : at + length]
        if length == size:
            out[done : done + size] = piece
        else:
            out[done : done + size] = block.decompress(piece, uncompressed_size=size)
        at += length
        done += size
    return out


def _zstd(data: Any) -> Any:
    zstd = _module("zstandard")
    dctx = getattr(_LOCAL, "zstd", None)
    if dctx is None:  # a decompression context is not thread-safe: one per thread
        dctx = _LOCAL.zstd = zstd.ZstdDecompressor()
    return dctx.decompress(data)


def _blosc(data: Any) -> Any:
    return _module("blosc2").decompress(data)


def decoder(
    filter_id: int, values: Sequence[int], itemsize: int, nbytes: int = 0
) -> tuple[Decoder | None, str]:
    """The function that undoes one filter, or ``None`` and why it cannot be undone here.

    Args:
        filter_id: The HDF5 filter id.
        values: The filter's client data (``cd_values``).
        itemsize: The dataset's element size (the shuffle filter's unit when it is not
            recorded).
        nbytes: A chunk's size once decoded (the output buffer zlib starts with; 0: unknown).

    Returns:
        ``(decode, "")``, or ``(None, reason)``.

    Example:
        >>> decoder(4, (), 4)[1]
        'filter 4 (szip) is not decoded by loaderkit'
    """
    known = DECODED_FILTERS.get(int(filter_id))
    if known is None:
        from loaderkit.hdf5.meta.filters import KNOWN_FILTERS

        name = KNOWN_FILTERS.get(int(filter_id), (f"filter {filter_id}", ""))[0]
        name = name.split(" ")[0]
        return None, f"filter {filter_id} ({name}) is not decoded by loaderkit"
    name, needs = known
    if needs is not None and _module(needs) is None:
        package = needs.split(".")[0]
        return None, f"{name} (filter {filter_id}) needs the {package!r} package (not installed)"
    if filter_id == 1:
        size = max(nbytes, zlib.DEF_BUF_SIZE)
        return (lambda data: zlib.decompress(data, 15, size)), ""
    if filter_id == 2:
        unit = int(values[0]) if values else itemsize
        return (lambda data: unshuffle(data, unit)), ""
    if filter_id == 3:
        return _check_fletcher32, ""
    if filter_id == 32004:
        return _lz4, ""
    if filter_id == 32015:
        return _zstd, ""
    return _blosc, ""
