"""Which column of each file a sparse matrix's batch column is: ``join=`` and ``genes=``.

Files collected from many studies hold other genes, in other orders. ``VarTable`` keeps each
file's var index as ids into one list of names (a file whose index another file already has
shares that file's ids), so a corpus of many files costs 4 bytes a column per distinct index,
never a Python string per file and gene. ``gene_map`` turns it, with the dataset's ``join=``
and ``genes=``, into a ``GeneMap``: the served columns (``columns``), and per file one lookup
array over its own columns (a column's place among the served ones, -1 where it is left out).
``GeneMap.apply`` renumbers a batch's column ids with it, vectorised over the batch (no
per-cell Python), and gives each value once per served copy of its gene (``genes=`` naming a
gene twice serves it twice, as ``adata[:, genes]`` does).

The meanings are anndata's:

* ``join="outer"``: every gene of any file, in the order ``anndata.concat(join="outer")``
  gives (pandas' ``Index.union`` folded over the files: the names sorted, unless every file
  holds the same index, which is then kept as it is); a gene a file lacks reads 0 there.
* ``join="inner"``: the genes every file has, in the first file's order.
* ``genes=``: ``adata[:, genes]`` over the joined columns (or the files' shared columns):
  names (a name twice gives two columns), integer positions (negative from the end), or a
  boolean mask. Across files whose indexes differ, without ``join=``, only names: a name some
  file lacks reads 0 there, a name no file has is refused.

Example:
    >>> table = VarTable.build([["a", "b", "c"], ["c", "d", "a"]], [3, 3])
    >>> m = gene_map(table, "outer", None, key="X", where=["f0", "f1"])
    >>> m.var_names, m.n_out
    (['a', 'b', 'c', 'd'], 4)
    >>> import numpy as np
    >>> m.apply(np.array([1, 0]), np.array([1, 1]), np.array([1.0, 2.0]), np.array([0, 0]))[2]
    array([2, 0])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from loaderkit.errors import ConfigError
from loaderkit.hdf5.anndata.encoding import var_difference
from loaderkit.plan import counted

__all__ = ["JOINS", "GeneMap", "VarTable", "VarTableBuilder", "gene_map"]

#: The values ``join=`` takes (anndata's words); ``None`` is "the files share one var index".
JOINS = ("outer", "inner")


@dataclass(frozen=True)
class VarTable:
    """Each file's var index as ids into one list of names.

    Attributes:
        names: Every name any file holds, first seen first (``None``: no file has a var index).
        ids: Per file, its columns' ids into ``names`` (int32; files with the same index share
            one array); ``None`` per file without a var index.
        n_vars: Per file, its number of columns.

    Example:
        >>> t = VarTable.build([["x", "y"], ["x", "y"]], [2, 2])
        >>> t.names, t.ids[0] is t.ids[1], t.same()
        (['x', 'y'], True, True)
    """

    names: list[str] | None
    ids: list[np.ndarray | None]
    n_vars: list[int]

    @classmethod
    def build(cls, names: Sequence[Sequence[str] | None], n_vars: Sequence[int]) -> VarTable:
        """The table of the files' var indexes (``None`` for a file without one)."""
        builder = VarTableBuilder()
        for var, n in zip(names, n_vars, strict=True):
            builder.add(var, n)
        return builder.table()

    def same(self) -> bool:
        """Whether every file has the same columns (names and order, or count without names)."""
        first = self.ids[0] if self.ids else None
        if any((i is None) != (first is None) for i in self.ids):
            return False
        if first is None:
            return len(set(self.n_vars)) <= 1
        return all(i is first for i in self.ids)

    def var(self, pos: int) -> list[str] | None:
        """File ``pos``'s var names."""
        ids = self.ids[pos]
        return None if ids is None or self.names is None else [self.names[i] for i in ids]


