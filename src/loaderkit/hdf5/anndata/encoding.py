"""AnnData's encodings in an ``.h5ad`` file: what a group is, and how a CSR row's bytes are found.

One room for the format (the reader, the collate step and the dataset ask here, never test
attributes themselves):

* ``sparse_group`` says whether a key names a sparse matrix group and which one: anndata's
  current ``encoding-type: csr_matrix`` (with ``shape``) or the legacy ``h5sparse_format: csr``
  (with ``h5sparse_shape``), as a ``CSRGroup``. CSC matrices and unknown encodings are refused
  by name (``ConfigError``), with how to convert.
* ``check_csr`` checks a group's ``indptr`` (read anyway, once per session) against its
  ``data``/``indices``: a damaged group is an ``HDF5FileError`` naming the file and row.
* ``var_path``/``var_names``/``var_difference``: the ``var`` index (gene names) a matrix's
  columns follow, current (``var/_index``) or legacy (a compound ``var`` table, ``index``
  field), and how two files' indexes differ.
* ``is_categorical``/``categories``: categorical ``obs`` columns (``codes`` + ``categories``);
* ``anndata_column``: whether a key is stored with an anndata column encoding (read through
  ``obs_column`` beside any matrix, or alone);
* ``obs_column``/``shared_categories``: what a per-cell key beside a matrix is (``ObsColumn``:
  a dataset of values, a categorical's codes and categories, current or anndata 0.7's
  referenced categories, or a ``nullable-string-array``'s ``values`` and ``mask``), refused
  by name where it is not one value per cell; and one category list for files whose lists
  differ (union, first seen first, as anndata's concat);
* ``string_array``: strings as anndata stores them (a dataset, or with pandas 3 a
  ``nullable-string-array`` group of ``values`` and ``mask``).

Example:
    >>> var_path("raw/X"), var_path("raw.X"), var_path("layers/counts")
    ('raw/var', 'raw.var', 'var')
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np

from loaderkit.errors import ConfigError, HDF5FileError

__all__ = [
    "NULLABLE_STRINGS",
    "CSRGroup",
    "ObsColumn",
    "anndata_column",
    "categories",
    "check_csr",
    "is_categorical",
    "nullable_strings",
    "obs_column",
    "shared_categories",
    "sparse_group",
    "string_array",
    "var_difference",
    "var_names",
    "var_path",
]

_CONVERT = (
    "Convert it to CSR once (rows stored contiguously): `adata = anndata.read_h5ad(path); "
    "adata.X = adata.X.tocsr(); adata.write_h5ad(new_path)` (or scipy.sparse's `.tocsr()` "
    "for raw/X and layers), then pass the new files."
)


#: anndata encodings of plain groups (``obsm``, ``uns``, ``obs``...): keys read as HDF5 groups.
_GROUPS = frozenset({"dict", "dataframe"})


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class CSRGroup:
    """A CSR matrix group: where a row's values and column ids are, and the matrix shape.

    Row ``r`` is ``data[indptr[r]:indptr[r+1]]`` at columns ``indices[indptr[r]:indptr[r+1]]``.

    Attributes:
        path: The group's path in the file (``"X"``, ``"raw/X"``, ``"raw.X"``...).
        n_obs: Rows (cells).
        n_vars: Columns (genes).
        legacy: Encoded with the legacy ``h5sparse_format`` attributes.

    Example:
        >>> g = CSRGroup("X", 3, 5)
        >>> g.data, g.indices, g.indptr
        ('X/data', 'X/indices', 'X/indptr')
    """

    path: str
    n_obs: int
    n_vars: int
    legacy: bool = False

    @property
    def data(self) -> str:
        """Path of the values."""
        return f"{self.path}/data"

    @property
    def indices(self) -> str:
        """Path of the column ids."""
        return f"{self.path}/indices"

    @property
    def indptr(self) -> str:
        """Path of the row pointers (``n_obs + 1`` of them)."""
        return f"{self.path}/indptr"


def _where(session: Hashable, file: str, path: str) -> str:
    return f"key {path!r} of session {session!r} ({file})"


def sparse_group(obj: Any, path: str, session: Hashable, file: str) -> CSRGroup | None:
    """The ``CSRGroup`` that ``obj`` (``f[path]``) is, or ``None`` when it is no encoded matrix.

    ``None`` for datasets (dense ``X``, ``obsm/<name>``) and for plain groups (no anndata
    encoding, or ``dict``/``dataframe``: a group of per-sample datasets, as in any file).

    Raises:
        ConfigError: A CSC matrix (with how to convert), or another anndata encoding that has
            no rows to serve (named).
        HDF5FileError: The group lacks ``data``/``indices``/``indptr`` or its shape.

    Example:
        >>> import h5py, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "a.h5ad")
        >>> with h5py.File(path, "w") as f:
        ...     g = f.create_group("X")
        ...     g.attrs.update({"encoding-type": "csr_matrix", "shape": (2, 3)})
        ...     for name in ("data", "indices"): _ = g.create_dataset(name, (0,), "f4")
        ...     _ = g.create_dataset("indptr", data=[0, 0, 0])
        ...     sparse_group(f["X"], "X", 0, path)
        CSRGroup(path='X', n_obs=2, n_vars=3, legacy=False)
    """
    if not isinstance(obj, h5py.Group):
        return None
    attrs = obj.attrs
    where = _where(session, file, path)
    if "encoding-type" in attrs:
        encoding = _text(attrs["encoding-type"])
        if encoding in _GROUPS:
            return None  # a group of datasets, as any HDF5 group
        legacy, shape_attr = False, "shape"
    elif "h5sparse_format" in attrs:
        encoding = _text(attrs["h5sparse_format"]) + " (h5sparse)"
        legacy, shape_attr = True, "h5sparse_shape"
    else:
        return None
    if encoding.startswith("csc"):
        raise ConfigError(
            f"{where} is a CSC sparse matrix ({encoding}): its rows are spread over every "
            f"column's slice, so loaderkit does not serve them. {_CONVERT}"
        )
    if encoding not in ("csr_matrix", "csr (h5sparse)"):
        raise ConfigError(
            f"{where} has the anndata encoding {encoding!r}, which has no rows loaderkit serves: "
            "keys are dense datasets (X, obsm/<name>) or CSR matrices (encoding-type "
            "csr_matrix, or the legacy h5sparse_format csr). Pass such a key."
        )
    missing = [name for name in ("data", "indices", "indptr") if name not in obj]
    if missing or shape_attr not in attrs:
        what = f"datasets {missing}" if missing else f"the attribute {shape_attr!r}"
        raise HDF5FileError(
            f"{where}: the CSR group lacks {what}; the file is damaged or was written "
            "incompletely. Write it again (anndata's write_h5ad)."
        )
    shape = [int(n) for n in np.asarray(attrs[shape_attr]).ravel()]
    if len(shape) != 2 or min(shape) < 0:
        raise HDF5FileError(f"{where}: the CSR group's {shape_attr} is {shape}, not (rows, cols).")
    return CSRGroup(path, shape[0], shape[1], legacy)


def check_csr(
    group: CSRGroup, indptr: np.ndarray, nnz: int, nnz_indices: int, session: Hashable, file: str
) -> None:
    """Raise ``HDF5FileError`` naming the first damaged row unless ``indptr`` fits the group.

    ``indptr`` must hold ``n_obs + 1`` entries from 0, never decreasing, none past ``nnz``
    (the length of ``data``), and ``data`` and ``indices`` must be as long as each other.

    Example:
        >>> check_csr(CSRGroup("X", 2, 3), np.array([0, 2, 1]), 2, 2, 0, "a.h5ad")
        ... # doctest: +ELLIPSIS
        Traceback (most recent call last):
        loaderkit.errors.HDF5FileError: key 'X' of session 0 (a.h5ad): row 1 ends before it ...
    """
    where = _where(session, file, group.path)
    fix = "the CSR group is damaged. Write the file again (anndata's write_h5ad) or leave the "
    fix += "session out."
    if nnz != nnz_indices:
        raise HDF5FileError(
            f"{where}: 'data' holds {nnz} values but 'indices' {nnz_indices} column ids; {fix}"
        )
    if indptr.shape != (group.n_obs + 1,):
        raise HDF5FileError(
            f"{where}: 'indptr' holds {indptr.size} entries, expected {group.n_obs + 1} "
            f"(rows + 1 for shape {(group.n_obs, group.n_vars)}); {fix}"
        )
    if indptr[0] != 0:
        raise HDF5FileError(f"{where}: row 0 starts at {int(indptr[0])}, not 0 (indptr[0]); {fix}")
    down = np.flatnonzero(indptr[1:] < indptr[:-1])
    if down.size:
        r = int(down[0])
        raise HDF5FileError(
            f"{where}: row {r} ends before it starts (indptr[{r}] = {int(indptr[r])} > "
            f"indptr[{r + 1}] = {int(indptr[r + 1])}); {fix}"
        )
    past = np.flatnonzero(indptr[1:] > nnz)
    if past.size:
        r = int(past[0])
        raise HDF5FileError(
            f"{where}: row {r} ends at {int(indptr[r + 1])}, past the {nnz} stored values "
            f"(indptr[{r + 1}] > len(data)); {fix}"
        )


def var_path(key: str) -> str:
    """Where the ``var`` table of matrix ``key`` lies (``raw/X``: ``raw/var``; legacy ``raw.X``).

    Example:
        >>> var_path("X")
        'var'
    """
    if key.startswith("raw/"):
        return "raw/var"
    if key.startswith("raw."):
        return "raw.var"
    return "var"


def string_array(obj: Any) -> list[str] | None:
    """The strings of an anndata string array, or ``None`` when ``obj`` holds none.

    A dataset of strings (``string-array``), or a ``nullable-string-array`` group (anndata
    with pandas 3: ``values`` and a boolean ``mask``; a masked entry reads as the group's
    ``na-value``, default ``"nan"``).

    Example:
        >>> import h5py, numpy as np, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "s.h5ad")
        >>> with h5py.File(path, "w") as f:
        ...     g = f.create_group("names"); g.attrs["encoding-type"] = "nullable-string-array"
        ...     _ = g.create_dataset("values", data=["a", "", "c"])
        ...     _ = g.create_dataset("mask", data=np.array([False, True, False]))
        ...     string_array(g), string_array(f.create_dataset("plain", data=["x"]))
        (['a', 'nan', 'c'], ['x'])
    """
    if isinstance(obj, h5py.Dataset):
        return [_text(v) for v in np.asarray(obj[()]).reshape(-1)]
    if isinstance(obj, h5py.Group) and _text(obj.attrs.get("encoding-type", "")) == (
        "nullable-string-array"
    ):
        values = obj.get("values")
        if not isinstance(values, h5py.Dataset):
            return None
        names = [_text(v) for v in np.asarray(values[()]).reshape(-1)]
        mask = obj.get("mask")
        if isinstance(mask, h5py.Dataset):
            na = _text(obj.attrs.get("na-value", "nan")).lower()
            for i in np.flatnonzero(np.asarray(mask[()], bool)).tolist():
                names[i] = na
        return names
    return None


def var_names(f: h5py.File, path: str) -> list[str] | None:
    """The ``var`` index (gene names, in column order) at ``path``, or ``None`` if there is none.

    Current files: a group whose ``_index`` attribute names the index (a string array, or
    with pandas 3 a ``nullable-string-array`` group). Legacy files: a compound table with an
    ``index`` field.

    Example:
        >>> import h5py, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "v.h5ad")
        >>> with h5py.File(path, "w") as f:
        ...     g = f.create_group("var"); g.attrs["_index"] = "_index"
        ...     _ = g.create_dataset("_index", data=["a", "b"])
        ...     var_names(f, "var")
        ['a', 'b']
    """
    obj = f.get(path)
    if isinstance(obj, h5py.Group):
        name = _text(obj.attrs.get("_index", "_index"))
        return string_array(obj.get(name))
    if isinstance(obj, h5py.Dataset) and obj.dtype.names and "index" in obj.dtype.names:
        return [_text(v) for v in obj["index"]]
    return None


def var_difference(first: Sequence[str], other: Sequence[str]) -> str | None:
    """How ``other`` differs from ``first`` (count, or first differing position), or ``None``.

    Example:
        >>> var_difference(["a", "b", "c"], ["a", "x", "c"])
        "position 1 holds 'x' where the first file holds 'b'"
    """
    if len(first) != len(other):
        return f"it has {len(other)} genes where the first file has {len(first)}"
    a, b = np.asarray(first, object), np.asarray(other, object)
    differ = np.flatnonzero(a != b)
    if not differ.size:
        return None
    i = int(differ[0])
    return f"position {i} holds {other[i]!r} where the first file holds {first[i]!r}"


def is_categorical(obj: Any) -> bool:
    """Whether ``obj`` is a categorical column (``encoding-type: categorical``).

    Example:
        >>> is_categorical(None)
        False
    """
    return isinstance(obj, h5py.Group) and _text(obj.attrs.get("encoding-type", "")) == (
        "categorical"
    )


def categories(obj: h5py.Group) -> list[str]:
    """The category names of a categorical column group (its ``codes`` index them).

    Example:
        >>> import h5py, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "c.h5ad")
        >>> with h5py.File(path, "w") as f:
        ...     g = f.create_group("cell_type"); g.attrs["encoding-type"] = "categorical"
        ...     _ = g.create_dataset("codes", data=[1, 0]); _ = g.create_dataset("categories", data=["B", "T"])
        ...     is_categorical(g), categories(g)
        (True, ['B', 'T'])
    """  # noqa: E501
    return string_array(obj.get("categories")) or []


#: anndata encodings of a column stored as values and a mask that loaderkit refuses.
_NULLABLE = {
    "nullable-integer": "integers with missing values",
    "nullable-boolean": "booleans with missing values",
}

#: The encoding of strings with missing values (pandas 3's string columns): served as ``str``
#: per cell, ``None`` where the mask says missing.
NULLABLE_STRINGS = "nullable-string-array"


@dataclass(frozen=True)
class ObsColumn:
    """A per-cell key of an ``.h5ad`` read beside its matrix: one value per row (cell).

    Attributes:
        path: The dataset whose rows are read (a categorical's ``codes``).
        categories: A categorical's category names (its codes index them, -1 is missing);
            ``None`` for values served as stored.
        encoding: What the key is, for messages: ``"a dataset of values"``, ``"categorical"``,
            ``"categorical (anndata 0.7)"`` or ``"nullable-string-array"``.
        mask: A ``nullable-string-array``'s ``mask`` (True: the cell's value is missing);
            ``None`` for other columns.

    Example:
        >>> ObsColumn("obs/cell_type/codes", ("B", "T"), "categorical").categories
        ('B', 'T')
    """

    path: str
    categories: tuple[str, ...] | None = None
    encoding: str = "a dataset of values"
    mask: str | None = None


def anndata_column(f: h5py.File, path: str) -> bool:
    """Whether key ``path`` of ``f`` is stored with an anndata per-cell column encoding.

    A categorical group, anndata 0.7's categorical (an integer dataset whose attribute
    ``categories`` references the names), a group of values and a mask
    (``nullable-string-array``, ``nullable-integer``, ``nullable-boolean``), or a field of
    anndata < 0.7's compound ``obs`` table: ``obs_column`` says what each is (and refuses
    what is not served, by name). Plain datasets and groups are not: they are read as any
    HDF5 key.

    Example:
        >>> import h5py, tempfile, os
        >>> with h5py.File(os.path.join(tempfile.mkdtemp(), "a.h5ad"), "w") as f:
        ...     f.create_group("obs/cell_type").attrs["encoding-type"] = "categorical"
        ...     anndata_column(f, "obs/cell_type"), anndata_column(f, "obs/missing")
        (True, False)
    """
    parent, _, field = path.rpartition("/")
    try:
        obj = f.get(path)
        table = f.get(parent) if parent else None
    except (KeyError, ValueError, TypeError):  # a path through a dataset
        obj = table = None
    if isinstance(table, h5py.Dataset) and table.dtype.names and field in table.dtype.names:
        return True  # a column of anndata < 0.7's compound table: refused by name
    if isinstance(obj, h5py.Dataset):
        return isinstance(obj.attrs.get("categories"), h5py.Reference)
    if not isinstance(obj, h5py.Group):
        return False
    encoding = _text(obj.attrs.get("encoding-type", ""))
    return encoding in ("categorical", NULLABLE_STRINGS) or encoding in _NULLABLE


def obs_column(f: h5py.File, path: str, session: Hashable, file: str) -> ObsColumn | None:
    """What key ``path`` of ``f`` is as a per-cell column, or ``None`` when it is missing.

    A dataset (numbers, strings, ``obsm/<name>`` embeddings) is read as stored; a categorical
    group as its ``codes`` with its ``categories``; anndata 0.7's categorical (an integer
    dataset whose attribute ``categories`` references the category names) likewise; a
    ``nullable-string-array`` group (anndata with pandas 3) as its ``values``, with its
    ``mask`` (``nullable_strings``).

    Raises:
        ConfigError: A group that is not one value per cell: nullable integers and booleans
            (values and a mask), sparse matrices, tables; or a column of anndata < 0.7's
            compound ``obs`` table. Each names the key, what it is, and what to do.
        HDF5FileError: A damaged categorical or ``nullable-string-array`` group.

    Example:
        >>> import h5py, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "o.h5ad")
        >>> with h5py.File(path, "w") as f:
        ...     g = f.create_group("obs/cell_type"); g.attrs["encoding-type"] = "categorical"
        ...     _ = g.create_dataset("codes", data=np.int8([1, 0]))
        ...     _ = g.create_dataset("categories", data=["B", "T"])
        ...     column = obs_column(f, "obs/cell_type", 0, path)
        >>> column.path, column.categories, column.encoding
        ('obs/cell_type/codes', ('B', 'T'), 'categorical')
    """
    where = _where(session, file, path)
    parent, _, field = path.rpartition("/")
    table = f.get(parent) if parent else None
    if isinstance(table, h5py.Dataset) and table.dtype.names and field in table.dtype.names:
        raise ConfigError(
            f"{where} is a field of the compound table {parent!r} (written by anndata < 0.7); "
            "loaderkit reads per-cell columns of the current encoding. Write the file again "
            "once (`anndata.read_h5ad(path).write_h5ad(new_path)`) and pass the new file."
        )
    try:
        obj = f.get(path)
    except (KeyError, ValueError, TypeError):  # a path through a dataset
        obj = None
    if obj is None:
        return None
    if isinstance(obj, h5py.Dataset):
        ref = obj.attrs.get("categories")
        if isinstance(ref, h5py.Reference):
            names = string_array(f[ref]) if ref else None
            if names is None or obj.dtype.kind not in "iu":
                raise HDF5FileError(
                    f"{where}: a categorical column of anndata 0.7 (codes {obj.dtype}) whose "
                    "'categories' reference names no string array; the file is damaged. "
                    "Write it again (anndata's write_h5ad)."
                )
            return ObsColumn(path, tuple(names), "categorical (anndata 0.7)")
        return ObsColumn(path)
    encoding = _text(obj.attrs.get("encoding-type", "")) or "a group without encoding"
    if is_categorical(obj):
        codes = obj.get("codes")
        if not isinstance(codes, h5py.Dataset) or codes.dtype.kind not in "iu":
            raise HDF5FileError(
                f"{where}: the categorical column has no integer 'codes' dataset; the file "
                "is damaged. Write it again (anndata's write_h5ad)."
            )
        return ObsColumn(f"{path}/codes", tuple(categories(obj)), "categorical")
    if encoding == NULLABLE_STRINGS:
        return nullable_strings(obj, path, session, file)
    if encoding in _NULLABLE:
        raise ConfigError(
            f"{where} is a {encoding} column ({_NULLABLE[encoding]}: 'values' and a 'mask'), "
            "which loaderkit does not serve. Store it as a categorical "
            "(`adata.obs[col] = adata.obs[col].astype('category')`; missing values get code "
            "-1) or as floats with NaN (`.astype('float32')`), then write the file again."
        )
    raise ConfigError(
        f"{where} is a group ({encoding}), not one value per cell. Keys beside a sparse "
        "matrix are per-cell columns: obs/<column> (numbers, strings, categoricals) or "
        "obsm/<name> (a dense array); one sparse matrix per dataset."
    )


def nullable_strings(obj: h5py.Group, path: str, session: Hashable, file: str) -> ObsColumn:
    """The ``ObsColumn`` of a ``nullable-string-array`` group: its ``values`` and ``mask``.

    ``values`` must be a 1-D dataset of strings and ``mask`` (True: missing) a 1-D dataset of
    booleans as long (anndata writes both; a masked entry's value is ``""``).

    Raises:
        HDF5FileError: Either dataset missing, of another type, or of another length, naming
            the file, the key and what to do.

    Example:
        >>> import h5py, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "n.h5ad")
        >>> with h5py.File(path, "w") as f:
        ...     g = f.create_group("obs/donor"); g.attrs["encoding-type"] = "nullable-string-array"
        ...     _ = g.create_dataset("values", data=["d1", ""], dtype=h5py.string_dtype())
        ...     _ = g.create_dataset("mask", data=np.array([False, True]))
        ...     nullable_strings(g, "obs/donor", 0, path).mask
        'obs/donor/mask'
    """
    where = _where(session, file, path)
    values, mask = obj.get("values"), obj.get("mask")
    how: str | None = None
    if not isinstance(values, h5py.Dataset):
        how = "has no 'values' dataset"
    elif not isinstance(mask, h5py.Dataset):
        how = "has no 'mask' dataset"
    elif values.ndim != 1 or h5py.check_string_dtype(values.dtype) is None:
        how = f"has 'values' of shape {values.shape} ({values.dtype}), not 1-D strings"
    elif mask.ndim != 1 or mask.dtype.kind not in "biu":
        how = f"has 'mask' of shape {mask.shape} ({mask.dtype}), not 1-D booleans"
    elif mask.shape != values.shape:
        how = f"has {mask.shape[0]} mask entries for {values.shape[0]} values"
    if how is not None:
        raise HDF5FileError(
            f"{where}: the {NULLABLE_STRINGS} column (strings with missing values: 'values' "
            f"and a boolean 'mask', one each per cell) {how}; the file is damaged or was "
            "written incompletely. Write it again (anndata's write_h5ad) or leave the key out."
        )
    return ObsColumn(f"{path}/values", None, NULLABLE_STRINGS, f"{path}/mask")


def shared_categories(
    lists: Sequence[Sequence[str]],
) -> tuple[list[str], list[np.ndarray | None]]:
    """One category list for every file, and per file how its codes map onto it.

    The shared list is the union in first-seen order (anndata's ``concat`` joins categoricals
    the same way): every file's codes keep meaning the same names.

    Returns:
        ``(shared, tables)``: per file, ``table[code]`` is the code in ``shared``; ``None``
        where the file's list is where it is in ``shared`` already (its codes stay).

    Example:
        >>> shared, tables = shared_categories([["B", "T"], ["T", "NK"]])
        >>> shared, tables[0], tables[1].tolist()
        (['B', 'T', 'NK'], None, [1, 2])
    """
    where: dict[str, int] = {}
    for names in lists:
        for name in names:
            where.setdefault(name, len(where))
    tables: list[np.ndarray | None] = []
    for names in lists:
        table = np.array([where[name] for name in names], np.int64)
        tables.append(None if np.array_equal(table, np.arange(table.size)) else table)
    return list(where), tables
