"""The HDF5 pieces of a verified copy: objects copied as they are, one object laid out anew.

``rechunk`` writes a file's copy with its keys stored anew (a dataset row by row, or a CSR
group's values uncompressed) and everything else as it is; these are the steps both share:

* ``copy_tree``: every object and attribute of a file copied (HDF5's own object copy), links
  kept as links, except the keys, which a callback creates;
* ``create_like``: a dataset with a source's type, shape, fill value and attributes, in a new
  layout (contiguous without filters, or chunks with or without the source's filters);
* ``copy_attrs``/``same_attrs``/``same_bits``: attributes copied with their own types, and
  compared bit for bit (NaNs and -0.0 included), ``COMPARE_BYTES`` at a time;
* ``reading``: h5py's errors while reading a source, as an ``HDF5FileError`` naming the file,
  what was read and what to do.

Example:
    >>> import numpy as np
    >>> same_bits(np.array([np.nan, -0.0]), np.array([np.nan, -0.0]))
    True
    >>> list(row_blocks(5, 2))
    [slice(0, 2, None), slice(2, 4, None), slice(4, 5, None)]
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from h5py import h5d, h5s, h5z

from loaderkit.errors import HDF5FileError, LoaderkitError
from loaderkit.hdf5.meta.diagnose import hdf5_message, repair_advice

__all__ = [
    "COMPARE_BYTES",
    "copy_attrs",
    "copy_tree",
    "create_like",
    "reading",
    "row_blocks",
    "same_attrs",
    "same_bits",
]

#: Bytes ``same_bits`` compares at once: its temporaries stay this small whatever the arrays.
COMPARE_BYTES = 1 << 20


@contextlib.contextmanager
def reading(source: Path, what: str) -> Iterator[None]:
    """h5py's errors while reading ``what`` of ``source``: an ``HDF5FileError`` naming it.

    The message carries the repair advice; loaderkit's own errors and ``MemoryError`` pass.

    Example:
        >>> with reading(Path("a.h5"), "dataset 'x'"):
        ...     raise OSError("Can't read data")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        loaderkit.errors.HDF5FileError: rechunk: cannot read dataset 'x' of a.h5: the file ...
    """
    try:
        yield
    except (LoaderkitError, MemoryError):
        raise
    except Exception as exc:
        raise HDF5FileError(
            f"rechunk: cannot read {what} of {source}: the file is damaged (HDF5: "
            f"{hdf5_message(exc)}). {repair_advice(str(source))}."
        ) from exc


def row_blocks(n: int, rows_per_block: int) -> Iterator[slice]:
    """Slices of ``rows_per_block`` rows (the last shorter) covering ``range(n)``."""
    for start in range(0, n, rows_per_block):
        yield slice(start, min(n, start + rows_per_block))


def copy_attrs(source: Any, target: Any) -> None:
    """Every attribute of ``source`` onto ``target``, with its own type.

    Example:
        >>> f = h5py.File("a.h5", "w", driver="core", backing_store=False)
        >>> f.attrs.create("shape", (2, 3), dtype="i8")
        >>> copy_attrs(f, f.create_group("g"))
        >>> f["g"].attrs["shape"].dtype
        dtype('int64')
    """
    for name in source.attrs:
        value = source.attrs[name]
        if isinstance(value, h5py.Empty):
            target.attrs[name] = value
            continue
        dtype = source.attrs.get_id(name).dtype
        target.attrs.create(name, value, dtype=dtype)


def create_like(
    src: h5py.Dataset,
    group: h5py.Group,
    name: str,
    chunks: tuple[int, ...] | None,
    *,
    filters: bool = True,
) -> h5py.Dataset:
    """A dataset like ``src`` (type, shape, fill value, attributes) in a new layout.

    ``chunks=None``: contiguous, no filters, a fixed shape. Otherwise chunks of ``chunks``
    with the source's maximum shape, and its filters where ``filters`` is true.

    Example:
        >>> f = h5py.File("a.h5", "w", driver="core", backing_store=False)
        >>> x = f.create_dataset("x", (100,), "f4", chunks=(10,), compression="gzip")
        >>> y = create_like(x, f, "y", (50,), filters=False)
        >>> y.chunks, y.compression, create_like(x, f, "z", None).chunks
        ((50,), None, None)
    """
    dcpl = src.id.get_create_plist().copy()
    if chunks is None or not filters:
        dcpl.remove_filter(h5z.FILTER_ALL)
    if chunks is None:
        dcpl.set_layout(h5d.CONTIGUOUS)
        maxshape: tuple[int, ...] = tuple(src.shape)
    else:
        dcpl.set_chunk(chunks)
        maxshape = tuple(h5s.UNLIMITED if m is None else m for m in (src.maxshape or src.shape))
    space = h5s.create_simple(src.shape, maxshape)
    dsid = h5d.create(group.id, name.encode(), src.id.get_type(), space, dcpl=dcpl)
    dset = h5py.Dataset(dsid)
    copy_attrs(src, dset)
    return dset


def copy_tree(
    src: h5py.Group,
    dst: h5py.Group,
    key_paths: str | Collection[str],
    make_key: Callable[[h5py.Group, str], None],
) -> None:
    """Copy ``src`` into ``dst`` except the keys, which ``make_key`` creates; links stay links.

    ``make_key(group, name)`` is called once per key (the key is ``group.name`` + ``name``),
    in the order the source lists its members.

    Example:
        >>> f = h5py.File("a.h5", "w", driver="core", backing_store=False)
        >>> _ = f.create_dataset("a/x", data=[1, 2]); _ = f.create_dataset("a/y", data=[3])
        >>> _ = f.create_dataset("z", data=[4])
        >>> g = h5py.File("b.h5", "w", driver="core", backing_store=False)
        >>> copy_tree(f, g, ["a/x", "/z"], lambda group, name: group.create_group(name))
        >>> type(g["a/x"]).__name__, type(g["z"]).__name__, g["a/y"][0]
        ('Group', 'Group', np.int64(3))
    """
    keys = [key_paths] if isinstance(key_paths, str) else list(key_paths)
    heads = [key.strip("/").partition("/") for key in keys]
    copy_attrs(src, dst)
    for name in src:
        link = src.get(name, getlink=True)
        if isinstance(link, h5py.SoftLink):
            dst[name] = h5py.SoftLink(link.path)
            continue
        if isinstance(link, h5py.ExternalLink):
            dst[name] = h5py.ExternalLink(link.filename, link.path)
            continue
        inside = [rest for head, _, rest in heads if head == name]
        if "" in inside:
            make_key(dst, name)
        elif inside:
            copy_tree(src[name], dst.create_group(name), inside, make_key)
        else:
            src.copy(src[name], dst, name=name)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit (NaNs and -0.0 included); element by element for variable-length data.

    C-contiguous arrays are compared ``COMPARE_BYTES`` at a time, with no copy of either.
    """
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.hasobject:
        return all(
            np.array_equal(np.asarray(x), np.asarray(y))
            for x, y in zip(a.reshape(-1), b.reshape(-1), strict=True)
        )
    if not a.size:
        return True
    left = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    right = np.ascontiguousarray(b).reshape(-1).view(np.uint8)
    return all(
        np.array_equal(left[i : i + COMPARE_BYTES], right[i : i + COMPARE_BYTES])
        for i in range(0, left.shape[0], COMPARE_BYTES)
    )


def same_attrs(a: Any, b: Any) -> bool:
    """Whether two objects hold the same attributes, values bit for bit."""
    if sorted(a.attrs) != sorted(b.attrs):
        return False
    for name in a.attrs:
        x, y = a.attrs[name], b.attrs[name]
        if isinstance(x, h5py.Empty) or isinstance(y, h5py.Empty):
            if not (isinstance(x, h5py.Empty) and isinstance(y, h5py.Empty)):
                return False
            continue
        if not same_bits(np.asarray(x), np.asarray(y)):
            return False
    return True