class VarTableBuilder:
    """Builds a ``VarTable`` file by file, so no file's list of names outlives its turn.

    Example:
        >>> b = VarTableBuilder(); b.add(["x", "y"], 2); b.add(None, 2); b.table().ids[1] is None
        True
    """

    def __init__(self) -> None:
        self._where: dict[str, int] = {}
        self._seen: dict[bytes, np.ndarray] = {}
        self._ids: list[np.ndarray | None] = []
        self._n_vars: list[int] = []

    def add(self, var: Sequence[str] | None, n_vars: int) -> None:
        """Add the next file's var names (``None``: it has none) and its column count."""
        self._n_vars.append(int(n_vars))
        if var is None:
            self._ids.append(None)
            return
        where = self._where
        these = np.fromiter(
            (where.setdefault(name, len(where)) for name in var), np.int32, len(var)
        )
        self._ids.append(self._seen.setdefault(these.tobytes(), these))

    def table(self) -> VarTable:
        """The table of every file added."""
        names = list(self._where) if any(i is not None for i in self._ids) else None
        return VarTable(names, list(self._ids), list(self._n_vars))


@dataclass(frozen=True)
class GeneMap:
    """The served columns and, per file, where its columns go.

    Attributes:
        var_names: The joined var index (``join=``), or the files' shared one; ``None``
            without a var index (or across differing files without ``join=``).
        columns: The names of the served columns, after ``genes=`` (``None``: no var index).
        n_out: Columns served.
        n_vars: Per file, its own number of columns (column ids are checked against it).
        lut: Every distinct lookup array back to back (int32: a file column's served column,
            -1 where left out); ``None``: each file's columns are served as stored.
        offsets: Per file, where its lookup array starts in ``lut``.
        copies: Where a gene is served more than once: ``(first, count, order)`` alongside
            ``lut`` (a file column's first place in ``order`` and how many served columns it
            gives; ``order``: the served columns sorted by what they serve); else ``None``.
        drops: Whether some file column is left out (-1 in ``lut``): without, a batch keeps
            every value and is only renumbered.

    Example:
        >>> GeneMap(None, None, 3, np.array([3]), None, np.zeros(1, np.int64), None).identity
        True
    """

    var_names: list[str] | None
    columns: list[str] | None
    n_out: int
    n_vars: np.ndarray
    lut: np.ndarray | None
    offsets: np.ndarray
    copies: tuple[np.ndarray, np.ndarray, np.ndarray] | None
    drops: bool = True

    @classmethod
    def plain(cls, table: VarTable) -> GeneMap:
        """Each file's columns as stored (the first file's names): before ``configure``.

        Example:
            >>> GeneMap.plain(VarTable(["a"], [np.zeros(1, np.int32)], [1])).columns
            ['a']
        """
        names = table.var(0) if table.ids else None
        n_vars = np.asarray(table.n_vars, np.int64)
        n_out = table.n_vars[0] if table.n_vars else 0
        return cls(names, names, n_out, n_vars, None, np.zeros(n_vars.size, np.int64), None)

    @property
    def identity(self) -> bool:
        """Whether every file's columns are served as stored."""
        return self.lut is None

    def digest_parts(self) -> list[bytes]:
        """What decides the served columns, as bytes (a resumed state must have the same)."""
        if self.lut is None:
            return [str(self.n_out).encode()]
        parts = [str(self.n_out).encode(), self.lut.tobytes(), self.offsets.tobytes()]
        if self.copies is not None:
            parts += [a.tobytes() for a in self.copies]
        return parts

    def apply(
        self, pos: np.ndarray, lengths: np.ndarray, values: np.ndarray, cols: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows of files ``pos`` (``lengths``, ``values``, ``cols``) renumbered to served columns.

        A value whose column is left out is dropped; one served ``k`` times is given ``k``
        times. Column ids come back increasing only where they were and no gene is
        reordered; the caller sorts (``forms.sorted_rows``).
        """
        if self.lut is None:
            return lengths, values, cols
        narrow = self.lut.size < 2**31  # int32 ids: half the bytes to move
        at = cols.astype(np.int32 if narrow else np.int64)
        if self.offsets.any():
            at += np.repeat(self.offsets[pos].astype(at.dtype), lengths)
        if self.copies is None:
            served = self.lut[at]
            if not self.drops:  # every value kept (an outer join): renumbered in place
                return lengths, values, served.astype(cols.dtype)
            keep = served >= 0
            return _row_counts(lengths, keep), values[keep], served[keep].astype(cols.dtype)
        first, count, order = self.copies
        times = count[at]
        source = np.repeat(np.arange(at.size), times)
        within = np.arange(source.size) - np.repeat(np.cumsum(times) - times, times)
        served = order[first[at][source] + within]
        return _row_counts(lengths, times), values[source], served.astype(cols.dtype)


def _row_counts(lengths: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Per row, the sum of ``weight`` (bool or counts) over its values."""
    ends = np.zeros(weight.size + 1, np.int64)
    np.cumsum(weight, out=ends[1:])
    crow = np.zeros(lengths.size + 1, np.int64)
    np.cumsum(lengths, out=crow[1:])
    return ends[crow[1:]] - ends[crow[:-1]]


def gene_map(
    table: VarTable,
    join: str | None,
    genes: Any,
    *,
    key: str,
    where: Sequence[str],
) -> GeneMap:
    """The ``GeneMap`` of files ``table`` under ``join=`` and ``genes=``.

    Args:
        table: The files' var indexes.
        join: ``None``, ``"outer"`` or ``"inner"``.
        genes: ``None``, names, integer positions or a boolean mask.
        key: The matrix's key (for messages).
        where: Per file, how a message names it (``"session 's1' (path)"``).

    Raises:
        ConfigError: An unknown ``join``; files whose var indexes differ without ``join=``
            or ``genes=`` names; ``join=`` over files without a var index, or with a name
            twice; no gene shared under ``"inner"``; a ``genes=`` name no file has (or not
            among the inner join's), a name a file holds twice, positions out of range, a
            mask of the wrong length, or another kind of value.
    """
    if join is not None and join not in JOINS:
        raise ConfigError(
            f"join={join!r}: expected one of {list(JOINS)} (anndata.concat's words) or None."
        )
    base_names: list[str] | None
    base_of: list[np.ndarray | None]
    if join is not None:
        base_names, base_of = _joined(table, join, key, where)
    elif table.same():
        base_names = table.var(0) if table.ids else None
        base_of = [None] * len(table.ids)  # each file's columns are the base's
    else:
        chosen = _as_array(genes)
        if chosen is None or chosen.dtype.kind not in "USO":
            raise ConfigError(_differ(table, key, where))
        base_names, base_of = _named_union(table, key, where)
    n_base = len(base_names) if base_names is not None else (table.n_vars or [0])[0]
    out = _chosen(genes, base_names, n_base, table, base_of, where)
    names = None
    if base_names is not None:
        names = base_names if out is None else [base_names[i] for i in out.tolist()]
    starts: dict[int, int] = {}  # a distinct base array's lookup array: where it starts
    parts: list[np.ndarray] = []
    firsts: list[np.ndarray] = []
    counts: list[np.ndarray] = []
    offsets = np.zeros(len(table.ids), np.int64)
    size = 0
    identity = out is None and all(b is None for b in base_of)
    copies = out is not None and np.unique(out).size < out.size
    order = np.argsort(out, kind="stable") if out is not None else None
    plain: dict[int, np.ndarray] = {}  # files served by their own columns: one array per width
    for pos, n in enumerate(table.n_vars):
        base = base_of[pos]
        if base is None:
            base = plain.setdefault(n, np.arange(n, dtype=np.int64))
        if id(base) not in starts:
            starts[id(base)] = size
            lut, first, count = _lookup(base, out, order)
            parts.append(lut)
            firsts.append(first)
            counts.append(count)
            size += lut.size
        offsets[pos] = starts[id(base)]
    n_vars = np.asarray(table.n_vars, np.int64)
    n_out = n_base if out is None else int(out.size)
    if identity:
        return GeneMap(base_names, names, n_out, n_vars, None, np.zeros_like(offsets), None)
    lut = np.concatenate(parts).astype(np.int32) if parts else np.zeros(0, np.int32)
    extra = None
    if copies:
        assert order is not None
        extra = (np.concatenate(firsts), np.concatenate(counts), order.astype(np.int64))
    return GeneMap(base_names, names, n_out, n_vars, lut, offsets, extra, bool((lut < 0).any()))


def _lookup(
    base: np.ndarray, out: np.ndarray | None, order: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A file's lookup array (its column → served column) and, for copies, first/count."""
    if out is None or order is None:
        return base.astype(np.int64), base, base  # served as the base's columns
    ranked = out[order]
    lo = np.searchsorted(ranked, base, "left")
    hi = np.searchsorted(ranked, base, "right")
    count = np.where(base >= 0, hi - lo, 0).astype(np.int32)
    lut = np.where(count > 0, order[np.minimum(lo, max(order.size - 1, 0))], -1)
    return lut, lo.astype(np.int64), count


def _joined(
    table: VarTable, join: str, key: str, where: Sequence[str]
) -> tuple[list[str], list[np.ndarray | None]]:
    """The joined names and, per file, its columns' places among them (-1: left out)."""
    names = table.names
    missing = [pos for pos, ids in enumerate(table.ids) if ids is None]
    if names is None or missing:
        at = where[missing[0]] if missing else where[0]
        raise ConfigError(
            f"join={join!r} aligns files by their var index ({key!r}'s genes), but {at} has "
            "none: write the files with their gene names (adata.var_names), or pass files "
            "that share their columns without join=."
        )
    ids = [i for i in table.ids if i is not None]
    for pos, these in enumerate(ids):
        if np.unique(these).size < these.size:
            raise ConfigError(
                f"join={join!r}: {where[pos]} holds {_twice(these, names)!r} twice in its var "
                "index, so its columns cannot be aligned by name (anndata.concat refuses it "
                "too). Make the names unique (adata.var_names_make_unique()) and write the "
                "file again."
            )
    current = ids[0]
    if join == "inner":
        for these in ids[1:]:
            if these is not current:
                current = current[np.isin(current, these)]
        if not current.size:
            raise ConfigError(
                f"join='inner': the {counted(len(ids), 'file')} share no gene of key {key!r} (each "
                "holds other names); use join='outer', or check that the files name genes "
                "alike (symbols or Ensembl ids)."
            )
    else:
        rank = np.argsort(np.argsort(np.asarray(names, dtype=object), kind="stable"))
        for these in ids[1:]:
            if these is current or np.array_equal(these, current) or not these.size:
                continue
            if not current.size:
                current = these
                continue
            both = np.union1d(current, these)
            current = both[np.argsort(rank[both], kind="stable")]
    place = np.full(len(names), -1, np.int64)
    place[current] = np.arange(current.size)
    return [names[i] for i in current.tolist()], _per_file(place, table)


def _named_union(
    table: VarTable, key: str, where: Sequence[str]
) -> tuple[list[str], list[np.ndarray | None]]:
    """Every name of any file (first seen first) as the base ``genes=`` names pick from."""
    names = table.names
    missing = [pos for pos, ids in enumerate(table.ids) if ids is None]
    if names is None or missing:
        raise ConfigError(
            f"genes= names genes, but {where[missing[0] if missing else 0]} has no var index: "
            "pass files that all have gene names, or a boolean mask over shared columns."
        )
    identity = np.arange(len(names), dtype=np.int64)
    return list(names), _per_file(identity, table)


def _per_file(place: np.ndarray, table: VarTable) -> list[np.ndarray | None]:
    """Per file, ``place`` at its ids (files sharing an index share the array)."""
    done: dict[int, np.ndarray] = {}
    return [None if ids is None else done.setdefault(id(ids), place[ids]) for ids in table.ids]


def _as_array(genes: Any) -> np.ndarray | None:
    if genes is None:
        return None
    if isinstance(genes, (str, bytes)):
        raise ConfigError(
            f"genes={genes!r} is one string; pass a list of names (genes=[{genes!r}]), "
            "integer positions or a boolean mask."
        )
    try:
        chosen = np.asarray(list(genes) if not isinstance(genes, np.ndarray) else genes)
    except TypeError as exc:
        raise ConfigError(
            f"genes= must be names, integer positions or a boolean mask; got "
            f"{type(genes).__name__}."
        ) from exc
    if chosen.ndim != 1:
        raise ConfigError(f"genes= must be one-dimensional; got shape {chosen.shape}.")
    if chosen.dtype.kind == "O" and all(isinstance(g, str) for g in chosen.tolist()):
        chosen = chosen.astype(str)
    return chosen


def _chosen(
    genes: Any,
    base_names: list[str] | None,
    n_base: int,
    table: VarTable,
    base_of: list[np.ndarray | None],
    where: Sequence[str],
) -> np.ndarray | None:
    """``genes=`` as positions into the base's columns (``None``: every column, in order)."""
    chosen = _as_array(genes)
    if chosen is None:
        return None
    if chosen.size == 0:
        raise ConfigError("genes= selects no gene; pass at least one name, position or True.")
    kind = chosen.dtype.kind
    if kind == "b":
        if chosen.shape != (n_base,):
            raise ConfigError(
                f"genes= is a boolean mask of shape {chosen.shape}; the matrix has {n_base} "
                f"columns{_joined_words(base_of)}: pass a mask of shape ({n_base},)."
            )
        return np.flatnonzero(chosen).astype(np.int64)
    if kind in "iu":
        out = chosen.astype(np.int64)
        bad = out[(out < -n_base) | (out >= n_base)]
        if bad.size:
            raise ConfigError(
                f"genes= holds position {int(bad[0])}, outside -{n_base}..{n_base - 1}: "
                f"integer genes= are column positions (as adata[:, [0, 5]]) over the "
                f"{n_base} columns{_joined_words(base_of)}; pass names to choose by var name."
            )
        return np.where(out < 0, out + n_base, out)
    if kind not in "US":
        raise ConfigError(
            f"genes= must be names, integer positions or a boolean mask; got values of "
            f"dtype {chosen.dtype}."
        )
    if base_names is None:
        raise ConfigError("genes= names genes but the files have no var index; pass a mask.")
    place = {name: i for i, name in enumerate(base_names)}
    wanted = [str(g) for g in chosen.tolist()]
    missing = [g for g in wanted if g not in place]
    if missing:
        raise ConfigError(
            f"genes= names {len(missing)} gene(s) no file's var index holds"
            f"{' under the inner join' if _inner(base_of) else ''}, first "
            f"{missing[:5]}; pass names from ds.handles.var_names (or positions, or a mask)."
        )
    out = np.array([place[g] for g in wanted], np.int64)
    _check_unique(out, base_names, base_of, where)
    return out


def _check_unique(
    out: np.ndarray,
    base_names: list[str],
    base_of: list[np.ndarray | None],
    where: Sequence[str],
) -> None:
    """``ConfigError`` where a chosen name stands for two columns of a file (anndata raises)."""
    wanted = {base_names[i] for i in np.unique(out).tolist()}
    seen: set[str] = set()
    for name in base_names:
        if name in seen and name in wanted:
            shared = "" if len(where) == 1 else " (which every file shares)"
            raise ConfigError(_twice_message(name, f"{where[0]}{shared}"))
        seen.add(name)
    done: set[int] = set()
    for pos, base in enumerate(base_of):
        if base is None or id(base) in done:
            continue
        done.add(id(base))
        hit = base[np.isin(base, out)]
        uniq, counts = np.unique(hit, return_counts=True)
        if (counts > 1).any():
            raise ConfigError(_twice_message(base_names[int(uniq[counts > 1][0])], where[pos]))


def _twice_message(name: str, at: str) -> str:
    return (
        f"genes= names {name!r}, which the var index of {at} holds more than once, so the "
        "name does not say which column (anndata raises too). Choose by position "
        "(genes=[i, ...]) or a boolean mask, or make the names unique "
        "(adata.var_names_make_unique()) and write the file again."
    )


def _twice(ids: np.ndarray, names: list[str]) -> str:
    uniq, counts = np.unique(ids, return_counts=True)
    return names[int(uniq[counts > 1][0])]


def _joined_words(base_of: list[np.ndarray | None]) -> str:
    return " of the join" if any(b is not None for b in base_of) else ""


def _inner(base_of: list[np.ndarray | None]) -> bool:
    return any(b is not None and (b < 0).any() for b in base_of)


def _differ(table: VarTable, key: str, where: Sequence[str]) -> str:
    """The message for files whose var indexes differ, with neither ``join=`` nor names."""
    first = table.var(0)
    other = next(p for p in range(1, len(table.ids)) if not _same_as_first(table, p))
    theirs = table.var(other)
    if first is not None and theirs is not None:
        how = var_difference(first, theirs)
    elif table.n_vars[0] != table.n_vars[other]:
        how = f"it has {table.n_vars[other]} columns where the first file has {table.n_vars[0]}"
    else:
        how = "one of the two files has no var index"
    return (
        f"{where[other]}: its var index (the genes of {key!r}) differs from {where[0]}'s: "
        f"{how}. Pass join='outer' (every gene of any file; absent ones read 0) or "
        "join='inner' (the genes every file has), as anndata.concat does, or genes=[names] "
        "to choose the genes; or write the files with one var index."
    )


def _same_as_first(table: VarTable, pos: int) -> bool:
    a, b = table.ids[0], table.ids[pos]
    if a is None or b is None:
        return a is None and b is None and table.n_vars[0] == table.n_vars[pos]
    return a is b
