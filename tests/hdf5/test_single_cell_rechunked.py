"""benchmarks/single_cell.py's ``lk-csr-rechunked``: ``loaderkit rechunk --key X`` copies of the
gzip files, made next to them once, reused while ``rechunked.json`` says the same files, and read
by the benchmark like any loaderkit row (a separate file from the benchmark's other tests)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import h5py
import numpy as np
import pytest

from loaderkit import HDF5SessionDataset

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def sc() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "single_cell_benchmark_rechunked", BENCHMARKS / "single_cell.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["single_cell_benchmark_rechunked"] = module
    spec.loader.exec_module(module)
    return module


def test_copies_are_made_once_and_again_for_other_files(sc: ModuleType, tmp_path: Path) -> None:
    root = tmp_path / "set"
    paths, _ = sc.write_files(root, sc.Sizes(2, 300, 200, 20, "gzip"))
    copies, made = sc.rechunked_copies(root, paths)
    assert made["cached"] is False and made["layout"] == "CSR values contiguous"
    assert [c.parent for c in copies] == [root / "rechunked"] * 2
    for source, copy in zip(paths, copies, strict=True):
        with h5py.File(source) as f, h5py.File(copy) as g:
            assert f["X/data"].compression == "gzip" and g["X/data"].compression is None
            assert g["X/data"].chunks is None
        with (
            HDF5SessionDataset([source], key="X", sparse="dense") as before,
            HDF5SessionDataset([copy], key="X", sparse="dense") as after,
        ):
            for i in (0, 7, 299):
                np.testing.assert_array_equal(np.asarray(after[i]), np.asarray(before[i]))
    stamp = copies[0].stat().st_mtime_ns
    again, made = sc.rechunked_copies(root, paths)  # the same files: reused
    assert again == copies and made["cached"] is True and copies[0].stat().st_mtime_ns == stamp
    paths, _ = sc.write_files(root, sc.Sizes(2, 300, 200, 30, "gzip"))  # other files
    copies, made = sc.rechunked_copies(root, paths)
    assert made["cached"] is False
    with h5py.File(paths[1]) as f, h5py.File(copies[1]) as g:
        np.testing.assert_array_equal(g["X/data"][...], f["X/data"][...])


def test_the_benchmark_reads_the_copies(sc: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    args = ["--only", "lk-csr,lk-csr-rechunked", "--compression", "gzip", "--no-cold"]
    args += ["--files", "2", "--cells", "300", "--genes", "200", "--nnz", "20"]
    code = sc.main([*args, "--batches", "3", "--cache", str(tmp_path), "--json", str(out)])
    assert code == 0
    (found,) = json.loads(out.read_text())["sets"]
    got = found["results"]["lk-csr-rechunked"]["warm"]
    assert got["runs"][0]["cells"] == 3 * 64 and got["cells_per_s"] > 0
    assert found["ratios"]["lk-csr-rechunked/lk-csr warm"] is not None
    assert (tmp_path / "2x300x200-20-gzip" / "rechunked" / "cells1.h5ad").exists()
