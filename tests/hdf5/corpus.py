"""Real HDF5 files, written the way other tools write them, and the oracle they are read against.

Importable on its own (spawned DataLoader workers and the no-plugin subprocess import it; the
heavy writers, PyTables, pandas and hdf5plugin, are imported only inside the functions that
need them). ``write_corpus(root)`` writes every case of ``SPECS`` into ``root`` and returns
``{name: Case}``; ``SPECS`` says which cases exist and what is expected of them without
writing anything (for ``pytest.mark.parametrize``).

The oracle (``expected_sample``, ``expected_samples``, ``expected_batch``) is computed from
h5py directly:

- numbers (either byte order; HDF5 enums -> their base integer type; h5py's bool enum -> numpy
  bool; bitfields -> unsigned integers; complex, compound-complex and native HDF5 complex): a
  numpy array for rows of one or more dimensions, a numpy scalar for 1-D datasets, always in
  native byte order;
- strings, fixed or variable length, ASCII or UTF-8: ``str`` (fixed length: trailing NULs
  stripped as numpy strips them, then decoded as UTF-8); an array of strings (a sub-array field
  of strings, as pandas writes string blocks) is the nested ``list`` of ``str`` numpy's
  ``tolist`` gives;
- variable-length arrays: a 1-D ``torch.Tensor`` in native order; variable-length arrays of
  strings (PyTables ``VLArray`` of ``StringAtom``): a ``list`` of ``str`` (``TextList``; nested
  lists for string atoms of several strings), batched as a list of those lists;
- compound rows: a ``dict`` field -> value with these rules applied recursively (nested
  compounds nested dicts, sub-array fields arrays of the field's shape);
- several keys: a ``dict`` name -> sample; a key naming a group: one sample per dataset of the
  group (in ``list(group.keys())`` order), the dataset's whole array.

One place where h5py itself is wrong is corrected: h5py 3.16 returns the elements of big-endian
variable-length arrays with their bytes unswapped but labelled native (the file holds the right
bytes); ``_h5py_vlen_byteorder_bug`` detects that once and the oracle reinterprets them. Every
case records ``truth`` (the values as written, in the oracle's form) where that is easy, so
``meta/test_types.py`` checks the oracle itself against what was written.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from h5py import h5d, h5p, h5s, h5t, h5z
from torch.utils.data import default_collate

ROWS = 12
ROW_SHAPE = (3, 4)
REPO_ROOT = Path(__file__).resolve().parents[2]

#: Kinds whose rows the dataset must read (the others must be refused at construction).
READABLE = frozenset({"numeric", "string", "ragged", "compound", "keys"})
KINDS = READABLE | {"refuse", "missing_filter", "missing_plugin", "bad_rows", "checksum"}


@dataclasses.dataclass(frozen=True, eq=False)
class Case:
    """One corpus entry: the files written, the key to read and what is expected.

    Attributes:
        name: Unique name (the pytest id).
        path: The (first) session file.
        key: ``key=`` for ``HDF5SessionDataset``: a name, a tuple of names or a mapping.
        expect_kind: One of ``KINDS``.
        rows: Rows of the (first) session.
        options: Extra keyword arguments for ``HDF5SessionDataset`` (``sample_axis``, ``fields``).
        sessions: Session id -> file, when there are several (default ``{"s": path}``).
        match: For refusals: words of which the message must contain at least one (the HDF5
            type); for filters: the filter's name and id.
        truth: The samples as written, in the oracle's form (``None``: not recorded).
        extra: Anything else a test needs (e.g. the rows of a damaged chunk).
    """

    name: str
    path: Path
    key: Any
    expect_kind: str
    rows: int = ROWS
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    sessions: Mapping[str, Path] | None = None
    match: tuple[str, ...] = ()
    truth: list[Any] | None = None
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def files(self) -> dict[str, str]:
        """The ``files`` argument: session id -> path."""
        sessions = self.sessions or {"s": self.path}
        return {sid: os.fspath(p) for sid, p in sessions.items()}

    @property
    def readable(self) -> bool:
        return self.expect_kind in READABLE

    @property
    def ragged(self) -> bool:
        return self.expect_kind == "ragged"


@dataclasses.dataclass(frozen=True)
class Spec:
    """What ``SPECS`` holds: a case's name, kind and writer (called as ``writer(root)``)."""

    name: str
    kind: str
    writer: Callable[[Path], Case]


SPECS: dict[str, Spec] = {}


def _register(name: str, kind: str, writer: Callable[[Path], Case]) -> None:
    assert name not in SPECS, name
    assert kind in KINDS, kind
    SPECS[name] = Spec(name, kind, writer)


def case_names(*kinds: str) -> list[str]:
    """Names of the cases of these kinds (all cases when none given), in ``SPECS`` order."""
    return [s.name for s in SPECS.values() if not kinds or s.kind in kinds]


def write_case(name: str, root: Path) -> Case:
    """Write one case into ``root`` (created if needed) and return it."""
    root.mkdir(parents=True, exist_ok=True)
    spec = SPECS[name]
    case = spec.writer(root)
    assert case.name == name and case.expect_kind == spec.kind, (case.name, case.expect_kind)
    return case


def write_corpus(root: Path) -> dict[str, Case]:
    """Write every case into ``root`` and return ``{name: Case}``."""
    return {name: write_case(name, root) for name in SPECS}


# ---------------------------------------------------------------------------------- values


def _base(shape: tuple[int, ...]) -> np.ndarray:
    """0, 1, 2, ... in ``shape``: each element (and so each row) is distinct."""
    return np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)


_MULT = {1: 1, 2: 0x0102, 4: 0x01020304, 8: 0x0102030405060708}


def numeric_values(code: str, shape: tuple[int, ...], offset: int = 0) -> np.ndarray:
    """Values that identify row and element, exact in ``code`` and different in every byte.

    ``offset`` shifts them (another session). Integers are multiplied by 0x0102... so that a
    missing byte swap never gives the same value back.
    """
    base = _base(shape) + offset
    dt = np.dtype(code)
    if dt.kind == "b":
        return base % 3 == 0
    if dt.kind == "u":
        return (base.astype(np.uint64) * np.uint64(_MULT[dt.itemsize])).astype(dt)
    if dt.kind == "i":
        return ((base - 64) * _MULT[dt.itemsize]).astype(dt)
    if dt.kind == "f":
        scale = 0.25 if dt.itemsize == 2 else 1.25
        return ((base - 64) * scale + (0 if dt.itemsize == 2 else 1 / 3)).astype(dt)
    if dt.kind == "c":
        return ((base - 64) * 1.5 - 1j * base / 4).astype(dt)
    raise ValueError(code)


def _native(dtype: np.dtype) -> np.dtype:
    """``dtype`` in native byte order, without h5py's metadata (enum, vlen, ...)."""
    return np.dtype(np.dtype(dtype).str).newbyteorder("=")


