"""What every session file holds of a key naming a CSR group, and of the per-cell keys beside it.

``csr_sessions`` opens each file once where the dataset is constructed: the group's encoding
and shape (``loaderkit.hdf5.meta.anndata.sparse_group``), its ``indptr`` checked against
``data``/``indices``, each session's ``var`` index (a ``genemap.VarTable``), and every other key
(``obs/<column>``, ``obsm/<name>``) as a ``LabelKey``: one value per cell, a categorical's
codes mapped onto one category list shared by every file, a ``nullable-string-array``'s
``values`` read as strings with its ``mask`` held (``None`` where it says missing).

Example:
    >>> csr_sessions(lambda pos: None, [], [], []) is None
    True
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from loaderkit.errors import ConfigError, HDF5FileError
from loaderkit.hdf5.meta.anndata import (
    CSRGroup,
    ObsColumn,
    check_csr,
    obs_column,
    shared_categories,
    sparse_group,
    var_names,
    var_path,
)
from loaderkit.hdf5.meta.inventory import inspect_session
from loaderkit.hdf5.meta.keyspecs import KeySpec, SessionRecord
from loaderkit.hdf5.meta.types import Samples
from loaderkit.hdf5.read.genemap import VarTable, VarTableBuilder

__all__ = ["CSRSessions", "LabelKey", "csr_sessions", "missing_masks"]


@dataclass(frozen=True)
class LabelKey:
    """A per-cell key read beside a CSR matrix: its sample name and, if categorical, its codes.

    Attributes:
        name: Its name in a sample's dict.
        path: The key as given (``"obs/cell_type"``), for messages.
        categories: The category names every session's codes are mapped onto (the union of
            the files' lists, first seen first); ``None``: values served as stored.
        sizes: Per session, how many categories its own list holds (a larger code is damage).
        tables: Per session, ``table[code]`` is the shared code; ``None``: its codes stay.
        masks: A ``nullable-string-array``'s missing cells (``missing_masks``): every
            session's mask packed to bits, back to back, and per session where its bits
            start (-1: nothing missing there); ``None``: no value is missing.

    Example:
        >>> key = LabelKey("y", "obs/y", ("B", "T", "NK"), (2, 2), (None, np.array([1, 2])))
        >>> key.shared_codes(np.array([0, 1, -1, 1]), np.array([0, 1, 1, 0]),
        ...                  np.arange(4), ["a", "b"], ["a.h5ad", "b.h5ad"]).tolist()
        [0, 2, -1, 1]
        >>> donor = LabelKey("d", "obs/d", masks=missing_masks([None, np.array([0, 1], bool)]))
        >>> donor.missing(np.array([0, 1, 1]), np.array([1, 0, 1])).tolist()
        [False, False, True]
    """

    name: str
    path: str
    categories: tuple[str, ...] | None = None
    sizes: tuple[int, ...] = ()
    tables: tuple[np.ndarray | None, ...] = ()
    masks: tuple[np.ndarray, np.ndarray] | None = None

    def value(
        self,
        value: Any,
        positions: np.ndarray,
        rows: np.ndarray,
        ids: Sequence[Hashable],
        paths: Sequence[str],
    ) -> Any:
        """One row's ``value`` as served: a categorical's shared code (``numpy.int64``).

        ``positions`` and ``rows`` hold the row's session position and row (one each); a
        missing value of a ``nullable-string-array`` is ``None``.
        """
        if self.categories is None:
            if self.masks is not None and self.missing(positions, rows)[0]:
                return None
            return value
        return self.shared_codes(np.array([value], np.int64), positions, rows, ids, paths)[0]

    def missing(self, positions: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Whether each of ``rows`` (of sessions ``positions``) is missing: a bool array."""
        out = np.zeros(rows.size, bool)
        if self.masks is None:
            return out
        bits, starts = self.masks
        start = starts[positions]
        has = start >= 0
        at = rows[has]
        out[has] = (bits[start[has] + (at >> 3)] >> (7 - (at & 7))) & 1
        return out

    def with_missing(
        self, part: tuple[Samples, Any], positions: np.ndarray, rows: np.ndarray
    ) -> tuple[Samples, Any]:
        """A batch of strings (samples and list, as read) with ``None`` where missing."""
        if self.masks is None:
            return part
        gone = np.flatnonzero(self.missing(positions, rows))
        if not gone.size:
            return part
        texts = list(part[1])
        for i in gone.tolist():
            texts[i] = None
        return functools.partial(list, texts), list(texts)

    def shared_codes(
        self,
        codes: np.ndarray,
        positions: np.ndarray,
        rows: np.ndarray,
        ids: Sequence[Hashable],
        paths: Sequence[str],
    ) -> np.ndarray:
        """``codes`` (int64, read from sessions ``positions``) as codes of ``categories``, in place.

        -1 (missing) stays -1.

        Raises:
            HDF5FileError: A code below -1 or past its session's list, naming the file and row.
        """
        sizes = np.asarray(self.sizes, np.int64)[positions]
        bad = np.flatnonzero((codes < -1) | (codes >= sizes))
        if bad.size:
            i = int(bad[0])
            p = int(positions[i])
            raise HDF5FileError(
                f"session {ids[p]!r} ({paths[p]}), key {self.path!r}: row {int(rows[i])} holds "
                f"category code {int(codes[i])}, outside -1..{self.sizes[p] - 1} (the file's "
                f"{self.sizes[p]} categories); the column is damaged, so the row was not "
                "returned. Write the file again (anndata's write_h5ad)."
            )
        if not any(table is not None for table in self.tables):
            return codes
        starts = np.zeros(len(self.sizes) + 1, np.int64)
        np.cumsum(self.sizes, out=starts[1:])
        flat = np.concatenate(
            [
                np.arange(n, dtype=np.int64) if table is None else table
                for n, table in zip(self.sizes, self.tables, strict=True)
            ]
        )
        known = codes >= 0
        codes[known] = flat[starts[positions[known]] + codes[known]]
        return codes


