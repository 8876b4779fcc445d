"""``rechunk`` of a CSR matrix group: an ``.h5ad`` sparse matrix with its values uncompressed.

Many public ``.h5ad`` files store ``X`` (anndata's ``csr_matrix`` group: ``data``, ``indices``,
``indptr``, attributes ``encoding-type`` and ``shape``) gzip-compressed in small chunks: a
cell's row then costs decompressing every chunk its span touches, through HDF5. loaderkit
reads uncompressed ``data`` and ``indices`` from their raw bytes (``os.preadv``, no HDF5
call; ``loaderkit.hdf5.anndata.csrplan``), and a contiguous dataset is one "chunk": a run of
adjacent rows is one read. The copy ``rechunk`` writes for such a key (``X``,
``layers/<name>``, ``raw/X``, or the legacy ``h5sparse_format: csr`` groups) has:

* ``data`` and ``indices`` without filters: *contiguous* (``layout="auto"`` or
  ``"contiguous"``), or with ``layout="chunked"`` in chunks of about ``chunk_bytes`` (whole
  source chunks) that keep the source's maximum shape (anndata can then append to them);
  their type, fill value and attributes kept;
* ``indptr``, the group's attributes and any other member copied as they are (HDF5's object
  copy), so anndata reads the copy as the same matrix, with no plugin for the values;
* values copied in slices of whole source chunks of at most ``block_bytes``, one buffer
  reused: memory stays within that bound plus HDF5's chunk buffer, whatever ``nnz``;
* the group checked first (``check_source``): its members, its shape and ``indptr`` against
  the lengths of ``data`` and ``indices``, a damaged group named by file, key and row.

Example:
    >>> import numpy as np
    >>> f = h5py.File("a.h5ad", "w", driver="core", backing_store=False)
    >>> data = f.create_dataset("X/data", (1000,), "f4", chunks=(100,), compression="gzip")
    >>> value_chunks(data, "auto", 1 << 20), value_chunks(data, "chunked", 1000)
    (None, (200,))
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np

from loaderkit.errors import HDF5FileError
from loaderkit.hdf5.anndata import CSRGroup, check_csr, sparse_group
from loaderkit.hdf5.convert.h5copy import copy_attrs, create_like, reading, row_blocks

__all__ = ["VALUES", "check_source", "copy_values", "create_csr", "value_chunks", "values_nbytes"]

#: The members of a CSR group stored anew (``indptr`` is copied as it is).
VALUES = ("data", "indices")


def check_source(group: h5py.Group, key: str, source: Path) -> CSRGroup | None:
    """The ``CSRGroup`` that ``group`` is, checked; ``None`` for a group with no matrix encoding.

    Raises:
        ConfigError: A CSC matrix or another anndata encoding (named, with how to convert).
        HDF5FileError: Members missing or not 1-D datasets, a bad shape, or an ``indptr`` that
            does not fit ``data``/``indices`` (the first damaged row named).

    Example:
        >>> import tempfile, os
        >>> path = Path(tempfile.mkdtemp()) / "a.h5ad"
        >>> with h5py.File(path, "w") as f:
        ...     g = f.create_group("X")
        ...     g.attrs.update({"encoding-type": "csr_matrix", "shape": (2, 3)})
        ...     _ = g.create_dataset("data", data=np.ones(3, "f4"))
        ...     _ = g.create_dataset("indices", data=[0, 2, 1])
        ...     _ = g.create_dataset("indptr", data=[0, 2, 4])  # row 1 ends past the values
        ...     check_source(g, "X", path)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        loaderkit.errors.HDF5FileError: key 'X' of session 'a.h5ad' (...): row 1 ends at 4, ...
    """
    with reading(source, f"the group {key!r}"):
        csr = sparse_group(group, key, source.name, str(source))
        if csr is None:
            return None
        flat = {name: group[name] for name in (*VALUES, "indptr")}
        bad = [n for n, d in flat.items() if not isinstance(d, h5py.Dataset) or d.ndim != 1]
        if bad:
            raise HDF5FileError(
                f"rechunk: the CSR group {key!r} in {source} has {bad} that are not 1-D "
                "datasets; the file is damaged or not an anndata file. Write it again "
                "(anndata's write_h5ad)."
            )
        indptr = flat["indptr"][()]
        nnz, nnz_indices = flat["data"].shape[0], flat["indices"].shape[0]
    check_csr(csr, indptr, nnz, nnz_indices, source.name, str(source))
    return csr


def value_chunks(dset: h5py.Dataset, layout: str, chunk_bytes: int) -> tuple[int] | None:
    """The chunks of ``dset``'s copy (``data`` or ``indices``): ``None`` for contiguous.

    ``"chunked"``: about ``chunk_bytes`` a chunk, a whole number of source chunks (at most
    the dataset's length where it cannot grow); any other layout: contiguous.
    """
    if layout != "chunked":
        return None
    unit = dset.chunks[0] if dset.chunks is not None else 1
    elems = max(1, chunk_bytes // (dset.dtype.itemsize * unit)) * unit
    if dset.maxshape[0] is not None:
        elems = min(elems, max(1, dset.maxshape[0]))
    return (elems,)


def values_nbytes(group: h5py.Group) -> int:
    """Bytes of the values stored anew (``data`` and ``indices``)."""
    return sum(int(group[name].size) * group[name].dtype.itemsize for name in VALUES)


def create_csr(
    src: h5py.Group, parent: h5py.Group, name: str, layout: str, chunk_bytes: int
) -> h5py.Group:
    """The group ``name`` in ``parent``: ``src``'s attributes and members, values laid out anew.

    ``data`` and ``indices`` are created empty (``copy_values`` fills them) without filters;
    every other member is HDF5's object copy of the source's.
    """
    group = parent.create_group(name)
    copy_attrs(src, group)
    for member in src:
        if member in VALUES:
            dset = src[member]
            create_like(dset, group, member, value_chunks(dset, layout, chunk_bytes), filters=False)
        else:
            src.copy(src[member], group, name=member)
    return group


def copy_values(
    src: h5py.Group,
    dst: h5py.Group,
    block_bytes: int,
    report: Callable[[str, int], None],
    source: Path,
) -> None:
    """``data`` and ``indices`` from ``src`` into ``dst`` in slices of at most ``block_bytes``.

    A slice is a whole number of source chunks (and of the copy's chunks), read into one
    buffer reused for every slice; ``report("writing", bytes done)`` after each. A slice that
    cannot be read is an ``HDF5FileError`` naming the file, the dataset and its elements.
    """
    done = 0
    for name in VALUES:
        s, d = src[name], dst[name]
        n = int(s.shape[0])
        if n == 0:
            continue
        unit = (d.chunks or s.chunks or (1,))[0]
        per = max(1, block_bytes // (s.dtype.itemsize * unit)) * unit
        buffer = np.empty(min(per, n), s.dtype)
        for part in row_blocks(n, per):
            view = buffer[: part.stop - part.start]
            with reading(source, f"elements {part.start}..{part.stop - 1} of {s.name!r}"):
                s.read_direct(view, source_sel=np.s_[part])
            d.write_direct(view, dest_sel=np.s_[part])
            done += view.nbytes
            report("writing", done)
