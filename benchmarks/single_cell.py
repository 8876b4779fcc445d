"""Single-cell `.h5ad` rows: loaderkit against the field's loaders, side by side in one run.

Usage: python benchmarks/single_cell.py [--quick] [--json PATH] [--only NAMES] [--batches N]
[--rounds N] [--compression none,gzip] [--cache DIR] [--no-cold] [--list]

Files: ``--files`` x ``--cells`` cells x ``--genes`` genes (default 4 x 20,000 x 20,000;
``--quick`` 4 x 2,000 x 2,000 and 40 batches a run), ``--nnz`` nonzeros a cell (800; quick 100),
float32 counts, int32 column ids, ``X`` a CSR matrix written by anndata's ``write_h5ad``
(uncompressed, its default chunks; with ``gzip`` its ``compression="gzip"``) or, where anndata is
missing, by h5py in anndata's encoding.
Column 0 of every cell holds its global number + 1 (file x cells + cell + 1), so every loader's
batches say which cells they hold: the batch mix and the epoch's coverage come from the data. The
files are written once into ``--cache`` (default: a directory per size under the system temp
dir) and reused while its ``done.json`` matches the sizes.

Each loader runs in a fresh process (``--child``), so its memory is its own: it builds the
loader, then times ``--batches`` batches (default one epoch) of 64 cells from the iterator's
creation (starting workers counts; opening the files and reading ``indptr`` does not: that is
``setup s``). Reported per loader: cells/s with a warm page cache (every file read whole just
before) and a cold one (every file evicted with ``posix_fadvise(POSIX_FADV_DONTNEED)`` just
before the process starts; the resident share is checked with ``mincore`` and printed); the batch
mix, the mean number of distinct 1,000-cell runs (file, cell // 1000) a batch draws from (~44
when 64 cells are drawn from 80 runs at random); the process's peak RSS (``VmHWM``: it counts
torch's import, ~250 MiB, and file pages mapped by the loader) and the largest worker process's
(``ru_maxrss`` of its children: a forked worker's counts the pages it shares with its parent).

Loaders (``--only`` takes names or prefixes, comma-separated; ``--list`` lists them): loaderkit
``HDF5SessionDataset(files, key="X")`` under ``create_dataloader(batch_size=64, shuffle=True,
seed=0)`` with no workers, 2 worker processes and 2 worker threads, CSR batches (the default) and
``sparse="dense"``; with ``cells=`` choosing every other cell of each file (``lk-cells-half``);
and over a corpus (``lk-corpus-*``): files of the same sizes whose var indexes share 80 % of
their genes, each in an order of its own (``gene_names``; written once next to the others, in
``<cache>-corpus``), read with ``join="outer"`` (CSR and dense batches); scDataset (PyPI
``scdataset``) over anndata's ``AnnCollection`` of the backed files, ``BlockShuffling(block_size)``
with ``fetch_factor`` (a fetch is ``64 x fetch_factor`` sorted cells, read at once and held: block 4
/ fetch 1024 is the paper's headline pair), its
batches kept sparse (scipy CSR) and handed over as ``torch.sparse_csr_tensor``; anndata's
``AnnLoader`` (``shuffle=True``, backed files); plain h5py (each batch's 64 cells sorted, one
read of ``data`` and ``indices`` per cell, ``indptr`` held); annbatch (PyPI ``annbatch``, Python
>= 3.12) on its own converted copy: the files converted once by ``DatasetCollection.add_adatas``
with its defaults (sharded zarr, lz4; pre-shuffled: random 1,000-cell runs gathered into datasets
of up to 20 GB, each dataset's cells permuted, so here one dataset, every cell anywhere) into
``annbatch-lz4.zarr`` next to the files (reused while ``annbatch.json`` there names the same files
and annbatch version; the conversion's wall time from warm files, its size on disk and its peak
RSS printed with the table), then read by its ``Loader(batch_size=64, to="torch")`` with its
defaults (512-cell chunks, 32 a load, CSR batches) and ``shuffle=True`` (chunks in random order,
a load's cells shuffled) or without (``annbatch-seq``: the store's own pre-shuffled order, the
same every epoch); its cold runs evict the store's files. Peers that are not importable are
skipped with a line saying so. Install them with ``pip install -e ".[bench-single-cell]"``.

Noise: this is a shared machine. ``--rounds N`` repeats every (loader, cache) cell N times in an
order rotated between rounds and reports the median cells/s (and the largest peak RSS); the
ratios are of those medians. The lead's command:
``python benchmarks/single_cell.py --rounds 3 --compression none,gzip --json single_cell.json``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import mmap
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, astuple, dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

try:
    import _cli
except ImportError:  # imported as a module from elsewhere (tests)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _cli

__all__ = ["LOADERS", "Sizes", "batch_mix", "cell_ids", "main", "resident_fraction", "write_files"]

BATCH = 64
#: cells per run in the batch-mix figure (file, cell // RUN)
RUN = 1000
VERSION = 1  # of the generated files' content; a cache with another is rewritten
#: the corpus case: the share of genes its files have in common
CORPUS_SHARED = 0.8


@dataclass(frozen=True)
class Sizes:
    """What the generated files hold."""

    files: int
    cells: int
    genes: int
    nnz: int
    compression: str  # "none" or "gzip"
    #: share of the genes every file holds; below 1, a corpus: each file's own genes besides
    #: them and its own order (``gene_names``)
    shared: float = 1.0


@dataclass(frozen=True)
class Loader:
    """One row of the table: ``kind`` says which builder runs, the rest are its options."""

    name: str
    label: str
    kind: str  # loaderkit, scdataset, annloader, h5py, annbatch
    workers: int = 0
    method: str | None = None  # loaderkit: process / thread
    form: str = "csr"  # loaderkit: csr / dense
    block: int = 0  # scDataset
    fetch: int = 0  # scDataset fetch_factor
    shuffle: bool = True  # annbatch: its RandomSampler, else its store order
    join: str | None = None  # loaderkit: the corpus files (``Sizes.shared``) under this join
    cells: int = 1  # loaderkit: every ``cells``-th cell of each file (``cells=``)


LOADERS: tuple[Loader, ...] = (
    Loader("lk-csr", "loaderkit, CSR batches", "loaderkit"),
    Loader("lk-dense", "loaderkit, dense batches", "loaderkit", form="dense"),
    Loader("lk-csr-2p", "loaderkit, CSR, 2 processes", "loaderkit", 2, "process"),
    Loader("lk-csr-2t", "loaderkit, CSR, 2 threads", "loaderkit", 2, "thread"),
    Loader("lk-cells-half", "loaderkit, CSR, every other cell (cells=)", "loaderkit", cells=2),
    Loader(
        "lk-corpus-outer",
        "loaderkit, CSR, a corpus (80 % shared genes, other orders), join='outer'",
        "loaderkit",
        join="outer",
    ),
    Loader(
        "lk-corpus-outer-dense",
        "loaderkit, dense, a corpus (80 % shared genes, other orders), join='outer'",
        "loaderkit",
        form="dense",
        join="outer",
    ),
    Loader("lk-dense-2p", "loaderkit, dense, 2 processes", "loaderkit", 2, "process", "dense"),
    Loader(
        "lk-csr-rechunked",  # the files' ``loaderkit rechunk --key X`` copies (rechunked_copies)
        "loaderkit, CSR, on its `loaderkit rechunk --key X` copy",
        "loaderkit",
    ),
    Loader("scd-4-1024", "scDataset block 4 / fetch 1024", "scdataset", block=4, fetch=1024),
    Loader("scd-16-1024", "scDataset block 16 / fetch 1024", "scdataset", block=16, fetch=1024),
    Loader("scd-64-64", "scDataset block 64 / fetch 64", "scdataset", block=64, fetch=64),
    Loader(
        "scd-16-64-2w",
        "scDataset block 16 / fetch 64, 2 workers",
        "scdataset",
        2,
        block=16,
        fetch=64,
    ),
    Loader("annloader", "anndata AnnLoader, shuffle", "annloader"),
    Loader("h5py", "h5py, sorted batch, one read per cell", "h5py"),
    Loader("annbatch", "annbatch defaults + shuffle, on its converted copy", "annbatch"),
    Loader(
        "annbatch-seq",
        "annbatch defaults (store order), on its converted copy",
        "annbatch",
        shuffle=False,
    ),
)
#: what each kind needs beyond loaderkit
NEEDS = {
    "scdataset": ("scdataset", "anndata", "scipy"),
    "annloader": ("anndata",),
    "annbatch": ("annbatch", "anndata", "zarr"),
}
#: annbatch's converted copy of a file set, next to the files, and what it was made from
STORE = "annbatch-lz4.zarr"
STORE_MARK = "annbatch.json"


# ------------------------------------------------------------------ pure helpers


def cell_ids(first_column: np.ndarray) -> np.ndarray:
    """Global cell numbers from column 0 of a batch (which holds the number + 1).

    >>> cell_ids(np.array([1.0, 20001.0], dtype=np.float32)).tolist()
    [0, 20000]
    """
    return np.rint(np.asarray(first_column, dtype=np.float64)).astype(np.int64) - 1


def batch_mix(batches: Iterable[np.ndarray], cells_per_file: int, run: int = RUN) -> float:
    """The mean number of distinct runs ``(file, cell // run)`` the batches draw from.

    ``batches`` hold global cell numbers (``file * cells_per_file + cell``).

    >>> batch_mix([np.array([0, 1, 999]), np.array([0, 1000, 2000, 2001])], 2000)
    2.0
    """
    runs_per_file = -(-cells_per_file // run)
    counts = [
        len(np.unique((b // cells_per_file) * runs_per_file + (b % cells_per_file) // run))
        for b in batches
        if len(b)
    ]
    return float(np.mean(counts)) if counts else 0.0


def selected(only: str | None) -> list[Loader]:
    """The loaders ``--only`` names, comma-separated: a loader's name picks that loader, any
    other word the loaders whose names start with it; all loaders without ``--only``.

    >>> [lo.name for lo in selected("lk-csr,scd-64")]
    ['lk-csr', 'scd-64-64']
    >>> [lo.name for lo in selected("lk-csr-")]
    ['lk-csr-2p', 'lk-csr-2t']
    """
    if not only:
        return list(LOADERS)
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    names = {lo.name for lo in LOADERS}

    def picks(lo: Loader, word: str) -> bool:
        return lo.name == word if word in names else lo.name.startswith(word)

    chosen = [lo for lo in LOADERS if any(picks(lo, w) for w in wanted)]
    unknown = [w for w in wanted if not any(lo.name.startswith(w) for lo in LOADERS)]
    if unknown:
        raise SystemExit(
            f"--only: no loader named {unknown}; the names: {[lo.name for lo in LOADERS]}"
        )
    return chosen


def tree_files(root: Path) -> list[Path]:
    """Every regular file under ``root`` (a zarr store is a directory of them), sorted; none
    where ``root`` does not exist."""
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []


def conversion_note(conversion: dict[str, Any]) -> str:
    """What a conversion cost, as the table says it: wall time, compressor, size on disk.

    >>> conversion_note(
    ...     {"annbatch": "0.3.1", "seconds": 27.6, "compressor": "lz4", "bytes": 161_234_567}
    ... )
    '(annbatch 0.3.1, converted in 28 s, lz4: 161 MB)'
    >>> conversion_note({"error": "MemoryError"})
    '(conversion failed: MemoryError)'
    """
    if "error" in conversion:
        return f"(conversion failed: {conversion['error']})"
    seconds, mb = conversion["seconds"], conversion["bytes"] / 1e6
    return (
        f"(annbatch {conversion['annbatch']}, converted in {seconds:,.0f} s, "
        f"{conversion['compressor']}: {mb:,.0f} MB)"
    )


# ------------------------------------------------------------------ the files


def _cell_arrays(sizes: Sizes, file: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(data, indices, indptr) of one file: ``nnz`` distinct sorted genes a cell, gene 0 first.

    Genes are drawn one from each of ``nnz`` equal strata of the gene range (vectorised, distinct
    and sorted by construction); counts are small integers as in real data; column 0 holds the
    cell's global number + 1.
    """
    rng = np.random.default_rng([VERSION, file, sizes.cells, sizes.genes, sizes.nnz])
    bounds = (np.arange(sizes.nnz + 1, dtype=np.int64) * sizes.genes) // sizes.nnz
    width = np.diff(bounds)
    indices = bounds[:-1] + (rng.random((sizes.cells, sizes.nnz)) * width).astype(np.int64)
    indices[:, 0] = 0
    data = np.minimum(rng.geometric(0.3, (sizes.cells, sizes.nnz)), 1000).astype(np.float32)
    data[:, 0] = file * sizes.cells + np.arange(sizes.cells) + 1
    indptr = np.arange(sizes.cells + 1, dtype=np.int64) * sizes.nnz
    return data.reshape(-1), indices.astype(np.int32).reshape(-1), indptr


def gene_names(sizes: Sizes, file: int) -> list[str]:
    """File ``file``'s var index: ``gene0..`` alike in every file, or a corpus's.

    With ``sizes.shared < 1`` the file holds the shared genes ``gene0..gene{S-1}`` (S =
    ``shared x genes``) and its own ``x{file}gene{j}``, in an order of its own but for
    ``gene0`` first (column 0 names the cell; under ``join="outer"`` it stays column 0, the
    smallest name).

    Example:
        >>> corpus = Sizes(2, 5, 5, 2, "none", shared=0.6)
        >>> gene_names(corpus, 1)[0], sorted(gene_names(corpus, 1)) == sorted(gene_names(corpus, 0))
        ('gene0', False)
    """
    if sizes.shared >= 1:
        return [f"gene{i}" for i in range(sizes.genes)]
    common = max(1, round(sizes.shared * sizes.genes))
    names = [f"gene{i}" for i in range(common)]
    names += [f"x{file}gene{j}" for j in range(sizes.genes - common)]
    rng = np.random.default_rng([VERSION, file, sizes.genes])
    return [names[0], *(names[1 + i] for i in rng.permutation(sizes.genes - 1))]


def _write_anndata(path: Path, sizes: Sizes, file: int) -> None:
    import anndata
    import pandas as pd
    import scipy.sparse

    data, indices, indptr = _cell_arrays(sizes, file)
    matrix = scipy.sparse.csr_matrix((data, indices, indptr), shape=(sizes.cells, sizes.genes))
    obs = pd.DataFrame(index=[f"f{file}c{i}" for i in range(sizes.cells)])
    var = pd.DataFrame(index=gene_names(sizes, file))
    compression = None if sizes.compression == "none" else sizes.compression
    anndata.AnnData(X=matrix, obs=obs, var=var).write_h5ad(path, compression=compression)


def _write_h5py(path: Path, sizes: Sizes, file: int) -> None:
    """anndata's encoding and chunking (``chunks=True``), for a machine without anndata."""
    data, indices, indptr = _cell_arrays(sizes, file)
    gzip = {"compression": "gzip"} if sizes.compression == "gzip" else {}
    with h5py.File(path, "w") as f:
        f.attrs.update({"encoding-type": "anndata", "encoding-version": "0.1.0"})
        x = f.create_group("X")
        x.attrs.update({"encoding-type": "csr_matrix", "encoding-version": "0.1.0"})
        x.attrs["shape"] = np.array([sizes.cells, sizes.genes])
        x.create_dataset("data", data=data, chunks=True, **gzip)
        x.create_dataset("indices", data=indices, chunks=True, **gzip)
        x.create_dataset("indptr", data=indptr, chunks=True, **gzip)
        obs = [f"f{file}c{i}" for i in range(sizes.cells)]
        for name, index in (("obs", obs), ("var", gene_names(sizes, file))):
            group = f.create_group(name)
            group.attrs.update({"encoding-type": "dataframe", "encoding-version": "0.2.0"})
            group.attrs.update({"_index": "_index", "column-order": np.array([], dtype="S1")})
            names = np.array(index, dtype=object)
            index = group.create_dataset("_index", data=names, dtype=h5py.string_dtype())
            index.attrs.update({"encoding-type": "string-array", "encoding-version": "0.2.0"})


def write_files(root: Path, sizes: Sizes) -> tuple[list[Path], str]:
    """The files of ``sizes`` under ``root`` (written unless ``done.json`` there matches).

    Returns the paths and the writer ("anndata x.y", "h5py" or "cached: ...").
    """
    root.mkdir(parents=True, exist_ok=True)
    paths = [root / f"cells{i}.h5ad" for i in range(sizes.files)]
    done = root / "done.json"
    wanted = {**asdict(sizes), "version": VERSION}
    with contextlib.suppress(OSError, ValueError):
        stored = json.loads(done.read_text())
        if stored.get("sizes") == wanted and all(p.exists() for p in paths):
            return paths, f"cached: {stored['writer']}"
    try:
        from importlib.metadata import version

        import anndata  # noqa: F401

        write, writer = _write_anndata, f"anndata {version('anndata')}"
    except ImportError:
        write, writer = _write_h5py, f"h5py {h5py.__version__} (anndata not installed)"
    done.unlink(missing_ok=True)
    for i, path in enumerate(paths):
        write(path, sizes, i)
        with open(path, "rb") as f:
            os.fsync(f.fileno())  # dirty pages cannot be evicted
    done.write_text(json.dumps({"sizes": wanted, "writer": writer}))
    return paths, writer


# ------------------------------------------------------------------ the page cache


def evict(paths: Sequence[Path]) -> None:
    """Drop every file's pages from the page cache (``POSIX_FADV_DONTNEED``)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm(paths: Sequence[Path]) -> None:
    """Read every file whole, so its pages are in the page cache."""
    for path in paths:
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass


def resident_fraction(paths: Sequence[Path]) -> float | None:
    """The share of the files' pages in the page cache (``mincore``), or None where unknown."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    except (OSError, AttributeError):
        return None
    resident = total = 0
    for path in paths:
        size = path.stat().st_size
        pages = -(-size // mmap.PAGESIZE)
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                return None
            vec = (ctypes.c_ubyte * pages)()
            failed = libc.mincore(addr, size, vec)
            libc.munmap(addr, size)
            if failed:
                return None
        finally:
            os.close(fd)
        resident += sum(v & 1 for v in vec)
        total += pages
    return resident / total if total else None


# ------------------------------------------------------------------ the loaders (in the child)


def _loaderkit(lo: Loader, paths: list[str]) -> tuple[Iterable[Any], Callable[[], None]]:
    from loaderkit import HDF5SessionDataset, create_dataloader

    step = lo.cells
    chosen = {"cells": lambda obs: np.arange(0, len(obs["_index"]), step)} if step > 1 else {}
    dataset = HDF5SessionDataset(paths, key="X", sparse=lo.form, join=lo.join, **chosen)
    extra = {"worker_method": lo.method} if lo.workers else {}
    loader = create_dataloader(
        dataset, batch_size=BATCH, shuffle=True, seed=0, num_workers=lo.workers, **extra
    )
    return loader, loader.close


def _scdataset(lo: Loader, paths: list[str]) -> tuple[Iterable[Any], Callable[[], None]]:
    import anndata
    import torch
    from anndata.experimental import AnnCollection
    from scdataset import BlockShuffling, scDataset

    collection = AnnCollection([anndata.read_h5ad(p, backed="r") for p in paths])

    def fetch(coll: Any, indices: np.ndarray) -> Any:  # one sorted read, held as scipy CSR
        return coll[indices].X

    def to_torch(batch: Any) -> torch.Tensor:
        return torch.sparse_csr_tensor(
            torch.from_numpy(batch.indptr.astype(np.int64)),
            torch.from_numpy(batch.indices.astype(np.int64)),
            torch.from_numpy(batch.data),
            batch.shape,
        )

    dataset = scDataset(
        collection,
        BlockShuffling(block_size=lo.block),
        batch_size=BATCH,
        fetch_factor=lo.fetch,
        fetch_callback=fetch,
        batch_transform=to_torch,
        seed=0,
    )
    if not lo.workers:
        return dataset, lambda: None
    # as the paper's benchmark: a fetch's batches in flight per worker
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=None, num_workers=lo.workers, prefetch_factor=lo.fetch + 1
    )
    return loader, lambda: None


def _annloader(lo: Loader, paths: list[str]) -> tuple[Iterable[Any], Callable[[], None]]:
    import anndata
    from anndata.experimental import AnnLoader

    adatas = [anndata.read_h5ad(p, backed="r") for p in paths]
    return AnnLoader(adatas, batch_size=BATCH, shuffle=True), lambda: None


class _H5pyRows:
    """Each batch's cells sorted, one read of ``data`` and ``indices`` per cell."""

    def __init__(self, paths: list[str]) -> None:
        self.files = [h5py.File(p, "r") for p in paths]
        self.indptr = [f["X/indptr"][:] for f in self.files]
        self.starts = np.cumsum([0] + [len(p) - 1 for p in self.indptr])
        self.genes = int(self.files[0]["X"].attrs["shape"][1])

    def __iter__(self) -> Iterator[Any]:
        import torch

        order = np.random.default_rng(0).permutation(int(self.starts[-1]))
        for at in range(0, len(order), BATCH):
            values, columns, crow = [], [], [0]
            for cell in np.sort(order[at : at + BATCH]):
                file = int(np.searchsorted(self.starts, cell, side="right")) - 1
                row = int(cell - self.starts[file])
                a, b = int(self.indptr[file][row]), int(self.indptr[file][row + 1])
                x = self.files[file]["X"]
                values.append(x["data"][a:b])
                columns.append(x["indices"][a:b])
                crow.append(crow[-1] + b - a)
            yield torch.sparse_csr_tensor(
                torch.tensor(crow),
                torch.from_numpy(np.concatenate(columns).astype(np.int64)),
                torch.from_numpy(np.concatenate(values)),
                (len(crow) - 1, self.genes),
            )

    def close(self) -> None:
        for f in self.files:
            f.close()


def _h5py(lo: Loader, paths: list[str]) -> tuple[Iterable[Any], Callable[[], None]]:
    rows = _H5pyRows(paths)
    return rows, rows.close


def _annbatch(lo: Loader, paths: list[str]) -> tuple[Iterable[Any], Callable[[], None]]:
    """``paths``: annbatch's converted store. Its batches are dicts; ``X`` a torch sparse CSR."""
    import annbatch

    collection = annbatch.DatasetCollection(paths[0], mode="r")
    options = {"shuffle": True, "rng": np.random.default_rng(0)} if lo.shuffle else {}
    loader = annbatch.Loader(batch_size=BATCH, to="torch", **options).use_collection(collection)
    return loader, lambda: None


def convert_annbatch(store: str, paths: list[str]) -> dict[str, Any]:
    """The files into annbatch's pre-shuffled sharded zarr at ``store``, with its defaults (in a
    child: its peak RSS is the conversion's)."""
    import zarr
    from annbatch import DatasetCollection

    started = time.perf_counter()
    DatasetCollection(store).add_adatas(paths, rng=np.random.default_rng(0))
    seconds = time.perf_counter() - started
    data = zarr.open_group(store, mode="r")["dataset_0/X/data"]
    names = [getattr(c, "cname", None) for c in data.compressors]
    return {
        "seconds": seconds,
        "compressor": ",".join(getattr(n, "value", str(n)) for n in names) or "none",
        "datasets": sum(1 for k in zarr.open_group(store, mode="r") if k.startswith("dataset_")),
        "peak_rss_mib": _peak_rss_mib(),
    }


BUILDERS = {
    "loaderkit": _loaderkit,
    "scdataset": _scdataset,
    "annloader": _annloader,
    "h5py": _h5py,
    "annbatch": _annbatch,
}


def _first_column(batch: Any) -> np.ndarray:
    """Column 0 of each cell of a batch (torch sparse CSR or dense, an AnnLoader batch, or
    annbatch's dict).

    A copy: a view would keep the whole batch alive, and the peak RSS with it.
    """
    import torch

    x = batch["X"] if isinstance(batch, dict) else batch.X if hasattr(batch, "X") else batch
    if isinstance(x, torch.Tensor) and x.layout == torch.sparse_csr:
        return x.values()[x.crow_indices()[:-1]].numpy()  # column 0 is stored first: a gather
    if isinstance(x, torch.Tensor):
        return x[:, 0].clone().numpy()
    if hasattr(x, "toarray"):
        return np.asarray(x[:, 0].toarray()).ravel()
    return np.array(np.asarray(x)[:, 0])


def _peak_rss_mib() -> float:
    """This process's peak RSS since its ``exec`` (``VmHWM``; ``ru_maxrss`` where unknown).

    ``ru_maxrss`` also keeps the peak of the process it was forked from (Linux carries it over
    ``exec``): the parent's, after it wrote the files.
    """
    with contextlib.suppress(OSError, StopIteration, ValueError):
        with open("/proc/self/status") as f:
            line = next(line for line in f if line.startswith("VmHWM:"))
        return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One loader's timed batches in this (fresh) process; what the parent prints."""
    import torch

    torch.manual_seed(0)
    lo = next(lo for lo in LOADERS if lo.name == spec["loader"])
    started = time.perf_counter()
    loader, close = BUILDERS[lo.kind](lo, spec["paths"])
    setup = time.perf_counter() - started
    firsts: list[np.ndarray] = []
    limit = spec["batches"] or sys.maxsize
    started = time.perf_counter()
    iterator = iter(loader)
    for batch in iterator:
        firsts.append(_first_column(batch))
        if len(firsts) >= limit:
            break
    seconds = time.perf_counter() - started
    del iterator, batch
    close()
    ids = [cell_ids(f) for f in firsts]
    seen = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    kib = 1024
    return {
        "cells": len(seen),
        "distinct_cells": len(np.unique(seen)),
        "batches": len(ids),
        "seconds": seconds,
        "setup_s": setup,
        "cells_per_s": len(seen) / seconds,
        "batch_mix": batch_mix(ids, spec["cells_per_file"]),
        "peak_rss_mib": _peak_rss_mib(),
        "worker_peak_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * kib / 2**20,
    }


# ------------------------------------------------------------------ the parent


def _missing(lo: Loader) -> str | None:
    import importlib.util

    for module in NEEDS.get(lo.kind, ()):
        if importlib.util.find_spec(module) is None:
            return module
    return None


def _in_child(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` run by this script in a fresh process: its JSON answer, or ``{"error": ...}``."""
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if done.returncode:
        tail = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
        return {"error": tail[0][:300]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _run_child(
    lo: Loader,
    paths: list[Path],
    sizes: Sizes,
    batches: int,
    cache: str,
    pages: list[Path] | None = None,
) -> dict:
    """One timed run of ``lo`` over ``paths``; ``pages`` (default: ``paths``) are the files
    evicted or warmed before it (a directory store's files)."""
    pages = list(paths) if pages is None else pages
    if cache == "cold":
        evict(pages)
    else:
        warm(pages)
    resident = resident_fraction(pages)
    spec = {
        "loader": lo.name,
        "paths": [str(p) for p in paths],
        "batches": batches,
        "cells_per_file": sizes.cells,
    }
    return {**_in_child(spec), "resident_before": resident}


def annbatch_store(root: Path, paths: list[Path]) -> tuple[Path, dict[str, Any]]:
    """annbatch's converted copy of the files of ``root``: its path and what the conversion cost.

    Converted (in a child, from warm files) unless ``annbatch.json`` in ``root`` says the store
    there was made from the same files (their ``done.json``) by the same annbatch version.
    """
    from importlib.metadata import version

    store, mark = root / STORE, root / STORE_MARK
    made_from = {
        "files": json.loads((root / "done.json").read_text()),
        "annbatch": version("annbatch"),
    }
    with contextlib.suppress(OSError, ValueError, KeyError):
        stored = json.loads(mark.read_text())
        if stored["made_from"] == made_from and tree_files(store):
            return store, {**stored["conversion"], "cached": True}
    mark.unlink(missing_ok=True)
    shutil.rmtree(store, ignore_errors=True)
    warm(paths)
    conversion = _in_child({"convert": str(store), "paths": [str(p) for p in paths]})
    if "error" not in conversion:
        size = sum(f.stat().st_size for f in tree_files(store))
        conversion.update(bytes=size, annbatch=made_from["annbatch"], cached=False)
        mark.write_text(json.dumps({"made_from": made_from, "conversion": conversion}))
    return store, conversion


#: ``lk-csr-rechunked`` reads ``loaderkit rechunk --key X`` copies of the files, made next to them
#: once and reused while ``rechunked.json`` says they were made from the same files
RECHUNKED_LOADER, RECHUNKED, RECHUNKED_MARK = "lk-csr-rechunked", "rechunked", "rechunked.json"


def rechunked_copies(root: Path, paths: list[Path]) -> tuple[list[Path], dict[str, Any]]:
    """``loaderkit rechunk --key X`` copies of the files of ``root`` (in ``root/rechunked``: CSR
    values uncompressed and contiguous, the rest as stored) and what the copy cost.

    Copied (from warm files, verification included in the time) unless ``rechunked.json`` in
    ``root`` says the copies there were made from the same files (their ``done.json``) by the
    same loaderkit version; ``{"error": ...}`` where ``rechunk`` refused or failed.
    """
    import loaderkit
    from loaderkit.hdf5 import rechunk

    out, mark = root / RECHUNKED, root / RECHUNKED_MARK
    copies = [out / p.name for p in paths]
    made_from = {
        "files": json.loads((root / "done.json").read_text()),
        "loaderkit": loaderkit.__version__,
    }
    with contextlib.suppress(OSError, ValueError, KeyError):
        stored = json.loads(mark.read_text())
        if stored["made_from"] == made_from and all(c.exists() for c in copies):
            return copies, {**stored["copy"], "cached": True}
    mark.unlink(missing_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    warm(paths)
    started = time.perf_counter()
    try:
        results = rechunk(paths, "X", out)
    except Exception as exc:  # reported in the table, as annbatch's conversion is
        return copies, {"error": f"{type(exc).__name__}: {exc}"[:300]}
    copy = {
        "seconds": time.perf_counter() - started,
        "bytes": sum(c.stat().st_size for c in copies),
        "source_bytes": sum(p.stat().st_size for p in paths),
        "layout": results[0].layout,
    }
    mark.write_text(json.dumps({"made_from": made_from, "copy": copy}))
    return copies, {**copy, "cached": False}


def _fmt(value: float | None, digits: int = 0) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _summary(runs: list[dict]) -> dict[str, Any]:
    errors = [r["error"] for r in runs if "error" in r]
    if errors:
        return {"error": errors[0], "runs": runs}
    return {
        "cells_per_s": statistics.median(r["cells_per_s"] for r in runs),
        "batch_mix": statistics.median(r["batch_mix"] for r in runs),
        "peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
        "worker_peak_rss_mib": max(r["worker_peak_rss_mib"] for r in runs),
        "runs": runs,
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def ratios(results: dict[str, dict[str, dict]]) -> dict[str, float | None]:
    """loaderkit (no workers, CSR) against scDataset block 4 / fetch 1024 and annbatch (shuffled,
    on its converted copy); 2 workers against 0."""

    def get(name: str, cache: str, what: str = "cells_per_s") -> float | None:
        return results.get(name, {}).get(cache, {}).get(what)

    out: dict[str, float | None] = {}
    for cache in ("warm", "cold"):
        out[f"loaderkit/scDataset 4-1024 {cache}"] = _ratio(
            get("lk-csr", cache), get("scd-4-1024", cache)
        )
        out[f"loaderkit/annbatch {cache}"] = _ratio(get("lk-csr", cache), get("annbatch", cache))
        for two, one in (
            ("lk-csr-2p", "lk-csr"),
            ("lk-csr-2t", "lk-csr"),
            ("lk-dense-2p", "lk-dense"),
            ("lk-cells-half", "lk-csr"),
            ("lk-corpus-outer", "lk-csr"),
            ("lk-corpus-outer-dense", "lk-dense"),
            ("lk-csr-rechunked", "lk-csr"),
        ):
            out[f"{two}/{one} {cache}"] = _ratio(get(two, cache), get(one, cache))
    out["loaderkit/scDataset 4-1024 peak RSS"] = _ratio(
        get("lk-csr", "warm", "peak_rss_mib"), get("scd-4-1024", "warm", "peak_rss_mib")
    )
    return out


TARGETS = {
    "loaderkit/scDataset 4-1024 warm": ">= 8",
    "loaderkit/scDataset 4-1024 cold": ">= 4",
    "loaderkit/scDataset 4-1024 peak RSS": "<= 0.5",
    "loaderkit/annbatch warm": "> 1",
    "loaderkit/annbatch cold": "> 1",
    "lk-csr-2p/lk-csr warm": ">= 1.5 (either method)",
    "lk-csr-2t/lk-csr warm": ">= 1.5 (either method)",
    "lk-dense-2p/lk-dense warm": ">= 1.5 (either method)",
    "lk-cells-half/lk-csr warm": ">= 0.9",
    "lk-corpus-outer/lk-csr warm": ">= 0.8",
    "lk-corpus-outer-dense/lk-dense warm": ">= 0.8",
}


def table(
    sizes: Sizes,
    writer: str,
    results: dict,
    skipped: dict,
    caches: list[str],
    notes: dict[str, str] | None = None,
) -> str:
    """The markdown table and the ratios of one file set; ``notes`` follow loaders' labels, and a
    note on ``""`` is a line under the table."""
    notes = notes or {}
    lines = [
        f"{sizes.files} files x {sizes.cells:,} cells x {sizes.genes:,} genes, {sizes.nnz} "
        f"nonzeros a cell, compression {sizes.compression}, written by {writer}; batch {BATCH}, "
        "cells/s from the iterator's creation",
        "",
        "| loader | warm cells/s | cold cells/s | batch mix | peak RSS MiB | worker peak RSS MiB "
        "| setup s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for lo in LOADERS:
        label = f"{lo.label} {notes[lo.name]}" if lo.name in notes else lo.label
        if lo.name in skipped:
            lines.append(f"| {label} | skipped: {skipped[lo.name]} | | | | | |")
            continue
        if lo.name not in results:
            continue
        cell = results[lo.name]
        first = cell.get("warm") or cell.get("cold") or {}
        if "error" in first:
            lines.append(f"| {label} | error: {first['error']} | | | | | |")
            continue
        rate = {c: cell.get(c, {}).get("cells_per_s") for c in ("warm", "cold")}
        setup = statistics.median(r["setup_s"] for r in first["runs"])
        lines.append(
            f"| {label} | {_fmt(rate['warm'])} | {_fmt(rate['cold'])} | "
            f"{_fmt(first['batch_mix'], 1)} | {_fmt(first['peak_rss_mib'])} | "
            f"{_fmt(first['worker_peak_rss_mib'] if lo.workers else None)} | {_fmt(setup, 2)} |"
        )
    resident = [
        r["resident_before"] for c in results.values() for r in c.get("cold", {}).get("runs", [])
    ]
    known = [r for r in resident if r is not None]
    if "cold" in caches:
        said = f"at most {max(known):.1%}" if known else "an unknown share (no mincore)"
        lines += ["", f"cold: {said} of the files' pages resident at each cold start"]
    if "" in notes:
        lines += ["", notes[""]]
    lines.append("")
    for name, value in ratios(results).items():
        if value is not None:
            target = TARGETS.get(name)
            lines.append(f"- {name}: {value:.2f}x" + (f" (target {target})" if target else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Write (or reuse) the files, run every loader in a fresh process per cache state, print."""
    p = _cli.parser(__doc__ or "", "4 x 2,000 cells x 2,000 genes, 100 nonzeros a cell")
    p.add_argument("--only", help="loader names or prefixes, comma-separated (see --list)")
    p.add_argument("--list", action="store_true", help="list the loaders and stop")
    p.add_argument("--batches", type=int, help="batches a run (default: one epoch; --quick: 40)")
    p.add_argument("--rounds", type=int, default=1, help="runs of each cell; the median counts")
    p.add_argument("--compression", default="none", help="none, gzip or both: none,gzip")
    p.add_argument("--cache", help="where the files are written and reused")
    p.add_argument("--no-cold", action="store_true", help="warm page cache only")
    p.add_argument("--files", type=int, default=4)
    p.add_argument("--cells", type=int)
    p.add_argument("--genes", type=int)
    p.add_argument("--nnz", type=int)
    p.add_argument("--child", help=argparse_hidden())
    args = p.parse_args(argv)
    if args.child:
        spec = json.loads(args.child)
        if "convert" in spec:
            print(json.dumps(convert_annbatch(spec["convert"], spec["paths"])))
        else:
            print(json.dumps(child(spec)))
        return 0
    if args.list:
        print("\n".join(f"{lo.name}: {lo.label}" for lo in LOADERS))
        return 0
    loaders = selected(args.only)
    quick = args.quick
    batches = args.batches if args.batches is not None else (40 if quick else 0)
    caches = ["warm"] if args.no_cold else ["warm", "cold"]
    skipped = {lo.name: f"`{m}` not importable" for lo in loaders if (m := _missing(lo))}
    for name, why in skipped.items():
        print(f"skipped {name}: {why}", file=sys.stderr)
    data: dict[str, Any] = {"batch_size": BATCH, "rounds": args.rounds, "sets": []}
    tables = []
    for compression in args.compression.split(","):
        sizes = Sizes(
            args.files,
            args.cells or (2_000 if quick else 20_000),
            args.genes or (2_000 if quick else 20_000),
            args.nnz or (100 if quick else 800),
            compression,
        )
        tag = f"{sizes.files}x{sizes.cells}x{sizes.genes}-{sizes.nnz}-{compression}"
        root = (
            Path(args.cache) / tag
            if args.cache
            else Path(tempfile.gettempdir()) / (f"loaderkit-single-cell-{tag}")
        )
        paths, writer = write_files(root, sizes)
        here = dict(skipped)  # and the annbatch loaders where its conversion failed
        opens: dict[str, tuple[list[Path], list[Path]]] = {}  # annbatch: its store, its files
        notes: dict[str, str] = {}
        conversion: dict[str, Any] | None = None
        if any(lo.kind == "annbatch" and lo.name not in here for lo in loaders):
            store, conversion = annbatch_store(root, paths)
            for lo in loaders:
                if lo.kind == "annbatch" and lo.name not in here:
                    notes[lo.name] = conversion_note(conversion)
                    if "error" in conversion:
                        here[lo.name] = f"conversion failed: {conversion['error']}"
                    opens[lo.name] = ([store], tree_files(store))
            if "error" not in conversion:
                again = "made by an earlier run, " if conversion["cached"] else ""
                notes[""] = (
                    f"annbatch's copy: {store} ({again}zarr datasets: {conversion['datasets']}, "
                    f"conversion peak RSS {conversion['peak_rss_mib']:,.0f} MiB)"
                )
        if any(lo.join for lo in loaders):
            corpus_sizes = Sizes(*astuple(sizes)[:5], shared=CORPUS_SHARED)
            corpus, _ = write_files(root.with_name(f"{root.name}-corpus"), corpus_sizes)
            for lo in loaders:
                if lo.join:
                    opens[lo.name] = (corpus, corpus)
        if any(lo.name == RECHUNKED_LOADER and lo.name not in here for lo in loaders):
            copies, made = rechunked_copies(root, paths)
            opens[RECHUNKED_LOADER] = (copies, copies)
            if "error" in made:
                here[RECHUNKED_LOADER] = f"rechunk failed: {made['error']}"
            else:
                again = "made by an earlier run, " if made["cached"] else ""
                notes[RECHUNKED_LOADER] = (
                    f"({again}{made['layout']}; copied and verified in {made['seconds']:,.1f} s: "
                    f"{made['source_bytes'] / 1e6:,.0f} MB -> {made['bytes'] / 1e6:,.0f} MB)"
                )
        running = [lo for lo in loaders if lo.name not in here]
        cells = [(lo, cache) for lo in running for cache in caches]
        runs: dict[tuple[str, str], list[dict]] = {}
        for r in range(args.rounds):
            shift = r * len(cells) // max(args.rounds, 1)
            for lo, cache in cells[shift:] + cells[:shift]:
                reads, pages = opens.get(lo.name, (paths, paths))
                runs.setdefault((lo.name, cache), []).append(
                    _run_child(lo, reads, sizes, batches, cache, pages)
                )
        results: dict[str, dict[str, dict]] = {}
        for (name, cache), got in runs.items():
            results.setdefault(name, {})[cache] = _summary(got)
        tables.append(table(sizes, writer, results, here, caches, notes))
        data["sets"].append(
            {
                "sizes": asdict(sizes),
                "files": [str(p) for p in paths],
                "writer": writer,
                "results": results,
                "skipped": here,
                "ratios": ratios(results),
                "annbatch_conversion": conversion,
            }
        )
    _cli.emit(data, "\n\n".join(tables), args.json)
    failed = [c for s in data["sets"] for c in s["results"].values() if _failed(c)]
    return 1 if failed else 0


def _failed(caches: dict[str, dict]) -> bool:
    return any("error" in summary for summary in caches.values())


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    raise SystemExit(main())
