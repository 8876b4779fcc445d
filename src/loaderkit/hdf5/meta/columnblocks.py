"""Blocks of whole chunks: how to walk a dataset whose rows span many chunks, in bounded memory.

A dataset such as NSD's betas, ``(750, V)`` with chunks ``(750, 1)``, stores each *column*
(one voxel's 750 trials) in its own chunk, so any one row touches every chunk. Reading it
row by row reads every chunk once per row; reading it in blocks of columns (every row, a
range of columns) reads every chunk exactly once. ``column_blocks`` cuts the row axes into
such blocks: each block is a box of whole chunks, all rows, within a byte budget and a chunk
count (HDF5 keeps a few KiB of bookkeeping per chunk of one read, so one read of a whole
session of hundreds of thousands of chunks costs gigabytes on top of the data).
``chunks_per_row`` counts the chunks one row touches.

Pure functions of shapes and sizes; nothing here opens a file.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

__all__ = ["chunks_per_row", "column_blocks"]


def chunks_per_row(shape: tuple[int, ...], chunks: tuple[int, ...] | None) -> int:
    """How many chunks one row (an index along axis 0) of a dataset touches.

    Args:
        shape: The dataset's shape (samples along axis 0).
        chunks: Its chunk shape (``None``: contiguous, 1).

    Returns:
        The product over the row axes of ``ceil(extent / chunk extent)`` (at least 1).

    Example:
        >>> chunks_per_row((750, 20000), (750, 1))
        20000
        >>> chunks_per_row((750, 64, 64), (1, 64, 64)), chunks_per_row((10, 4), None)
        (1, 1)
    """
    if chunks is None or len(shape) < 2:
        return 1
    return max(1, math.prod(-(-n // max(1, c)) for n, c in zip(shape[1:], chunks[1:], strict=True)))


def column_blocks(
    shape: tuple[int, ...],
    chunks: tuple[int, ...] | None,
    itemsize: int,
    *,
    max_bytes: int,
    max_chunks: int | None = None,
) -> Iterator[tuple[slice, ...]]:
    """Selections that cover a dataset in boxes of whole chunks, every row each, in order.

    Each selection is a tuple of slices over *all* axes: axis 0 whole, the row axes cut at
    chunk boundaries so that a box holds at most ``max_bytes`` of data and touches at most
    ``max_chunks`` chunks. The outermost row axis is cut first; an axis is cut further only
    when one chunk's width along it is still too big (then the next axis is cut inside each
    slab). A box is never smaller than one chunk column (all rows, one chunk wide on every
    row axis), so the budget is exceeded only by a single chunk column.

    Args:
        shape: The dataset's shape (samples along axis 0).
        chunks: Its chunk shape (``None``: contiguous; blocks are then cut at any index).
        itemsize: Bytes per element.
        max_bytes: Most bytes of data per box.
        max_chunks: Most chunks per box (``None``: no limit).

    Yields:
        Tuples of slices, one per axis.

    Example:
        >>> [b[1] for b in column_blocks((750, 10), (750, 1), 2, max_bytes=750 * 2 * 4)]
        [slice(0, 4, None), slice(4, 8, None), slice(8, 10, None)]
        >>> blocks = list(column_blocks((4, 3, 5), (4, 1, 1), 1, max_bytes=4 * 2))
        >>> len(blocks), blocks[0]
        (9, (slice(0, 4, None), slice(0, 1, None), slice(0, 2, None)))
    """
    ndim = len(shape)
    if ndim < 2 or math.prod(shape) == 0:
        yield tuple(slice(0, n) for n in shape)
        return
    grid = tuple(chunks) if chunks is not None else (shape[0],) + (1,) * (ndim - 1)
    bands = -(-shape[0] // max(1, grid[0]))  # chunks along the sample axis a box touches
    max_bytes = max(1, max_bytes)

    def cost(extents: tuple[int, ...], axis: int) -> tuple[int, int]:
        """Bytes and chunks of a box: ``extents`` on axes 1..axis-1, whole beyond."""
        sizes = (*extents, *shape[axis:])
        nbytes = shape[0] * math.prod(sizes) * itemsize
        touched = bands * math.prod(
            -(-n // max(1, c)) for n, c in zip(sizes, grid[1:], strict=True)
        )
        return nbytes, touched

    def fits(extents: tuple[int, ...], axis: int) -> bool:
        nbytes, touched = cost(extents, axis)
        return nbytes <= max_bytes and (max_chunks is None or touched <= max_chunks)

    def walk(prefix: tuple[slice, ...], axis: int) -> Iterator[tuple[slice, ...]]:
        extents = tuple(s.stop - s.start for s in prefix)
        whole = tuple(slice(0, n) for n in shape[axis:])
        if axis >= ndim or fits(extents, axis):
            yield (slice(0, shape[0]), *prefix, *whole)
            return
        width = max(1, grid[axis])
        # how many chunk widths along ``axis`` fit, with every later axis whole: bytes and
        # chunks grow linearly with the number of widths
        one_bytes, one_chunks = cost((*extents, min(width, shape[axis])), axis + 1)
        step = max_bytes // max(1, one_bytes)
        if max_chunks is not None:
            step = min(step, max_chunks // max(1, one_chunks))
        if step:
            for start in range(0, shape[axis], step * width):
                stop = min(shape[axis], start + step * width)
                yield (slice(0, shape[0]), *prefix, slice(start, stop), *whole[1:])
            return
        for start in range(0, shape[axis], width):  # one chunk width is too big: cut deeper
            yield from walk((*prefix, slice(start, min(shape[axis], start + width))), axis + 1)

    yield from walk((), 1)
