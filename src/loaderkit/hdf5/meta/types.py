"""HDF5 types as samples: what a row of each HDF5 type becomes, and the types refused.

``row_type`` inspects one dataset (or one field of a compound) and returns a ``RowType``: the
``Kind`` of its samples, the numpy dtype rows are read into (``mem_dtype``: native byte order,
packed, only the selected fields) and how a row read into it becomes a sample. HDF5 converts
byte order, enums and booleans itself when it reads into ``mem_dtype``; bytes read around
HDF5 (``os.preadv``, memory maps) land in a buffer of the file's byte order (``read_dtype``) and
are converted while they are copied into the native batch (``RowType.swap``).

=============================  ==============================  ================================
HDF5 type                      sample (``ds[i]``)              batch (``loaderkit.batches``)
=============================  ==============================  ================================
integer, float, complex,       numpy array (numpy scalar for   one tensor
bool, enum, bitfield; any      1-D datasets), native order
byte order
compound                       ``dict`` field -> value (nested dict of batches per field
                               dicts for nested compounds)
fixed / variable-length        ``str`` (UTF-8; undecodable     list of ``str``
string                         bytes kept as surrogates)
variable-length array of       ``list`` of ``str`` (nested     list of those lists
strings (PyTables ``VLArray``  lists for string atoms of
of ``StringAtom``)             several strings)
variable-length array          1-D ``torch.Tensor``            ``RaggedBatchError``; use
                                                               ``loaderkit.pad_collate``
time, reference, opaque,       refused at construction         --
long double, 128-bit float     (``ConfigError``)
=============================  ==============================  ================================
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import h5py
import numpy as np
import torch
from h5py import h5t
from torch.utils.data import default_collate

from loaderkit.batches.contract import torch_dtype
from loaderkit.errors import ConfigError, HDF5FileError
from loaderkit.hdf5.meta.diagnose import repair_advice, type_damage

__all__ = [
    "Kind",
    "RowType",
    "decode_text",
    "dict_rows",
    "row_type",
    "struct_of",
    "type_name",
    "vlen_bytes_unswapped",
    "where",
]

#: Allocates ``(tensor, array)`` sharing one buffer of ``(n, *shape)`` and a dtype.
Allocator = Callable[[int, tuple[int, ...], np.dtype], tuple[torch.Tensor, np.ndarray]]


#: Builds the samples of a batch when they are asked for.
Samples = Callable[[], list[Any]]


class _Columns:
    """Splits batches of records into one contiguous array per numeric field, in one allocation.

    The fields lie one after another in one buffer (one allocation, one shared-memory segment
    or batch slot inside a worker), each at a 64-byte aligned offset. Where each field goes is
    worked out once per batch shape, as one numpy dtype whose fields are the whole per-field
    arrays: a batch then costs one allocation and, per field, one view, one converting copy
    and one tensor.

    Args:
        fields: ``(name, RowType)`` of the numeric fields, in order.
    """

    def __init__(self, fields: Sequence[tuple[str, RowType]]) -> None:
        self.names = [name for name, _ in fields]
        self._fields = [(sub.mem_dtype, sub.row_shape) for _, sub in fields]
        self._kinds = [sub.torch_dtype or torch.uint8 for _, sub in fields]  # numbers: set
        self._layouts: dict[tuple[int, ...], tuple[np.dtype, tuple[int, ...]]] = {}

    def _layout(self, shape: tuple[int, ...]) -> tuple[np.dtype, tuple[int, ...]]:
        """The dtype of one buffer holding every field of a batch of ``shape`` records."""
        layout = self._layouts.get(shape)
        if layout is None:
            formats, offsets, offset = [], [], 0
            for dtype, row_shape in self._fields:
                full = (*shape, *row_shape)
                formats.append((dtype, full))
                offsets.append(offset)
                offset += -(-math.prod(full) * dtype.itemsize // 64) * 64
            names, total = self.names, max(offset, 1)
            spec = {"names": names, "formats": formats, "offsets": offsets, "itemsize": total}
            layout = self._layouts[shape] = (np.dtype(spec), (total,))  # type: ignore[call-overload]
        return layout

    def split(
        self, values: np.ndarray, alloc: Allocator
    ) -> dict[str, tuple[Samples, torch.Tensor]]:
        """Copy the numeric fields of ``values`` (records) out, converted to native order.

        Returns:
            ``name -> (samples, tensor)`` per numeric field, in field order.
        """
        dtype, total = self._layout(values.shape)
        flat, raw = alloc(1, total, _BYTE)
        columns: np.ndarray = np.ndarray((), dtype, buffer=raw)
        # torch's own shared storage (a worker without batch slots) needs tensor views of it;
        # anywhere else a tensor over the numpy view is the same memory, made in one call
        torch_views = flat.is_shared()
        out: dict[str, tuple[Samples, torch.Tensor]] = {}
        for name, kind in zip(self.names, self._kinds, strict=True):
            array = columns[name]
            array[...] = values[name]  # to native byte order while copying
            if torch_views:
                offset = dtype.fields[name][1]  # type: ignore[index]
                view = flat.reshape(-1)[offset : offset + array.nbytes].view(kind)
                tensor = view.reshape(array.shape)
            else:
                tensor = torch.from_numpy(array)
            out[name] = (functools.partial(list, array), tensor)
        return out


_BYTE = np.dtype(np.uint8)


def _nested(convert: Callable[[Any], Any], value: Any) -> Any:
    """``convert`` applied to every element of nested lists (``tolist()`` of an array)."""
    if isinstance(value, list):
        return [_nested(convert, v) for v in value]
    return convert(value)


def _text_list(value: Any) -> list[Any]:
    """A variable-length array of strings as a list of ``str`` (nested for string atoms)."""
    return _nested(decode_text, np.asarray(value).tolist())


def dict_rows(names: Sequence[str], columns: Sequence[Samples]) -> list[dict[str, Any]]:
    """One dict per row from per-field sample builders (a compound's or several keys' rows).

    Example:
        >>> dict_rows(["a", "b"], [lambda: [1, 2], lambda: ["x", "y"]])
        [{'a': 1, 'b': 'x'}, {'a': 2, 'b': 'y'}]
    """
    rows = zip(*(column() for column in columns), strict=True)
    return [dict(zip(names, row, strict=True)) for row in rows]


def _numpy_buffer(
    n: int, shape: tuple[int, ...], dtype: np.dtype
) -> tuple[torch.Tensor, np.ndarray]:
    array = np.empty((n, *shape), dtype)
    return torch.from_numpy(array), array


#: HDF5 type classes and how they are called in messages.
_CLASS_NAMES = {
    h5t.INTEGER: "integer",
    h5t.FLOAT: "float",
    h5t.TIME: "time",
    h5t.STRING: "string",
    h5t.BITFIELD: "bitfield",
    h5t.OPAQUE: "opaque",
    h5t.COMPOUND: "compound",
    h5t.REFERENCE: "reference",
    h5t.ENUM: "enum",
    h5t.VLEN: "variable-length",
    h5t.ARRAY: "array",
    getattr(h5t, "COMPLEX", 11): "complex",  # HDF5 2.0's own complex class
}

_WAY_OUT = (
    "Override read(session, row) (or read_rows) to convert these rows yourself, e.g. "
    "self.h5dataset(session)[row] with your own decoding"
)


class Kind(enum.Enum):
    """What a row holds.

    Attributes:
        NUMBER: Numbers with a torch dtype: arrays, batched into one tensor.
        STRUCT: Compound rows (or several keys): a dict per sample, a dict of batches.
        TEXT: Strings: ``str`` per sample, a list of ``str`` per batch; rows that are
            variable-length arrays of strings (``RowType.element`` set): a list of ``str``
            per sample, a list of such lists per batch.
        RAGGED: Variable-length arrays: a 1-D tensor per sample, no stacked batch.

    Example:
        >>> Kind.NUMBER.value
        'number'
    """

    NUMBER = "number"
    STRUCT = "struct"
    TEXT = "text"
    RAGGED = "ragged"


@dataclass(frozen=True)
class RowType:
    """How rows of one dataset (or one compound field) are read and turned into samples.

    Attributes:
        kind: What a row holds.
        mem_dtype: The numpy dtype rows are read into (native order, packed, selected fields;
            ``object`` for variable-length data).
        row_shape: Shape of one row (the field's sub-array shape for compound fields).
        torch_dtype: The torch dtype of ``NUMBER`` rows (``None`` otherwise).
        swap: Bytes read around HDF5 are in the other byte order and must be swapped.
        fields: ``STRUCT`` only: ``(name, RowType)`` per field, in order.
        element: ``RAGGED``: the native dtype of the elements; ``TEXT``: set when every row
            is a variable-length array of strings, their dtype (e.g. ``S6``).
        record: ``STRUCT`` only: the file's own record dtype (byte order and offsets as
            stored) when whole records are read as they are and converted field by field in
            numpy, which is far cheaper than HDF5's compound conversion; ``None`` when HDF5
            converts (variable-length fields, or ``fields=`` to read only some fields).
        columns: ``STRUCT`` only: how batches split into per-field arrays (numeric fields).
        parts: ``STRUCT`` only: ``fields`` as one row holds them (for the records of a
            multi-dimensional dataset, each field's ``row_shape`` starts with ``row_shape``).

    Example:
        >>> rt = RowType(Kind.NUMBER, np.dtype("f4"), (2,), torch.float32)
        >>> rt.kind.name, rt.mem_dtype.str
        ('NUMBER', '<f4')
    """

    kind: Kind
    mem_dtype: np.dtype
    row_shape: tuple[int, ...]
    torch_dtype: torch.dtype | None = None
    swap: bool = False
    fields: tuple[tuple[str, RowType], ...] = field(default=())
    element: np.dtype | None = None
    record: np.dtype | None = None
    columns: _Columns | None = field(default=None, init=False, repr=False, compare=False)
    parts: tuple[tuple[str, RowType], ...] = field(
        default=(), init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:  # a frozen dataclass: derived attributes set once, here
        numeric = [(name, sub) for name, sub in self.fields if sub.kind is Kind.NUMBER]
        if numeric:
            object.__setattr__(self, "columns", _Columns(numeric))
        # what one row holds of each field: records of a multi-dimensional dataset hold an
        # array of each field per row (the field's rows take the record rows' shape first)
        parts = tuple(
            (name, dataclasses.replace(sub, row_shape=(*self.row_shape, *sub.row_shape)))
            if self.row_shape
            else (name, sub)
            for name, sub in self.fields
        )
        object.__setattr__(self, "parts", parts)

    @property
    def raw_ok(self) -> bool:
        """Whether rows may be read as raw bytes (``os.preadv``, memory maps)."""
        return self.kind is Kind.NUMBER or self.record is not None

    @property
    def read_dtype(self) -> np.dtype:
        """The dtype raw rows are read into: as stored (the file's record or byte order).

        A copy into ``mem_dtype`` converts (numpy converts byte order while copying, about 4x
        faster than swapping in place).
        """
        if self.record is not None:
            return self.record
        if self.kind is Kind.NUMBER and self.swap:
            return self.mem_dtype.newbyteorder()
        return self.mem_dtype

    def sample(self, value: Any) -> Any:
        """Turn one row as read into ``mem_dtype`` into a sample.

        Args:
            value: A row: an array of ``row_shape`` (a numpy scalar or ``numpy.void`` for
                1-D datasets), or an object for variable-length data.

        Returns:
            The sample (see the module's table).

        Example:
            >>> RowType(Kind.TEXT, np.dtype("S4"), ()).sample(np.bytes_(b"ab"))
            'ab'
        """
        if self.kind is Kind.NUMBER:
            if isinstance(value, np.ndarray) and (
                value.dtype != self.mem_dtype or not value.flags.c_contiguous
            ):  # a field of records read as stored: native order, contiguous (torch needs it)
                return np.ascontiguousarray(value, self.mem_dtype)
            return value
        if self.kind is Kind.TEXT:
            if self.element is not None:  # a variable-length array of strings per element
                if self.row_shape:
                    return _nested(_text_list, np.asarray(value).tolist())
                return _text_list(value)
            if self.row_shape:  # nested lists, as numpy's tolist() nests them
                return _nested(decode_text, np.asarray(value).tolist())
            return decode_text(value)
        if self.kind is Kind.RAGGED:
            if self.row_shape:
                return _nested(self._tensor, np.asarray(value).tolist())
            return self._tensor(value)
        return {name: sub.sample(value[name]) for name, sub in self.parts}

    def _tensor(self, value: Any) -> torch.Tensor:
        element = self.element if self.element is not None else np.dtype("f8")
        array = np.asarray(value)
        if self.swap and array.dtype == element and vlen_bytes_unswapped():
            array = array.view(element.newbyteorder())  # the file's bytes, as h5py left them
        return torch.from_numpy(np.array(array, dtype=element, copy=True).reshape(-1))

    def batch(self, values: np.ndarray, alloc: Allocator = _numpy_buffer) -> tuple[Samples, Any]:
        """Samples and the collated batch of rows read into one buffer.

        Args:
            values: The rows, ``(n, *row_shape)`` of ``read_dtype`` (or ``mem_dtype``).
            alloc: Allocates a batch tensor and its numpy view (a ``BatchMemory``'s
                ``buffer``: a worker's batch slot).

        Returns:
            ``(samples, collated)``: a function that builds one sample per row (dict samples
            are built only when asked for), and what ``default_collate`` would make of them
            (``None`` when they cannot be stacked: ragged rows).

        Example:
            >>> rt = RowType(Kind.TEXT, np.dtype("S2"), ())
            >>> samples, collated = rt.batch(np.array([b"a", b"bc"]))
            >>> samples(), collated
            (['a', 'bc'], ['a', 'bc'])
        """
        if self.kind is Kind.NUMBER:
            tensor, array = alloc(values.shape[0], tuple(values.shape[1:]), self.mem_dtype)
            np.copyto(array, values)  # to native byte order while copying
            return functools.partial(list, array), tensor
        if self.kind is Kind.TEXT:
            texts = [self.sample(v) for v in values]
            stacked = self.row_shape and self.element is None  # lists of equal length
            return functools.partial(list, texts), (
                default_collate(texts) if stacked else list(texts)
            )
        if self.kind is Kind.RAGGED:
            return functools.partial(list, [self.sample(v) for v in values]), None
        parts = self.columns.split(values, alloc) if self.columns is not None else {}
        if len(parts) < len(self.parts):  # text, ragged or nested fields: each on its own
            parts = {
                name: parts.get(name) or sub.batch(values[name], alloc) for name, sub in self.parts
            }
        samples = functools.partial(dict_rows, list(parts), [part[0] for part in parts.values()])
        collated = {name: part[1] for name, part in parts.items()}
        return samples, None if any(c is None for c in collated.values()) else collated

    def ragged_field(self) -> str | None:
        """The first field path holding ragged rows (``""`` for the rows themselves), or ``None``.

        Example:
            >>> RowType(Kind.RAGGED, np.dtype(object), ()).ragged_field()
            ''
        """
        if self.kind is Kind.RAGGED:
            return ""
        for name, sub in self.fields:
            inner = sub.ragged_field()
            if inner is not None:
                return f"{name}/{inner}" if inner else name
        return None


@functools.cache
def vlen_bytes_unswapped() -> bool:
    """Whether h5py hands out elements of big-endian variable-length arrays unswapped.

    h5py 3.16 returns them labelled with the native dtype but holding the file's bytes; a
    probe on an in-memory file tells, once per process, so a fixed h5py is read as it is.

    Example:
        >>> isinstance(vlen_bytes_unswapped(), bool)
        True
    """
    other = ">i4" if np.little_endian else "<i4"
    with h5py.File("loaderkit-vlen-probe.h5", "w", driver="core", backing_store=False) as f:
        d = f.create_dataset("v", shape=(1,), dtype=h5py.vlen_dtype(np.dtype(other)))
        d[0] = np.array([1], other)
        got = np.asarray(d[0])
    return bool(got.dtype.isnative and int(got[0]) != 1)


def decode_text(value: Any) -> str:
    r"""A string as HDF5 stored it, decoded: ``bytes`` as UTF-8 (bad bytes kept as surrogates).

    ASCII is a subset of UTF-8; bytes that are not valid UTF-8 (Latin-1 text in old files)
    decode with ``surrogateescape``, so ``s.encode("utf-8", "surrogateescape")`` gives them back.

    Example:
        >>> decode_text(b"caf\xc3\xa9"), decode_text("x")
        ('café', 'x')
    """
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    if isinstance(value, str):
        return value
    if isinstance(value, np.bytes_):
        return bytes(value).decode("utf-8", "surrogateescape")
    return str(value)


def type_name(tid: Any) -> str:
    """A short, readable name of an HDF5 type (class, size, byte order).

    Example:
        >>> type_name(h5t.STD_I32BE)
        'integer (4 bytes, big-endian)'
    """
    try:
        cls = tid.get_class()
        size = tid.get_size()
    except Exception:  # an exotic type h5py cannot describe
        return "unknown type"
    name = _CLASS_NAMES.get(cls, f"class {cls}")
    detail = ""
    if cls == h5t.FLOAT:
        try:  # long double (80-bit precision in 16 bytes) and IEEE quad (113) differ here
            precision, mantissa = tid.get_precision(), tid.get_fields()[4]
            if precision != size * 8 or size > 8:
                detail = f", {precision}-bit precision, {mantissa}-bit mantissa"
        except Exception:
            detail = ""
    if cls in (h5t.INTEGER, h5t.FLOAT, h5t.TIME, h5t.BITFIELD):
        try:
            detail += ", big-endian" if tid.get_order() == h5t.ORDER_BE else ", little-endian"
        except Exception:
            detail += ""
    return f"{name} ({size} bytes{detail})"


def _refuse(what: str, hdf5_type: str, why: str) -> ConfigError:
    return ConfigError(
        f"{what} holds HDF5 {hdf5_type} values, which {why}; no torch dtype holds them. "
        f"{_WAY_OUT}, or store them as a supported type (see docs/hdf5.md, 'Types')."
    )


def row_type(
    dset: h5py.Dataset,
    *,
    fields: Sequence[str] | None = None,
    row_shape: tuple[int, ...],
    where: str,
    path: str = "FILE",
) -> RowType:
    """The ``RowType`` of ``dset``'s rows (only ``fields`` of a compound, when given).

    Args:
        dset: The dataset.
        fields: Compound fields to read (``None``: all).
        row_shape: Shape of one row (the dataset's shape without its sample axis).
        where: What to call the dataset in messages ("dataset 'x' of session 0 (path)").
        path: The file (for the advice about a damaged one).

    Returns:
        The row type.

    Raises:
        ConfigError: A type with no torch equivalent (long double, 128-bit float, time,
            reference, opaque), or ``fields`` that are not fields of a compound.
        HDF5FileError: The stored type is inconsistent (damaged metadata).

    Example:
        >>> import h5py, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "t.h5")
        >>> with h5py.File(path, "w") as f:
        ...     d = f.create_dataset("x", data=np.zeros((2, 3), ">i4"))
        ...     rt = row_type(d, row_shape=(3,), where="x")
        >>> rt.kind.name, rt.mem_dtype.str, rt.swap
        ('NUMBER', '<i4', True)
    """
    tid = dset.id.get_type()
    try:
        dtype = dset.dtype
    except (TypeError, ValueError) as exc:  # time types, floats numpy cannot hold
        damage = type_damage(tid)
        if damage:
            raise HDF5FileError(
                f"{where} is damaged: {damage}, which HDF5 never writes (h5py: {exc}). The "
                "damage is in the file's metadata, which no read of this dataset can get "
                f"past. {repair_advice(path)}."
            ) from exc
        raise _refuse(where, type_name(tid), f"numpy cannot represent ({exc})") from None
    rt = _of(dtype, tid, row_shape, where)
    if fields is None:
        if rt.kind is Kind.STRUCT and not dtype.hasobject and dtype.fields is not None:
            return dataclasses.replace(rt, record=dtype)
        return rt
    if rt.kind is not Kind.STRUCT:
        raise ConfigError(
            f"fields={list(fields)!r} given, but {where} is not a compound (table) dataset: "
            f"its rows are {dtype}. Drop fields=, or point key= at a compound dataset."
        )
    present = dict(rt.fields)
    missing = [name for name in fields if name not in present]
    if missing or not fields:
        raise ConfigError(
            f"fields={list(fields)!r}: {where} has fields {list(present)}; "
            f"{'missing: ' + str(missing) if missing else 'name at least one'}."
        )
    return _struct([(name, present[name]) for name in fields], row_shape)


def _member_type(tid: Any, index: int) -> Any:
    try:
        return tid.get_member_type(index)
    except Exception:
        return None


def _of(dtype: np.dtype, tid: Any, row_shape: tuple[int, ...], where: str) -> RowType:
    """Row type of ``dtype`` (numpy, as h5py reads it) with HDF5 type ``tid``."""
    if dtype.subdtype is not None:  # an HDF5 array type: its shape joins the row's
        base, shape = dtype.subdtype
        inner = tid.get_super() if tid is not None and tid.get_class() == h5t.ARRAY else None
        return _of(base, inner, (*row_shape, *shape), where)
    if dtype.fields is not None:
        names = list(dtype.names or ())
        subs = []
        for k, name in enumerate(names):
            ftype = dtype.fields[name][0]
            ftid = _member_type(tid, k) if tid is not None else None
            subs.append((name, _of(ftype, ftid, (), f"field {name!r} of {where}")))
        return _struct(subs, row_shape)
    string = h5py.check_string_dtype(dtype)
    if string is not None:
        return RowType(
            Kind.TEXT, dtype if string.length is None else np.dtype(dtype.str), row_shape
        )
    if h5py.check_ref_dtype(dtype) is not None:
        raise _refuse(where, "reference", "point at other HDF5 objects")
    vlen = h5py.check_vlen_dtype(dtype)
    if vlen is not None:
        base = np.dtype(vlen)
        text = base.subdtype[0] if base.subdtype is not None else base
        if text.kind in "SU" or h5py.check_string_dtype(text) is not None:
            return RowType(Kind.TEXT, dtype, row_shape, element=base)  # PyTables VLArray
        if base.fields is not None or torch_dtype(base.newbyteorder("=")) is None:
            raise _refuse(where, f"variable-length arrays of {base}", "torch cannot hold")
        native = base.newbyteorder("=")
        return RowType(Kind.RAGGED, dtype, row_shape, swap=not base.isnative, element=native)
    cls = tid.get_class() if tid is not None else None
    if cls == h5t.TIME:
        raise _refuse(where, type_name(tid), "have no numpy or torch equivalent")
    if cls == h5t.OPAQUE or dtype.kind == "V":
        raise _refuse(where, "opaque", "are untyped bytes")
    native = np.dtype(dtype.str).newbyteorder("=") if dtype.kind != "b" else np.dtype(bool)
    kind = torch_dtype(native)
    if kind is None or (dtype.kind == "f" and dtype.itemsize > 8):
        why = "are wider than torch's float64" if dtype.kind == "f" else "torch cannot hold"
        raise _refuse(where, f"{type_name(tid) if tid is not None else dtype} ({dtype})", why)
    return RowType(Kind.NUMBER, native, row_shape, kind, swap=not dtype.isnative)


def _struct(subs: Sequence[tuple[str, RowType]], row_shape: tuple[int, ...]) -> RowType:
    mem = np.dtype([(name, sub.mem_dtype, sub.row_shape) for name, sub in subs])
    return RowType(Kind.STRUCT, mem, row_shape, fields=tuple(subs))


def struct_of(parts: Sequence[tuple[str, RowType]]) -> RowType:
    """A ``STRUCT`` row type whose fields are whole keys (``key=("a", "b")``).

    Its ``mem_dtype`` is unused: every key is read into its own buffer.

    Example:
        >>> a = RowType(Kind.NUMBER, np.dtype("f4"), (2,), torch.float32)
        >>> [name for name, _ in struct_of([("a", a)]).fields]
        ['a']
    """
    return RowType(Kind.STRUCT, np.dtype(object), (), fields=tuple(parts))


def where(key: str, session: Hashable, path: str) -> str:
    """How messages name a dataset: ``dataset 'key' of session 0 (path)``.

    Example:
        >>> where("x", 0, "/a.h5")
        "dataset 'x' of session 0 (/a.h5)"
    """
    return f"dataset {key!r} of session {session!r} ({path})"
