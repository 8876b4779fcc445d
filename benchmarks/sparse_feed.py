"""Single-cell batches into a training loop: sparse CSR batches expanded on the device vs dense.

Run ``python benchmarks/sparse_feed.py --device cuda`` on a GPU host (``--quick`` keeps it under
a minute; ``--json PATH`` saves the numbers; on a machine without CUDA ``--device cpu`` measures
the loader and the expansion on the CPU). It writes AnnData-layout ``.h5ad`` files with plain
h5py (``X`` a ``csr_matrix`` group with ``data``/``indices``/``indptr`` chunked as anndata 0.12
chunks them, ``var/_index``; no anndata needed), then, on the same files and the same shuffled
order (``seed=0``), one epoch per configuration:

- ``sparse -> device``: ``HDF5SessionDataset(files, key="X")`` (the default ``sparse="csr"``): a
  batch is one ``torch.sparse_csr_tensor`` moved with ``to_device`` and expanded with
  ``.to_dense()`` on the device (an 800-nonzero row crosses as ~6.4 KB instead of 80 KB);
- ``dense -> device``: ``sparse="dense"``: rows filled into a dense batch on the CPU, moved.

Each batch is consumed by a reduction on the device, synchronised, so every row is really
there. Reported: cells/s, MB moved per batch, the ratio sparse/dense, at each worker count,
and a check that the first batch of both forms is identical once on the device. Speed is a
ratio measured side by side in one run; nothing is asserted but equality.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch

try:
    import _cli
except ImportError:  # run from elsewhere
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _cli

from loaderkit import HDF5SessionDataset, create_dataloader, to_device

__all__ = ["main", "measure", "write_h5ad"]

#: anndata 0.12 chunks a sparse matrix's data/indices this many elements at a time.
ANNDATA_CHUNK = 15_625


def write_h5ad(path: Path, cells: int, genes: int, nnz: int, seed: int) -> Path:
    """One ``.h5ad`` file in anndata's current CSR encoding, ``nnz`` nonzeros a cell."""
    rng = np.random.default_rng(seed)
    indices = np.sort(
        np.argsort(rng.random((cells, genes), dtype=np.float32), axis=1)[:, :nnz], axis=1
    ).astype(np.int32)
    data = rng.integers(1, 50, (cells, nnz)).astype(np.float32)
    indptr = np.arange(cells + 1, dtype=np.int64) * nnz
    with h5py.File(path, "w") as f:
        x = f.create_group("X")
        x.attrs["encoding-type"] = "csr_matrix"
        x.attrs["encoding-version"] = "0.1.0"
        x.attrs["shape"] = np.array([cells, genes])
        chunk = (min(ANNDATA_CHUNK, cells * nnz),)
        x.create_dataset("data", data=data.reshape(-1), chunks=chunk)
        x.create_dataset("indices", data=indices.reshape(-1), chunks=chunk)
        x.create_dataset("indptr", data=indptr)
        var = f.create_group("var")
        var.attrs["encoding-type"] = "dataframe"
        var.attrs["encoding-version"] = "0.2.0"
        var.attrs["_index"] = "_index"
        var.attrs["column-order"] = np.array([], dtype="S1")
        names = np.array([f"gene{i}" for i in range(genes)], dtype=object)
        var.create_dataset("_index", data=names, dtype=h5py.string_dtype())
    return path


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(
    paths: list[Path], form: str, workers: int, device: torch.device, batch_size: int
) -> dict[str, Any]:
    """One epoch of ``form`` batches to ``device``: cells/s and bytes moved per batch."""
    ds = HDF5SessionDataset(paths, key="X", sparse=form)
    loader = create_dataloader(ds, batch_size=batch_size, shuffle=True, seed=0, num_workers=workers)
    cells, moved, batches = 0, 0, 0
    total = torch.zeros((), device=device)
    try:
        start = time.perf_counter()
        for batch in loader:
            if form == "csr":
                moved += sum(
                    t.numel() * t.element_size()
                    for t in (batch.crow_indices(), batch.col_indices(), batch.values())
                )
            else:
                moved += batch.numel() * batch.element_size()
            on_device = to_device(batch, device)
            dense = on_device.to_dense() if form == "csr" else on_device
            total += dense.sum()
            cells += dense.shape[0]
            batches += 1
        _sync(device)
        seconds = time.perf_counter() - start
    finally:
        loader.close()
    return {
        "form": form,
        "workers": workers,
        "cells_per_s": cells / seconds,
        "mb_per_batch": moved / max(batches, 1) / 1e6,
        "checksum": float(total.item()),
    }


