"""Per-cell ``.h5ad`` columns as every reader serves them: one category list, missing values.

A key of an AnnData file that is one value per cell (``obs/<column>``, ``obs/_index``,
``obsm/<name>``) is read by the reader's own row reads from one dataset: a categorical's
``codes``, a ``nullable-string-array``'s ``values``, or the dataset itself. What turns those
rows into the values served is a ``LabelKey``, the same beside a CSR matrix
(``csrmatrix.CSRMatrix``), beside a dense matrix or embedding, or alone
(``reader.SessionReader``): a categorical's codes mapped onto one category list shared by
every file (the union, first seen first, as anndata's ``concat``), ``None`` where a
``nullable-string-array``'s mask says missing. ``LabelColumns`` finds those keys file by file
where the dataset is constructed (``sessions.csr_sessions`` and the dense inspection), and
refuses by name a key stored one way in one file and another way in the next.

Example:
    >>> key = LabelKey("y", "obs/y", ("B", "T", "NK"), (2, 2), (None, np.array([1, 2])))
    >>> import torch
    >>> part = served_parts((None, key), [(list, "x"), (list, torch.tensor([0, 1]))],
    ...                     np.array([0, 1 << ROW_BITS]), ["a", "b"], ["a.h5ad", "b.h5ad"])
    >>> part[1][1].tolist(), part[0][1]
    ([0, 2], 'x')
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np

from loaderkit.batches.contract import PLAIN, BatchMemory
from loaderkit.errors import ConfigError, HDF5FileError
from loaderkit.hdf5.anndata.encoding import (
    ObsColumn,
    anndata_column,
    obs_column,
    shared_categories,
)
from loaderkit.hdf5.meta.index import ROW_BITS, ROW_MASK
from loaderkit.hdf5.meta.keyspecs import KeySpec, SessionRecord
from loaderkit.hdf5.meta.types import Samples

__all__ = ["LabelColumns", "LabelKey", "missing_masks", "served_parts", "served_values"]


@dataclass(frozen=True)
class LabelKey:
    """A per-cell key of an ``.h5ad``: its sample name and, if categorical, its codes.

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

    def batch(
        self,
        part: tuple[Samples, Any],
        keys: np.ndarray,
        ids: Sequence[Hashable],
        paths: Sequence[str],
        memory: BatchMemory = PLAIN,
    ) -> tuple[Samples, Any]:
        """A batch of packed ``keys`` as read (samples and batch) as served.

        A categorical's codes become one int64 batch of shared codes (``shared_codes``);
        strings of a ``nullable-string-array`` are ``None`` where missing (``with_missing``);
        other keys' batches stay as they are.
        """
        if self.categories is None:
            return self.with_missing(part, keys)
        tensor, codes = memory.buffer(keys.size, (), np.dtype(np.int64))
        np.copyto(codes, np.asarray(part[1]))
        self.shared_codes(codes, keys >> ROW_BITS, keys & ROW_MASK, ids, paths)
        return functools.partial(list, codes), tensor

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

    def with_missing(self, part: tuple[Samples, Any], keys: np.ndarray) -> tuple[Samples, Any]:
        """A batch of strings (samples and list, as read) of ``keys``; ``None`` where missing."""
        if self.masks is None:
            return part
        gone = np.flatnonzero(self.missing(keys >> ROW_BITS, keys & ROW_MASK))
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


def served_parts(
    served: Sequence[LabelKey | None],
    parts: Sequence[tuple[Samples, Any]],
    keys: np.ndarray,
    ids: Sequence[Hashable],
    paths: Sequence[str],
    memory: BatchMemory = PLAIN,
) -> list[tuple[Samples, Any]]:
    """Every key's batch of packed ``keys`` (samples and batch, as read) as served.

    ``served``: per key, its ``LabelKey`` (``None``: served as read); ``memory``: where a
    categorical's codes are written.
    """
    return [
        part if label is None else label.batch(part, keys, ids, paths, memory)
        for label, part in zip(served, parts, strict=True)
    ]


def served_values(
    served: Sequence[LabelKey | None],
    keys: Iterable[int],
    values: list[Any],
    position: tuple[int, int],
    ids: Sequence[Hashable],
    paths: Sequence[str],
) -> list[Any]:
    """One row's ``values`` of keys ``keys`` as served, in place; ``position``: (session, row).

    Example:
        >>> served_values([None], [0], [3.5], (0, 7), ["a"], ["a.h5ad"])
        [3.5]
    """
    for i, k in enumerate(keys):
        label = served[k]
        if label is not None:
            where = (np.array(position[:1], np.int64), np.array(position[1:], np.int64))
            values[i] = label.value(values[i], *where, ids, paths)
    return values


