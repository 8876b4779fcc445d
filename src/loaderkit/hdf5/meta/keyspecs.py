"""What a session reader knows of each key and each session file, and the slab helpers.

``KeySpec`` says where a key's rows lie, ``SessionRecord`` what a session file held when the
index was built (checked at every reopen); ``axis_selection`` and ``read_slab`` select and read
rows along any axis.

Example:
    >>> KeySpec("x", "data/x").axis, axis_selection(1, 2, 4)
    (0, (slice(None, None, None), slice(2, 4, None)))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import h5py
import numpy as np
from h5py import h5s

from loaderkit.hdf5.meta.diagnose import Identity
from loaderkit.hdf5.meta.layout import SessionLayout

__all__ = ["KeySpec", "SessionRecord", "axis_selection", "read_slab"]


@dataclass(frozen=True)
class KeySpec:
    """One dataset a sample is read from.

    Attributes:
        name: The name in a sample's dict (several keys), or the key itself.
        path: The dataset's path in the file (links are followed), or the group's path when
            ``members`` is set.
        axis: The axis samples lie along (``sample_axis``, non-negative).
        members: The path names a group whose datasets are the samples, one each.

    Example:
        >>> KeySpec("x", "data/x").axis
        0
    """

    name: str
    path: str
    axis: int = 0
    members: bool = False


class SessionRecord(NamedTuple):
    """What a session file held when the index was built: checked at every (re)open.

    Attributes:
        identity: The file's ``Identity`` then.
        layouts: Per key: rows, row shape and dtype (``SessionLayout``).
        members: Per key: the names of a group's per-sample datasets (``None``: not a group).

    Example:
        >>> SessionRecord(None, (), ()).layouts
        ()
    """

    identity: Identity | None
    layouts: tuple[SessionLayout, ...]
    members: tuple[tuple[str, ...] | None, ...]


def axis_selection(axis: int, start: int, stop: int | None) -> tuple[Any, ...]:
    """The selection of rows ``start..stop-1`` (or row ``start`` when ``stop`` is ``None``)."""
    row: Any = start if stop is None else slice(start, stop)
    return (slice(None),) * axis + (row,)


def read_slab(dset: h5py.Dataset, axis: int, start: int, length: int, dtype: np.dtype) -> Any:
    """Rows ``start..start+length-1`` along ``axis`` read into ``dtype`` (HDF5 converts).

    Returns the slab in the file's axis order (``moveaxis`` brings the sample axis first).
    """
    shape = dset.shape
    count = tuple(length if k == axis else n for k, n in enumerate(shape))
    offset = tuple(start if k == axis else 0 for k in range(len(shape)))
    out = np.empty(count, dtype)
    fspace = dset.id.get_space()
    fspace.select_hyperslab(offset, count)
    dset.id.read(h5s.create_simple(count), fspace, out)  # HDF5's default transfer properties
    return out
