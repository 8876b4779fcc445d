"""Records kept in the cache directory as data: versioned JSON that decodes to values, never code.

A node cache is a shared directory: whatever a record holds, reading it must not run anything.
``RecordCodec`` turns a value into JSON and back using only:

- ``None``, ``bool``, ``int``, ``float``, ``str``, lists, tuples and dicts of them;
- numpy dtypes (plain, structured, sub-array; h5py's ``vlen``, ``h5py_encoding`` and ``enum``
  metadata), numpy scalars as Python numbers;
- the classes the caller registers: frozen dataclasses and named tuples (rebuilt by calling the
  class with the stored fields), enums (by member name), exceptions (rebuilt from their
  message), and ``atoms`` (a value with the caller's own text form, e.g. a torch dtype).

A value holding anything else does not encode (``RecordError``): the caller keeps no record. A
file that is not JSON, has another ``format`` or ``version``, another key, or a tag or class
the codec does not know, decodes to ``RecordError`` as well: the caller rebuilds the record.

Examples:
    >>> import numpy as np
    >>> codec = RecordCodec("example", 1)
    >>> text = codec.dumps("k", {"shape": (2, 3), "dtype": np.dtype("<f4")})
    >>> codec.loads("k", text)
    {'shape': (2, 3), 'dtype': dtype('float32')}
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

__all__ = ["RecordCodec", "RecordError", "decode_dtype", "encode_dtype"]


class RecordError(ValueError):
    """A value that does not encode, or a record that is not one of this codec's."""


def encode_dtype(dtype: np.dtype) -> Any:
    """A numpy dtype as JSON data (``decode_dtype`` rebuilds it, metadata included).

    Examples:
        >>> decode_dtype(encode_dtype(np.dtype([("a", "<i2"), ("b", "<f4", (3,))])))
        dtype([('a', '<i2'), ('b', '<f4', (3,))])
    """
    if dtype.fields is not None:
        names = list(dtype.names or ())
        fields = []
        for name in names:
            spec = dtype.fields[name]
            if len(spec) > 2:
                raise RecordError(f"a field with a title ({name!r}) is not kept")
            fields.append([name, encode_dtype(spec[0]), int(spec[1])])
        out: dict[str, Any] = {"fields": fields, "itemsize": dtype.itemsize}
    elif dtype.subdtype is not None:
        base, shape = dtype.subdtype
        out = {"sub": encode_dtype(base), "shape": list(shape)}
    else:
        out = {"str": dtype.str}
    metadata = dtype.metadata
    if metadata:
        out["meta"] = {key: _encode_meta(key, value) for key, value in metadata.items()}
    return out


def decode_dtype(data: Any) -> np.dtype:
    """The dtype ``encode_dtype`` described (``RecordError`` for anything else)."""
    if not isinstance(data, dict):
        raise RecordError(f"not a dtype: {data!r}")
    meta = data.get("meta")
    metadata = (
        {key: _decode_meta(key, value) for key, value in meta.items()}
        if isinstance(meta, dict)
        else None
    )
    try:
        if "fields" in data:
            names, formats, offsets = [], [], []
            for name, sub, offset in data["fields"]:
                names.append(str(name))
                formats.append(decode_dtype(sub))
                offsets.append(int(offset))
            spec = {
                "names": names,
                "formats": formats,
                "offsets": offsets,
                "itemsize": int(data["itemsize"]),
            }
            dtype = np.dtype(spec)  # type: ignore[call-overload]
            return np.dtype(dtype, metadata=metadata) if metadata else dtype
        if "sub" in data:
            base = decode_dtype(data["sub"])
            return np.dtype((base, tuple(int(n) for n in data["shape"])))
        text = data["str"]
        if not isinstance(text, str) or not text or text[0] not in "<>|=":
            raise RecordError(f"not a dtype string: {text!r}")
        return np.dtype(text, metadata=metadata) if metadata else np.dtype(text)
    except (KeyError, TypeError, ValueError) as exc:
        raise RecordError(f"not a dtype: {data!r} ({exc})") from exc


def _encode_meta(key: str, value: Any) -> Any:
    if key == "vlen":
        if value is str or value is bytes:
            return {"type": value.__name__}
        if isinstance(value, np.dtype):
            return {"dtype": encode_dtype(value)}
    elif key == "h5py_encoding" and isinstance(value, str):
        return value
    elif key == "enum" and isinstance(value, dict):
        return {str(name): int(number) for name, number in value.items()}
    raise RecordError(f"dtype metadata {key!r}={value!r} is not kept")


def _decode_meta(key: str, value: Any) -> Any:
    if key == "vlen" and isinstance(value, dict):
        if value.get("type") in ("str", "bytes"):
            return str if value["type"] == "str" else bytes
        if "dtype" in value:
            return decode_dtype(value["dtype"])
    elif key == "h5py_encoding" and value in ("ascii", "utf-8"):
        return value
    elif key == "enum" and isinstance(value, dict):
        return {str(name): int(number) for name, number in value.items()}
    raise RecordError(f"dtype metadata {key!r}={value!r} is not one this codec writes")


