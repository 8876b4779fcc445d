"""benchmarks/single_cell.py: its pure helpers and files (fast), its quick run (slow; no timing
is asserted, only what the run says about the cells it read)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import h5py
import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def sc() -> ModuleType:
    """benchmarks/single_cell.py, imported by path (it imports loaderkit only in its children)."""
    spec = importlib.util.spec_from_file_location(
        "single_cell_benchmark", BENCHMARKS / "single_cell.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["single_cell_benchmark"] = module
    spec.loader.exec_module(module)
    return module


def test_batch_mix_counts_distinct_runs_per_batch(sc: ModuleType) -> None:
    # 3,000 cells a file, runs of 1,000: file 1's cell 2,999 is run (1, 2), its cell 0 run (1, 0)
    batches = [np.array([0, 999, 1000, 2999]), np.array([3000, 5999, 5998]), np.array([], int)]
    assert sc.batch_mix(batches, 3000) == (3 + 2) / 2  # empty batches count for nothing
    assert sc.batch_mix([np.arange(64)], 3000) == 1.0
    assert sc.batch_mix([np.arange(0, 6000, 1000)], 3000) == 6.0
    assert sc.batch_mix([np.array([0, 10])], 3000, run=10) == 2.0
    assert sc.batch_mix([], 3000) == 0.0


def test_cell_ids_round_the_stored_numbers(sc: ModuleType) -> None:
    assert sc.cell_ids(np.array([1.0, 80000.0], np.float32)).tolist() == [0, 79999]


def test_only_picks_by_name_then_by_prefix(sc: ModuleType) -> None:
    assert [lo.name for lo in sc.selected("h5py,lk-csr")] == ["lk-csr", "h5py"]
    assert [lo.name for lo in sc.selected("scd")] == [
        "scd-4-1024", "scd-16-1024", "scd-64-64", "scd-16-64-2w",
    ]  # fmt: skip
    assert len(sc.selected(None)) == len(sc.LOADERS)
    with pytest.raises(SystemExit, match="no loader named"):
        sc.selected("lk-csr,zarr")
    assert [lo.name for lo in sc.selected("annbatch")] == ["annbatch"]  # a name: that one only
    assert [lo.name for lo in sc.selected("annb")] == ["annbatch", "annbatch-seq"]


def test_tree_files_are_a_stores_regular_files_sorted(sc: ModuleType, tmp_path: Path) -> None:
    store = tmp_path / "copy.zarr"
    for name in ("zarr.json", "dataset_0/X/data/c/0", "dataset_0/X/zarr.json", "dataset_1/obs/a"):
        (store / name).parent.mkdir(parents=True, exist_ok=True)
        (store / name).write_bytes(b"x")
    (store / "empty_group").mkdir()
    assert [p.relative_to(store).as_posix() for p in sc.tree_files(store)] == [
        "dataset_0/X/data/c/0", "dataset_0/X/zarr.json", "dataset_1/obs/a", "zarr.json",
    ]  # fmt: skip
    assert sc.tree_files(tmp_path / "not_there") == []


def test_conversion_note_says_version_time_compressor_and_size(sc: ModuleType) -> None:
    made = {"annbatch": "0.3.1", "seconds": 1234.4, "compressor": "zstd", "bytes": 2_500_000_000}
    assert sc.conversion_note(made) == "(annbatch 0.3.1, converted in 1,234 s, zstd: 2,500 MB)"
    assert sc.conversion_note({"error": "no space"}) == "(conversion failed: no space)"


def test_annbatch_rows_ratios_and_its_copy_in_the_table(sc: ModuleType) -> None:
    def summary(rate: float) -> dict:
        run = {"cells_per_s": rate, "batch_mix": 44.0, "peak_rss_mib": 900.0, "setup_s": 1.5}
        return sc._summary([{**run, "worker_peak_rss_mib": 0.0, "resident_before": 0.0}])

    results = {
        "lk-csr": {"warm": summary(60_000.0), "cold": summary(30_000.0)},
        "annbatch": {"warm": summary(20_000.0), "cold": summary(40_000.0)},
    }
    ratios = sc.ratios(results)
    assert ratios["loaderkit/annbatch warm"] == 3.0 and ratios["loaderkit/annbatch cold"] == 0.75
    sizes = sc.Sizes(files=4, cells=20_000, genes=20_000, nnz=800, compression="none")
    note = "(annbatch 0.3.1, converted in 28 s, lz4: 161 MB)"
    notes = {"annbatch": note, "": "annbatch's copy: /x/annbatch-lz4.zarr"}
    text = sc.table(sizes, "anndata", results, {}, ["warm", "cold"], notes)
    row = f"| annbatch defaults + shuffle, on its converted copy {note} | 20,000 | 40,000 | 44.0 |"
    assert row in text
    assert "\nannbatch's copy: /x/annbatch-lz4.zarr\n" in text
    assert "- loaderkit/annbatch warm: 3.00x (target > 1)" in text
    assert "- loaderkit/annbatch cold: 0.75x (target > 1)" in text
    failed = {"annbatch-seq": "conversion failed: disk full"}
    text = sc.table(sizes, "anndata", {}, failed, ["warm"], {"annbatch-seq": "(conversion failed)"})
    assert "| annbatch defaults (store order), on its converted copy (conversion failed) | " in text


def test_first_column_reads_annbatchs_dict_batches(sc: ModuleType) -> None:
    torch = pytest.importorskip("torch")
    x = torch.sparse_csr_tensor(  # two cells, numbers 7 and 3, column 0 stored first
        torch.tensor([0, 2, 3]),
        torch.tensor([0, 5, 0]),
        torch.tensor([8.0, 1.0, 4.0]),
        (2, 9),
        check_invariants=True,
    )
    batch = {"X": x, "obs": None, "var": None, "index": None}
    assert sc.cell_ids(sc._first_column(batch)).tolist() == [7, 3]


@pytest.mark.parametrize("writer", ["anndata", "h5py"])
def test_files_are_anndatas_csr_and_number_their_cells(
    sc: ModuleType, tmp_path: Path, writer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    anndata = pytest.importorskip("anndata")
    sizes = sc.Sizes(files=2, cells=50, genes=40, nnz=7, compression="gzip")
    if writer == "h5py":  # what a machine without anndata writes: read back by anndata
        monkeypatch.setitem(sys.modules, "anndata", None)
    paths, how = sc.write_files(tmp_path, sizes)
    monkeypatch.undo()
    assert how.startswith(writer)
    assert sc.write_files(tmp_path, sizes) == (paths, f"cached: {how}")
    for file, path in enumerate(paths):
        adata = anndata.read_h5ad(path)
        x = adata.X
        assert x.format == "csr" and x.shape == (50, 40) and x.dtype == np.float32
        assert x.indices.dtype == np.int32 and np.all(np.diff(x.indptr) == 7)
        assert all(
            np.all(np.diff(x.indices[a:b]) > 0)
            for a, b in zip(x.indptr[:-1], x.indptr[1:], strict=True)
        )
        assert np.array_equal(sc.cell_ids(x[:, 0].toarray().ravel()), file * 50 + np.arange(50))
        assert list(adata.var_names[:2]) == ["gene0", "gene1"]
        with h5py.File(path) as f:
            assert f["X/data"].compression == "gzip"
    other = sc.Sizes(files=2, cells=50, genes=40, nnz=8, compression="gzip")
    assert not sc.write_files(tmp_path, other)[1].startswith("cached")  # sizes changed: rewritten


def test_resident_fraction_sees_a_warmed_and_an_evicted_file(
    sc: ModuleType, tmp_path: Path
) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(np.random.default_rng(0).bytes(1 << 20))
    sc.warm([path])
    assert sc.resident_fraction([path]) == 1.0
    sc.evict([path])
    if sc.resident_fraction([path]) == 1.0:
        pytest.skip("this filesystem keeps the pages (tmpfs): posix_fadvise evicts nothing")
    assert sc.resident_fraction([path]) < 0.5


def test_a_peer_that_is_not_importable_is_a_line_not_an_error(
    sc: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(sc.NEEDS, "h5py", ("no_such_module_here",))
    args = ["--only", "h5py", "--cells", "20", "--genes", "10", "--nnz", "2", "--files", "1"]
    assert sc.main([*args, "--cache", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "skipped h5py: `no_such_module_here` not importable" in captured.err
    row = "| h5py, sorted batch, one read per cell | skipped: `no_such_module_here` not importable"
    assert row in captured.out


@pytest.mark.slow  # 20 fresh processes that import torch: ~70 s on 2 cores
def test_quick_run_reads_every_cell_once_per_loader(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    loaders = "lk-csr,lk-dense,lk-csr-2p,lk-csr-2t,h5py"
    args = ["--quick", "--only", loaders, "--files", "3", "--cells", "2000", "--genes", "300"]
    args += ["--nnz", "20", "--batches", "0", "--compression", "none,gzip"]
    args += ["--cache", str(tmp_path), "--json", str(out)]
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / "single_cell.py"), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("\n|---|") == 2  # a table a file set
    data = json.loads(out.read_text())
    assert [s["sizes"]["compression"] for s in data["sets"]] == ["none", "gzip"]
    for files in data["sets"]:
        assert set(files["results"]) == set(loaders.split(","))
        for name, caches in files["results"].items():
            assert set(caches) == {"warm", "cold"}
            for cache, summary in caches.items():
                (run,) = summary["runs"]
                # one epoch: 6,000 cells, each once, in 94 batches of 64 and one of 48
                assert (run["cells"], run["distinct_cells"], run["batches"]) == (6000, 6000, 94)
                # 6 runs of 1,000 cells: a shuffled batch of 64 draws from nearly all
                assert 5.0 < run["batch_mix"] <= 6.0, (name, cache)
                assert run["cells_per_s"] > 0 and run["peak_rss_mib"] > 0
                if cache == "warm" and run["resident_before"] is not None:
                    assert run["resident_before"] == 1.0
        ratios = files["ratios"]
        assert ratios["lk-csr-2p/lk-csr warm"] > 0 and ratios["lk-csr-2t/lk-csr cold"] > 0
        assert ratios["loaderkit/scDataset 4-1024 warm"] is None  # not run
        workers = files["results"]["lk-csr-2p"]["warm"]["worker_peak_rss_mib"]
        assert workers > 0  # the worker processes' own peak