@dataclass(frozen=True)
class CSRSessions:
    """What ``csr_sessions`` found: the ``CSRReader``'s arguments.

    Attributes:
        records: Per session, the ``SessionRecord`` of every key in ``specs``.
        specs: The group's ``data`` and ``indices``, then the dataset of each label key.
        groups: Per session, its ``CSRGroup``.
        vars: Each session's var index (``genemap.VarTable``): whether the files share one,
            or how ``join=``/``genes=`` align them, is the reader's ``configure``'s to say.
        labels: The keys beside the matrix, in the order given (``specs[2:]``).
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
    with open_file(0) as f:
        for s in specs:
            try:
                found.append(sparse_group(f.get(s.path), s.path, ids[0], paths[0]))
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
    columns: list[list[ObsColumn]] = []
    masks: list[list[np.ndarray | None]] = []  # per session, per key: True where missing
    var_table = VarTableBuilder()
    parts: list[KeySpec] = []
    for pos, (sid, path) in enumerate(zip(ids, paths, strict=True)):
        with open_file(pos) as f:
            group = _group(f, key, sid, path, ids[0], paths[0])
            var_table.add(var_names(f, var_path(key)), group.n_vars)
            found_columns = [obs_column(f, s.path, sid, path) for s in others]
            here = [
                c if c is not None else ObsColumn(s.path)
                for s, c in zip(others, found_columns, strict=True)
            ]
            masks.append([None if c.mask is None else _mask(f, c.mask) for c in here])
            parts = [KeySpec(spec.name, group.data), KeySpec(f"{spec.name}/indices", group.indices)]
            parts += [KeySpec(s.name, c.path) for s, c in zip(others, here, strict=True)]
            if columns:
                _same_encoding(others, columns[0], here, (ids[0], paths[0]), (sid, path))
            # a missing key: KeyError
            record, _, _ = inspect_session(f, parts, sid, path, identity=identity)
        for s, layout in zip(others, record.layouts[2:], strict=True):
            if layout.rows != group.n_obs:
                raise ConfigError(
                    f"key {s.path!r} of session {sid!r} ({path}) has {layout.rows} rows, but "
                    f"the matrix {key!r} has {group.n_obs} cells: every key beside it holds "
                    "one row per cell (obs/<column>, obsm/<name>; var and varm hold one per "
                    "gene)."
                )
        records.append(record)
        groups.append(group)
        columns.append(here)
    labels = [
        _label(s, k, columns, records, ids, paths, [m[k] for m in masks])
        for k, s in enumerate(others)
    ]
    return CSRSessions(records, parts, groups, var_table.table(), labels, spec.name)


def _mask(f: Any, path: str) -> np.ndarray | None:
    """A ``nullable-string-array``'s mask as bools (``None``: nothing missing)."""
    mask = np.asarray(f[path][()]).astype(bool, copy=False)
    return mask if mask.any() else None


