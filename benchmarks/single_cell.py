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
loader, then times an epoch of its batches (64 cells, or 4,096 for the ``-b4096`` loaders;
``--batches N``: N x 64 cells, rounded up to whole batches) from the iterator's creation
(starting workers counts; opening the files and reading ``indptr`` does not: that is ``setup
s``). Reported per loader:

* warm (every file read whole just before the process starts): its first epoch, and its steady
  state, a second epoch from a new iterator over the same loader in the same process; the
  ratios' "warm" is the steady state;
* cold: a fresh process's first epoch, every file evicted with
  ``posix_fadvise(POSIX_FADV_DONTNEED)`` just before it starts (by the parent, which maps none of
  them, while no child runs: the call leaves the pages a live process maps; the resident share is
  checked with ``mincore`` and printed), and that rate over the cold ceiling;
* the cold ceiling: the disk's sequential rate, the files' ``X/data`` + ``X/indices`` bytes as
  stored (their chunks, merged where they touch) read in order by a fresh process just after
  the files were evicted, taking its turn among the cold runs; the epoch's cells over the time
  its bytes take at that rate;
* private memory: the peak of the process tree's anonymous + shmem pages, ``Pss_Anon +
  Pss_Shmem`` of ``/proc/<pid>/smaps_rollup`` summed over the child and its descendants (a page
  shared by forked workers counts once), sampled every ``SAMPLE_S`` (50 ms) by a thread from
  the child's start (torch imported) to its end; mapped clean file pages are the page cache,
  not the loader's. The JSON also has the private memory at the child's start and the sampled
  peak of the tree's summed RSS;
* the batch mix, the mean number of distinct 1,000-cell runs (file, cell // 1000) a batch draws
  from (~44 when 64 cells are drawn from 80 runs at random), and the file mix,
  ``loaderkit.batch_mix`` of each cell's file (a batch's file entropy over the epoch's: ~1 for
  a full shuffle, 0 for file order); the process's peak RSS (``VmHWM``:
  it counts torch's import, ~250 MiB, and file pages mapped by the loader) and the largest
  worker process's (``ru_maxrss`` of its children: a forked worker's counts the pages it shares
  with its parent).

Loaders (``--only`` takes names or prefixes, comma-separated; ``--list`` lists them): loaderkit
``HDF5SessionDataset(files, key="X")`` under ``create_dataloader(batch_size=64, shuffle=True,
seed=0)`` with no workers, 2 worker processes and 2 worker threads, CSR batches (the default) and
``sparse="dense"``; with ``cells=`` choosing every other cell of each file (``lk-cells-half``);
with ``BlockShuffleSampler(block_size=16)`` and its buffered block shuffle, ``fetch_factor=16``
(``lk-block-16``, ``lk-block-16-fetch-16``);
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
same every epoch); its cold runs evict the store's files (its cold / ceiling is its cells/s over
the ceiling of the ``.h5ad`` files, which hold the same cells). At batch 4,096 (annbatch's paper
setting): loaderkit CSR (``lk-csr-b4096``), annbatch shuffled (``annbatch-b4096``) and
scDataset block 4 / fetch 16 (``scd-4-16-b4096``: a fetch of 65,536 cells, as its headline
pair's at batch 64). Peers that are not importable are skipped with a line saying so. Install
them with ``pip install -e ".[bench-single-cell]"`` (annbatch needs Python >= 3.12: a venv of
its own, e.g. ``python3.12 -m venv v && v/bin/pip install torch h5py psutil tqdm
scdataset anndata scipy annbatch``, run as ``PYTHONPATH=src v/bin/python
benchmarks/single_cell.py``; PyPI's torch is a CUDA build, which adds to every loader's RSS
and private memory alike).

Noise: this is a shared machine. ``--rounds N`` repeats every (loader, cache) cell, and the
disk's read, N times in an order rotated between rounds and reports the median cells/s (and
the largest memory peaks); the ratios are of those medians. The issue's table (warm @64 and
@4096, cold, ceiling, private memory; 11 minutes on a busy 2-core machine, the files
and annbatch's copy written first):
``python benchmarks/single_cell.py --rounds 3 --only
lk-csr,annbatch,scd-4-1024,lk-csr-b4096,annbatch-b4096,scd-4-16-b4096 --json single_cell.json``;
every loader, both compressions (hours: AnnLoader, h5py and gzip are slow):
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
import threading
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
import _cgroups
import _disk

__all__ = [
    "LOADERS",
    "Sizes",
    "TreeMemory",
    "batch_mix",
    "batches_for",
    "ceiling_cells_per_s",
    "cell_ids",
    "file_mix",
    "main",
    "merge_ranges",
    "parse_smaps_rollup",
    "private_kib",
    "resident_fraction",
    "write_files",
]

BATCH = 64
#: the large batch: annbatch's paper setting
BIG_BATCH = 4096
#: cells per run in the batch-mix figure (file, cell // RUN)
RUN = 1000
VERSION = 1  # of the generated files' content; a cache with another is rewritten
#: the corpus case: the share of genes its files have in common
CORPUS_SHARED = 0.8
#: how many times the limit a corpus must be for ``--memory-limit`` runs to be out of core
OUT_OF_CORE = 2.5
#: seconds between two looks at a child's process tree's memory (each look reads every
#: process's ``smaps_rollup``: well under a millisecond for a loader's few processes)
SAMPLE_S = 0.05


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
    block: int = 0  # scDataset's block_size; loaderkit: BlockShuffleSampler(block_size=)
    fetch: int = 0  # scDataset's fetch_factor; loaderkit: BlockShuffleSampler(fetch_factor=)
    shuffle: bool = True  # annbatch: its RandomSampler, else its store order
    join: str | None = None  # loaderkit: the corpus files (``Sizes.shared``) under this join
    cells: int = 1  # loaderkit: every ``cells``-th cell of each file (``cells=``)
    batch: int = BATCH  # cells a batch


