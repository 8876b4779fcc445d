"""Compression filters: is every filter a dataset needs available in this process?

HDF5 reports a missing filter only when a chunk is read, as an ``OSError`` about the plugin
directory. ``check_filters`` asks HDF5's filter registry (``H5Zfilter_avail``) for every filter
in a dataset's pipeline at construction instead, and names the filter, its id and the package
that provides it. ``hdf5plugin`` (imported by ``loaderkit.hdf5.dataset.dataset`` when installed)
registers the common third-party filters in every process that imports loaderkit.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import NamedTuple

import h5py
from h5py import h5z

from loaderkit.errors import HDF5FileError

__all__ = [
    "Filter",
    "check_available",
    "check_filters",
    "fletcher_damage",
    "needed_filters",
    "pipeline",
]

#: Registered HDF5 filter ids: (name, where to get it). Ids from the HDF Group's registry.
KNOWN_FILTERS: dict[int, tuple[str, str]] = {
    1: ("deflate (gzip)", "built into HDF5"),
    2: ("shuffle", "built into HDF5"),
    3: ("fletcher32", "built into HDF5"),
    4: ("szip", "an HDF5 (and h5py) built with szip/libaec"),
    5: ("nbit", "built into HDF5"),
    6: ("scaleoffset", "built into HDF5"),
    305: ("LZO", "no maintained plugin: rewrite the file with another filter (e.g. h5repack)"),
    307: ("bzip2", "`pip install hdf5plugin`"),
    32000: ("LZF", "`pip install hdf5plugin` (or h5py built with LZF)"),
    32001: ("Blosc", "`pip install hdf5plugin`"),
    32004: ("LZ4", "`pip install hdf5plugin`"),
    32008: ("bitshuffle", "`pip install hdf5plugin`"),
    32013: ("ZFP", "`pip install hdf5plugin`"),
    32015: ("Zstandard", "`pip install hdf5plugin`"),
    32017: ("SZ", "`pip install hdf5plugin`"),
    32018: ("FCIDECOMP", "`pip install hdf5plugin`"),
    32024: ("SZ3", "`pip install hdf5plugin`"),
    32026: ("Blosc2", "`pip install hdf5plugin`"),
    32028: ("SPERR", "`pip install hdf5plugin`"),
}


class Filter(NamedTuple):
    """One filter of a dataset's pipeline.

    Attributes:
        id: The HDF5 filter id.
        name: Its name (as the file records it, else the registry's).
        optional: Whether HDF5 may skip it where it fails (``H5Z_FLAG_OPTIONAL``).

    Example:
        >>> Filter(32001, "blosc", False).id
        32001
    """

    id: int
    name: str
    optional: bool


def pipeline(dset: h5py.Dataset) -> list[Filter]:
    """The filters of ``dset``'s pipeline, in order (empty for contiguous or compact data).

    Example:
        >>> import h5py, numpy as np, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "f.h5")
        >>> with h5py.File(path, "w") as f:
        ...     d = f.create_dataset("x", data=np.zeros(8), chunks=(4,), compression="gzip")
        ...     pipeline(d)[0].id, len(pipeline(d))
        (1, 1)
    """
    dcpl = dset.id.get_create_plist()
    out = []
    for k in range(dcpl.get_nfilters()):
        code, flags, _values, name = dcpl.get_filter(k)
        text = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
        known = KNOWN_FILTERS.get(int(code), (f"filter {int(code)}", ""))[0]
        out.append(Filter(int(code), text or known, bool(flags & h5z.FLAG_OPTIONAL)))
    return out


def _applied(dset: h5py.Dataset, k: int) -> bool:
    """Whether the ``k``-th filter was applied to the first written chunk (optional filters)."""
    try:
        if dset.id.get_num_chunks() == 0:
            return False
        return not dset.id.get_chunk_info(0).filter_mask & (1 << k)
    except Exception:  # no chunk index to ask: assume it was applied
        return True


def needed_filters(dset: h5py.Dataset) -> tuple[Filter, ...]:
    """The filters ``dset``'s rows need: its pipeline, less optional filters never applied.

    What a dataset's metadata record keeps, so that a later construction that reads no file
    (``loaderkit.hdf5.remote.remotemeta``) still checks them (``check_available``).

    Example:
        >>> import h5py, numpy as np, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "n.h5")
        >>> with h5py.File(path, "w") as f:
        ...     d = f.create_dataset("x", data=np.zeros(8), chunks=(4,), compression="gzip")
        ...     [flt.id for flt in needed_filters(d)]
        [1]
    """
    return tuple(
        flt for k, flt in enumerate(pipeline(dset)) if not flt.optional or _applied(dset, k)
    )


def check_available(filters: Iterable[Filter], *, key: str, session: Hashable, path: str) -> None:
    """Raise ``HDF5FileError`` if one of ``filters`` (as ``needed_filters`` gave) is missing here.

    Args:
        filters: The filters the dataset's rows need.
        key: Its name (for the message).
        session: Session id (for the message).
        path: File path or URL (for the message).

    Raises:
        HDF5FileError: Names the filter, its id, the session, the file and where to get it.

    Example:
        >>> check_available([Filter(1, "deflate", False)], key="x", session=0, path="s.h5")
    """
    for flt in filters:
        if h5z.filter_avail(flt.id):
            continue
        name, source = KNOWN_FILTERS.get(flt.id, (flt.name, ""))
        where = (
            f"Install it: {source}."
            if source
            else "No package is known for it: ask the file's author which filter wrote it, "
            "and set HDF5_PLUGIN_PATH to a directory holding its plugin."
        )
        raise HDF5FileError(
            f"session {session!r}: dataset {key!r} in {path} is compressed with the {name} "
            f"filter (HDF5 filter id {flt.id}; the file calls it {flt.name!r}), which is not "
            f"available in this process, so no row can be read. {where}"
        )


def check_filters(dset: h5py.Dataset, *, key: str, session: Hashable, path: str) -> None:
    """Raise ``HDF5FileError`` if a filter ``dset`` needs is not available in this process.

    An optional filter is needed only where it was applied (checked on the first chunk).

    Args:
        dset: The dataset.
        key: Its name (for the message).
        session: Session id (for the message).
        path: File path (for the message).

    Raises:
        HDF5FileError: Names the filter, its id, the session, the file and where to get it.

    Example:
        >>> import h5py, numpy as np, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "g.h5")
        >>> with h5py.File(path, "w") as f:
        ...     d = f.create_dataset("x", data=np.zeros(8), chunks=(4,), compression="gzip")
        ...     check_filters(d, key="x", session=0, path=path)  # gzip is always there
    """
    check_available(needed_filters(dset), key=key, session=session, path=path)


def fletcher_damage(dset: h5py.Dataset, axis: int, rows: range) -> str:
    """Which chunks among ``rows`` fail their Fletcher-32 checksum, as a cause ("": none).

    Each chunk holding one of ``rows`` is read on its own; the ones that fail are named by
    their row spans. Datasets without the Fletcher-32 filter give "".
    """
    if not any(flt.id == 3 for flt in pipeline(dset)):
        return ""
    chunk = dset.chunks[axis] if dset.chunks else 1
    bad = []
    start = rows.start // chunk * chunk
    while start <= rows[-1]:
        stop = min(start + chunk, dset.shape[axis])
        try:
            dset[(slice(None),) * axis + (slice(start, stop),)]
        except Exception:  # h5py raises OSError, damaged chunk indexes other errors
            bad.append(f"rows {start}..{stop - 1}")
        start = stop
    if not bad:
        return ""
    return (
        f"Fletcher-32 checksum mismatch: the chunk(s) holding {', '.join(bad)} are damaged "
        "(the file's bytes differ from what was written); the other rows read correctly"
    )
