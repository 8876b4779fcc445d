"""A chunked dataset's chunk index read from its file: HDF5's version-1 B-tree, in numpy.

Files written in HDF5's earliest format (h5py's default; the seeds' NSD session files) index
a chunked dataset with a version-1 B-tree. Asking HDF5 for every chunk (``H5Dchunk_iter``)
calls back into Python once a chunk, about 2 us: 0.6 s for the 300,000 chunks of one NSD
session, more than reading its data. Here the tree's nodes are read a level at a time (one
table of reads a level, performed by the caller's ``read``: ``rawio`` passes
``readtable.read_table``) and decoded with numpy. Only what is certain is read this way:
superblock version 0, 8-byte addresses and lengths, no user block, a version-1 object
header whose layout message is version 3 and chunked. Anything else, or any node that is not
what the format says, gives ``None`` and the caller asks HDF5; ``rawio.chunk_map`` also
checks what it gets against what HDF5 reads for some chunks.

The layout (HDF5 file format specification, version 0 superblock): a B-tree node is
``"TREE"``, node type (1: raw data chunks), level (0: leaves), entries used (2 bytes), left
and right sibling addresses, then keys and children interleaved: key 0, child 0, key 1, ...,
key ``n``. A key of a chunk tree holds the chunk's size in bytes (4), its filter mask (4) and
its offset in elements along each axis plus a trailing 0 (8 bytes each); a leaf's children
are the chunks' addresses, an inner node's its child nodes'. Nodes are allocated for ``2K``
entries, ``K`` = 32 in a version-0 superblock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NamedTuple

import h5py
import numpy as np

__all__ = ["ChunkRecords", "ReadTable", "chunk_records"]

#: Performs a table of reads ``(fd, file offset, offset in out, bytes)`` into ``out`` in full,
#: or raises ``OSError`` (``loaderkit.hdf5.read.readtable.read_table``'s ``ShortRead`` is one).
ReadTable = Callable[[np.ndarray, Any], None]

logger = logging.getLogger(__name__)

#: Entries a chunk B-tree node is allocated for in a version-0 superblock (``2K``, K = 32).
_NODE_ENTRIES = 64
#: A node's header: signature, type, level, entries used, left and right sibling addresses.
_HEADER = 24
#: Most levels a tree is walked through (64 entries a node: 64**8 chunks).
_MAX_LEVELS = 8
_UNDEFINED = 0xFFFF_FFFF_FFFF_FFFF


class ChunkRecords(NamedTuple):
    """Every chunk of a dataset, as its index holds them (in the index's order).

    Attributes:
        addresses: Byte offset of each chunk in the file.
        corners: ``(chunks, rank)`` offset of each chunk in elements.
        sizes: Bytes each chunk takes in the file.
        filter_masks: Filters skipped on each chunk (bit ``i``: filter ``i``).
    """

    addresses: np.ndarray
    corners: np.ndarray
    sizes: np.ndarray
    filter_masks: np.ndarray


def _read_bytes(read: ReadTable, fd: int, offset: int, nbytes: int) -> bytes:
    """``nbytes`` at ``offset`` of ``fd``, through ``read``."""
    out = np.empty(nbytes, np.uint8)
    read(out, [(fd, offset, 0, nbytes)])
    return out.tobytes()


def _layout_tree(
    read: ReadTable, fd: int, header: int, rank: int
) -> tuple[int, tuple[int, ...]] | None:
    """``(B-tree address, chunk dims)`` from a version-1 object header, or ``None``."""
    head = _read_bytes(read, fd, header, 16)
    if head[0] != 1:
        return None  # a version-2 object header ("OHDR"): HDF5 reads it
    messages = int.from_bytes(head[2:4], "little")
    blocks = [(header + 16, int.from_bytes(head[8:12], "little"))]
    seen = 0
    while blocks and seen < messages:
        start, length = blocks.pop(0)
        block = _read_bytes(read, fd, start, length)
        at = 0
        while at + 8 <= length and seen < messages:
            kind = int.from_bytes(block[at : at + 2], "little")
            size = int.from_bytes(block[at + 2 : at + 4], "little")
            body = block[at + 8 : at + 8 + size]
            at += 8 + size
            seen += 1
            if kind == 0x10 and size >= 16:  # continuation: more messages elsewhere
                blocks.append(
                    (int.from_bytes(body[:8], "little"), int.from_bytes(body[8:16], "little"))
                )
            elif kind == 0x08:  # data layout
                if len(body) < 11 or body[0] != 3 or body[1] != 2 or body[2] != rank + 1:
                    return None
                address = int.from_bytes(body[3:11], "little")
                dims = np.frombuffer(body, "<u4", rank + 1, 11)
                return address, tuple(int(x) for x in dims)
    return None


def _levels(read: ReadTable, fd: int, root: int, key_bytes: int) -> list[np.ndarray] | None:
    """The tree's leaves' entries ``(entries, key + child)`` as uint8, or ``None``."""
    stride = key_bytes + 8
    node_bytes = _HEADER + _NODE_ENTRIES * stride + key_bytes
    addresses = np.array([root], np.int64)
    level: int | None = None
    for _ in range(_MAX_LEVELS):
        nodes = np.empty((addresses.shape[0], node_bytes), np.uint8)
        starts = np.arange(addresses.shape[0], dtype=np.int64) * node_bytes
        table = np.stack(
            [np.full_like(addresses, fd), addresses, starts, np.full_like(addresses, node_bytes)],
            axis=1,
        )
        read(nodes, table)
        if not bool(np.all(nodes[:, :4] == np.frombuffer(b"TREE", np.uint8))):
            return None
        if not bool(np.all(nodes[:, 4] == 1)):
            return None  # not a tree of raw data chunks
        levels = nodes[:, 5]
        here = int(levels[0])
        if not bool(np.all(levels == here)) or (level is not None and here != level - 1):
            return None
        level = here
        used = nodes[:, 6:8].copy().view("<u2")[:, 0].astype(np.int64)
        if bool(np.any(used > _NODE_ENTRIES)) or bool(np.any(used < 1)):
            return None  # allocated for more entries than a version-0 file's K
        entries = nodes[:, _HEADER : _HEADER + _NODE_ENTRIES * stride].reshape(
            addresses.shape[0], _NODE_ENTRIES, stride
        )
        valid = np.arange(_NODE_ENTRIES)[None, :] < used[:, None]
        picked = entries[valid]  # (entries, key + child), nodes in order, keys in order
        if here == 0:
            return [picked]
        children = picked[:, key_bytes:].copy().view("<u8")[:, 0]
        if bool(np.any(children == _UNDEFINED)):
            return None
        addresses = children.astype(np.int64)
    return None


def _header_address(dset: h5py.Dataset) -> int:
    """The file address of ``dset``'s object header.

    ``H5Gget_objinfo`` reads the header's address alone. ``H5Oget_info`` (``h5o.get_info``)
    also sums the chunk index's size, walking every node of the B-tree: 0.28 s of scattered
    reads for a cold 300,000-chunk session, before this module reads the same nodes again.
    The decoder checks what it finds at the address, so a wrong one only means ``None``.
    """
    try:
        return int(h5py.h5g.get_objinfo(dset.id).objno[0])
    except (AttributeError, TypeError, ValueError, RuntimeError):  # no deprecated symbols
        return int(h5py.h5o.get_info(dset.id).addr)


def chunk_records(f: h5py.File, dset: h5py.Dataset, read: ReadTable) -> ChunkRecords | None:
    """Every chunk of ``dset`` from its version-1 B-tree, or ``None`` (ask HDF5 instead).

    Args:
        f: The open file (the default ``sec2`` driver: its descriptor is read).
        dset: A chunked dataset of ``f``.
        read: Performs a table of reads (``ReadTable``).

    Returns:
        The chunks, or ``None`` when the file or the dataset is not in the format read here.

    Example:
        >>> import h5py, numpy as np, tempfile, os
        >>> from loaderkit.hdf5.read.readtable import read_table
        >>> path = os.path.join(tempfile.mkdtemp(), "b.h5")
        >>> with h5py.File(path, "w") as f:
        ...     _ = f.create_dataset("x", data=np.zeros((4, 300), "i2"), chunks=(4, 1))
        >>> with h5py.File(path, "r") as f:
        ...     got = chunk_records(f, f["x"], read_table)
        ...     want = f["x"].id.get_chunk_info_by_coord((0, 299)).byte_offset
        >>> len(got.addresses), int(got.addresses[got.corners[:, 1] == 299][0]) == want
        (300, True)
    """
    try:
        fcpl = f.id.get_create_plist()
        if fcpl.get_version()[0] != 0 or fcpl.get_sizes() != (8, 8) or fcpl.get_userblock():
            return None
        fd = f.id.get_vfd_handle()
        if not isinstance(fd, int) or fd < 0 or dset.chunks is None:
            return None
        rank = len(dset.shape)
        found = _layout_tree(read, fd, _header_address(dset), rank)
        if found is None:
            return None
        root, dims = found
        if root == _UNDEFINED or dims[:rank] != tuple(dset.chunks):
            return None
        key_bytes = 8 + 8 * (rank + 1)
        leaves = _levels(read, fd, root, key_bytes)
    except (OSError, ValueError, TypeError, RuntimeError, AttributeError, KeyError):
        logger.debug("chunk index of %s not read from the file", f.filename, exc_info=True)
        return None
    if leaves is None:
        return None
    picked = leaves[0]
    keys = picked[:, :key_bytes].copy()
    return ChunkRecords(
        addresses=picked[:, key_bytes:].copy().view("<u8")[:, 0].astype(np.int64),
        corners=keys[:, 8:].view("<u8")[:, :rank].astype(np.int64),
        sizes=keys[:, :4].view("<u4")[:, 0].astype(np.int64),
        filter_masks=keys[:, 4:8].view("<u4")[:, 0].astype(np.int64),
    )
