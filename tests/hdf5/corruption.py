"""A corpus of corrupted session files, and what h5py and loaderkit make of each.

Four small files written by h5py (contiguous, chunked + gzip, chunked + shuffle + gzip +
Fletcher-32, a compound table) are damaged the ways disks, copies and downloads damage
files: random bit flips anywhere, bit flips in the first 4 KiB (where h5py puts the
superblock, the root group and the object headers), a zeroed 4 KiB page, and truncation.
Every damaged copy is seeded (``random.Random`` of its name), so the corpus is the same on
every run and machine.

``classify(path, truth)`` reads one file whole, with h5py and through
``create_dataloader(HDF5SessionDataset(...))``, and names each outcome:

- ``exact``: the values written;
- ``wrong``: other values without an error (bit flips in raw data no checksum covers);
- ``named``: an ``HDF5FileError`` naming the session and the file, with advice (``h5check``)
  and the original exception as its ``__cause__`` (loaderkit only);
- ``raw``: any other exception (for h5py, every exception is ``raw``).

Run as ``python -m tests.hdf5.corruption ROOT`` it writes the corpus into ``ROOT`` and prints
one JSON line per file, announcing each file before reading it: the tests run it in one
child process, so a crash or a hang (HDF5 reading a damaged file) fails the test naming the
file instead of taking pytest down, at the cost of one interpreter start for the whole corpus.
"""

from __future__ import annotations

import dataclasses
import json
import random
import sys
import warnings
from pathlib import Path
from typing import Any

import h5py
import numpy as np

ROWS = 96
COLUMNS = 24
KEY = "data"
#: The undamaged files: name -> ``h5py.create_dataset`` options.
BASES: dict[str, dict[str, Any]] = {
    "contiguous": {},
    "gzip": {"chunks": (8, COLUMNS), "compression": "gzip"},
    "fletcher32": {
        "chunks": (8, COLUMNS),
        "shuffle": True,
        "compression": "gzip",
        "fletcher32": True,
    },
    "table": {"chunks": (16,)},
}
DAMAGE = ("flips", "head_flips", "zero_page", "truncate")
#: Damaged copies per (base, damage).
COPIES = 8
#: Chosen so that the corpus holds three damages that HDF5 reports in its own words (a wrong
#: B-tree signature, an address overflow, a datatype with too many unused bits).
SEED = 12
PAGE = 4096
#: Outcomes that are fine (``wrong`` only where h5py is wrong too).
OUTCOMES = ("exact", "wrong", "named", "raw", "crash")


@dataclasses.dataclass(frozen=True)
class Damaged:
    """One damaged copy: where it is, what it was made from and how.

    Attributes:
        path: The damaged file.
        base: Name of the undamaged file (a key of ``BASES``).
        damage: One of ``DAMAGE``.
    """

    path: Path
    base: str
    damage: str


def truth(base: str) -> np.ndarray:
    """The values ``base`` holds, as written (deterministic)."""
    rng = np.random.default_rng(12345)
    if base != "table":
        return rng.standard_normal((ROWS, COLUMNS)).astype("f4")
    table = np.zeros(ROWS, dtype=[("t", "<f8"), ("channel", "<i4"), ("v", "<f4", (4,))])
    table["t"] = np.arange(ROWS) * 0.5
    table["channel"] = np.arange(ROWS) % 7
    table["v"] = rng.standard_normal((ROWS, 4))
    return table


def write_base(root: Path, base: str) -> Path:
    """Write the undamaged file ``base`` into ``root``."""
    path = root / f"base_{base}.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset(KEY, data=truth(base), **BASES[base])
    return path


