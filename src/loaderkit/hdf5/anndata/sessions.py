"""What every session file holds of a key naming a CSR group, and of the per-cell keys beside it.

``csr_sessions`` opens each file once where the dataset is constructed: the group's encoding
and shape (``loaderkit.hdf5.anndata.encoding.sparse_group``), its ``indptr`` checked against
``data``/``indices``, each session's ``var`` index (a ``genemap.VarTable``), and every other key
(``obs/<column>``, ``obsm/<name>``) as a ``labels.LabelKey``: one value per cell, a
categorical's codes mapped onto one category list shared by every file, a
``nullable-string-array``'s ``values`` read as strings with its ``mask`` held (``None`` where
it says missing), as every reader serves such keys.

Example:
    >>> csr_sessions(lambda pos: None, [], [], []) is None
    True
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from loaderkit.errors import ConfigError, HDF5FileError
from loaderkit.hdf5.anndata.csrmatrix import CSRMatrix
from loaderkit.hdf5.anndata.encoding import (
    CSRGroup,
    anndata_column,
    check_csr,
    sparse_group,
    var_names,
    var_path,
)
from loaderkit.hdf5.anndata.genemap import VarTable, VarTableBuilder
from loaderkit.hdf5.anndata.labels import LabelColumns, LabelKey
from loaderkit.hdf5.meta.inventory import inspect_session
from loaderkit.hdf5.meta.keyspecs import KeySpec, SessionRecord

__all__ = ["CSRSessions", "csr_sessions"]


@dataclass(frozen=True)
class CSRSessions:
    """What ``csr_sessions`` found: the arguments of a CSR key's reader and its parts.

    Attributes:
        records: Per session, the ``SessionRecord`` of every key in ``specs``.
        specs: The group's ``data`` and ``indices``, then the dataset of each label key.
        groups: Per session, its ``CSRGroup``.
        vars: Each session's var index (``genemap.VarTable``): whether the files share one,
            or how ``join=``/``genes=`` align them, is the reader's ``configure``'s to say.
        labels: The keys beside the matrix, in the order given (the specs after the matrix's).
        name: The matrix's name in a sample's dict.

    Example:
        >>> CSRSessions([], [], [], VarTable(None, [], []), [], "X").labels
        []
    """

    records: list[SessionRecord]
    specs: list[KeySpec]
    groups: list[CSRGroup]
    vars: VarTable
    labels: list[LabelKey]
    name: str

    @property
    def var(self) -> list[str] | None:
        """The first session's var names (``None``: it has no var index)."""
        return self.vars.var(0) if self.vars.ids else None


def csr_sessions(
    open_file: Callable[[int], Any],
    ids: Sequence[Hashable],
    paths: Sequence[str],
    specs: Sequence[KeySpec],
    *,
    identity: bool = True,
) -> CSRSessions | None:
    """What every session holds of keys naming a CSR group (and others); ``None`` without one.

    Opens each file once (``open_file(pos)``): the group's encoding and shape, its ``indptr``
    checked against ``data``/``indices`` (``check_csr``), the ``var`` index (a ``VarTable``:
    the reader's ``configure`` checks or aligns the files'), and each other key as a per-cell
    column (``obs_column``) with one row per cell. ``identity=False``: records without the local
    file's identity (``inventory.inspect_session``; files read through a cache).

    Raises:
        ConfigError: CSC or unknown encodings (``sparse_group``), two sparse keys, a
            ``sample_axis``, sessions whose key is not CSR; a
            key beside the matrix that is not one value per cell (named), has another row
            count than the matrix, or is categorical in one file and not in another.
        HDF5FileError: A damaged CSR group or categorical column (named file, row, what).
    """
    if not specs:
        return None
    found: list[CSRGroup | None] = []
    refused: list[ConfigError] = []
    at = (ids[0], paths[0])
    with open_file(0) as f:
        for s in specs:
            try:
                column = anndata_column(f, s.path)  # a per-cell column: served beside any key
                found.append(None if column else sparse_group(f.get(s.path), s.path, *at))
            except ConfigError as exc:  # a key beside a matrix says what it is below
                found.append(None)
                refused.append(exc)
    sparse = [k for k, group in enumerate(found) if group is not None]
    if not sparse:
        if refused:
            raise refused[0]
        return None
    spec = specs[sparse[0]]
    key = spec.path
    if len(sparse) > 1:
        raise ConfigError(
            f"keys {[specs[k].path for k in sparse]} are all sparse matrices; a dataset reads "
            "one sparse matrix, with per-cell keys beside it (obs/<column>, obsm/<name>). Make "
            "one dataset per matrix."
        )
    if any(s.axis != 0 for s in specs):
        raise ConfigError(
            f"key {key!r} is a CSR matrix: its rows lie along axis 0; pass it without sample_axis."
        )
    others = [s for k, s in enumerate(specs) if k != sparse[0]]
    records: list[SessionRecord] = []
    groups: list[CSRGroup] = []
    columns = LabelColumns(others, every=True)
    var_table = VarTableBuilder()
    parts: list[KeySpec] = []
    for pos, (sid, path) in enumerate(zip(ids, paths, strict=True)):
        with open_file(pos) as f:
            group = _group(f, key, sid, path, ids[0], paths[0])
            var_table.add(var_names(f, var_path(key)), group.n_vars)
            matrix = [  # the files' keys the matrix part reads (``CSRMatrix.keys``)
                KeySpec(spec.name, group.data),
                KeySpec(f"{spec.name}/indices", group.indices),
            ]
            parts = [*matrix, *columns.resolve(f, sid, path)]
            # a missing key: KeyError
            record, _, _ = inspect_session(f, parts, sid, path, identity=identity)
        for s, layout in zip(others, record.layouts[len(matrix) :], strict=True):
            if layout.rows != group.n_obs:
                raise ConfigError(
                    f"key {s.path!r} of session {sid!r} ({path}) has {layout.rows} rows, but "
                    f"the matrix {key!r} has {group.n_obs} cells: every key beside it holds "
                    "one row per cell (obs/<column>, obsm/<name>; var and varm hold one per "
                    "gene)."
                )
        records.append(record)
        groups.append(group)
    found_labels = columns.labels(records, ids, paths, offset=len(CSRMatrix.keys))
    labels = [label for label in found_labels if label is not None]  # every key beside it
    return CSRSessions(records, parts, groups, var_table.table(), labels, spec.name)


def _group(f: Any, key: str, sid: Hashable, path: str, sid0: Hashable, path0: str) -> CSRGroup:
    """Session ``sid``'s ``CSRGroup`` at ``key``, its ``indptr`` checked."""
    group = sparse_group(f.get(key), key, sid, path)
    if group is None:
        raise ConfigError(
            f"key {key!r} of session {sid!r} ({path}) is not a CSR matrix, but it is "
            f"in session {sid0!r} ({path0}): pass files of one encoding."
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
    return group