LOADERS: tuple[Loader, ...] = (
    Loader("lk-csr", "loaderkit, CSR batches", "loaderkit"),
    Loader("lk-dense", "loaderkit, dense batches", "loaderkit", form="dense"),
    Loader("lk-csr-2p", "loaderkit, CSR, 2 processes", "loaderkit", 2, "process"),
    Loader("lk-csr-2t", "loaderkit, CSR, 2 threads", "loaderkit", 2, "thread"),
    Loader("lk-cells-half", "loaderkit, CSR, every other cell (cells=)", "loaderkit", cells=2),
    Loader("lk-block-16", "loaderkit, CSR, BlockShuffleSampler block 16", "loaderkit", block=16),
    Loader(
        "lk-block-16-fetch-16",
        "loaderkit, CSR, BlockShuffleSampler block 16 / fetch 16",
        "loaderkit",
        block=16,
        fetch=16,
    ),
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
    # annbatch's paper setting: batches of 4,096; scDataset's fetch of 16 batches is the
    # 65,536 cells of its headline pair's (64 x 1,024)
    Loader("lk-csr-b4096", "loaderkit, CSR batches", "loaderkit", batch=BIG_BATCH),
    Loader(
        "scd-4-16-b4096",
        "scDataset block 4 / fetch 16",
        "scdataset",
        block=4,
        fetch=16,
        batch=BIG_BATCH,
    ),
    Loader(
        "annbatch-b4096",
        "annbatch defaults + shuffle, on its converted copy",
        "annbatch",
        batch=BIG_BATCH,
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


def file_mix(cells: np.ndarray, cells_per_file: int, batch: int) -> float | None:
    """``loaderkit.batch_mix`` of the cells' files: each batch's file entropy over the epoch's.

    About 1 for a full shuffle, 0 for file order. ``None`` where the loaderkit this child
    imports has no ``batch_mix`` (an older commit read side by side).
    """
    try:
        from loaderkit import batch_mix as entropy_mix
    except ImportError:
        return None
    return entropy_mix(np.asarray(cells) // cells_per_file, batch) if len(cells) else None


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
    ['lk-csr-2p', 'lk-csr-2t', 'lk-csr-rechunked', 'lk-csr-b4096']
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


def batches_for(batch: int, batches: int) -> int:
    """Batches of ``batch`` cells a run reads for ``batches`` batches of 64 (``--batches``): as
    many cells, rounded up to whole batches; 0 (one epoch) stays 0.

    >>> batches_for(64, 40), batches_for(4096, 40), batches_for(4096, 0)
    (40, 1, 0)
    """
    return -(-batches * BATCH // batch)


def parse_smaps_rollup(text: str) -> dict[str, int]:
    """The ``kB`` fields of a ``/proc/<pid>/smaps_rollup`` (its first line, the range, skipped).

    >>> parse_smaps_rollup("55fb-7ffc ---p 00000000 00:00 0  [rollup]\\nRss:  1764 kB\\n")
    {'Rss': 1764}
    """
    fields: dict[str, int] = {}
    for line in text.splitlines():
        name, colon, rest = line.partition(":")
        value = rest.split()
        if colon and len(value) == 2 and value[1] == "kB" and value[0].isdigit():
            fields[name.strip()] = int(value[0])
    return fields


def private_kib(fields: dict[str, int]) -> int | None:
    """A process's private memory in KiB from its ``smaps_rollup`` fields: its anonymous and
    shmem pages, each page shared by N processes counted 1/N (``Pss_Anon + Pss_Shmem``), so a
    process tree's sum counts a shared page once. Mapped clean file pages are the page cache, not
    the process's. An older kernel without ``Pss_Anon`` gives ``Anonymous`` (shmem
    left out, shared pages counted in each process); None where neither is there.

    >>> private_kib({"Rss": 900, "Pss_Anon": 112, "Pss_File": 227, "Pss_Shmem": 30})
    142
    >>> private_kib({"Rss": 900, "Anonymous": 120}), private_kib({})
    (120, None)
    """
    if "Pss_Anon" in fields:
        return fields["Pss_Anon"] + fields.get("Pss_Shmem", 0)
    return fields.get("Anonymous")


def merge_ranges(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """``(offset, length)`` byte ranges sorted, the touching and overlapping ones merged.

    >>> merge_ranges([(100, 50), (0, 100), (300, 10), (140, 20)])
    [(0, 160), (300, 10)]
    """
    merged: list[tuple[int, int]] = []
    for offset, length in sorted(r for r in ranges if r[1] > 0):
        if merged and offset <= merged[-1][0] + merged[-1][1]:
            start = merged[-1][0]
            merged[-1] = (start, max(merged[-1][1], offset + length - start))
        else:
            merged.append((offset, length))
    return merged


def ceiling_cells_per_s(bytes_per_s: float, epoch_bytes: int, epoch_cells: int) -> float | None:
    """The cold ceiling: an epoch's cells over the time the disk takes to read the epoch's bytes
    (its cells' ``data`` and ``indices`` as stored) in order; None where a figure is missing.

    >>> ceiling_cells_per_s(1.8e9, 512_000_000, 80_000)
    281250.0
    >>> ceiling_cells_per_s(1.8e9, 0, 80_000) is None
    True
    """
    if bytes_per_s <= 0 or epoch_bytes <= 0 or epoch_cells <= 0:
        return None
    return epoch_cells * bytes_per_s / epoch_bytes


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


def stored_ranges(
    paths: Sequence[Path], keys: Sequence[str] = ("X/data", "X/indices")
) -> list[tuple[str, int, int]]:
    """Where ``keys`` lie in each file as stored: ``(path, offset, length)``, a file's ranges
    sorted and merged (a chunked dataset's chunks, a contiguous one's extent)."""
    out: list[tuple[str, int, int]] = []
    for path in paths:
        ranges: list[tuple[int, int]] = []
        with h5py.File(path, "r") as f:
            for key in keys:
                dsid = f[key].id
                if f[key].chunks is None:
                    offset = dsid.get_offset()
                    if offset is not None:
                        ranges.append((offset, dsid.get_storage_size()))
                    continue
                for i in range(dsid.get_num_chunks()):
                    info = dsid.get_chunk_info(i)
                    ranges.append((info.byte_offset, info.size))
        out += [(str(path), offset, length) for offset, length in merge_ranges(ranges)]
    return out


def cell_pages(paths: Sequence[Path], keys: Sequence[str] = ("X/data", "X/indices")) -> float:
    """The mean 4 KiB pages a cell's extents of ``keys`` touch (``_disk.pages_per_extent``,
    summed over the keys): what one cell costs a loader reading it where it lies.

    Only for data stored uncompressed: a compressed chunk is read and decoded whole.
    """
    lengths: dict[str, list[np.ndarray]] = {key: [] for key in keys}
    sizes: dict[str, int] = {}
    for path in paths:
        with h5py.File(path, "r") as f:
            counts = np.diff(f["X/indptr"][:])
            for key in keys:
                sizes[key] = f[key].dtype.itemsize
                lengths[key].append(counts * sizes[key])
    return sum(
        _disk.pages_per_extent(np.concatenate(lengths[key]), itemsize=sizes[key]) for key in keys
    )


def read_sequentially(ranges: Sequence[Sequence[Any]], block: int = 8 << 20) -> dict[str, Any]:
    """Read ``ranges`` (``(path, offset, length)``) in order, ``block`` bytes a ``preadv``
    (each file advised ``POSIX_FADV_SEQUENTIAL``): the bytes and how long they took.

    Run in a fresh process, the files evicted just before: the disk's sequential rate.
    """
    buffer = bytearray(block)
    view = memoryview(buffer)
    fds: dict[str, int] = {}
    total = 0
    started = time.perf_counter()
    try:
        for path, offset, length in ranges:
            if path not in fds:
                fds[path] = os.open(path, os.O_RDONLY)
                os.posix_fadvise(fds[path], 0, 0, os.POSIX_FADV_SEQUENTIAL)
            at, end = int(offset), int(offset) + int(length)
            while at < end:
                got = os.preadv(fds[path], [view[: min(block, end - at)]], at)
                if got <= 0:
                    raise OSError(f"{path}: nothing read at byte {at} of a range ending at {end}")
                at += got
                total += got
        seconds = time.perf_counter() - started
    finally:
        for fd in fds.values():
            os.close(fd)
    return {"bytes": total, "seconds": seconds, "bytes_per_s": total / seconds}


# ------------------------------------------------------------------ private memory


def tree_pids(pid: int) -> list[int]:
    """``pid`` and its descendants, parents first (``/proc/<pid>/task/<tid>/children``); the
    ones gone while looked at are left out."""
    found, at = [pid], 0
    while at < len(found):
        here = found[at]
        at += 1
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{here}/task"):
                with contextlib.suppress(OSError), open(f"/proc/{here}/task/{task}/children") as f:
                    found += [int(c) for c in f.read().split() if int(c) not in found]
    return found


class TreeMemory:
    """The peaks of a process tree's private memory and RSS, sampled every ``every`` seconds by
    a thread (and once more when stopped).

    Private memory is each process's ``Pss_Anon + Pss_Shmem`` (:func:`private_kib`) summed over
    the tree: a page a forked worker shares with its parent counts once. RSS is the sum of each
    process's ``Rss``: shared pages, and mapped file pages, count in every process.

    Example:
        >>> with TreeMemory(every=0.01) as memory:
        ...     held = bytearray(64 << 20)
        ...     time.sleep(0.05)
        >>> memory.private_peak_mib >= 64, memory.samples >= 2
        (True, True)
    """

    def __init__(self, pid: int | None = None, every: float = 0.05) -> None:
        self.pid = os.getpid() if pid is None else pid
        self.every = every
        self.private_peak_kib = 0
        self.rss_peak_kib = 0
        #: the private memory of the first look (None before it)
        self.private_first_kib: int | None = None
        self.samples = 0
        #: False where no process of the tree had a private figure (no ``smaps_rollup``)
        self.known = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-memory", daemon=True)

    @property
    def private_peak_mib(self) -> float | None:
        """The largest private memory sampled, MiB; None where it was never known."""
        return self.private_peak_kib / 1024 if self.known else None

    @property
    def rss_peak_mib(self) -> float:
        """The largest sum of RSS sampled, MiB."""
        return self.rss_peak_kib / 1024

    def sample(self) -> None:
        """One look at every process of the tree; the peaks updated."""
        private = rss = 0
        known = False
        for pid in tree_pids(self.pid):
            try:
                with open(f"/proc/{pid}/smaps_rollup") as f:
                    fields = parse_smaps_rollup(f.read())
            except OSError:  # gone, or no smaps_rollup (before Linux 4.14)
                continue
            mine = private_kib(fields)
            if mine is not None:
                private, known = private + mine, True
            rss += fields.get("Rss", 0)
        self.private_peak_kib = max(self.private_peak_kib, private)
        self.rss_peak_kib = max(self.rss_peak_kib, rss)
        self.known = self.known or known
        if not self.samples and known:
            self.private_first_kib = private
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def __enter__(self) -> TreeMemory:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


# ------------------------------------------------------------------ the loaders (in the child)


def _loaderkit(lo: Loader, paths: list[str]) -> tuple[Iterable[Any], Callable[[], None]]:
    from loaderkit import HDF5SessionDataset, create_dataloader

    step = lo.cells
    chosen = {"cells": lambda obs: np.arange(0, len(obs["_index"]), step)} if step > 1 else {}
    dataset = HDF5SessionDataset(paths, key="X", sparse=lo.form, join=lo.join, **chosen)
    extra: dict[str, Any] = {"worker_method": lo.method} if lo.workers else {}
    if lo.block:  # blocks of consecutive cells, and with a fetch, a buffered block shuffle
        from loaderkit import BlockShuffleSampler

        fetch = {"batch_size": lo.batch, "fetch_factor": lo.fetch} if lo.fetch else {}
        extra["sampler"] = BlockShuffleSampler(dataset, block_size=lo.block, seed=0, **fetch)
    else:
        extra["shuffle"] = True
    loader = create_dataloader(
        dataset, batch_size=lo.batch, seed=0, num_workers=lo.workers, **extra
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
        batch_size=lo.batch,
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
    return AnnLoader(adatas, batch_size=lo.batch, shuffle=True), lambda: None


class _H5pyRows:
    """Each batch's cells sorted, one read of ``data`` and ``indices`` per cell."""

    def __init__(self, paths: list[str], batch: int = BATCH) -> None:
        self.batch = batch
        self.files = [h5py.File(p, "r") for p in paths]
        self.indptr = [f["X/indptr"][:] for f in self.files]
        self.starts = np.cumsum([0] + [len(p) - 1 for p in self.indptr])
        self.genes = int(self.files[0]["X"].attrs["shape"][1])

    def __iter__(self) -> Iterator[Any]:
        import torch

        order = np.random.default_rng(0).permutation(int(self.starts[-1]))
        for at in range(0, len(order), self.batch):
            values, columns, crow = [], [], [0]
            for cell in np.sort(order[at : at + self.batch]):
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
    rows = _H5pyRows(paths, lo.batch)
    return rows, rows.close


def _annbatch(lo: Loader, paths: list[str]) -> tuple[Iterable[Any], Callable[[], None]]:
    """``paths``: annbatch's converted store. Its batches are dicts; ``X`` a torch sparse CSR."""
    import annbatch

    collection = annbatch.DatasetCollection(paths[0], mode="r")
    options = {"shuffle": True, "rng": np.random.default_rng(0)} if lo.shuffle else {}
    loader = annbatch.Loader(batch_size=lo.batch, to="torch", **options).use_collection(collection)
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

    A copy: a view would keep the whole batch alive, and the peak RSS with it. Taken through
    numpy: torch's own indexing of a fresh batch costs some 45 us a batch inside the epoch's
    loop (against 6 us alone), a tenth of a fast loader's batch of 64, which would shrink every
    ratio between loaders; numpy's costs a few.
    """
    import torch

    x = batch["X"] if isinstance(batch, dict) else batch.X if hasattr(batch, "X") else batch
    if isinstance(x, torch.Tensor) and x.layout == torch.sparse_csr:
        # column 0 is stored first in each row: a gather of the rows' first values
        return x.values().numpy()[x.crow_indices().numpy()[:-1]]
    if isinstance(x, torch.Tensor):
        return x.numpy()[:, 0].copy()
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


def _epoch(loader: Iterable[Any], batches: int, cells_per_file: int) -> dict[str, Any]:
    """``batches`` batches (0: all) of a fresh iterator over ``loader``, timed from its creation."""
    firsts: list[np.ndarray] = []
    limit = batches or sys.maxsize
    started = time.perf_counter()
    iterator = iter(loader)
    for batch in iterator:
        firsts.append(_first_column(batch))
        del batch
        if len(firsts) >= limit:
            break
    seconds = time.perf_counter() - started
    del iterator
    ids = [cell_ids(f) for f in firsts]
    seen = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    return {
        "cells": len(seen),
        "distinct_cells": len(np.unique(seen)),
        "batches": len(ids),
        "seconds": seconds,
        "cells_per_s": len(seen) / seconds,
        "batch_mix": batch_mix(ids, cells_per_file),
        "file_mix": file_mix(seen, cells_per_file, len(ids[0]) if ids else 1),
    }


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One loader's timed epochs in this (fresh) process; what the parent prints.

    The first epoch's figures are the answer's own; with ``spec["epochs"]`` 2 the second
    epoch's, from a new iterator over the same loader (its steady state), are under
    ``"steady"``. The process tree's private memory is sampled from the start to the end.
    """
    import torch

    torch.manual_seed(0)
    lo = next(lo for lo in LOADERS if lo.name == spec["loader"])
    with TreeMemory(every=SAMPLE_S) as memory:
        started = time.perf_counter()
        loader, close = BUILDERS[lo.kind](lo, spec["paths"])
        setup = time.perf_counter() - started
        epochs = [
            _epoch(loader, spec["batches"], spec["cells_per_file"])
            for _ in range(spec.get("epochs", 1))
        ]
        close()
    kib = 1024
    return {
        **epochs[0],
        "steady": epochs[1] if len(epochs) > 1 else None,
        "setup_s": setup,
        "peak_rss_mib": _peak_rss_mib(),
        "worker_peak_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * kib / 2**20,
        "private_peak_mib": memory.private_peak_mib,
        "private_start_mib": (
            None if memory.private_first_kib is None else memory.private_first_kib / 1024
        ),
        "tree_rss_peak_mib": memory.rss_peak_mib,
        "memory_samples": memory.samples,
    }


# ------------------------------------------------------------------ the parent


def _missing(lo: Loader) -> str | None:
    import importlib.util

    for module in NEEDS.get(lo.kind, ()):
        if importlib.util.find_spec(module) is None:
            return module
    return None


def _in_child(spec: dict[str, Any], limit: int | None = None) -> dict[str, Any]:
    """``spec`` run by this script in a fresh process: its JSON answer, or ``{"error": ...}``.

    With ``limit`` (bytes), the process runs in a child memory cgroup of this one's made for
    it (``_cgroups.child_cgroup``): its private memory and the page cache it fills are bounded
    together; the answer gains ``"cgroup"``, the limit, its peak (page cache included), the
    peak of its anonymous memory and how often the limit was hit.
    """
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
    cgroup: dict[str, Any] | None = None
    if limit is None:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
        returncode, stdout, stderr = done.returncode, done.stdout, done.stderr
    else:
        with _cgroups.child_cgroup(memory_bytes=limit) as group:
            run = group.run(argv, timeout=3600)
        returncode, stdout, stderr = run.returncode, run.stdout, run.stderr
        cgroup = {
            "limit_mib": limit / 2**20,
            "peak_mib": run.peak_bytes / 2**20,
            "anon_peak_mib": run.peak_anon / 2**20,
            "failcnt": run.failcnt,
        }
    if returncode in (137, -9) and limit is not None:
        return {"error": f"killed in its {limit_words(limit)} memory cgroup", "cgroup": cgroup}
    if returncode:
        tail = stderr.strip().splitlines()[-1:] or ["(no output)"]
        return {"error": tail[0][:300]}
    result: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return result if cgroup is None else {**result, "cgroup": cgroup}


def bound_line(limit: int, stored: int) -> str:
    """The line that says every run was out of core: the cgroup's limit against the corpus.

    >>> bound_line(2 << 30, 5_100_000_000)  # doctest: +NORMALIZE_WHITESPACE
    "out of core: every run in a memory cgroup of 2,048 MiB of its own (its private memory and
    the page cache it fills), the files evicted first; the files' `data` + `indices`, 5,100 MB,
    are 2.4x the limit (below 2.5x: not out of core enough)"
    """
    over = stored / limit
    short = "" if over >= OUT_OF_CORE else f" (below {OUT_OF_CORE}x: not out of core enough)"
    return (
        f"out of core: every run in a memory cgroup of {limit_words(limit)} of its own (its "
        f"private memory and the page cache it fills), the files evicted first; the files' "
        f"`data` + `indices`, {stored / 1e6:,.0f} MB, are {over:.1f}x the limit{short}"
    )


def cgroup_line(groups: Sequence[dict[str, Any]]) -> str:
    """What the runs' memory cgroups saw: their peaks (page cache included) against the limit.

    >>> cgroup_line([{"limit_mib": 2048.0, "peak_mib": 2048.0, "anon_peak_mib": 300.0,
    ...               "failcnt": 5}, {"limit_mib": 2048.0, "peak_mib": 900.0,
    ...               "anon_peak_mib": 250.0, "failcnt": 0}])  # doctest: +NORMALIZE_WHITESPACE
    'memory cgroups: peaks 900-2,048 MiB of 2,048 (page cache included), anonymous 250-300 MiB;
    the limit reached in 1 of 2 runs (the kernel reclaimed page cache there)'
    """
    peaks = [g["peak_mib"] for g in groups]
    anon = [g["anon_peak_mib"] for g in groups]
    hit = sum(1 for g in groups if g["failcnt"])
    return (
        f"memory cgroups: peaks {min(peaks):,.0f}-{max(peaks):,.0f} MiB of "
        f"{groups[0]['limit_mib']:,.0f} (page cache included), anonymous "
        f"{min(anon):,.0f}-{max(anon):,.0f} MiB; the limit reached in {hit} of {len(groups)} runs "
        "(the kernel reclaimed page cache there)"
    )


def limit_words(limit: int) -> str:
    """A memory limit as the table says it.

    >>> limit_words(2 << 30), limit_words(1536 << 20)
    ('2,048 MiB', '1,536 MiB')
    """
    return f"{limit / 2**20:,.0f} MiB"


def _run_child(
    lo: Loader,
    paths: list[Path],
    sizes: Sizes,
    batches: int,
    cache: str,
    pages: list[Path] | None = None,
    limit: int | None = None,
) -> dict:
    """One timed run of ``lo`` over ``paths``; ``pages`` (default: ``paths``) are the files
    evicted or warmed before it (a directory store's files).

    ``batches`` counts batches of 64 (0: one epoch). A warm run reads two epochs (the first,
    then the steady state); a cold one its first only. The files are evicted by this process,
    which maps none of them, while no child runs: ``POSIX_FADV_DONTNEED`` leaves the pages a live
    process maps. ``limit``: the run's memory cgroup (``_in_child``).
    """
    pages = list(paths) if pages is None else pages
    if cache == "cold":
        evict(pages)
    else:
        warm(pages)
    resident = resident_fraction(pages)
    spec = {
        "loader": lo.name,
        "paths": [str(p) for p in paths],
        "batches": batches_for(lo.batch, batches),
        "cells_per_file": sizes.cells,
        "epochs": 2 if cache == "warm" else 1,
    }
    # a whole epoch holds every cell chosen once: checked by the table (``epoch_problems``)
    chosen = sizes.files * -(-sizes.cells // lo.cells) if not batches else None
    return {**_in_child(spec, limit), "resident_before": resident, "epoch_cells": chosen}


def _run_disk(
    ranges: list[tuple[str, int, int]],
    paths: list[Path],
    limit: int | None = None,
    random_s: float = 5.0,
) -> dict:
    """The disk's ceilings: its sequential rate, ``ranges`` read in order by a fresh process
    (in the memory cgroup ``limit`` makes, if any) just after the files were evicted; then its
    random 4 KiB reads at depth 32 over the files for ``random_s`` seconds (fio, ``O_DIRECT``:
    the page cache plays no part; ``"random"``, or its error where fio is missing)."""
    evict(paths)
    resident = resident_fraction(paths)
    sequential = _in_child({"disk": [list(r) for r in ranges]}, limit)
    random = _disk.random_iops(paths, seconds=random_s)
    return {**sequential, "resident_before": resident, "random": random}


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


def _median_or_none(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _summary(runs: list[dict]) -> dict[str, Any]:
    """A (loader, cache) cell's runs: median cells/s (first epoch; ``steady_cells_per_s``, the
    second, where every run read one), the largest memory peaks."""
    errors = [r["error"] for r in runs if "error" in r]
    if errors:
        return {"error": errors[0], "runs": runs}
    steady = [r["steady"]["cells_per_s"] for r in runs if r.get("steady")]
    private = [r["private_peak_mib"] for r in runs if r.get("private_peak_mib") is not None]
    return {
        "cells_per_s": statistics.median(r["cells_per_s"] for r in runs),
        "steady_cells_per_s": statistics.median(steady) if len(steady) == len(runs) else None,
        "batch_mix": statistics.median(r["batch_mix"] for r in runs),
        "file_mix": _median_or_none([r.get("file_mix") for r in runs]),
        "peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
        "worker_peak_rss_mib": max(r["worker_peak_rss_mib"] for r in runs),
        "private_peak_mib": max(private) if private else None,
        "tree_rss_peak_mib": max(r.get("tree_rss_peak_mib", 0.0) for r in runs),
        "runs": runs,
    }


def disk_summary(
    runs: list[dict], epoch_cells: int, pages_per_cell: float | None = None
) -> dict[str, Any]:
    """The sequential reads' median rate and the cold ceiling it implies for ``epoch_cells``
    cells stored in the bytes read; with ``pages_per_cell`` (uncompressed files), the random
    reads' median IOPS and the random ceiling they imply (``_disk.random_ceiling``).

    >>> runs = [{"bytes": 512_000_000, "bytes_per_s": rate} for rate in (1e9, 2e9, 3e9)]
    >>> got = disk_summary(runs, 80_000)
    >>> got["bytes_per_s"], got["ceiling_cells_per_s"], got["random_ceiling_cells_per_s"]
    (2000000000.0, 312500.0, None)
    >>> runs = [{**r, "random": {"iops": 100_000.0}} for r in runs]
    >>> disk_summary(runs, 80_000, 4.0)["random_ceiling_cells_per_s"]
    25000.0
    """
    errors = [r["error"] for r in runs if "error" in r]
    if errors:
        return {"error": errors[0], "runs": runs}
    rate = float(statistics.median(r["bytes_per_s"] for r in runs))
    stored = int(runs[0]["bytes"])
    measured = [r["random"] for r in runs if "iops" in r.get("random", {})]
    iops = float(statistics.median(m["iops"] for m in measured)) if measured else None
    random_errors = [r["random"]["error"] for r in runs if "error" in r.get("random", {})]
    return {
        "bytes_per_s": rate,
        "bytes": stored,
        "cells": epoch_cells,
        "ceiling_cells_per_s": ceiling_cells_per_s(rate, stored, epoch_cells),
        "random_iops": iops,
        "pages_per_cell": pages_per_cell,
        "random_ceiling_cells_per_s": (
            _disk.random_ceiling(iops, pages_per_cell) if iops and pages_per_cell else None
        ),
        "random_error": random_errors[0] if random_errors and not measured else None,
        "random_tool": measured[0].get("tool") if measured else None,
        "runs": runs,
    }


def disk_line(disk: dict[str, Any]) -> str:
    """The line under the table that says the disk's rate and the cold ceiling.

    >>> disk = {"bytes_per_s": 1.8e9, "bytes": 512_000_000, "cells": 80_000}
    >>> disk_line({**disk, "ceiling_cells_per_s": 281_250.0, "runs": [{}, {}, {}]})
    ... # doctest: +NORMALIZE_WHITESPACE
    "disk: 1.80 GB/s reading the files' `data` + `indices` in order (512 MB as stored; a fresh
    process, the files evicted; median of 3): the epoch's 80,000 cells in 0.28 s, the cold
    ceiling 281,250 cells/s"
    >>> random = {"random_iops": 113e3, "pages_per_cell": 3.56, "random_tool": "fio-3.33"}
    >>> disk_line({**disk, "ceiling_cells_per_s": 281_250.0, "runs": [{}], **random,
    ...            "random_ceiling_cells_per_s": 31_742.0}).split("; random")[1]
    ... # doctest: +NORMALIZE_WHITESPACE
    ' 4 KiB reads at depth 32 (fio-3.33, O_DIRECT): 113,000 IOPS; a cell touches 3.56 pages
    (values, column ids): the random ceiling 31,742 cells/s'
    >>> disk_line({**disk, "ceiling_cells_per_s": 1.0, "runs": [{}],
    ...            "random_error": "fio not found"}).split("; ")[-1]
    'random reads not measured: fio not found'
    >>> disk_line({"error": "OSError: no"})
    'disk: its sequential read failed: OSError: no'
    """
    if "error" in disk:
        return f"disk: its sequential read failed: {disk['error']}"
    rate, stored = disk["bytes_per_s"], disk["bytes"]
    line = (
        f"disk: {rate / 1e9:.2f} GB/s reading the files' `data` + `indices` in order "
        f"({stored / 1e6:,.0f} MB as stored; a fresh process, the files evicted; median of "
        f"{len(disk['runs'])}): the epoch's {disk['cells']:,} cells in {stored / rate:.2f} s, "
        f"the cold ceiling {_fmt(disk['ceiling_cells_per_s'])} cells/s"
    )
    if disk.get("random_ceiling_cells_per_s"):
        line += (
            f"; random 4 KiB reads at depth 32 ({disk['random_tool']}, O_DIRECT): "
            f"{disk['random_iops']:,.0f} IOPS; a cell touches {disk['pages_per_cell']:.2f} pages "
            f"(values, column ids): the random ceiling "
            f"{_fmt(disk['random_ceiling_cells_per_s'])} cells/s"
        )
    elif disk.get("random_error"):
        line += f"; random reads not measured: {disk['random_error']}"
    return line


def epoch_problems(results: dict[str, dict[str, dict]]) -> list[str]:
    """The runs whose whole epoch did not hold every cell once (``epoch_cells``, set where a run
    read whole epochs): which loader, cache and epoch, and what it read.

    >>> run = {"cells": 4096, "distinct_cells": 4096, "epoch_cells": 6000}
    >>> for line in epoch_problems({"lk-csr-b4096": {"warm": {"runs": [{**run, "steady": run}]}}}):
    ...     print(line)
    lk-csr-b4096 warm, 1st epoch: 4,096 cells (4,096 distinct) of 6,000
    lk-csr-b4096 warm, 2nd epoch: 4,096 cells (4,096 distinct) of 6,000
    """
    found = []
    for name, caches in results.items():
        for cache, summary in caches.items():
            for run in summary.get("runs", []):
                want = run.get("epoch_cells")
                for which, epoch in (("1st", run), ("2nd", run.get("steady"))):
                    if not want or not epoch or "cells" not in epoch:
                        continue
                    if epoch["cells"] != want or epoch["distinct_cells"] != want:
                        found.append(
                            f"{name} {cache}, {which} epoch: {epoch['cells']:,} cells "
                            f"({epoch['distinct_cells']:,} distinct) of {want:,}"
                        )
    return found


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _rate(cell: dict[str, Any], cache: str) -> float | None:
    """A loader's figure for ``cache``: warm, its steady state (second epoch); cold, its first."""
    summary = cell.get(cache, {})
    return summary.get("steady_cells_per_s" if cache == "warm" else "cells_per_s")


def _private(cell: dict[str, Any]) -> float | None:
    """A loader's private memory: the largest peak of its runs, warm and cold."""
    peaks = [s.get("private_peak_mib") for s in cell.values() if isinstance(s, dict)]
    known = [p for p in peaks if p is not None]
    return max(known) if known else None


def ratios(
    results: dict[str, dict[str, dict]],
    ceiling: float | None = None,
    random: float | None = None,
) -> dict[str, float | None]:
    """loaderkit (no workers, CSR) against annbatch (shuffled, on its converted copy) and
    scDataset block 4 / fetch 1024, at batch 64 and 4,096; loaderkit's cold rate against the
    disk's sequential ``ceiling`` and its full shuffles' against the ``random`` one (cells/s);
    the buffered block shuffle against annbatch, scDataset and the sequential ceiling, its file
    mix against the full shuffle's; 2 workers against 0. Warm is each loader's steady state."""

    def rate(name: str, cache: str) -> float | None:
        return _rate(results.get(name, {}), cache)

    def first(name: str) -> float | None:
        return results.get(name, {}).get("warm", {}).get("cells_per_s")

    def private(name: str) -> float | None:
        return _private(results.get(name, {}))

    def mix(name: str) -> float | None:
        cell = results.get(name, {})
        return (cell.get("cold") or cell.get("warm") or {}).get("file_mix")

    out: dict[str, float | None] = {}
    for cache in ("warm", "cold"):
        for lk, ab in (("lk-csr", "annbatch"), ("lk-csr-b4096", "annbatch-b4096")):
            batch = next(lo.batch for lo in LOADERS if lo.name == lk)
            out[f"loaderkit/annbatch {cache} @{batch}"] = _ratio(rate(lk, cache), rate(ab, cache))
    out["loaderkit/annbatch warm 1st epoch @64"] = _ratio(first("lk-csr"), first("annbatch"))
    out["loaderkit cold/ceiling"] = _ratio(rate("lk-csr", "cold"), ceiling)
    for name in ("lk-csr", "lk-csr-2t", "lk-csr-2p"):
        out[f"{name} cold/random ceiling"] = _ratio(rate(name, "cold"), random)
    block = "lk-block-16-fetch-16"
    out[f"{block} cold/ceiling"] = _ratio(rate(block, "cold"), ceiling)
    out[f"{block}/annbatch cold"] = _ratio(rate(block, "cold"), rate("annbatch", "cold"))
    out[f"{block}/scDataset 4-1024 cold"] = _ratio(rate(block, "cold"), rate("scd-4-1024", "cold"))
    out[f"{block}/lk-csr file mix"] = _ratio(mix(block), mix("lk-csr"))
    out[f"{block}/annbatch private memory"] = _ratio(private(block), private("annbatch"))
    out["annbatch cold/ceiling"] = _ratio(rate("annbatch", "cold"), ceiling)
    out["loaderkit/annbatch private memory"] = _ratio(private("lk-csr"), private("annbatch"))
    out["loaderkit/scDataset 4-1024 private memory"] = _ratio(
        private("lk-csr"), private("scd-4-1024")
    )
    for cache in ("warm", "cold"):
        out[f"loaderkit/scDataset 4-1024 {cache}"] = _ratio(
            rate("lk-csr", cache), rate("scd-4-1024", cache)
        )
        out[f"loaderkit/scDataset 4-16 {cache} @4096"] = _ratio(
            rate("lk-csr-b4096", cache), rate("scd-4-16-b4096", cache)
        )
        for two, one in (
            ("lk-csr-2p", "lk-csr"),
            ("lk-csr-2t", "lk-csr"),
            ("lk-dense-2p", "lk-dense"),
            ("lk-cells-half", "lk-csr"),
            ("lk-corpus-outer", "lk-csr"),
            ("lk-corpus-outer-dense", "lk-dense"),
            ("lk-csr-rechunked", "lk-csr"),
        ):
            out[f"{two}/{one} {cache}"] = _ratio(rate(two, cache), rate(one, cache))
    out["loaderkit/scDataset 4-1024 peak RSS"] = _ratio(
        results.get("lk-csr", {}).get("warm", {}).get("peak_rss_mib"),
        results.get("scd-4-1024", {}).get("warm", {}).get("peak_rss_mib"),
    )
    return out


TARGETS = {
    "loaderkit/annbatch warm @64": ">= 3",
    "loaderkit/annbatch warm @4096": ">= 4",
    "loaderkit/annbatch cold @64": ">= 1.5",
    "loaderkit cold/ceiling": ">= 0.5",
    "lk-csr cold/random ceiling": ">= 0.9 (out of core)",
    "lk-csr-2t cold/random ceiling": ">= 0.9 (out of core)",
    "lk-csr-2p cold/random ceiling": ">= 0.9 (out of core)",
    "lk-block-16-fetch-16 cold/ceiling": ">= 0.5 (out of core)",
    "lk-block-16-fetch-16/annbatch cold": ">= 2.5 (out of core)",
    "lk-block-16-fetch-16/scDataset 4-1024 cold": ">= 5 (out of core)",
    "lk-block-16-fetch-16/lk-csr file mix": ">= 0.95",
    "lk-block-16-fetch-16/annbatch private memory": "<= 1",
    "loaderkit/annbatch private memory": "<= 0.5",
    "loaderkit/scDataset 4-1024 private memory": "<= 0.5",
    "loaderkit/scDataset 4-1024 warm": ">= 8",
    "loaderkit/scDataset 4-1024 cold": ">= 4",
    "loaderkit/scDataset 4-1024 peak RSS": "<= 0.5",
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
    disk: dict[str, Any] | None = None,
    bound: str | None = None,
) -> str:
    """The markdown table and the ratios of one file set; ``notes`` follow loaders' labels, and a
    note on ``""`` is a line under the table; ``disk`` (:func:`disk_summary`) gives the cold
    ceilings; ``bound`` (:func:`bound_line`) says the memory cgroup every run had."""
    notes = notes or {}
    ceiling = (disk or {}).get("ceiling_cells_per_s")
    random = (disk or {}).get("random_ceiling_cells_per_s")
    lines = [
        f"{sizes.files} files x {sizes.cells:,} cells x {sizes.genes:,} genes, {sizes.nnz} "
        f"nonzeros a cell, compression {sizes.compression}, written by {writer}; cells/s from "
        "the iterator's creation. Warm: the files in the page cache; its 2nd epoch is a second "
        "epoch in the process that read the first (the steady state). Cold: a fresh process's "
        "first epoch, the files evicted. Private MiB: the peak of the process tree's anonymous + "
        f"shmem pages (PSS: a shared page once), sampled every {SAMPLE_S * 1000:.0f} ms; peak "
        "RSS: the main process's, with the file pages it maps",
        *(["", bound] if bound else []),
        "",
        "| loader | batch | warm, 2nd epoch | warm, 1st epoch | cold | cold / ceiling "
        "| cold / random | private MiB | peak RSS MiB | worker peak RSS MiB | batch mix "
        "| file mix | setup s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    blank = " | | | | | | | | | | |"
    for lo in LOADERS:
        label = f"{lo.label} {notes[lo.name]}" if lo.name in notes else lo.label
        if lo.name in skipped:
            lines.append(f"| {label} | {lo.batch:,} | skipped: {skipped[lo.name]}{blank}")
            continue
        if lo.name not in results:
            continue
        cell = results[lo.name]
        first = cell.get("warm") or cell.get("cold") or {}
        if "error" in first:
            lines.append(f"| {label} | {lo.batch:,} | error: {first['error']}{blank}")
            continue
        cold = _rate(cell, "cold")
        fraction = _ratio(cold, ceiling)
        setup = statistics.median(r["setup_s"] for r in first["runs"])
        lines.append(
            f"| {label} | {lo.batch:,} | {_fmt(_rate(cell, 'warm'))} | "
            f"{_fmt(cell.get('warm', {}).get('cells_per_s'))} | {_fmt(cold)} | "
            f"{_fmt(fraction, 2)} | {_fmt(_ratio(cold, random), 2)} | "
            f"{_fmt(_private(cell))} | {_fmt(first['peak_rss_mib'])} | "
            f"{_fmt(first['worker_peak_rss_mib'] if lo.workers else None)} | "
            f"{_fmt(first['batch_mix'], 1)} | {_fmt(first.get('file_mix'), 2)} | "
            f"{_fmt(setup, 2)} |"
        )
    resident = [
        r["resident_before"] for c in results.values() for r in c.get("cold", {}).get("runs", [])
    ]
    known = [r for r in resident if r is not None]
    if "cold" in caches:
        said = f"at most {max(known):.1%}" if known else "an unknown share (no mincore)"
        lines += ["", f"cold: {said} of the files' pages resident at each cold start"]
    starts = [
        r["private_start_mib"]
        for c in results.values()
        for s in c.values()
        for r in s.get("runs", [])
        if r.get("private_start_mib") is not None
    ]
    if starts:
        lines += [
            "",
            f"private memory at a child's start (torch imported, no loader built): "
            f"{min(starts):,.0f}-{max(starts):,.0f} MiB",
        ]
    if disk:
        lines += ["", disk_line(disk)]
    groups = [
        r["cgroup"]
        for c in results.values()
        for s in c.values()
        for r in s.get("runs", [])
        if r.get("cgroup")
    ]
    if groups:
        lines += ["", cgroup_line(groups)]
    problems = epoch_problems(results)
    if problems:
        lines += ["", "epochs that did not read every cell once: " + "; ".join(problems)]
    if "" in notes:
        lines += ["", notes[""]]
    lines.append("")
    for name, value in ratios(results, ceiling, random).items():
        if value is not None:
            target = TARGETS.get(name)
            lines.append(f"- {name}: {value:.2f}x" + (f" (target {target})" if target else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Write (or reuse) the files, run every loader in a fresh process per cache state, print."""
    p = _cli.parser(__doc__ or "", "4 x 2,000 cells x 2,000 genes, 100 nonzeros a cell")
    p.add_argument("--only", help="loader names or prefixes, comma-separated (see --list)")
    p.add_argument("--list", action="store_true", help="list the loaders and stop")
    p.add_argument(
        "--batches",
        type=int,
        help="batches of 64 an epoch (as many cells at batch 4,096; default: all; --quick: 40)",
    )
    p.add_argument("--rounds", type=int, default=1, help="runs of each cell; the median counts")
    p.add_argument("--compression", default="none", help="none, gzip or both: none,gzip")
    p.add_argument("--cache", help="where the files are written and reused")
    p.add_argument("--no-cold", action="store_true", help="warm page cache only")
    p.add_argument(
        "--memory-limit",
        type=int,
        metavar="MIB",
        help="out of core: every run (cold only) in a memory cgroup of MIB MiB of its own, "
        "private memory and page cache together; make the corpus >= 2.5x that",
    )
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
        elif "disk" in spec:
            print(json.dumps(read_sequentially(spec["disk"])))
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
    limit = None if args.memory_limit is None else args.memory_limit << 20
    if limit is not None:
        caches = ["cold"]  # out of core every epoch is read from the disk
        try:
            with _cgroups.child_cgroup(memory_bytes=limit):
                pass
        except _cgroups.CgroupUnavailable as exc:
            print(
                f"--memory-limit {args.memory_limit}: no memory cgroup can bound the runs here "
                f"({exc}); it needs cgroup v1 and root (a child of this process's own memory "
                "cgroup). Without one the page cache is the machine's: run without "
                "--memory-limit and the figures are files in memory, or use a machine whose "
                "memory is smaller than the files",
                file=sys.stderr,
            )
            return 2
    skipped = {lo.name: f"`{m}` not importable" for lo in loaders if (m := _missing(lo))}
    for name, why in skipped.items():
        print(f"skipped {name}: {why}", file=sys.stderr)
    data: dict[str, Any] = {
        "batch_size": BATCH,
        "big_batch_size": BIG_BATCH,
        "rounds": args.rounds,
        "sets": [],
    }
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
        # the disk's sequential read takes its turn among the cold runs (None: the disk)
        cells: list[tuple[Loader | None, str]] = [(lo, cache) for lo in running for cache in caches]
        ranges = stored_ranges(paths) if "cold" in caches and running else []
        stored = sum(length for _, _, length in ranges)
        bound = None if limit is None or not ranges else bound_line(limit, stored)
        if limit is not None and bound and stored < OUT_OF_CORE * limit:
            print(f"warning: {bound}", file=sys.stderr)
        if ranges:
            cells.append((None, "cold"))
        runs: dict[tuple[str, str], list[dict]] = {}
        for r in range(args.rounds):
            shift = r * len(cells) // max(args.rounds, 1)
            for who, cache in cells[shift:] + cells[:shift]:
                if who is None:
                    runs.setdefault(("", cache), []).append(
                        _run_disk(ranges, paths, limit, 1.0 if quick else 5.0)
                    )
                    continue
                reads, pages = opens.get(who.name, (paths, paths))
                runs.setdefault((who.name, cache), []).append(
                    _run_child(who, reads, sizes, batches, cache, pages, limit)
                )
        pages_per_cell = cell_pages(paths) if ranges and compression == "none" else None
        disk = (
            disk_summary(runs.pop(("", "cold")), sizes.files * sizes.cells, pages_per_cell)
            if ranges
            else None
        )
        results: dict[str, dict[str, dict]] = {}
        for (name, cache), got in runs.items():
            results.setdefault(name, {})[cache] = _summary(got)
        tables.append(table(sizes, writer, results, here, caches, notes, disk, bound))
        data["sets"].append(
            {
                "sizes": asdict(sizes),
                "files": [str(p) for p in paths],
                "writer": writer,
                "results": results,
                "skipped": here,
                "disk": disk,
                "ratios": ratios(
                    results,
                    (disk or {}).get("ceiling_cells_per_s"),
                    (disk or {}).get("random_ceiling_cells_per_s"),
                ),
                "memory_limit_mib": args.memory_limit,
                "stored_bytes": stored if ranges else None,
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
