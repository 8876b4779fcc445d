"""``cells=``: the cells of each file a dataset serves, chosen once by a function of its obs.

``choose_cells`` runs where the dataset is built (the main process): for every file it calls
the user's function once with that file's ``obs`` (``loaderkit.hdf5.anndata.obs.ObsTable``,
columns read only when asked for), checks what it returned (a boolean mask over the file's
cells, or sorted unique positions) and packs the chosen rows into the dataset's index
(``position << ROW_BITS | row``). Nothing else is kept: the function is not (spawn workers get
the index), and ``CellChoice`` holds a count per file for the plan.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from loaderkit.errors import ConfigError, add_note
from loaderkit.hdf5.anndata.obs import ObsTable
from loaderkit.hdf5.meta.index import ROW_BITS

__all__ = ["CellChoice", "choose_cells"]

#: Files named one by one in the plan row; the rest are counted.
_NAMED = 4


@dataclass(frozen=True)
class CellChoice:
    """How many cells each file gave to a dataset built with ``cells=``.

    Attributes:
        ids: Session ids, in position order.
        chosen: Cells chosen per file.
        cells: Cells per file.

    Example:
        >>> choice = CellChoice((0, 1), (3, 0), (5, 4))
        >>> print(choice.summary())
        3 of 9 cells in 2 files chosen by cells=; per file: 0: 3 of 5, 1: 0 of 4
    """

    ids: tuple[Hashable, ...]
    chosen: tuple[int, ...]
    cells: tuple[int, ...]

    def summary(self) -> str:
        """One line: the cells chosen of all, and per file (the first few, then a count)."""
        files = len(self.ids)
        per = [
            f"{sid!r}: {c:,} of {n:,}" if not isinstance(sid, int) else f"{sid}: {c:,} of {n:,}"
            for sid, c, n in zip(self.ids[:_NAMED], self.chosen, self.cells, strict=False)
        ]
        more = f", ... ({files - _NAMED} more files)" if files > _NAMED else ""
        return (
            f"{sum(self.chosen):,} of {sum(self.cells):,} cells in {files} "
            f"file{'s' * (files != 1)} chosen by cells=; per file: {', '.join(per)}{more}"
        )


def _positions(result: Any, cells: int, where: str) -> np.ndarray:
    """The chosen rows (int64, sorted, unique) of what the function returned for a file."""
    expected = (
        f"cells= must return a boolean mask of the file's {cells} cells (numpy bool, length "
        f"{cells}) or sorted unique integer positions in 0..{cells - 1}"
    )
    if hasattr(result, "to_numpy") and not isinstance(result, np.ndarray):
        result = result.to_numpy()  # a pandas Series (obs columns compared with pandas)
    if not isinstance(result, np.ndarray | list | tuple | range):
        raise ConfigError(f"{expected}; for {where} it returned a {type(result).__name__}.")
    values = np.asarray(result)
    if values.ndim != 1:
        raise ConfigError(f"{expected}; for {where} it returned an array of shape {values.shape}.")
    if values.dtype == np.bool_:
        if values.shape[0] != cells:
            raise ConfigError(
                f"{expected}; for {where} it returned a mask of length {values.shape[0]}."
            )
        return np.flatnonzero(values).astype(np.int64)
    if values.size == 0:
        return np.zeros(0, np.int64)
    if values.dtype.kind not in "iu":
        raise ConfigError(
            f"{expected}; for {where} it returned an array of dtype {values.dtype} (a mask "
            "must be bool: compare a column, e.g. obs['n_counts'] > 500)."
        )
    rows = values.astype(np.int64)
    bad = np.flatnonzero((rows < 0) | (rows >= cells))
    if bad.size:
        k = int(bad[0])
        raise ConfigError(f"{expected}; for {where} entry {k} is {int(rows[k])}, out of range.")
    steps = np.diff(rows)
    if steps.size and steps.min() <= 0:
        k = int(np.flatnonzero(steps <= 0)[0])
        how = "repeated" if steps[k] == 0 else "not sorted"
        raise ConfigError(
            f"{expected}; for {where} entries {k} and {k + 1} ({int(rows[k])}, "
            f"{int(rows[k + 1])}) are {how}: pass np.unique(positions)."
        )
    return rows


def choose_cells(
    fn: Callable[[ObsTable], Any],
    ids: Sequence[Hashable],
    paths: Sequence[str],
    cells: Sequence[int],
    open_file: Callable[[int], Any],
) -> tuple[np.ndarray, CellChoice]:
    """Call ``fn`` once per file with its obs; the packed index of the cells it chose.

    Args:
        fn: The dataset's ``cells=``: ``fn(obs) -> mask | positions``.
        ids: Session ids, in position order.
        paths: Their paths, for messages.
        cells: Cells (rows of the key) per file.
        open_file: Opens file ``pos`` read-only (a context manager giving an ``h5py.File``).

    Returns:
        ``(index, choice)``: the packed keys of the chosen cells (file order, then row order;
        int64, read-only) and how many each file gave.

    Raises:
        ConfigError: A file without obs, or a return that is not a mask of the file's cells
            or sorted unique positions in range (naming the session, its path and what was
            expected). What ``fn`` raises keeps its type, with a note naming the file.

    Example:
        >>> choose_cells.__name__
        'choose_cells'
    """
    if not callable(fn):
        raise ConfigError(
            f"cells= must be a function obs -> mask | positions (called once per file), got "
            f"{type(fn).__name__}."
        )
    parts, chosen = [], []
    for pos, (sid, path) in enumerate(zip(ids, paths, strict=True)):
        where = f"session {sid!r} ({path}), {cells[pos]} cells"
        with contextlib.ExitStack() as stack:
            f = stack.enter_context(open_file(pos))
            obs = ObsTable(f, sid, path)
            try:
                result = fn(obs)
            except Exception as exc:
                add_note(exc, f"loaderkit: in cells= for session {sid!r} ({path})")
                raise
        rows = _positions(result, int(cells[pos]), where)
        parts.append((np.int64(pos) << ROW_BITS) | rows)
        chosen.append(int(rows.shape[0]))
    index = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    index.setflags(write=False)
    return index, CellChoice(tuple(ids), tuple(chosen), tuple(int(n) for n in cells))
