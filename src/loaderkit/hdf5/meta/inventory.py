"""What a dataset reads from each file: its keys, and what every session file holds of them.

``parse_keys`` normalises ``key=`` (one name, several names, or a mapping name -> path) and
``sample_axis`` into ``KeySpec``s. ``inspect_session`` reads one open file's keys once, at
construction: layout (rows, row shape, dtype, chunking), the file's identity, the names of a
group's per-sample datasets, and filter availability. ``row_types`` turns the records of all
sessions into one ``RowType`` per key, refusing types no torch dtype holds, and
``check_aligned`` checks that several keys have the same rows in every session.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import h5py
import numpy as np

from loaderkit.errors import ConfigError, HDF5FileError, check_int
from loaderkit.hdf5.meta.diagnose import identity_of, metadata_errors, missing_sources
from loaderkit.hdf5.meta.filters import check_filters
from loaderkit.hdf5.meta.keyspecs import KeySpec, SessionRecord
from loaderkit.hdf5.meta.layout import (
    SessionLayout,
    check_same_rows,
    dataset_at,
    describe_layout,
    open_object,
)
from loaderkit.hdf5.meta.types import RowType, row_type, struct_of, where

__all__ = [
    "check_aligned",
    "check_rows",
    "check_sources",
    "inspect_session",
    "parse_keys",
    "row_types",
    "sample_type",
]


def parse_keys(key: Any, sample_axis: Any) -> list[KeySpec] | None:
    """``KeySpec``s of ``key`` (``None``: find the only dataset of the first file).

    Args:
        key: ``None``, a dataset path, a sequence of paths, or a mapping name -> path.
        sample_axis: The axis samples lie along in every key (negative counts from the end;
            resolved per file by ``inspect_session``).

    Returns:
        One spec per key, or ``None``.

    Raises:
        ConfigError: A key that is not a string, no keys, or a name given twice.

    Example:
        >>> [(s.name, s.path) for s in parse_keys({"x": "data/betas", "y": "labels"}, 0)]
        [('x', 'data/betas'), ('y', 'labels')]
    """
    axis = check_int("sample_axis", sample_axis)
    if key is None:
        return None
    if isinstance(key, str):
        pairs = [(key, key)]
    elif isinstance(key, Mapping):
        pairs = list(key.items())
    elif isinstance(key, Sequence) and not isinstance(key, bytes):
        pairs = [(k, k) for k in key]
    else:
        raise ConfigError(
            f"key must be a dataset name, a tuple/list of names or a mapping name -> dataset "
            f"path, got {type(key).__name__} {key!r}."
        )
    if not pairs:
        raise ConfigError("key is empty: name at least one HDF5 dataset.")
    for name, path in pairs:
        if not isinstance(name, str) or not isinstance(path, str) or not path:
            raise ConfigError(
                f"key: names and dataset paths must be strings, got {name!r}: {path!r}."
            )
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names):
        raise ConfigError(f"key names a sample field twice: {names}.")
    return [KeySpec(name, path, axis) for name, path in pairs]


def _axis(spec: KeySpec, ndim: int, session: Hashable, path: str) -> int:
    axis = spec.axis + ndim if spec.axis < 0 else spec.axis
    if not 0 <= axis < ndim:
        raise ConfigError(
            f"sample_axis={spec.axis}: dataset {spec.path!r} in {path} (session {session!r}) "
            f"has {ndim} axes. Pass the axis that indexes samples."
        )
    return axis


def inspect_session(
    f: h5py.File,
    specs: Sequence[KeySpec],
    session: Hashable,
    path: str,
    *,
    identity: bool = True,
) -> tuple[SessionRecord, list[KeySpec], list[bool]]:
    """What session file ``f`` holds of every key: its ``SessionRecord``.

    A key that names a group has one sample per dataset in it (in the order h5py lists them),
    all of one dtype. Every filter a key's data needs is checked for availability.

    Args:
        f: The open file.
        specs: The keys (``axis`` may be negative here).
        session: Session id (for messages).
        path: File path (for messages).
        identity: Record the local file's ``Identity`` (``False`` for a file read through a
            cache: the store's identity keys the cached copy, whose own differs).

    Returns:
        The record, the specs resolved for this file (non-negative axis, ``members`` set for
        groups), and per key whether a group's datasets differ in shape.

    Raises:
        MissingKeyError: A key is missing (a ``KeyError``; the message lists the datasets
            present).
        ConfigError: A bad axis, an empty group, or a group whose datasets differ in dtype.
        HDF5FileError: A filter the data needs is not available, or HDF5 cannot read a key's
            metadata (the file is damaged; the message names the object and what to do).
    """
    found = None
    if identity:
        with metadata_errors(session, path, "the file"):
            fd = f.id.get_vfd_handle() if f.driver == "sec2" else None
            found = identity_of(fd if isinstance(fd, int) and fd >= 0 else path)
    layouts: list[SessionLayout] = []
    members: list[tuple[str, ...] | None] = []
    resolved: list[KeySpec] = []
    uneven: list[bool] = []
    for spec in specs:
        with metadata_errors(session, path, f"dataset {spec.path!r}"):
            obj = open_object(f, spec.path)
            if isinstance(obj, h5py.Group):
                layout, names, odd = _group_layout(obj, spec, session, path)
                layouts.append(layout)
                members.append(names)
                resolved.append(KeySpec(spec.name, spec.path, 0, members=True))
                uneven.append(odd)
                continue
            dset = dataset_at(f, spec.path, session, path)
            axis = _axis(spec, len(dset.shape or ()), session, path)
            layouts.append(describe_layout(f, spec.path, session, path, axis=axis))
            check_filters(dset, key=spec.path, session=session, path=path)
            check_sources(dset, spec.path, session, path)
            members.append(None)
            resolved.append(KeySpec(spec.name, spec.path, axis))
            uneven.append(False)
    return SessionRecord(found, tuple(layouts), tuple(members)), resolved, uneven


def check_sources(dset: h5py.Dataset, key: str, session: Hashable, path: str) -> None:
    """``HDF5FileError`` when a virtual dataset's source files are missing.

    HDF5 reads the rows of a missing source as the fill value, without an error.

    Raises:
        HDF5FileError: Names the key, the session, the file and the missing sources.
    """
    missing = missing_sources(dset, path)
    if missing:
        raise HDF5FileError(
            f"session {session!r}: {key!r} in {path} is a virtual dataset whose source files "
            f"{missing} do not exist; HDF5 would read their rows as the fill value. Put the "
            "source files beside the virtual dataset's file (or set HDF5_VDS_PREFIX)."
        )


def _group_layout(
    group: h5py.Group, spec: KeySpec, session: Hashable, path: str
) -> tuple[SessionLayout, tuple[str, ...], bool]:
    names = tuple(n for n in group if group.get(n, getclass=True) is h5py.Dataset)
    if not names:
        raise ConfigError(
            f"key {spec.path!r} of session {session!r} ({path}) is a group without datasets; "
            "a group key reads one sample per dataset in it."
        )
    first = group[names[0]]
    check_filters(first, key=f"{spec.path}/{names[0]}", session=session, path=path)
    shapes = set()
    for name in names:
        member = group[name]
        if _comparable(member.dtype) != _comparable(first.dtype):
            raise ConfigError(
                f"key {spec.path!r} of session {session!r} ({path}): datasets {names[0]!r} "
                f"({first.dtype}) and {name!r} ({member.dtype}) differ in dtype; every "
                "dataset of a group key is one sample of one type."
            )
        shapes.add(member.shape)
    layout = SessionLayout(len(names), tuple(first.shape), first.dtype, None, None, ())
    return layout, names, len(shapes) > 1


def _comparable(dtype: np.dtype) -> np.dtype:
    """``dtype`` in native byte order where it is a plain number (byte order is converted)."""
    return dtype.newbyteorder("=") if dtype.kind in "biufc" and dtype.fields is None else dtype


def row_types(
    records: Sequence[SessionRecord],
    specs: Sequence[KeySpec],
    fields: Sequence[str] | None,
    files: Sequence[tuple[Hashable, str]],
    open_file: Any,
    known: Mapping[tuple[int, int], RowType | Exception] | None = None,
) -> list[RowType]:
    """One ``RowType`` per key, from the first session holding rows of it.

    Args:
        records: Every session's record.
        specs: The resolved keys.
        fields: Compound fields to read (single key only).
        files: ``(session id, path)`` per session.
        open_file: ``open_file(pos)`` opens session ``pos``'s file for inspection.
        known: ``(pos, key) -> RowType`` (or the error it raised) already found, as for
            remote sessions whose metadata is kept in the cache: those files are not opened.

    Returns:
        The row types.

    Raises:
        ConfigError: A type with no torch dtype, or ``fields`` that do not fit.
        HDF5FileError: HDF5 cannot read a key's type (damaged metadata).
    """
    if fields is not None and len(specs) != 1:
        raise ConfigError(
            "fields= selects fields of one compound dataset; with several keys, name "
            "compound fields through a mapping key instead, or read them all."
        )
    types = []
    for k, spec in enumerate(specs):
        pos = next((p for p, rec in enumerate(records) if rec.layouts[k].rows), 0)
        layout = records[pos].layouts[k]
        sid, path = files[pos]
        found = (known or {}).get((pos, k))
        if isinstance(found, Exception):
            raise found
        if found is not None:
            types.append(found)
            continue
        with open_file(pos) as f, metadata_errors(sid, path, f"the type of {spec.path!r}"):
            obj = f[spec.path]
            if spec.members:
                names = records[pos].members[k]
                assert names is not None
                obj = obj[names[0]]
            shape = layout.row_shape
            types.append(
                row_type(
                    obj,
                    fields=fields,
                    row_shape=shape,
                    where=where(spec.path, sid, path),
                    path=path,
                )
            )
    return types


def sample_type(types: Sequence[RowType], specs: Sequence[KeySpec]) -> RowType:
    """The type of a whole sample: the one key's, or a dict of every key's.

    Example:
        >>> from loaderkit.hdf5.meta.types import Kind
        >>> rt = RowType(Kind.TEXT, np.dtype("S2"), ())
        >>> sample_type([rt], [KeySpec("x", "x")]) is rt
        True
    """
    if len(specs) == 1:
        return types[0]
    return struct_of([(spec.name, rt) for spec, rt in zip(specs, types, strict=True)])


def check_aligned(
    records: Sequence[SessionRecord],
    specs: Sequence[KeySpec],
    files: Sequence[tuple[Hashable, str]],
) -> None:
    """``ConfigError`` unless every key has the same number of rows in each session.

    Raises:
        ConfigError: Names the session, its file and every key's row count.
    """
    if len(specs) < 2:
        return
    for (sid, path), rec in zip(files, records, strict=True):
        counts = {spec.name: lay.rows for spec, lay in zip(specs, rec.layouts, strict=True)}
        if len(set(counts.values())) > 1:
            raise ConfigError(
                f"session {sid!r} ({path}): the keys have different numbers of rows {counts}; "
                "a sample takes row i of every key, so their rows must align. Fix the file, "
                "or read the keys with separate datasets."
            )


def check_rows(
    records: Sequence[SessionRecord],
    specs: Sequence[KeySpec],
    files: Sequence[tuple[Hashable, str]],
) -> None:
    """``ConfigError`` unless each key has one row shape and dtype in every session."""
    ids = [sid for sid, _ in files]
    paths = [path for _, path in files]
    for k, spec in enumerate(specs):
        if spec.members:
            continue
        check_same_rows([rec.layouts[k] for rec in records], spec.path, ids, paths)