def _native_numeric(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.astype(_native(value.dtype), copy=True)
    if isinstance(value, np.generic):
        return np.asarray(value).astype(_native(value.dtype))[()]
    raise TypeError(f"not numpy: {type(value).__name__}")


def _decode(value: Any) -> str:
    if isinstance(value, str):
        return value
    return bytes(value).decode("utf-8")


def _decode_nested(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode_nested(v) for v in value]
    return _decode(value)


def _truth_rows(data: np.ndarray) -> list[Any]:
    """Rows of an array as the oracle gives them (numbers only)."""
    return [_native_numeric(data[i]) for i in range(len(data))]


# ---------------------------------------------------------------------------------- oracle


@functools.cache
def _h5py_vlen_byteorder_bug() -> bool:
    """Whether h5py returns big-endian vlen elements unswapped but labelled native (3.16 does)."""
    with h5py.File("vlen-probe.h5", "w", driver="core", backing_store=False) as f:
        d = f.create_dataset("v", shape=(1,), dtype=h5py.vlen_dtype(np.dtype(">i4")))
        d[0] = np.array([1], ">i4")
        got = d[0]
    value = int(got[0])
    if value == 1:
        return False
    assert value == 1 << 24 and got.dtype.isnative, (value, got.dtype)
    return True


def _vlen_array(value: Any, base: np.dtype) -> torch.Tensor:
    arr = np.asarray(value)
    if arr.dtype == object:
        raise NotImplementedError("variable-length arrays in rows of more than one element")
    if (
        _h5py_vlen_byteorder_bug()
        and not base.isnative
        and arr.dtype.isnative
        and arr.dtype == _native(base)
    ):
        arr = arr.view(base)  # h5py left the file's bytes as they were
    return torch.from_numpy(arr.astype(_native(arr.dtype), copy=True))


class TextList(list):  # type: ignore[type-arg]
    """The oracle's row of a variable-length array of strings: batched as a plain list."""


def to_sample(value: Any, dtype: np.dtype) -> Any:
    """Convert what h5py returned for elements of ``dtype`` into the oracle's form."""
    dtype = np.dtype(dtype)
    if dtype.subdtype is not None:  # a sub-array field: value is already an array of the base
        return to_sample(np.asarray(value), dtype.subdtype[0])
    if dtype.names:  # rows of several records: each field an array (or nested list) of them
        return {name: to_sample(value[name], dtype.fields[name][0]) for name in dtype.names}
    if h5py.check_string_dtype(dtype) is not None or dtype.kind == "S":
        if isinstance(value, np.ndarray):
            return _decode_nested(value.tolist())
        return _decode(value)
    base = h5py.check_vlen_dtype(dtype)
    if base is not None:
        element = np.dtype(base).subdtype[0] if np.dtype(base).subdtype else np.dtype(base)
        if element.kind in "SU":
            return TextList(_decode_nested(np.asarray(value).tolist()))
        return _vlen_array(value, np.dtype(base))
    if dtype.kind in "biufc":
        return _native_numeric(value)
    raise ValueError(f"the oracle has no rule for {dtype!r}")


def expected_sample(
    dset: h5py.Dataset,
    row: int,
    *,
    sample_axis: int = 0,
    fields: Sequence[str] | None = None,
) -> Any:
    """Sample ``row`` of an open h5py dataset as loaderkit must return it (see module doc)."""
    axis = sample_axis % dset.ndim
    sel = tuple(row if d == axis else slice(None) for d in range(dset.ndim))
    value = dset[sel]
    if fields is not None:
        return {name: to_sample(value[name], dset.dtype.fields[name][0]) for name in fields}
    return to_sample(value, dset.dtype)


def _key_samples(f: h5py.File, key: str, options: Mapping[str, Any]) -> list[Any]:
    obj = f[key]
    if isinstance(obj, h5py.Group):  # one sample per dataset of the group: its whole array
        return [to_sample(obj[name][()], obj[name].dtype) for name in obj]
    axis = int(options.get("sample_axis", 0))
    n = obj.shape[axis % obj.ndim]
    fields = options.get("fields")
    return [expected_sample(obj, i, sample_axis=axis, fields=fields) for i in range(n)]


def key_names(key: Any) -> dict[str, str] | None:
    """``{name: hdf5 key}`` for several keys, ``None`` for one."""
    if isinstance(key, Mapping):
        return dict(key)
    if isinstance(key, tuple | list):
        return {k: k for k in key}
    return None


def expected_samples(case: Case) -> list[Any]:
    """Every sample of a readable case, in dataset order (sessions in order, rows in order)."""
    out: list[Any] = []
    names = key_names(case.key)
    for path in case.files.values():
        with h5py.File(path, "r") as f:
            if names is None:
                out += _key_samples(f, case.key, case.options)
                continue
            columns = {n: _key_samples(f, k, case.options) for n, k in names.items()}
            (rows,) = {len(c) for c in columns.values()}
            out += [{n: c[i] for n, c in columns.items()} for i in range(rows)]
    return out


def expected_batch(samples: Sequence[Any]) -> Any:
    """``default_collate`` of the expected samples (numpy uint64 scalars, which torch's
    ``as_tensor`` refuses, become a uint64 tensor; numpy bools, which torch 2.6 refuses under
    numpy 2.4, the bool tensor newer torch makes of them)."""
    first = samples[0]
    if isinstance(first, TextList):  # lists of different lengths: never collated
        return [list(s) for s in samples]
    if isinstance(first, Mapping):
        return {k: expected_batch([s[k] for s in samples]) for k in first}
    if isinstance(first, np.generic) and first.dtype in (np.uint64, np.bool_):
        return torch.from_numpy(np.array(samples))
    return default_collate(list(samples))


def assert_same(actual: Any, expected: Any, where: str = "sample") -> None:
    """Equal type, dtype (native byte order), shape and values, recursively."""
    if isinstance(expected, Mapping):
        assert isinstance(actual, Mapping), f"{where}: {type(actual).__name__}, expected a dict"
        assert list(actual) == list(expected), f"{where}: keys {list(actual)} != {list(expected)}"
        for k in expected:
            assert_same(actual[k], expected[k], f"{where}[{k!r}]")
    elif isinstance(expected, str):
        assert isinstance(actual, str), f"{where}: {type(actual).__name__} {actual!r}, expected str"
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"
    elif isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), (
            f"{where}: {type(actual).__name__}, expected Tensor"
        )
        assert actual.dtype == expected.dtype, f"{where}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{where}: shape {actual.shape} != {expected.shape}"
        a, e = actual.detach().cpu().numpy(), expected.numpy()
        assert np.array_equal(a, e, equal_nan=e.dtype.kind in "fc"), f"{where}: {a} != {e}"
    elif isinstance(expected, np.ndarray | np.generic):
        want = np.ndarray if isinstance(expected, np.ndarray) else np.generic
        assert isinstance(actual, want), (
            f"{where}: {type(actual).__name__} {actual!r}, expected {want.__name__} of "
            f"{expected.dtype}"
        )
        assert actual.dtype.isnative, f"{where}: dtype {actual.dtype} is not in native byte order"
        assert _native(actual.dtype) == expected.dtype, (
            f"{where}: dtype {actual.dtype} != {expected.dtype}"
        )
        assert np.shape(actual) == np.shape(expected), f"{where}: shape {np.shape(actual)}"
        eq = np.array_equal(actual, expected, equal_nan=expected.dtype.kind in "fc")
        assert eq, f"{where}: {actual!r} != {expected!r}"
    elif isinstance(expected, list | tuple):
        assert isinstance(actual, list | tuple), f"{where}: {type(actual).__name__}, expected list"
        assert len(actual) == len(expected), f"{where}: length {len(actual)} != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, f"{where}[{i}]")
    else:
        raise TypeError(f"{where}: no comparison for expected {type(expected).__name__}")


# ------------------------------------------------------------------- h5py file inspection


def hdf5_order(dset: h5py.Dataset) -> set[str]:
    """Byte orders of the atomic parts of a dataset's file type ({'<'}, {'>'}, {'<', '>'})."""
    orders: set[str] = set()

    def walk(t: Any) -> None:
        if isinstance(t, h5t.TypeCompoundID):
            for i in range(t.get_nmembers()):
                walk(t.get_member_type(i))
        elif isinstance(t, h5t.TypeArrayID | h5t.TypeVlenID | h5t.TypeEnumID):
            walk(t.get_super())
        elif hasattr(t, "get_order") and not isinstance(t, h5t.TypeStringID) and t.get_size() > 1:
            orders.add(">" if t.get_order() == h5t.ORDER_BE else "<")

    walk(dset.id.get_type())
    return orders


def describe(path: str | os.PathLike[str], key: str) -> str:
    """h5py's view of a dataset: dtype, HDF5 type class, order, layout, chunks, filters."""
    with h5py.File(path, "r") as f:
        obj = f[key]
        if isinstance(obj, h5py.Group):
            return f"group of {len(obj)} datasets"
        plist = obj.id.get_create_plist()
        filters = [plist.get_filter(i) for i in range(plist.get_nfilters())]
        try:
            dtype = str(obj.dtype)
        except (TypeError, ValueError) as exc:
            dtype = f"<{type(exc).__name__}: {exc}>"
        layout = {h5d.COMPACT: "compact", h5d.CONTIGUOUS: "contiguous", h5d.CHUNKED: "chunked"}
        kind = layout.get(plist.get_layout(), "virtual")
        return (
            f"{obj.shape} {dtype} {type(obj.id.get_type()).__name__} order={hdf5_order(obj)} "
            f"{kind} chunks={obj.chunks} filters={[(x[0], x[3]) for x in filters]}"
        )


def _layout(dset: h5py.Dataset) -> int:
    return dset.id.get_create_plist().get_layout()


# ---------------------------------------------------------------------------- the writers


def _case(name: str, path: Path, key: Any, kind: str, **kw: Any) -> Case:
    return Case(name=name, path=path, key=key, expect_kind=kind, **kw)


