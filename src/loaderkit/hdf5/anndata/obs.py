"""A file's ``obs`` table as ``cells=`` sees it: column name -> numpy array, read on demand.

``ObsTable`` is a read-only ``Mapping`` over an open ``.h5ad`` file's ``obs``: listing its
columns reads no values; ``obs[name]`` reads that one column (once) and returns a read-only
numpy array with one value per cell, as pandas shows it in ``adata.obs``:

* a categorical (current, or anndata 0.7's referenced categories): an object array of the
  category names (``str``), ``None`` where the code is -1 (missing);
* numbers and booleans: as stored;
* strings: an object array of ``str``; a ``nullable-string-array`` (anndata with pandas 3):
  ``str``, ``None`` where missing;
* nullable integers and booleans (pandas' ``Int64``, ``boolean``): an object array of the
  values, ``None`` where missing (compare them: ``obs["flag"] == True`` is a mask);
* ``"_index"``: the index (the cell names), whatever name anndata stored it under (the
  index's own name, where it has one, reads the same);
* anndata < 0.7's compound ``obs`` table: its fields, strings decoded, a field whose
  categories lie in ``uns/<field>_categories`` as category names.

Example:
    >>> import h5py, numpy as np, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "o.h5ad")
    >>> with h5py.File(path, "w") as f:
    ...     obs = f.create_group("obs"); obs.attrs["_index"] = "_index"
    ...     _ = obs.create_dataset("_index", data=["c0", "c1"])
    ...     g = obs.create_group("cell_type"); g.attrs["encoding-type"] = "categorical"
    ...     _ = g.create_dataset("codes", data=np.int8([1, -1]))
    ...     _ = g.create_dataset("categories", data=["B", "T"])
    ...     table = ObsTable(f, 0, path)
    ...     list(table), table["cell_type"].tolist(), table.read
    (['_index', 'cell_type'], ['T', None], ['cell_type'])
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping
from typing import Any

import h5py
import numpy as np

from loaderkit.errors import ConfigError
from loaderkit.hdf5.anndata.encoding import NULLABLE_STRINGS, obs_column, string_array

__all__ = ["INDEX", "ObsTable"]

#: The name the index (cell names) is read under, whatever anndata stored it as.
INDEX = "_index"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _readonly(values: np.ndarray) -> np.ndarray:
    values.setflags(write=False)
    return values


def _strings(values: Any, missing: np.ndarray | None = None) -> np.ndarray:
    """An object array of ``str`` (``None`` where ``missing``)."""
    flat = np.asarray(values).reshape(-1)
    out = np.empty(flat.shape[0], object)
    out[:] = [_text(v) for v in flat.tolist()]
    if missing is not None:
        out[missing] = None
    return out


class ObsTable(Mapping[str, np.ndarray]):
    """One file's ``obs`` columns, each read from the file only when asked for.

    Args:
        f: The open file (kept open by the caller while the table is used).
        session: The session id, for messages.
        path: The file's path or URL, for messages.

    Attributes:
        read: The columns read so far, in the order they were first asked for.

    Raises:
        ConfigError: The file has no ``obs`` table (a group, or a legacy compound dataset).

    Example:
        >>> ObsTable.__mro__[1].__name__
        'Mapping'
    """

    def __init__(self, f: h5py.File, session: Hashable, path: str) -> None:
        self._f, self._session, self._path = f, session, path
        obs = f.get("obs")
        if not isinstance(obs, h5py.Group | h5py.Dataset) or (
            isinstance(obs, h5py.Dataset) and not obs.dtype.names
        ):
            raise ConfigError(
                f"cells=: session {session!r} ({path}) has no 'obs' table (an AnnData .h5ad "
                "file's per-cell columns); cells= chooses cells by their obs. Pass .h5ad "
                "files, or choose samples in a subclass's build_index() instead."
            )
        self._obs = obs
        self._values: dict[str, np.ndarray] = {}
        self.read: list[str] = []
        if isinstance(obs, h5py.Dataset):  # anndata < 0.7: a compound table
            names = list(obs.dtype.names or ())
            self._index = "index" if "index" in names else None
            self._columns = [INDEX] + [n for n in names if n != self._index]
        else:
            self._index = _text(obs.attrs.get("_index", INDEX))
            order = [_text(n) for n in np.asarray(obs.attrs.get("column-order", [])).ravel()]
            members = [n for n in obs if n not in (self._index, "__categories")]
            self._columns = [INDEX] + [n for n in order if n in obs]
            self._columns += [n for n in members if n not in self._columns]

    def _missing(self, name: Any) -> KeyError:
        return KeyError(
            f"cells=: session {self._session!r} ({self._path}) has no obs column {name!r}; "
            f"its columns: {self._columns}"
        )

    def __getitem__(self, name: str) -> np.ndarray:
        """The column ``name``, one value per cell (read from the file at the first ask)."""
        if name == self._index and name != INDEX:
            name = INDEX  # the index under its own name
        if name not in self._columns:
            raise self._missing(name)
        values = self._values.get(name)
        if values is None:
            values = self._values[name] = _readonly(self._column(name))
            self.read.append(name)
        return values

    def __iter__(self) -> Iterator[str]:
        return iter(self._columns)

    def __len__(self) -> int:
        return len(self._columns)

    def __contains__(self, name: object) -> bool:
        return name in self._columns or (name == self._index and name is not None)

    def _column(self, name: str) -> np.ndarray:
        obs = self._obs
        if isinstance(obs, h5py.Dataset):
            return self._legacy(obs, name)
        if name == INDEX:
            names = string_array(obs.get(self._index or INDEX))
            if names is None:
                raise ConfigError(
                    f"cells=: session {self._session!r} ({self._path}): obs has no index "
                    f"dataset {self._index!r}; the file is damaged. Write it again "
                    "(anndata's write_h5ad)."
                )
            return _strings(names)
        f = self._f
        group = obs.get(name)
        if isinstance(group, h5py.Group) and _text(group.attrs.get("encoding-type", "")) in (
            "nullable-integer",
            "nullable-boolean",
        ):
            return self._nullable(group, name)
        column = obs_column(f, f"obs/{name}", self._session, self._path)
        if column is None:  # pragma: no cover - listed, so present
            raise self._missing(name)
        values = np.asarray(f[column.path][()])
        if column.categories is not None:
            named = np.empty(len(column.categories) + 1, object)
            named[:-1] = column.categories
            codes = values.astype(np.int64).reshape(-1)
            return named[np.where(codes < 0, len(column.categories), codes)]
        if column.encoding == NULLABLE_STRINGS:
            assert column.mask is not None
            return _strings(values, np.asarray(f[column.mask][()], bool).reshape(-1))
        if h5py.check_string_dtype(f[column.path].dtype) is not None:
            return _strings(values)
        return values

    def _nullable(self, group: h5py.Group, name: str) -> np.ndarray:
        values, mask = group.get("values"), group.get("mask")
        if not isinstance(values, h5py.Dataset) or not isinstance(mask, h5py.Dataset):
            raise ConfigError(
                f"cells=: session {self._session!r} ({self._path}): obs column {name!r} "
                f"({_text(group.attrs['encoding-type'])}) has no 'values' and 'mask' datasets; "
                "the file is damaged. Write it again (anndata's write_h5ad)."
            )
        out = np.asarray(values[()]).reshape(-1).astype(object)
        out[np.asarray(mask[()], bool).reshape(-1)] = None
        return out

    def _legacy(self, obs: h5py.Dataset, name: str) -> np.ndarray:
        field = self._index if name == INDEX else name
        if field is None:
            raise self._missing(name)
        values = np.asarray(obs.fields(field)[()])
        if values.dtype.kind in "SUO":
            return _strings(values)
        cats = self._f.get(f"uns/{field}_categories")
        if isinstance(cats, h5py.Dataset) and values.dtype.kind in "iu":
            names = np.empty(cats.shape[0] + 1, object)
            names[:-1] = _strings(cats[()])
            codes = values.astype(np.int64)
            return names[np.where(codes < 0, cats.shape[0], codes)]
        return values
