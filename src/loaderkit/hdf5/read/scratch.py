"""``ScratchRows``: a reused per-thread buffer for rows read as stored and converted after.

Rows that need converting (another byte order, records split into fields) are read into a
scratch batch and copied out: the batch then costs no fresh allocation and no page faults
twice. Each thread has its own buffer (threads read batches at once); views of it are kept
per (rows, dtype, row shape), at most ``MAX_VIEWS``. A scratch batch is never handed out.

Example:
    >>> import numpy as np
    >>> scratch = ScratchRows()
    >>> rows = scratch.rows(4, np.dtype(">f4"), (3,))
    >>> rows.shape, rows.dtype.str, scratch.rows(4, np.dtype(">f4"), (3,)) is rows
    ((4, 3), '>f4', True)
"""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np

__all__ = ["MAX_VIEWS", "ScratchRows"]

#: Views kept per thread (batches of many sizes: the views stay bounded).
MAX_VIEWS = 16


class ScratchRows:
    """Per thread, one reused buffer of rows as stored; pickled empty (a fresh one).

    Example:
        >>> ScratchRows().rows(2, np.dtype("i4"), ()).shape
        (2,)
    """

    def __init__(self) -> None:
        self._local = threading.local()

    def __reduce__(self) -> tuple[Any, ...]:
        return (ScratchRows, ())

    def rows(self, n: int, dtype: np.dtype, row_shape: tuple[int, ...]) -> np.ndarray:
        """A buffer of ``n`` rows of ``row_shape`` and ``dtype``, this thread's, reused."""
        local = self._local
        views: dict[tuple[int, np.dtype, tuple[int, ...]], np.ndarray] | None = getattr(
            local, "views", None
        )
        if views is None:
            views = local.views = {}
            local.spare = None
        view = views.get((n, dtype, row_shape))
        if view is not None:
            return view
        shape = (n, *row_shape)
        nbytes = math.prod(shape) * dtype.itemsize
        if local.spare is None or local.spare.nbytes < nbytes:
            local.spare = np.empty(max(nbytes, 1 << 16), np.uint8)
            views.clear()  # views of the buffer replaced
        if len(views) >= MAX_VIEWS:
            views.clear()
        view = local.spare[:nbytes].view(dtype).reshape(shape)
        views[n, dtype, row_shape] = view
        return view