class LabelColumns:
    """The per-cell anndata columns among a dataset's keys, found file by file.

    Args:
        specs: The keys to look at.
        every: Every key is a per-cell column (the keys beside a CSR matrix: a group that is
            not one value per cell is refused by name). ``False``: only keys stored with an
            anndata column encoding (``anndata.encoding.anndata_column``: categoricals, anndata
            0.7's categoricals, nullable columns, fields of anndata < 0.7's compound ``obs``)
            are; others are read as any HDF5 key.

    Example:
        >>> found = LabelColumns([KeySpec("x", "X")], every=False)
        >>> found.labels([], [], [])
        [None]
    """

    def __init__(self, specs: Sequence[KeySpec], *, every: bool) -> None:
        self.specs = list(specs)
        self.every = every
        #: Per session, per key: what it is (``None``: read as any HDF5 key).
        self.columns: list[list[ObsColumn | None]] = []
        #: Per session, per key: where a ``nullable-string-array`` is missing (``None``: nowhere).
        self.masks: list[list[np.ndarray | None]] = []
        self._first: tuple[Hashable, str] = ("", "")

    def resolve(self, f: h5py.File, sid: Hashable, path: str) -> list[KeySpec]:
        """The keys of file ``f`` (session ``sid``): each column as the dataset of its rows.

        A categorical's ``codes``, a ``nullable-string-array``'s ``values`` (its ``mask`` read
        here, once), other keys as given.

        Raises:
            ConfigError: A key stored otherwise than in the first file (a categorical in one
                file and not in the other, strings with a mask and without), or a key that is
                not one value per cell (``anndata.encoding.obs_column``).
            HDF5FileError: A damaged categorical or ``nullable-string-array`` column.
        """
        here: list[ObsColumn | None] = []
        for s in self.specs:
            if not self.every and not anndata_column(f, s.path):
                here.append(None)
                continue
            found = obs_column(f, s.path, sid, path)
            here.append(ObsColumn(s.path) if found is None else found)
        if self.columns:
            self._same_encoding(here, (sid, path))
        else:
            self._first = (sid, path)
        self.columns.append(here)
        self.masks.append([None if c is None or c.mask is None else _mask(f, c.mask) for c in here])
        return [
            s if c is None else KeySpec(s.name, c.path, s.axis)
            for s, c in zip(self.specs, here, strict=True)
        ]

    def _same_encoding(self, here: Sequence[ObsColumn | None], at: tuple[Hashable, str]) -> None:
        """``ConfigError`` where a key is stored one way in the first file and another here."""
        first = self.columns[0]
        for s, a, b in zip(self.specs, first, here, strict=True):
            a = a or ObsColumn(s.path)
            b = b or ObsColumn(s.path)
            if a.path != b.path or (a.categories is None) != (b.categories is None):
                raise ConfigError(
                    f"key {s.path!r} is {a.encoding} in session {self._first[0]!r} "
                    f"({self._first[1]}) but {b.encoding} in session {at[0]!r} ({at[1]}); pass "
                    "files that store it alike (write every file with one anndata version, a "
                    "categorical in each: `.astype('category')`)."
                )

    def labels(
        self,
        records: Sequence[SessionRecord],
        ids: Sequence[Hashable],
        paths: Sequence[str],
        offset: int = 0,
    ) -> list[LabelKey | None]:
        """Per key, its ``LabelKey`` (``None``: read as any HDF5 key), its categories shared.

        ``offset``: where the keys' layouts start in each record (2 beside a CSR matrix).

        Raises:
            ConfigError: A categorical whose codes are of another integer type in one file.
        """
        out: list[LabelKey | None] = []
        for k, spec in enumerate(self.specs):
            lists = [session[k] for session in self.columns]
            if not lists or lists[0] is None:
                out.append(None)
                continue
            masks = [m[k] for m in self.masks]
            out.append(_label(spec, k + offset, lists, records, ids, paths, masks))
        return out


def _mask(f: Any, path: str) -> np.ndarray | None:
    """A ``nullable-string-array``'s mask as bools (``None``: nothing missing)."""
    mask = np.asarray(f[path][()]).astype(bool, copy=False)
    return mask if mask.any() else None


def _label(
    spec: KeySpec,
    k: int,
    columns: Sequence[ObsColumn | None],
    records: Sequence[SessionRecord],
    ids: Sequence[Hashable],
    paths: Sequence[str],
    masks: Sequence[np.ndarray | None],
) -> LabelKey:
    """The ``LabelKey`` of a key (layout ``k`` of each record): its categories shared.

    ``masks``: per session, where a ``nullable-string-array`` is missing (``None``: nowhere).
    """
    lists = [None if c is None else c.categories for c in columns]
    if lists[0] is None:
        return LabelKey(spec.name, spec.path, masks=missing_masks(masks))
    dtypes = [rec.layouts[k].dtype for rec in records]
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