def _first_batches_equal(paths: list[Path], device: torch.device, batch_size: int) -> bool:
    """The first shuffled batch of both forms, on the device, element for element."""
    got = {}
    for form in ("csr", "dense"):
        ds = HDF5SessionDataset(paths, key="X", sparse=form)
        with create_dataloader(ds, batch_size=batch_size, shuffle=True, seed=0) as loader:
            batch = to_device(next(iter(loader)), device)
        got[form] = batch.to_dense() if form == "csr" else batch
    return bool(torch.equal(got["csr"], got["dense"]))


def main(argv: list[str] | None = None) -> int:
    """Write the files, measure every configuration, print the table."""
    args_parser = _cli.parser(__doc__ or "", "fewer cells, one pass per configuration")
    args_parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args_parser.add_argument("--workers", default="0,4", help="worker counts, comma-separated")
    args_parser.add_argument("--genes", type=int, default=20_000)
    args_parser.add_argument("--nnz", type=int, default=800)
    args_parser.add_argument("--batch-size", type=int, default=256)
    args = args_parser.parse_args(argv)
    device = torch.device(args.device)
    files, cells = (4, 5_000) if args.quick else (4, 20_000)
    workers = [int(w) for w in args.workers.split(",")]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as root:
        paths = [
            write_h5ad(Path(root) / f"cells{i}.h5ad", cells, args.genes, args.nnz, seed=i)
            for i in range(files)
        ]
        equal = _first_batches_equal(paths, device, args.batch_size)
        for count in workers:
            measured = {}
            for form in ("csr", "dense"):
                runs = [measure(paths, form, count, device, args.batch_size) for _ in range(2)]
                best = max(runs, key=lambda r: r["cells_per_s"])
                measured[form] = best
                rows.append(best)
            measured["csr"]["ratio_to_dense"] = (
                measured["csr"]["cells_per_s"] / measured["dense"]["cells_per_s"]
            )
            assert measured["csr"]["checksum"] == measured["dense"]["checksum"]
    lines = [
        f"device {device}, {files} files x {cells} cells x {args.genes} genes, {args.nnz} "
        f"nonzeros a cell, batch {args.batch_size}; first batches equal on the device: {equal}",
        "",
        "| workers | batch | cells/s | MB moved a batch | sparse/dense |",
        "|---:|---|---:|---:|---:|",
    ]
    for row in rows:
        ratio = row.get("ratio_to_dense")
        what = "sparse -> device" if row["form"] == "csr" else "dense -> device"
        lines.append(
            f"| {row['workers']} | {what} | {row['cells_per_s']:,.0f} | "
            f"{row['mb_per_batch']:.2f} | {'' if ratio is None else f'{ratio:.2f}x'} |"
        )
    data = {
        "device": str(device),
        "cells": cells,
        "files": files,
        "genes": args.genes,
        "nnz": args.nnz,
        "equal": equal,
        "median_ratio": statistics.median(
            r["ratio_to_dense"] for r in rows if "ratio_to_dense" in r
        ),
        "rows": rows,
    }
    _cli.emit(data, "\n".join(lines), args.json)
    return 0 if equal else 1


if __name__ == "__main__":
    raise SystemExit(main())