def missing_masks(masks: Sequence[np.ndarray | None]) -> tuple[np.ndarray, np.ndarray] | None:
    """Per-session masks (True: missing; ``None``: none) as ``LabelKey.masks``.

    Only sessions with a missing value keep bits (one per cell); ``None`` when none has one.

    Example:
        >>> bits, starts = missing_masks([None, np.array([1, 0, 0, 0, 0, 0, 0, 0, 1], bool)])
        >>> bits.tolist(), starts.tolist()
        ([128, 128], [-1, 0])
    """
    starts = np.full(len(masks), -1, np.int64)
    packed: list[np.ndarray] = []
    size = 0
    for pos, mask in enumerate(masks):
        if mask is not None and mask.any():
            starts[pos] = size
            packed.append(np.packbits(mask))
            size += packed[-1].size
    if not packed:
        return None
    return np.concatenate(packed), starts


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


def _same_encoding(
    specs: Sequence[KeySpec],
    first: Sequence[ObsColumn],
    here: Sequence[ObsColumn],
    at0: tuple[Hashable, str],
    at: tuple[Hashable, str],
) -> None:
    """``ConfigError`` where a key is stored one way in the first file and another here."""
    for s, a, b in zip(specs, first, here, strict=True):
        if a.path != b.path or (a.categories is None) != (b.categories is None):
            raise ConfigError(
                f"key {s.path!r} is {a.encoding} in session {at0[0]!r} ({at0[1]}) but "
                f"{b.encoding} in session {at[0]!r} ({at[1]}); pass files that store it "
                "alike (write every file with one anndata version, a categorical in each: "
                "`.astype('category')`)."
            )


def _label(
    spec: KeySpec,
    k: int,
    columns: Sequence[Sequence[ObsColumn]],
    records: Sequence[SessionRecord],
    ids: Sequence[Hashable],
    paths: Sequence[str],
    masks: Sequence[np.ndarray | None],
) -> LabelKey:
    """The ``LabelKey`` of extra key ``k``: its categories shared by every session.

    ``masks``: per session, where a ``nullable-string-array`` is missing (``None``: nowhere).
    """
    lists = [session[k].categories for session in columns]
    if lists[0] is None:
        return LabelKey(spec.name, spec.path, masks=missing_masks(masks))
    dtypes = [rec.layouts[k + 2].dtype for rec in records]
    other = next((p for p, dtype in enumerate(dtypes) if dtype != dtypes[0]), None)
    if other is not None:
        raise ConfigError(
            f"key {spec.path!r}: its category codes are {dtypes[0]} in session {ids[0]!r} "
            f"({paths[0]}) but {dtypes[other]} in session {ids[other]!r} ({paths[other]}) "
            "(anndata stores codes in the smallest integer type their categories fit); "
            "loaderkit reads one dtype per key. Give every file the same categories before "
            "writing (`adata.obs[col] = adata.obs[col].cat.set_categories(shared)`)."
        )
    full = [tuple(names or ()) for names in lists]
    shared, tables = shared_categories(full)
    return LabelKey(
        spec.name, spec.path, tuple(shared), tuple(len(names) for names in full), tuple(tables)
    )