NUMERIC_CODES = ["i1", "u1", "i2", "i4", "i8", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16"]


def _numeric_writer(code: str, order: str, chunked: bool, one_d: bool) -> Callable[[Path], Case]:
    def write(root: Path) -> Case:
        name = _numeric_name(code, order, chunked, one_d)
        path = root / f"{name}.h5"
        shape = (ROWS,) if one_d else (ROWS, *ROW_SHAPE)
        dtype = np.dtype(code).newbyteorder(order) if order in "<>" else np.dtype(code)
        data = numeric_values(code, shape).astype(dtype)
        kw: dict[str, Any] = {}
        if chunked:
            kw = {"chunks": (4, *shape[1:]), "compression": "gzip", "shuffle": True}
        with h5py.File(path, "w") as f:
            d = f.create_dataset("x", data=data, **kw)
            assert _layout(d) == (h5d.CHUNKED if chunked else h5d.CONTIGUOUS)
            if dtype.itemsize // (2 if dtype.kind == "c" else 1) > 1:
                assert hdf5_order(d) == {order}, (name, hdf5_order(d))
        return _case(name, path, "x", "numeric", truth=_truth_rows(data))

    return write


def _numeric_name(code: str, order: str, chunked: bool, one_d: bool) -> str:
    o = {"<": "le", ">": "be", "|": ""}[order]
    parts = ["num", code] + ([o] if o else []) + (["1d"] if one_d else [])
    parts.append("gzip" if chunked else "contig")
    return "_".join(parts)


for _code in NUMERIC_CODES:
    _orders = "|" if np.dtype(_code).itemsize == 1 else "<>"
    for _order in _orders:
        for _chunked in (False, True):
            _register(
                _numeric_name(_code, _order, _chunked, False),
                "numeric",
                _numeric_writer(_code, _order, _chunked, False),
            )
for _code, _order, _chunked in [
    ("f8", ">", False),
    ("f8", ">", True),
    ("i4", "<", False),
    ("u8", ">", False),
    ("f2", "<", True),
    ("c8", ">", False),
    ("i2", ">", True),
]:
    _register(
        _numeric_name(_code, _order, _chunked, True),
        "numeric",
        _numeric_writer(_code, _order, _chunked, True),
    )


def _bool_writer(chunked: bool, one_d: bool) -> Callable[[Path], Case]:
    def write(root: Path) -> Case:
        name = f"num_bool{'_1d' if one_d else ''}_{'gzip' if chunked else 'contig'}"
        path = root / f"{name}.h5"
        data = numeric_values("?", (ROWS,) if one_d else (ROWS, *ROW_SHAPE))
        kw = {"chunks": (4, *data.shape[1:]), "compression": "gzip"} if chunked else {}
        with h5py.File(path, "w") as f:
            d = f.create_dataset("x", data=data, **kw)
            assert isinstance(d.id.get_type(), h5t.TypeEnumID)  # h5py writes bool as an enum
            assert d.dtype == np.bool_
        return _case(name, path, "x", "numeric", truth=_truth_rows(data))

    return write


for _chunked, _one_d in [(False, False), (True, False), (False, True)]:
    _register(
        f"num_bool{'_1d' if _one_d else ''}_{'gzip' if _chunked else 'contig'}",
        "numeric",
        _bool_writer(_chunked, _one_d),
    )

_ENUM = {"RED": 0, "GREEN": 1, "BLUE": 2, "UNKNOWN": -5}


def _enum_writer(order: str, chunked: bool) -> Callable[[Path], Case]:
    def write(root: Path) -> Case:
        name = f"num_enum_i2_{'be' if order == '>' else 'le'}_{'gzip' if chunked else 'contig'}"
        path = root / f"{name}.h5"
        base = _base((ROWS, *ROW_SHAPE)) % 4
        values = np.where(base == 3, -5, base).astype(np.dtype("i2").newbyteorder(order))
        dt = h5py.enum_dtype(_ENUM, basetype=np.dtype("i2").newbyteorder(order))
        kw = {"chunks": (4, *ROW_SHAPE), "compression": "gzip"} if chunked else {}
        with h5py.File(path, "w") as f:
            d = f.create_dataset("x", data=values, dtype=dt, **kw)
            assert isinstance(d.id.get_type(), h5t.TypeEnumID)
            assert h5py.check_enum_dtype(d.dtype) == _ENUM
            assert hdf5_order(d) == {order}
        return _case(name, path, "x", "numeric", truth=_truth_rows(values))

    return write


for _order, _chunked in [(">", False), ("<", False), (">", True)]:
    _register(
        f"num_enum_i2_{'be' if _order == '>' else 'le'}_{'gzip' if _chunked else 'contig'}",
        "numeric",
        _enum_writer(_order, _chunked),
    )

_BITFIELDS = {
    "b8le": (h5t.STD_B8LE, "<u1"),
    "b16be": (h5t.STD_B16BE, ">u2"),
    "b16le": (h5t.STD_B16LE, "<u2"),
    "b32be": (h5t.STD_B32BE, ">u4"),
    "b64le": (h5t.STD_B64LE, "<u8"),
}


def _lowlevel(
    f: h5py.File, name: str, tid: Any, shape: tuple[int, ...], data: Any, dcpl: Any = None
) -> Any:
    space = h5s.create_simple(shape)
    dsid = h5d.create(f.id, name.encode(), tid, space, dcpl=dcpl)
    if data is not None:
        dsid.write(h5s.ALL, h5s.ALL, np.ascontiguousarray(data), mtype=tid)
    return dsid


def _bitfield_writer(tag: str) -> Callable[[Path], Case]:
    def write(root: Path) -> Case:
        tid, code = _BITFIELDS[tag]
        name = f"num_bitfield_{tag}"
        path = root / f"{name}.h5"
        shape = (ROWS, 4) if tag != "b16be" else (ROWS,)
        data = numeric_values(code[1:], shape).astype(code)
        with h5py.File(path, "w") as f:
            _lowlevel(f, "x", tid.copy(), shape, data)
            d = f["x"]
            assert isinstance(d.id.get_type(), h5t.TypeBitfieldID)
            assert d.dtype.kind == "u", d.dtype
        return _case(name, path, "x", "numeric", truth=_truth_rows(data))

    return write


for _tag in _BITFIELDS:
    _register(f"num_bitfield_{_tag}", "numeric", _bitfield_writer(_tag))

_NATIVE_COMPLEX = {
    "f32be": (h5t.COMPLEX_IEEE_F32BE, ">c8"),
    "f64le": (h5t.COMPLEX_IEEE_F64LE, "<c16"),
    "f64be": (h5t.COMPLEX_IEEE_F64BE, ">c16"),
}


def _native_complex_writer(tag: str) -> Callable[[Path], Case]:
    """HDF5 2.0's own complex class (H5T_COMPLEX), not h5py's default {r, i} compound."""

    def write(root: Path) -> Case:
        tid, code = _NATIVE_COMPLEX[tag]
        name = f"num_h5complex_{tag}"
        path = root / f"{name}.h5"
        data = numeric_values(code[1:], (ROWS, *ROW_SHAPE)).astype(code)
        with h5py.File(path, "w") as f:
            _lowlevel(f, "x", tid.copy(), data.shape, data)
            assert isinstance(f["x"].id.get_type(), h5t.TypeComplexID)
        return _case(name, path, "x", "numeric", truth=_truth_rows(data))

    return write


for _tag in _NATIVE_COMPLEX:
    _register(f"num_h5complex_{_tag}", "numeric", _native_complex_writer(_tag))


def _two_sessions_numeric(root: Path) -> Case:
    """Big-endian chunked rows in two sessions of different lengths (batches cross files)."""
    name = "num_f8_be_gzip_2sessions"
    sessions, truth = {}, []
    for sid, rows, offset in (("first", ROWS, 0), ("second", 7, 1000)):
        path = root / f"{name}_{sid}.h5"
        data = numeric_values("f8", (rows, *ROW_SHAPE), offset).astype(">f8")
        with h5py.File(path, "w") as f:
            f.create_dataset("x", data=data, chunks=(4, *ROW_SHAPE), compression="gzip")
        sessions[sid] = path
        truth += _truth_rows(data)
    return _case(name, sessions["first"], "x", "numeric", sessions=sessions, truth=truth)


_register("num_f8_be_gzip_2sessions", "numeric", _two_sessions_numeric)


# --------------------------------------------------------------------------------- strings


def _text(i: int, alphabet: str) -> str:
    """Row i's text: empty for row 0, of varying length otherwise."""
    if i == 0:
        return ""
    return "".join(alphabet[(i + k) % len(alphabet)] for k in range(i % 4)) + str(i)


_UTF8 = "éü€日本🙂ß"
_ASCII = "abc xyz-"


def _string_writer(tag: str) -> Callable[[Path], Case]:
    def write(root: Path) -> Case:
        name = f"str_{tag}"
        path = root / f"{name}.h5"
        kw: dict[str, Any] = {}
        if tag.endswith("_gzip"):
            kw = {"chunks": (4,), "compression": "gzip"}
        if tag.startswith("fixed_ascii"):
            texts = [_text(i, _ASCII) for i in range(ROWS)]
            data: Any = np.array([t.encode() for t in texts], "S8")
            dtype = None
        elif tag.startswith("fixed_utf8"):
            texts = [_text(i, "éü€") for i in range(ROWS)]
            dtype = h5py.string_dtype("utf-8", 10)
            data = np.array([t.encode() for t in texts], dtype=dtype)
        elif tag.startswith("vlen_ascii"):
            texts = [f"row {i}: " + "x" * i if i else "" for i in range(ROWS)]
            dtype = h5py.string_dtype("ascii")
            data = np.array([t.encode() for t in texts], dtype=object)
        else:
            texts = [_text(i, _UTF8) * 2 for i in range(ROWS)]
            dtype = h5py.string_dtype("utf-8")
            data = np.array(texts, dtype=object)
        with h5py.File(path, "w") as f:
            d = f.create_dataset("x", data=data, dtype=dtype, **kw)
            info = h5py.check_string_dtype(d.dtype)
            assert info is not None
            assert info.encoding == ("ascii" if "ascii" in tag else "utf-8"), info
            assert (info.length is None) == tag.startswith("vlen"), info
        assert any(ord(c) > 127 for t in texts for c in t) == ("utf8" in tag)
        return _case(name, path, "x", "string", truth=texts)

    return write


for _tag in ["fixed_ascii", "fixed_utf8", "vlen_ascii", "vlen_utf8", "vlen_utf8_gzip"]:
    _register(f"str_{_tag}", "string", _string_writer(_tag))


# ---------------------------------------------------------------------------------- ragged


def _ragged_rows(code: str, rows: int, offset: int = 0) -> list[np.ndarray]:
    """Row i holds ``(i * 7) % 5`` values (row 0 and row 5: none)."""
    out = []
    for i in range(rows):
        n = (i * 7) % 5
        out.append(numeric_values(code, (n,), offset + 10 * i).astype(code))
    return out


def _obj(rows: list[np.ndarray]) -> np.ndarray:
    arr = np.empty(len(rows), dtype=object)
    for i, r in enumerate(rows):
        arr[i] = r
    return arr


def _ragged_truth(rows: list[np.ndarray]) -> list[torch.Tensor]:
    return [torch.from_numpy(r.astype(_native(r.dtype))) for r in rows]


def _ragged_writer(code: str, chunked: bool) -> Callable[[Path], Case]:
    def write(root: Path) -> Case:
        name = _ragged_name(code, chunked)
        path = root / f"{name}.h5"
        rows = _ragged_rows(code, ROWS)
        kw = {"chunks": (4,), "compression": "gzip"} if chunked else {}
        with h5py.File(path, "w") as f:
            d = f.create_dataset(
                "spikes", shape=(ROWS,), dtype=h5py.vlen_dtype(np.dtype(code)), **kw
            )
            d[...] = _obj(rows)
            assert isinstance(d.id.get_type(), h5t.TypeVlenID)
            if np.dtype(code).itemsize > 1:
                assert hdf5_order(d) == {code[0]}, hdf5_order(d)
        assert [len(r) for r in rows].count(0) >= 1
        return _case(name, path, "spikes", "ragged", truth=_ragged_truth(rows))

    return write


def _ragged_name(code: str, chunked: bool) -> str:
    o = {"<": "le", ">": "be", "|": ""}[code[0]]
    return f"ragged_{code[1:]}_{o}_{'gzip' if chunked else 'contig'}".replace("__", "_")


for _code, _chunked in [("<f4", False), (">i4", False), (">f8", True), ("|u1", False)]:
    _register(_ragged_name(_code, _chunked), "ragged", _ragged_writer(_code, _chunked))


def _ragged_two_sessions(root: Path) -> Case:
    name = "ragged_f4_le_2sessions"
    sessions, truth = {}, []
    for sid, rows, offset in (("a", ROWS, 0), ("b", 6, 5000)):
        path = root / f"{name}_{sid}.h5"
        data = _ragged_rows("<f4", rows, offset)
        with h5py.File(path, "w") as f:
            d = f.create_dataset("spikes", shape=(rows,), dtype=h5py.vlen_dtype(np.dtype("<f4")))
            d[...] = _obj(data)
        sessions[sid] = path
        truth += _ragged_truth(data)
    return _case(name, sessions["a"], "spikes", "ragged", sessions=sessions, truth=truth)


_register("ragged_f4_le_2sessions", "ragged", _ragged_two_sessions)


# -------------------------------------------------------------------------------- compound

_COMPOUNDS: dict[str, list[Any]] = {
    "flat": [("a", "<f4"), ("b", ">i8"), ("c", "S4")],
    "nested": [("pos", [("x", "<f8"), ("y", "<f8")]), ("id", "<i4")],
    "subarray": [("img", ">i2", (5, 10)), ("id", "<u2"), ("t", ">f8")],
    "be": [("a", ">f4"), ("b", ">i4"), ("c", ">c16"), ("d", ">u8"), ("e", ">f2")],
    "mixed": [("flag", "?"), ("kind", "enum"), ("label", "vlen_str"), ("w", ">f4", (2,))],
}


def _compound_dtype(tag: str) -> np.dtype:
    fields = []
    for f in _COMPOUNDS[tag]:
        if f[1] == "enum":
            fields.append((f[0], h5py.enum_dtype(_ENUM, basetype=np.dtype(">i2"))))
        elif f[1] == "vlen_str":
            fields.append((f[0], h5py.string_dtype("utf-8")))
        else:
            fields.append(f)
    return np.dtype(fields)


def _fill_compound(arr: np.ndarray, offset: int = 0) -> None:
    """Give every field of every row a value that identifies the row."""

    def fill(a: np.ndarray, dtype: np.dtype, salt: int) -> None:
        for k, name in enumerate(dtype.names):
            sub = dtype.fields[name][0]
            n = len(a)
            if sub.names:
                fill(a[name], sub, salt + 10 * k)
                continue
            base = sub.subdtype[0] if sub.subdtype else sub
            shape = (n, *(sub.subdtype[1] if sub.subdtype else ()))
            if h5py.check_string_dtype(base) is not None and base.kind == "O":
                a[name] = [_text(i + offset, _UTF8) for i in range(n)]
            elif base.kind == "S":
                a[name] = [f"c{i + offset}".encode() for i in range(n)]
            elif h5py.check_enum_dtype(base) is not None:
                a[name] = (np.arange(n) + salt) % 3
            else:
                vals = numeric_values(base.str[1:], shape, offset * 100 + salt)
                a[name] = vals.reshape(shape).astype(base)

    fill(arr, arr.dtype, 0)


def _compound_writer(tag: str, chunked: bool, name: str | None = None) -> Callable[[Path], Case]:
    def write(root: Path) -> Case:
        name_ = name or f"compound_{tag}_{'gzip' if chunked else 'contig'}"
        path = root / f"{name_}.h5"
        dtype = _compound_dtype(tag)
        data = np.zeros(ROWS, dtype=dtype)
        _fill_compound(data)
        kw = {"chunks": (4,), "compression": "gzip"} if chunked else {}
        with h5py.File(path, "w") as f:
            d = f.create_dataset("table", data=data, **kw)
            assert isinstance(d.id.get_type(), h5t.TypeCompoundID)
            truth = [to_sample(data[i], dtype) for i in range(ROWS)]
        return _case(name_, path, "table", "compound", truth=truth)

    return write


for _tag, _chunked in [
    ("flat", False),
    ("flat", True),
    ("nested", False),
    ("subarray", False),
    ("subarray", True),
    ("be", False),
    ("mixed", False),
]:
    _register(
        f"compound_{_tag}_{'gzip' if _chunked else 'contig'}",
        "compound",
        _compound_writer(_tag, _chunked),
    )


def _compound_rows_of_records(root: Path) -> Case:
    """A 2-D compound dataset: each row holds 3 records (strings and a nested compound too)."""
    name = "compound_2d_rows"
    path = root / f"{name}.h5"
    dtype = np.dtype(
        [("a", "<f4", (2,)), ("b", ">i8"), ("c", "S4"), ("pos", [("x", ">f8"), ("y", "<i2")])]
    )
    data = np.zeros(ROWS * 3, dtype=dtype)
    _fill_compound(data)
    data = data.reshape(ROWS, 3)
    with h5py.File(path, "w") as f:
        f.create_dataset("table", data=data)
    truth = [to_sample(data[i], dtype) for i in range(ROWS)]
    return _case(name, path, "table", "compound", truth=truth)


_register("compound_2d_rows", "compound", _compound_rows_of_records)


def _compound_two_sessions(root: Path) -> Case:
    name = "compound_flat_2sessions"
    sessions, truth = {}, []
    dtype = _compound_dtype("flat")
    for sid, rows, offset in (("a", 5, 0), ("b", ROWS, 7)):
        path = root / f"{name}_{sid}.h5"
        data = np.zeros(rows, dtype=dtype)
        _fill_compound(data, offset)
        with h5py.File(path, "w") as f:
            f.create_dataset("table", data=data, chunks=(3,))
        sessions[sid] = path
        truth += [to_sample(data[i], dtype) for i in range(rows)]
    return _case(name, sessions["a"], "table", "compound", sessions=sessions, truth=truth, rows=5)


_register("compound_flat_2sessions", "compound", _compound_two_sessions)


def _fields_writer(tag: str, fields: list[str]) -> Callable[[Path], Case]:
    def write(root: Path) -> Case:
        case = _compound_writer(tag, False, name=f"fields_{tag}")(root)
        truth = [{k: t[k] for k in fields} for t in case.truth or []]
        return dataclasses.replace(case, options={"fields": fields}, truth=truth)

    return write


_register("fields_flat", "compound", _fields_writer("flat", ["a", "b"]))
_register("fields_subarray", "compound", _fields_writer("subarray", ["t", "img"]))


# ------------------------------------------------------------------------- PyTables, pandas


def _tables() -> Any:
    import tables

    return tables


def _pytables_table(root: Path, *, big: bool, zlib: bool) -> Case:
    tables = _tables()

    class Particle(tables.IsDescription):
        idnum = tables.Int64Col(pos=0)
        name = tables.StringCol(8, pos=1)
        energy = tables.Float64Col(pos=2)
        img = tables.Int16Col(shape=(5, 10), pos=3)
        flag = tables.BoolCol(pos=4)
        count = tables.UInt32Col(pos=5)
        half = tables.Float16Col(pos=6)
        z = tables.ComplexCol(itemsize=16, pos=7)

    name = f"tables_table_{'be' if big else 'le'}{'_zlib' if zlib else ''}"
    path = root / f"{name}.h5"
    filters = tables.Filters(complevel=5, complib="zlib") if zlib else None
    with tables.open_file(str(path), "w") as f:
        kw: dict[str, Any] = {"byteorder": "big"} if big else {}
        t = f.create_table("/", "particles", Particle, filters=filters, **kw)
        row = t.row
        for i in range(ROWS):
            row["idnum"] = i * 1_000_003
            row["name"] = f"p{i}".encode() if i else b""
            row["energy"] = i * 1.5 - 3
            row["img"] = np.arange(50).reshape(5, 10) + i * 100
            row["flag"] = i % 3 == 0
            row["count"] = i * 0x01020304
            row["half"] = i / 4
            row["z"] = i - 2j * i
            row.append()
        t.flush()
    with h5py.File(path, "r") as f:
        d = f["particles"]
        assert isinstance(d.id.get_type(), h5t.TypeCompoundID)
        assert (">" in hdf5_order(d)) == big, hdf5_order(d)
        assert d.dtype.fields["img"][0].shape == (5, 10)
    truth = [
        {
            "idnum": np.int64(i * 1_000_003),
            "name": f"p{i}" if i else "",
            "energy": np.float64(i * 1.5 - 3),
            "img": (np.arange(50).reshape(5, 10) + i * 100).astype(np.int16),
            "flag": np.uint8(i % 3 == 0),  # PyTables' BoolCol is an 8-bit bitfield
            "count": np.uint32(i * 0x01020304),
            "half": np.float16(i / 4),
            "z": np.complex128(i - 2j * i),
        }
        for i in range(ROWS)
    ]
    return _case(name, path, "particles", "compound", truth=truth)


_register("tables_table_be", "compound", lambda r: _pytables_table(r, big=True, zlib=False))
_register("tables_table_le_zlib", "compound", lambda r: _pytables_table(r, big=False, zlib=True))


def _pytables_array(root: Path) -> Case:
    tables = _tables()
    name = "tables_array_be"
    path = root / f"{name}.h5"
    data = numeric_values("f8", (ROWS, 3)).astype(">f8")
    with tables.open_file(str(path), "w") as f:
        f.create_array("/", "array", data)
    with h5py.File(path, "r") as f:
        assert hdf5_order(f["array"]) == {">"} and _layout(f["array"]) == h5d.CONTIGUOUS
    return _case(name, path, "array", "numeric", truth=_truth_rows(data))


_register("tables_array_be", "numeric", _pytables_array)


def _pytables_earray(root: Path) -> Case:
    tables = _tables()
    name = "tables_earray"
    path = root / f"{name}.h5"
    data = numeric_values("i4", (ROWS, 4))
    with tables.open_file(str(path), "w") as f:
        e = f.create_earray("/", "earray", tables.Int32Atom(), shape=(0, 4), chunkshape=(4, 4))
        e.append(data[:5])
        e.append(data[5:])  # extended twice, as loggers write them
    with h5py.File(path, "r") as f:
        assert f["earray"].maxshape == (None, 4) and f["earray"].chunks == (4, 4)
    return _case(name, path, "earray", "numeric", truth=_truth_rows(data))


_register("tables_earray", "numeric", _pytables_earray)

#: PyTables complib -> the filter id h5py sees in the pipeline.
_CARRAY_LIBS = {"blosc": 32001, "blosc:lz4": 32001, "blosc2": 32026, "zlib": 1, "bzip2": 307}


def _pytables_carray(lib: str) -> Callable[[Path], Case]:
    def write(root: Path) -> Case:
        tables = _tables()
        name = f"tables_carray_{lib.replace(':', '_')}"
        path = root / f"{name}.h5"
        data = numeric_values("f4", (ROWS, 6))
        filters = tables.Filters(complevel=5, complib=lib, shuffle=True)
        with tables.open_file(str(path), "w") as f:
            c = f.create_carray(
                "/",
                "carray",
                tables.Float32Atom(),
                shape=data.shape,
                chunkshape=(3, 6),
                filters=filters,
            )
            c[:] = data
        with h5py.File(path, "r") as f:
            plist = f["carray"].id.get_create_plist()
            ids = [plist.get_filter(i)[0] for i in range(plist.get_nfilters())]
            assert _CARRAY_LIBS[lib] in ids, ids
        return _case(name, path, "carray", "numeric", truth=_truth_rows(data))

    return write


for _lib in _CARRAY_LIBS:
    _register(f"tables_carray_{_lib.replace(':', '_')}", "numeric", _pytables_carray(_lib))


def _pytables_vlarray(atom: str) -> Callable[[Path], Case]:
    def write(root: Path) -> Case:
        tables = _tables()
        name = f"tables_vlarray_{atom}"
        path = root / f"{name}.h5"
        with tables.open_file(str(path), "w") as f:
            if atom == "int32":
                rows: list[Any] = _ragged_rows("<i4", ROWS)
                v = f.create_vlarray("/", "events", tables.Int32Atom())
            elif atom == "vlstring":  # stored as vlen of uint8 (h5py: uint8 arrays)
                rows = [np.frombuffer((f"s{i}" * (i % 3)).encode(), "u1") for i in range(ROWS)]
                v = f.create_vlarray("/", "events", tables.VLStringAtom())
            else:  # vlunicode: vlen of uint32 code points
                rows = [np.array([ord(c) for c in _text(i, _UTF8)], "<u4") for i in range(ROWS)]
                v = f.create_vlarray("/", "events", tables.VLUnicodeAtom())
            for i, r in enumerate(rows):
                if atom == "vlstring":
                    v.append(r.tobytes())
                elif atom == "vlunicode":
                    v.append(_text(i, _UTF8))
                else:
                    v.append(r)
        with h5py.File(path, "r") as f:
            assert isinstance(f["events"].id.get_type(), h5t.TypeVlenID)
        return _case(name, path, "events", "ragged", truth=_ragged_truth(rows))

    return write


for _atom in ("int32", "vlstring", "vlunicode"):
    _register(f"tables_vlarray_{_atom}", "ragged", _pytables_vlarray(_atom))


def _pytables_vlarray_strings(pairs: bool) -> Callable[[Path], Case]:
    """A ``VLArray`` of fixed-length strings (``StringAtom``): each row a list of strings.

    ``pairs``: an atom of two strings per element (rows of ``(k, 2)`` strings), compressed.
    """

    def write(root: Path) -> Case:
        tables = _tables()
        name = f"tables_vlarray_strings{'_pairs_zlib' if pairs else ''}"
        path = root / f"{name}.h5"
        truth: list[Any] = []
        with tables.open_file(str(path), "w") as f:
            if pairs:
                filters = tables.Filters(complevel=5, complib="zlib")
                atom = tables.StringAtom(itemsize=4, shape=(2,))
                v = f.create_vlarray("/", "labels", atom, filters=filters)
                for i in range(ROWS):
                    row = [[f"a{i}{k}", f"b{k}"] for k in range(i % 4)]
                    v.append(np.array(row, dtype="S4").reshape(-1, 2))
                    truth.append(TextList(row))
            else:
                v = f.create_vlarray("/", "labels", tables.StringAtom(itemsize=6))
                for i in range(ROWS):
                    row = [_text(i + k, _ASCII)[:6] for k in range(i % 3)]
                    v.append(np.array([t.encode() for t in row], dtype="S6"))
                    truth.append(TextList(row))
        with h5py.File(path, "r") as f:
            base = h5py.check_vlen_dtype(f["labels"].dtype)
            assert base is not None and np.dtype(base).kind in "SV", base
        return _case(name, path, "labels", "string", truth=truth)

    return write


for _pairs in (False, True):
    _register(
        f"tables_vlarray_strings{'_pairs_zlib' if _pairs else ''}",
        "string",
        _pytables_vlarray_strings(_pairs),
    )


def _pandas_table(data_columns: bool) -> Callable[[Path], Case]:
    def write(root: Path) -> Case:
        import pandas as pd

        name = f"pandas_table{'_data_columns' if data_columns else ''}"
        path = root / f"{name}.h5"
        df = pd.DataFrame(
            {
                "count": np.arange(ROWS, dtype="int64") * 3 - 7,
                "value": np.arange(ROWS) * 0.25,
                "label": [f"row{i}" if i % 5 else "" for i in range(ROWS)],
                "ok": np.arange(ROWS) % 3 == 0,
                "small": np.arange(ROWS, dtype="int32"),
            }
        )
        df.to_hdf(path, key="df", format="table", data_columns=data_columns or None)
        with h5py.File(path, "r") as f:
            d = f["df/table"]
            assert isinstance(d.id.get_type(), h5t.TypeCompoundID) and d.shape == (ROWS,)
            if not data_columns:  # columns in per-dtype blocks: sub-array fields of shape (k,)
                assert any(d.dtype.fields[n][0].subdtype for n in d.dtype.names)
        return _case(name, path, "df/table", "compound")

    return write


_register("pandas_table", "compound", _pandas_table(False))
_register("pandas_table_data_columns", "compound", _pandas_table(True))


# --------------------------------------------------------------------------------- layouts


def _rows_f4(offset: int = 0, rows: int = ROWS, code: str = "<f4") -> np.ndarray:
    return numeric_values("f4", (rows, *ROW_SHAPE), offset).astype(code)


def _soft_link(root: Path) -> Case:
    name = "layout_soft_link"
    path = root / f"{name}.h5"
    data = _rows_f4(code=">f4")
    with h5py.File(path, "w") as f:
        f.create_dataset("real/data", data=data)
        f["betas"] = h5py.SoftLink("/real/data")
        assert isinstance(f.get("betas", getlink=True), h5py.SoftLink)
    return _case(name, path, "betas", "numeric", truth=_truth_rows(data))


def _external_link(root: Path) -> Case:
    name = "layout_external_link"
    path = root / f"{name}.h5"
    target = root / f"{name}_target.h5"
    data = _rows_f4(7, code="<f4")
    with h5py.File(target, "w") as f:
        f.create_dataset("data", data=data, chunks=(2, *ROW_SHAPE))
    with h5py.File(path, "w") as f:
        f["betas"] = h5py.ExternalLink(target.name, "/data")  # relative, as tools write it
    return _case(name, path, "betas", "numeric", truth=_truth_rows(data))


def _external_storage(root: Path) -> Case:
    """Contiguous big-endian rows whose bytes live in a raw file next to the HDF5 file."""
    name = "layout_external_storage"
    path = root / f"{name}.h5"
    raw = root / f"{name}.raw"
    data = _rows_f4(3, code=">f4")
    with h5py.File(path, "w") as f:
        d = f.create_dataset("betas", data=data, external=[(os.fspath(raw), 0, h5py.h5f.UNLIMITED)])
        assert d.id.get_create_plist().get_external_count() == 1
    assert raw.stat().st_size == data.nbytes
    return _case(name, path, "betas", "numeric", truth=_truth_rows(data))


def _virtual(root: Path) -> Case:
    """A virtual dataset whose rows come from two other (big-endian) files."""
    name = "layout_virtual"
    path = root / f"{name}.h5"
    halves = []
    layout = h5py.VirtualLayout(shape=(ROWS, *ROW_SHAPE), dtype="<f4")
    for part, lo in (("a", 0), ("b", ROWS // 2)):
        src = root / f"{name}_src_{part}.h5"
        data = _rows_f4(code=">f4")[lo : lo + ROWS // 2]
        with h5py.File(src, "w") as f:
            f.create_dataset("data", data=data)
        layout[lo : lo + ROWS // 2] = h5py.VirtualSource(src.name, "data", shape=data.shape)
        halves.append(data)
    with h5py.File(path, "w") as f:
        d = f.create_virtual_dataset("betas", layout, fillvalue=-1)
        assert d.is_virtual and len(d.virtual_sources()) == 2
    return _case(name, path, "betas", "numeric", truth=_truth_rows(np.concatenate(halves)))


def _unwritten_chunks(root: Path) -> Case:
    name = "layout_unwritten_chunks"
    path = root / f"{name}.h5"
    data = numeric_values("i4", (ROWS, *ROW_SHAPE))
    stored = np.full_like(data, -1)
    stored[4:8] = data[4:8]
    with h5py.File(path, "w") as f:
        d = f.create_dataset(
            "betas", shape=data.shape, dtype="<i4", chunks=(4, *ROW_SHAPE), fillvalue=-1
        )
        d[4:8] = data[4:8]  # chunks 0 and 2 are never written
        assert d.id.get_num_chunks() == 1
    return _case(name, path, "betas", "numeric", truth=_truth_rows(stored))


def _compact(root: Path) -> Case:
    name = "layout_compact"
    path = root / f"{name}.h5"
    data = _rows_f4(code=">f4")[:, :2, :2]  # compact data must fit in the object header
    dcpl = h5p.create(h5p.DATASET_CREATE)
    dcpl.set_layout(h5d.COMPACT)
    with h5py.File(path, "w") as f:
        _lowlevel(f, "betas", h5t.py_create(data.dtype), data.shape, data, dcpl)
        assert _layout(f["betas"]) == h5d.COMPACT
    return _case(name, path, "betas", "numeric", truth=_truth_rows(data))


def _scaleoffset(kind: str) -> Callable[[Path], Case]:
    def write(root: Path) -> Case:
        name = f"layout_scaleoffset_{kind}"
        path = root / f"{name}.h5"
        if kind == "int":
            data: np.ndarray = numeric_values("i4", (ROWS, *ROW_SHAPE)).astype(">i4")
            so = 0
        else:
            data = (_base((ROWS, *ROW_SHAPE)) / 7).astype("<f8")
            so = 2  # lossy: two decimal digits kept
        with h5py.File(path, "w") as f:
            d = f.create_dataset("betas", data=data, chunks=(4, *ROW_SHAPE), scaleoffset=so)
            plist = d.id.get_create_plist()
            assert plist.get_filter(0)[0] == h5z.FILTER_SCALEOFFSET
        truth = _truth_rows(data) if kind == "int" else None
        return _case(name, path, "betas", "numeric", truth=truth)

    return write


def _nbit(root: Path) -> Case:
    name = "layout_nbit"
    path = root / f"{name}.h5"
    data = (numeric_values("i4", (ROWS, *ROW_SHAPE)) // 4096).astype("<i4")  # fits 20 bits
    tid = h5t.STD_I32LE.copy()
    tid.set_precision(20)  # HDF5 2.0 refuses fewer bits (H5Pset_relax_file_integrity_checks)
    dcpl = h5p.create(h5p.DATASET_CREATE)
    dcpl.set_chunk((4, *ROW_SHAPE))
    dcpl.set_filter(h5z.FILTER_NBIT, h5z.FLAG_OPTIONAL)  # what H5Pset_nbit does
    with h5py.File(path, "w") as f:
        _lowlevel(f, "betas", tid, data.shape, data, dcpl)
        d = f["betas"]
        assert d.id.get_create_plist().get_filter(0)[0] == h5z.FILTER_NBIT
        assert d.id.get_type().get_precision() == 20
    return _case(name, path, "betas", "numeric", truth=_truth_rows(data))


def _fletcher32(root: Path) -> Case:
    name = "layout_fletcher32"
    path = root / f"{name}.h5"
    data = _rows_f4(code="<f4")
    with h5py.File(path, "w") as f:
        f.create_dataset("betas", data=data, chunks=(4, *ROW_SHAPE), fletcher32=True)
    return _case(name, path, "betas", "numeric", truth=_truth_rows(data))


def _filter_writer(tag: str) -> Callable[[Path], Case]:
    """Filters loaderkit's process has: h5py's own LZF, hdf5plugin's LZ4/Zstd/Blosc2."""

    def write(root: Path) -> Case:
        name = f"filter_{tag}"
        path = root / f"{name}.h5"
        data = _rows_f4(code=">f4" if tag == "lzf" else "<f4")
        kw: dict[str, Any]
        if tag == "lzf":
            kw = {"compression": "lzf"}
        else:
            import hdf5plugin

            kw = dict(
                {"lz4": hdf5plugin.LZ4, "zstd": hdf5plugin.Zstd, "blosc2": hdf5plugin.Blosc2}[tag]()
            )
        with h5py.File(path, "w") as f:
            f.create_dataset("betas", data=data, chunks=(4, *ROW_SHAPE), **kw)
        return _case(name, path, "betas", "numeric", truth=_truth_rows(data))

    return write


_register("layout_soft_link", "numeric", _soft_link)
_register("layout_external_link", "numeric", _external_link)
_register("layout_external_storage", "numeric", _external_storage)
_register("layout_virtual", "numeric", _virtual)
_register("layout_unwritten_chunks", "numeric", _unwritten_chunks)
_register("layout_compact", "numeric", _compact)
_register("layout_scaleoffset_int", "numeric", _scaleoffset("int"))
_register("layout_scaleoffset_float", "numeric", _scaleoffset("float"))
_register("layout_nbit", "numeric", _nbit)
_register("layout_fletcher32", "numeric", _fletcher32)
for _tag in ("lzf", "lz4", "zstd", "blosc2"):
    _register(f"filter_{_tag}", "numeric", _filter_writer(_tag))


# --------------------------------------------------- sample axis, groups, several keys


def _sample_axis(axis: int, chunked: bool) -> Callable[[Path], Case]:
    """Shape (4, 5, N) (MATLAB/Fortran order), read there as ``dset[:, :, i]``."""

    def write(root: Path) -> Case:
        name = f"axis_{'last' if axis < 0 else axis}_{'chunked' if chunked else 'contig'}"
        path = root / f"{name}.h5"
        code = "<i2" if chunked else ">f4"
        shape = (4, 5, ROWS) if axis != 1 else (4, ROWS, 5)
        data = numeric_values(code[1:], shape).astype(code)
        kw = {"chunks": (4, 5, 1) if axis != 1 else (4, 1, 5)} if chunked else {}
        with h5py.File(path, "w") as f:
            f.create_dataset("x", data=data, **kw)
        sel = [np.take(data, i, axis=axis) for i in range(ROWS)]
        return _case(
            name,
            path,
            "x",
            "numeric",
            options={"sample_axis": axis},
            truth=[_native_numeric(s) for s in sel],
        )

    return write


for _axis, _chunked in [(2, False), (-1, True), (1, False)]:
    _register(
        f"axis_{'last' if _axis < 0 else _axis}_{'chunked' if _chunked else 'contig'}",
        "numeric",
        _sample_axis(_axis, _chunked),
    )


def _patches(root: Path) -> Case:
    """One dataset per sample (``f["patches"][keys[i]]``), names in h5py's order."""
    name = "group_patches"
    path = root / f"{name}.h5"
    truth = []
    with h5py.File(path, "w") as f:
        g = f.create_group("patches")
        for i in range(ROWS):
            data = numeric_values("f4", (8, 8), 64 * i).astype(">f4" if i % 2 else "<f4")
            g.create_dataset(f"p{i:03d}", data=data)
            truth.append(_native_numeric(data))
        assert list(g.keys()) == [f"p{i:03d}" for i in range(ROWS)]
    return _case(name, path, "patches", "numeric", truth=truth)


_register("group_patches", "numeric", _patches)


def _write_keys_file(path: Path, rows: int, label_rows: int | None = None) -> dict[str, Any]:
    betas = _rows_f4(rows=rows, code=">f4")
    labels = (np.arange(label_rows or rows) * 3).astype("<i8")
    names = [_text(i, _UTF8) for i in range(rows)]
    with h5py.File(path, "w") as f:
        f.create_dataset("betas", data=betas, chunks=(4, *ROW_SHAPE))
        f.create_dataset("labels", data=labels)
        f.create_dataset("meta/labels", data=labels.astype(">i2"))
        f.create_dataset("names", data=np.array(names, dtype=object), dtype=h5py.string_dtype())
    return {
        "betas": _truth_rows(betas),
        "labels": _truth_rows(labels),
        "meta/labels": _truth_rows(labels.astype(">i2")),
        "names": names,
    }


def _keys_writer(tag: str, key: Any) -> Callable[[Path], Case]:
    def write(root: Path) -> Case:
        name = f"keys_{tag}"
        path = root / f"{name}.h5"
        cols = _write_keys_file(path, ROWS)
        names = key_names(key) or {}
        truth = [{n: cols[k][i] for n, k in names.items()} for i in range(ROWS)]
        return _case(name, path, key, "keys", truth=truth)

    return write


_register("keys_tuple", "keys", _keys_writer("tuple", ("betas", "labels")))
_register("keys_mapping", "keys", _keys_writer("mapping", {"x": "betas", "y": "meta/labels"}))
_register("keys_with_strings", "keys", _keys_writer("with_strings", ("betas", "names", "labels")))


def _keys_bad_rows(root: Path) -> Case:
    """Session "ok" is aligned; in session "short" ``labels`` has 10 rows and ``betas`` 12."""
    name = "keys_bad_rows"
    ok, short = root / f"{name}_ok.h5", root / f"{name}_short.h5"
    _write_keys_file(ok, ROWS)
    _write_keys_file(short, ROWS, label_rows=10)
    return _case(
        name,
        ok,
        ("betas", "labels"),
        "bad_rows",
        sessions={"ok": ok, "short": short},
        match=("short", "12", "10"),
    )


_register("keys_bad_rows", "bad_rows", _keys_bad_rows)


# ------------------------------------------------------------------------------- refusals


def _refusal(tag: str, match: tuple[str, ...]) -> Callable[[Path], Case]:
    def write(root: Path) -> Case:
        name = f"refuse_{tag}"
        path = root / f"{name}.h5"
        with h5py.File(path, "w") as f:
            if tag == "longdouble":
                f.create_dataset(
                    "payload", data=np.arange(ROWS * 3).reshape(ROWS, 3).astype(np.longdouble)
                )
                assert f["payload"].dtype == np.longdouble
            elif tag == "float128":
                tid = h5t.IEEE_F128LE.copy()
                _lowlevel(f, "payload", tid, (ROWS, 3), np.zeros((ROWS, 3), "V16"))
            elif tag in ("time32", "time64be"):
                tid = (h5t.UNIX_D32LE if tag == "time32" else h5t.UNIX_D64BE).copy()
                code = "<i4" if tag == "time32" else ">i8"
                _lowlevel(
                    f, "payload", tid, (ROWS,), (np.arange(ROWS) + 1_600_000_000).astype(code)
                )
                assert isinstance(f["payload"].id.get_type(), h5t.TypeTimeID)
            elif tag == "reference":
                f.create_dataset("target", data=np.arange(3))
                d = f.create_dataset("payload", shape=(ROWS,), dtype=h5py.ref_dtype)
                d[...] = np.array([f["target"].ref] * ROWS, dtype=h5py.ref_dtype)
            elif tag == "region_reference":
                f.create_dataset("target", data=np.arange(ROWS))
                d = f.create_dataset("payload", shape=(ROWS,), dtype=h5py.regionref_dtype)
                for i in range(ROWS):
                    d[i] = f["target"].regionref[i : i + 1]
            elif tag == "opaque":
                f.create_dataset("payload", data=np.zeros((ROWS,), "V8"))
                assert isinstance(f["payload"].id.get_type(), h5t.TypeOpaqueID)
            elif tag == "complex_half":  # H5T_COMPLEX of 2-byte floats: no numpy type
                tid = h5t.COMPLEX_IEEE_F16LE.copy()
                _lowlevel(f, "payload", tid, (ROWS, 2), np.zeros((ROWS, 2), "V4"))
            elif tag == "compound_with_reference":
                f.create_dataset("target", data=np.arange(3))
                dt = np.dtype([("id", "<i4"), ("where", h5py.ref_dtype)])
                data = np.zeros(ROWS, dt)
                data["id"] = np.arange(ROWS)
                data["where"] = [f["target"].ref] * ROWS
                f.create_dataset("payload", data=data)
            else:
                raise ValueError(tag)
        return _case(name, path, "payload", "refuse", match=match)

    return write


REFUSALS = {
    "longdouble": ("long double", "longdouble", "float128", "extended", "80-bit", "80 bit"),
    "float128": ("128-bit", "128 bit", "quad", "float128", "binary128", "16 bytes", "16-byte"),
    "time32": ("time",),
    "time64be": ("time",),
    "reference": ("reference",),
    "region_reference": ("reference",),
    "opaque": ("opaque",),
    "complex_half": ("complex",),
    "compound_with_reference": ("reference",),
}
for _tag, _match in REFUSALS.items():
    _register(f"refuse_{_tag}", "refuse", _refusal(_tag, _match))


# --------------------------------------------------------------------------------- filters

#: Filters whose absence must be reported with "pip install hdf5plugin" (name, id).
PLUGIN_FILTERS = {
    "bzip2": ("bzip2", 307),
    "lz4": ("lz4", 32004),
    "zstd": ("zstd", 32015),
    "blosc": ("blosc", 32001),
    "blosc2": ("blosc2", 32026),
}


#: Session ids that contain no filter name (the message must name the session and the filter).
_SESSION_NAMES = {
    "bzip2": "sess_alpha",
    "lz4": "sess_beta",
    "zstd": "sess_gamma",
    "blosc": "sess_delta",
    "blosc2": "sess_epsilon",
}


def _lzo(root: Path) -> Case:
    """A pipeline with LZO (305), which no process here has (hdf5plugin does not ship it).

    The chunks are written raw with ``write_direct_chunk`` and a filter mask that says LZO was
    applied: a read needs the filter, as it does for the LZO files PyTables wrote.
    """
    name = "missing_lzo"
    path = root / f"{name}.h5"
    assert not h5z.filter_avail(305)
    dcpl = h5p.create(h5p.DATASET_CREATE)
    dcpl.set_chunk((4, 3))
    dcpl.set_filter(305, h5z.FLAG_OPTIONAL, (0, 0, 0))
    with h5py.File(path, "w") as f:
        did = _lowlevel(f, "betas", h5t.STD_I32LE, (ROWS, 3), None, dcpl)
        for c in range(ROWS // 4):
            raw = np.arange(12 * c, 12 * c + 12, dtype="<i4").tobytes()
            did.write_direct_chunk((4 * c, 0), raw, filter_mask=0)
    return _case(
        name, path, "betas", "missing_filter", match=("lzo", "305"), sessions={"sess_omega": path}
    )


_register("missing_lzo", "missing_filter", _lzo)


def _plugin_writer(tag: str) -> Callable[[Path], Case]:
    """Written with a filter from hdf5plugin (or PyTables' own blosc/bzip2); read without it."""

    def write(root: Path) -> Case:
        name = f"missing_plugin_{tag}"
        path = root / f"{name}.h5"
        data = _rows_f4()
        if tag in ("blosc", "bzip2"):  # PyTables writes these with its own filters
            tables = _tables()
            with tables.open_file(str(path), "w") as f:
                c = f.create_carray(
                    "/",
                    "betas",
                    tables.Float32Atom(),
                    shape=data.shape,
                    chunkshape=(4, *ROW_SHAPE),
                    filters=tables.Filters(complevel=5, complib=tag),
                )
                c[:] = data
        else:
            import hdf5plugin

            kw = dict(
                {"lz4": hdf5plugin.LZ4, "zstd": hdf5plugin.Zstd, "blosc2": hdf5plugin.Blosc2}[tag]()
            )
            with h5py.File(path, "w") as f:
                f.create_dataset("betas", data=data, chunks=(4, *ROW_SHAPE), **kw)
        with h5py.File(path, "r") as f:
            plist = f["betas"].id.get_create_plist()
            ids = [plist.get_filter(i)[0] for i in range(plist.get_nfilters())]
            assert PLUGIN_FILTERS[tag][1] in ids, ids
        return _case(
            name,
            path,
            "betas",
            "missing_plugin",
            match=PLUGIN_FILTERS[tag],
            sessions={_SESSION_NAMES[tag]: path},
            truth=_truth_rows(data),
        )

    return write


for _tag in PLUGIN_FILTERS:
    _register(f"missing_plugin_{_tag}", "missing_plugin", _plugin_writer(_tag))


def _damaged(root: Path) -> Case:
    """Fletcher-32 chunks of 4 rows; one byte of chunk 1 (rows 4-7) flipped on disk."""
    name = "checksum_damaged"
    path = root / f"{name}.h5"
    data = _rows_f4()
    with h5py.File(path, "w") as f:
        d = f.create_dataset("betas", data=data, chunks=(4, *ROW_SHAPE), fletcher32=True)
        info = d.id.get_chunk_info(1)
        assert info.chunk_offset == (4, 0, 0)
        offset = info.byte_offset + 5
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))
    with h5py.File(path, "r") as f:  # the damage is real: HDF5 refuses the chunk
        try:
            f["betas"][5]
        except OSError:
            pass
        else:  # pragma: no cover
            raise AssertionError("the flipped byte was not detected")
        np.testing.assert_array_equal(f["betas"][0], data[0])
    return _case(
        name,
        path,
        "betas",
        "checksum",
        sessions={"sess_kappa": path},
        extra={"damaged_rows": range(4, 8)},
        truth=_truth_rows(data),
    )


_register("checksum_damaged", "checksum", _damaged)


# ---------------------------------------------------------- reading without hdf5plugin


def construct_all(requests: list[dict[str, Any]]) -> dict[str, Any]:
    """Build ``HDF5SessionDataset(files, key=key)`` for each request; report what happened."""
    from loaderkit import HDF5SessionDataset

    out: dict[str, Any] = {
        "hdf5plugin": "hdf5plugin" in sys.modules and sys.modules["hdf5plugin"] is not None,
        "avail": {str(i): bool(h5z.filter_avail(i)) for _, i in PLUGIN_FILTERS.values()},
    }
    for req in requests:
        try:
            ds = HDF5SessionDataset(req["files"], key=req["key"])
        except Exception as exc:  # report everything, the test judges
            out[req["name"]] = {
                "raised": type(exc).__name__,
                "mro": [c.__name__ for c in type(exc).__mro__],
                "message": str(exc),
            }
        else:
            try:
                sample = ds[0]
                out[req["name"]] = {"raised": None, "read": repr(sample)[:200]}
            except Exception as exc:
                out[req["name"]] = {
                    "raised": None,
                    "read_raised": type(exc).__name__,
                    "message": str(exc),
                }
            ds.close()
    return out


_PROBE = (
    "import sys, json; sys.modules['hdf5plugin'] = None\n"
    "from tests.hdf5.corpus import construct_all\n"
    "print('RESULT ' + json.dumps(construct_all(json.loads(sys.stdin.read()))))\n"
)


def construct_without_plugins(cases: Sequence[Case], timeout: float = 120) -> dict[str, Any]:
    """``construct_all`` in a fresh interpreter that cannot import ``hdf5plugin`` and whose
    ``HDF5_PLUGIN_PATH`` is an empty directory (so no compression plugin is available)."""
    requests = [{"name": c.name, "files": c.files, "key": c.key} for c in cases]
    with tempfile.TemporaryDirectory() as empty:
        env = dict(os.environ)
        env["HDF5_PLUGIN_PATH"] = empty
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])]
        )
        proc = subprocess.run(
            [sys.executable, "-c", _PROBE],
            input=json.dumps(requests),
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
            env=env,
            timeout=timeout,
            check=False,
        )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(
            f"probe failed (rc={proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return json.loads(lines[-1][len("RESULT ") :])