def damage(data: bytes, kind: str, rng: random.Random) -> bytes:
    """``data`` damaged one way (``kind`` of ``DAMAGE``), drawing positions from ``rng``."""
    out = bytearray(data)
    size = len(out)
    if kind == "flips":
        for _ in range(rng.randint(1, 8)):
            out[rng.randrange(size)] ^= 1 << rng.randrange(8)
    elif kind == "head_flips":
        for _ in range(rng.randint(1, 4)):
            out[rng.randrange(min(PAGE, size))] ^= 1 << rng.randrange(8)
    elif kind == "zero_page":
        page = rng.randrange(-(-size // PAGE))
        end = min(size, (page + 1) * PAGE)
        out[page * PAGE : end] = bytes(end - page * PAGE)
    elif kind == "truncate":
        del out[rng.randrange(1, size) :]
    else:
        raise ValueError(kind)
    return bytes(out)


def write_corpus(root: Path, copies: int = COPIES, seed: int = SEED) -> list[Damaged]:
    """Write every base file and its damaged copies into ``root`` (seeded)."""
    root.mkdir(parents=True, exist_ok=True)
    out = []
    for base in BASES:
        data = write_base(root, base).read_bytes()
        for kind in DAMAGE:
            for copy in range(copies):
                name = f"{base}_{kind}_{copy}"
                path = root / f"{name}.h5"
                path.write_bytes(damage(data, kind, random.Random(f"{seed}/{name}")))
                out.append(Damaged(path, base, kind))
    return out


def same(got: Any, want: np.ndarray) -> bool:
    """Whether ``got`` (an array, or a dict of field arrays) holds exactly ``want``."""
    if want.dtype.names:
        if not isinstance(got, dict) and getattr(got, "dtype", None) is not None:
            got = {name: got[name] for name in got.dtype.names}
        return isinstance(got, dict) and all(
            np.array_equal(np.asarray(got[name]), want[name]) for name in want.dtype.names
        )
    return np.array_equal(np.asarray(got), want)


def read_h5py(path: Path, want: np.ndarray) -> tuple[str, str]:
    """``(outcome, error text)`` of reading ``path``'s key whole with h5py."""
    try:
        with h5py.File(path, "r") as f:
            got = f[KEY][()]
    except Exception as exc:
        return "raw", f"{type(exc).__name__}: {exc}"
    return ("exact" if same(got, want) else "wrong"), ""


def named(exc: BaseException, path: Path, session: Any = 0) -> bool:
    """Whether ``exc`` is an ``HDF5FileError`` that names session and file, says what to do,
    and keeps HDF5's exception as its cause."""
    from loaderkit import HDF5FileError

    text = str(exc)
    return (
        isinstance(exc, HDF5FileError)
        and str(path) in text
        and f"session {session!r}" in text
        and "h5check" in text
        and exc.__cause__ is not None
    )


def read_loaderkit(path: Path, want: np.ndarray) -> tuple[str, str]:
    """``(outcome, error text)`` of reading ``path`` whole through a loaderkit loader."""
    import torch

    from loaderkit import HDF5SessionDataset, create_dataloader

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dataset = HDF5SessionDataset([path], key=KEY)
        with dataset, create_dataloader(dataset, batch_size=16) as loader:
            batches = list(loader)
    except Exception as exc:
        outcome = "named" if named(exc, path) else "raw"
        return outcome, f"{type(exc).__name__}: {exc}"
    if not batches:
        return ("exact" if len(want) == 0 else "wrong"), ""
    if isinstance(batches[0], dict):
        got: Any = {name: torch.cat([b[name] for b in batches]).numpy() for name in batches[0]}
    else:
        got = torch.cat(batches).numpy()
    return ("exact" if same(got, want) else "wrong"), ""


def read_rechunk(path: Path) -> tuple[str, str]:
    """``(outcome, error text)`` of ``loaderkit rechunk``'s function on ``path``: ``done``, a
    ``named`` error (a loaderkit error naming the file, with the repair advice) or ``raw``."""
    from loaderkit.errors import LoaderkitError
    from loaderkit.hdf5.convert.rechunk import rechunk

    out = path.parent / "rechunked" / path.stem
    try:
        rechunk([path], KEY, out)
    except Exception as exc:
        text = str(exc)
        ok = isinstance(exc, LoaderkitError) and str(path) in text and "h5check" in text
        return ("named" if ok else "raw"), f"{type(exc).__name__}: {text}"
    return "done", ""


def classify(item: Damaged) -> dict[str, str]:
    """What h5py and loaderkit make of one damaged file (a JSON-ready dict)."""
    want = truth(item.base)
    h5, h5_error = read_h5py(item.path, want)
    lk, lk_error = read_loaderkit(item.path, want)
    rc, rc_error = read_rechunk(item.path)
    return {
        "file": item.path.name,
        "base": item.base,
        "damage": item.damage,
        "h5py": h5,
        "h5py_error": h5_error,
        "loaderkit": lk,
        "loaderkit_error": lk_error,
        "names_file": str(item.path) in lk_error,
        "rechunk": rc,
        "rechunk_error": rc_error,
    }


def main(argv: list[str]) -> int:
    """Write the corpus into ``argv[0]`` and print one JSON line per file."""
    root = Path(argv[0])
    copies = int(argv[1]) if len(argv) > 1 else COPIES
    for item in write_corpus(root, copies):
        print(json.dumps({"start": item.path.name}), flush=True)
        print(json.dumps(classify(item)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
