"""What a batch of CSR rows becomes: a sparse CSR tensor, dense rows, or (gene ids, values).

The reads (``csrmatrix.CSRMatrix.gather``) give a batch as three arrays in request order: each
row's number of stored values, the values and their column ids, back to back. ``FORMS`` are
what the dataset's ``sparse=`` option makes of them:

* ``"csr"``: one ``torch.sparse_csr_tensor`` ``(batch, columns)`` over those arrays (no dense
  intermediate), a sample a 1-D ``torch.sparse_coo_tensor``;
* ``"dense"``: rows scattered into a zeroed batch buffer (the ``BatchMemory`` handed over: a
  worker's slot);
* ``"tokens"``: per row ``{"genes": int64 ids, "values": values}``, a batch padded at the end
  with 0 as ``pad_collate`` pads it.

Example:
    >>> import numpy as np
    >>> lengths, values, cols = np.array([1, 0]), np.array([5.0], "f4"), np.array([2], "i4")
    >>> matrix_batch("csr", 3, lengths, values, cols).tensor.to_dense().tolist()
    [[0.0, 0.0, 5.0], [0.0, 0.0, 0.0]]
    >>> [row.tolist() for row in row_samples("dense", 3, lengths, values, cols)]
    [[0.0, 0.0, 5.0], [0.0, 0.0, 0.0]]
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import torch

from loaderkit.batches.contract import PLAIN, BatchMemory, Padded, RowBatch

__all__ = ["FORMS", "matrix_batch", "part_buffer", "row_samples", "sorted_rows"]

#: What a batch of CSR rows becomes: a sparse CSR tensor, dense rows, or (gene ids, values).
FORMS = ("csr", "dense", "tokens")


def part_buffer(n: int, dtype: np.dtype, memory: BatchMemory = PLAIN) -> np.ndarray:
    """``n`` elements for a part of a sparse batch, in ``memory`` (a worker's batch slot).

    A batch's values, column ids and row offsets read into the slot cross to the main
    process as they are; for a type torch has not, a plain allocation the batch copies.

    Example:
        >>> part_buffer(3, np.dtype("f4")).shape
        (3,)
    """
    if dtype.isnative:
        try:
            return memory.buffer(n, (), dtype)[1]
        except TypeError:  # no torch dtype: an allocation the batch copies once
            pass
    return np.empty(n, dtype)


def sorted_rows(
    lengths: np.ndarray, values: np.ndarray, cols: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(values, cols)`` with each row's column ids in increasing order (as torch expects).

    anndata and scipy write them sorted, but nothing requires it: older files hold them in
    any order (scanpy's bundled ``pbmc68k_reduced`` descending), and a ``genes=`` subset given
    out of the file's order renumbers them out of order. One vectorised pass finds whether
    any row is out of order; only then are the rows sorted (one ``lexsort``).

    Example:
        >>> import numpy as np
        >>> v, c = sorted_rows(np.array([2, 1]), np.array([1.0, 2.0, 3.0]), np.array([5, 1, 0]))
        >>> c.tolist(), v.tolist()
        ([1, 5, 0], [2.0, 1.0, 3.0])
    """
    total = cols.size
    if total < 2:
        return values, cols
    down = cols[1:] <= cols[:-1]
    bounds = np.cumsum(lengths)[:-1]
    down[bounds[(bounds > 0) & (bounds < total)] - 1] = False  # a new row may start lower
    if not down.any():
        return values, cols
    order, cols = _row_major_order(lengths, cols)
    return values[order], cols


def _row_major_order(lengths: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The stable order that sorts each row's values by column, and the sorted column ids.

    The order is ``lexsort((cols, rows))``'s. Rows are taken in blocks of at most
    ``_SORT_BLOCK`` values. Each value's key is its column shifted left past its place in
    the block, so sorting the keys sorts by column and says where each value came from; a
    block's keys are laid out a row per line, padded with the largest key, and sorted along
    the lines: numpy sorts short lines of integers with its vectorised sort (64 rows of 800
    values: ~0.4 ms, against ~5 ms for ``lexsort``).

    Example:
        >>> order, cols = _row_major_order(np.array([2, 2]), np.array([70000, 3, 2, 1]))
        >>> order.tolist(), cols.tolist()
        ([1, 0, 3, 2], [3, 70000, 1, 2])
    """
    crow = np.zeros(lengths.size + 1, np.int64)
    np.cumsum(lengths, out=crow[1:])
    order = np.empty(cols.size, np.int64)
    out = np.empty_like(cols)
    top = int(cols.max()) + 1 if cols.size else 1
    r0 = 0
    while r0 < lengths.size:
        r1 = max(int(np.searchsorted(crow, crow[r0] + _SORT_BLOCK, "right")) - 1, r0 + 1)
        r1 = min(r1, lengths.size)
        a, b = int(crow[r0]), int(crow[r1])
        part, line = lengths[r0:r1], int(lengths[r0:r1].max())
        if not line:  # empty rows only
            r0 = r1
            continue
        shift = max(b - a - 1, 0).bit_length()
        dtype = np.dtype(np.int32) if top << shift < 2**31 else np.dtype(np.int64)
        keys: np.ndarray = np.left_shift(cols[a:b].astype(dtype), shift)
        keys |= np.arange(b - a, dtype=dtype)
        flat = np.full((r1 - r0) * line, np.iinfo(dtype).max, dtype)
        lines = np.arange(0, (r1 - r0) * line, line) - (crow[r0:r1] - a)
        flat[np.repeat(lines, part) + np.arange(b - a)] = keys
        grid = flat.reshape(r1 - r0, line)
        grid.sort(axis=1)
        used = grid[np.arange(line) < part[:, None]]
        order[a:b] = (used & ((1 << shift) - 1)) + a
        out[a:b] = used >> shift
        r0 = r1
    return order, out


#: Values a block of rows holds while ``_row_major_order`` sorts them (a core's L2 cache).
_SORT_BLOCK = 1 << 15


def matrix_batch(
    form: str,
    n_out: int,
    lengths: np.ndarray,
    values: np.ndarray,
    cols: np.ndarray,
    memory: BatchMemory = PLAIN,
) -> RowBatch:
    """The rows as one batch in ``form``; the samples built only when something asks.

    Args:
        form: One of ``FORMS``.
        n_out: Columns of a row.
        lengths: Stored values of each row.
        values: The values, row after row.
        cols: Their column ids (``int32`` or ``int64``).
        memory: Where the batch is written (``BatchMemory``).
    """
    n = lengths.size
    if form == "dense":
        tensor, out = memory.buffer(n, (n_out,), values.dtype)
        out.fill(0)
        out[np.repeat(np.arange(n), lengths), cols] = values
        return RowBatch(tensor, list(out))
    if form == "tokens":
        return RowBatch(_padded(lengths, values, cols), lambda: _tokens(lengths, values, cols))
    crow = part_buffer(n + 1, cols.dtype, memory)
    crow[0] = 0
    np.cumsum(lengths, out=crow[1:])
    tensor = torch.sparse_csr_tensor(
        torch.from_numpy(crow),
        torch.from_numpy(cols),
        torch.from_numpy(values),
        size=(n, n_out),
        check_invariants=False,
    )
    return RowBatch(tensor, lambda: row_samples(form, n_out, lengths, values, cols))


def row_samples(
    form: str, n_out: int, lengths: np.ndarray, values: np.ndarray, cols: np.ndarray
) -> list[Any]:
    """Per-row samples in ``form`` (arguments as ``matrix_batch``'s)."""
    if form == "tokens":
        return _tokens(lengths, values, cols)
    bounds = np.concatenate(([0], np.cumsum(lengths))).tolist()
    samples: list[Any] = []
    for a, b in itertools.pairwise(bounds):
        if form == "dense":
            row = np.zeros(n_out, values.dtype)
            row[cols[a:b]] = values[a:b]
            samples.append(row)
        else:
            ids = torch.from_numpy(cols[a:b].astype(np.int64)).reshape(1, -1)
            samples.append(
                torch.sparse_coo_tensor(
                    ids, torch.from_numpy(values[a:b]), (n_out,), check_invariants=False
                )
            )
    return samples


def _tokens(lengths: np.ndarray, values: np.ndarray, cols: np.ndarray) -> list[dict[str, Any]]:
    """Per row ``{"genes": int64 ids, "values": values}``."""
    bounds = np.concatenate(([0], np.cumsum(lengths))).tolist()
    return [
        {
            "genes": torch.from_numpy(cols[a:b].astype(np.int64)),
            "values": torch.from_numpy(values[a:b].copy()),
        }
        for a, b in itertools.pairwise(bounds)
    ]


def _padded(lengths: np.ndarray, values: np.ndarray, cols: np.ndarray) -> dict[str, Padded]:
    """The token rows padded at the end with 0, as ``pad_collate`` pads them."""
    n = lengths.size
    width = int(lengths.max()) if n else 0
    genes = np.zeros((n, width), np.int64)
    vals = np.zeros((n, width), values.dtype)
    rows = np.repeat(np.arange(n), lengths)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    within = np.arange(int(lengths.sum())) - np.repeat(starts, lengths)
    genes[rows, within] = cols
    vals[rows, within] = values
    counts = torch.from_numpy(lengths.astype(np.int64))
    return {
        "genes": Padded(torch.from_numpy(genes), counts),
        "values": Padded(torch.from_numpy(vals), counts.clone()),
    }