class RecordCodec:
    """A versioned JSON form for values made of plain data and the registered classes.

    Args:
        format: The record's kind, written and checked in every file.
        version: Its version: a file with another one is not read (rebuilt by the caller).
        classes: Dataclasses, named tuples, enums and exceptions that records may hold.
        atoms: ``name -> (type, to_text, from_text)`` for values kept as text.

    Examples:
        >>> codec = RecordCodec("example", 1)
        >>> codec.loads("k", codec.dumps("other", 1))
        Traceback (most recent call last):
        ...
        loaderkit.storage.datarecords.RecordError: the record is for key 'other', not 'k'
    """

    def __init__(
        self,
        format: str,
        version: int,
        classes: Iterable[type] = (),
        atoms: Mapping[str, tuple[type, Callable[[Any], str], Callable[[str], Any]]] | None = None,
    ) -> None:
        self.format = format
        self.version = version
        self._classes = {cls.__name__: cls for cls in classes}
        self._atoms = dict(atoms or {})

    def dumps(self, key: str, value: Any) -> str:
        """The record's text (``RecordError`` when ``value`` holds what the codec cannot keep)."""
        envelope = {
            "format": self.format,
            "version": self.version,
            "key": key,
            "value": self._encode(value),
        }
        return json.dumps(envelope, separators=(",", ":"), allow_nan=True)

    def loads(self, key: str, text: str | bytes) -> Any:
        """The value of a record ``dumps`` wrote for ``key``; ``RecordError`` for any other."""
        try:
            envelope = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise RecordError(f"not JSON ({exc})") from exc
        if not isinstance(envelope, dict):
            raise RecordError("not a record")
        if envelope.get("format") != self.format or envelope.get("version") != self.version:
            raise RecordError(
                f"a record of format {envelope.get('format')!r} version "
                f"{envelope.get('version')!r}, not {self.format!r} version {self.version}"
            )
        if envelope.get("key") != key:
            raise RecordError(f"the record is for key {envelope.get('key')!r}, not {key!r}")
        try:
            return self._decode(envelope.get("value"))
        except RecordError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise RecordError(f"a damaged record ({exc!r})") from exc

    def _encode(self, value: Any) -> Any:
        if value is None or isinstance(value, bool | str):
            return value
        if isinstance(value, int | float) and not isinstance(value, enum.Enum):
            return value
        if isinstance(value, np.integer):
            return int(value)
        if isinstance(value, np.floating):
            return float(value)
        if isinstance(value, np.bool_):
            return bool(value)
        if isinstance(value, np.dtype):
            return {"$": "dtype", "v": encode_dtype(value)}
        for name, (kind, to_text, _) in self._atoms.items():
            if isinstance(value, kind):
                return {"$": "atom", "c": name, "v": to_text(value)}
        cls = type(value)
        known = self._classes.get(cls.__name__) is cls
        if known and isinstance(value, enum.Enum):
            return {"$": "enum", "c": cls.__name__, "v": value.name}
        if known and isinstance(value, BaseException):
            return {"$": "exc", "c": cls.__name__, "v": str(value)}
        if known and dataclasses.is_dataclass(value):
            fields = {
                f.name: self._encode(getattr(value, f.name))
                for f in dataclasses.fields(value)
                if f.init
            }
            return {"$": "obj", "c": cls.__name__, "v": fields}
        if known and isinstance(value, tuple) and hasattr(cls, "_fields"):
            named = zip(cls._fields, value, strict=True)
            return {"$": "obj", "c": cls.__name__, "v": {k: self._encode(v) for k, v in named}}
        if cls is tuple:
            return {"$": "tuple", "v": [self._encode(item) for item in value]}
        if cls is list:
            return [self._encode(item) for item in value]
        if cls is dict:
            pairs = [[self._encode(k), self._encode(v)] for k, v in value.items()]
            return {"$": "dict", "v": pairs}
        raise RecordError(f"a {cls.__module__}.{cls.__qualname__} is not kept in records")

    def _decode(self, data: Any) -> Any:
        if data is None or isinstance(data, bool | int | float | str):
            return data
        if isinstance(data, list):
            return [self._decode(item) for item in data]
        if not isinstance(data, dict):
            raise RecordError(f"not a value: {data!r}")
        tag, body = data.get("$"), data.get("v")
        if tag in ("tuple", "dict"):
            if not isinstance(body, list):
                raise RecordError(f"a {tag} without items: {body!r}")
            if tag == "tuple":
                return tuple(self._decode(item) for item in body)
            return {self._decode(k): self._decode(v) for k, v in body}
        if tag == "dtype":
            return decode_dtype(body)
        if tag == "atom":
            atom = self._atoms.get(data.get("c", ""))
            if atom is None:
                raise RecordError(f"an unknown atom {data.get('c')!r}")
            return atom[2](str(body))
        cls = self._classes.get(data.get("c", ""))
        if cls is None:
            raise RecordError(f"an unknown class {data.get('c')!r}")
        if tag == "enum" and issubclass(cls, enum.Enum):
            return cls[str(body)]
        if tag == "exc" and issubclass(cls, BaseException):
            return cls(str(body))
        if tag == "obj" and isinstance(body, dict):
            return cls(**{str(k): self._decode(v) for k, v in body.items()})
        raise RecordError(f"an unknown tag {tag!r} for {cls.__name__}")
