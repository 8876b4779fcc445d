"""What every session file holds of a key naming a CSR group: the inspection ``CSRReader`` needs.

``csr_sessions`` opens each file once where the dataset is constructed: the group's encoding
and shape (``loaderkit.hdf5.meta.anndata.sparse_group``), its ``indptr`` checked against
``data``/``indices``, and the ``var`` index every session must share.

Example:
    >>> csr_sessions(lambda pos: None, [], [], []) is None
    True
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from loaderkit.errors import ConfigError, HDF5FileError
from loaderkit.hdf5.meta.anndata import (
    CSRGroup,
    check_csr,
    sparse_group,
    var_difference,
    var_names,
    var_path,
)
from loaderkit.hdf5.meta.inventory import inspect_session
from loaderkit.hdf5.meta.keyspecs import KeySpec, SessionRecord

__all__ = ["csr_sessions"]


def csr_sessions(
    open_file: Callable[[int], Any],
    ids: Sequence[Hashable],
    paths: Sequence[str],
    specs: Sequence[KeySpec],
) -> tuple[list[SessionRecord], list[KeySpec], list[CSRGroup], list[str] | None] | None:
    """What every session holds of a key naming a CSR group; ``None`` for any other key.

    Opens each file once (``open_file(pos)``): the group's encoding and shape, its ``indptr``
    checked against ``data``/``indices`` (``check_csr``), and the ``var`` index, which every
    session must share (names and order).

    Returns:
        ``(records, specs, groups, var)``: per session the ``SessionRecord`` of the group's
        ``data`` and ``indices`` (the two keys ``specs``), its ``CSRGroup``, and the shared
        var names (``None`` when the files have no ``var`` index).

    Raises:
        ConfigError: CSC or unknown encodings (``sparse_group``), a CSR key with other keys
            or a ``sample_axis``, sessions whose key is not CSR or whose var index differs.
        HDF5FileError: A damaged CSR group (named file, row and what is wrong).
    """
    if not specs:
        return None
    with open_file(0) as f:
        found = [sparse_group(f.get(s.path), s.path, ids[0], paths[0]) for s in specs]
    if all(group is None for group in found):
        return None
    key = next(s.path for s, group in zip(specs, found, strict=True) if group is not None)
    if len(specs) > 1 or specs[0].axis != 0:
        raise ConfigError(
            f"key {key!r} is a CSR matrix: it is read on its own, rows along axis 0, for now "
            "(pass key=" + repr(key) + " without other keys or sample_axis)."
        )
    spec = specs[0]
    records: list[SessionRecord] = []
    groups: list[CSRGroup] = []
    var: list[str] | None = None
    parts: list[KeySpec] = []
    for pos, (sid, path) in enumerate(zip(ids, paths, strict=True)):
        with open_file(pos) as f:
            group = sparse_group(f.get(key), key, sid, path)
            if group is None:
                raise ConfigError(
                    f"key {key!r} of session {sid!r} ({path}) is not a CSR matrix, but it is "
                    f"in session {ids[0]!r} ({paths[0]}): pass files of one encoding."
                )
            data, indices = f[group.data], f[group.indices]
            if indices.dtype.kind not in "iu" or data.ndim != 1 or indices.ndim != 1:
                raise HDF5FileError(
                    f"key {key!r} of session {sid!r} ({path}): 'data' {data.shape} and "
                    f"'indices' {indices.shape} ({indices.dtype}) are not 1-D values and "
                    "integer column ids; the CSR group is damaged. Write the file again."
                )
            indptr = np.asarray(f[group.indptr][()], np.int64)
            check_csr(group, indptr, data.shape[0], indices.shape[0], sid, path)
            del indptr
            names = var_names(f, var_path(key))
            if pos == 0:
                var = names
            how = _var_differs(var, names, group, groups[0] if groups else group)
            if how is not None:
                raise ConfigError(
                    f"session {sid!r} ({path}): its var index ({var_path(key)!r}) differs from "
                    f"session {ids[0]!r}'s ({paths[0]}): {how}. Every file's columns must be "
                    "the same genes in the same order: subset or reorder them when writing "
                    "(adata[:, genes].write_h5ad), or pass files of one var index."
                )
            parts = [KeySpec(spec.name, group.data), KeySpec(f"{spec.name}/indices", group.indices)]
            record, _, _ = inspect_session(f, parts, sid, path)
        records.append(record)
        groups.append(group)
    return records, parts, groups, var


def _var_differs(
    first: list[str] | None, names: list[str] | None, group: CSRGroup, first_group: CSRGroup
) -> str | None:
    """How a session's columns differ from the first session's, or ``None``."""
    if first is not None and names is not None:
        return var_difference(first, names)
    if group.n_vars != first_group.n_vars:
        return f"it has {group.n_vars} columns where the first file has {first_group.n_vars}"
    if (first is None) != (names is None):
        return "one of the two files has no var index"
    return None
