"""benchmarks/single_cell.py: its pure helpers and files (fast), its quick run (slow; no timing
is asserted, only what the run says about the cells it read)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
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
        "scd-4-1024", "scd-16-1024", "scd-64-64", "scd-16-64-2w", "scd-4-16-b4096",
    ]  # fmt: skip
    assert len(sc.selected(None)) == len(sc.LOADERS)
    with pytest.raises(SystemExit, match="no loader named"):
        sc.selected("lk-csr,zarr")
    assert [lo.name for lo in sc.selected("annbatch")] == ["annbatch"]  # a name: that one only
    assert [lo.name for lo in sc.selected("annb")] == ["annbatch", "annbatch-seq", "annbatch-b4096"]
    assert {lo.name: lo.batch for lo in sc.selected("lk-csr-b,scd-4-16,annbatch-b")} == {
        "lk-csr-b4096": 4096, "scd-4-16-b4096": 4096, "annbatch-b4096": 4096,
    }  # fmt: skip


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


def _run(first: float, steady: float | None = None, private: float | None = 100.0) -> dict:
    """One child's answer as ``child`` gives it (``steady``: a warm run's second epoch)."""
    return {
        "cells_per_s": first,
        "steady": None if steady is None else {"cells_per_s": steady},
        "batch_mix": 44.0,
        "peak_rss_mib": 900.0,
        "setup_s": 1.5,
        "worker_peak_rss_mib": 0.0,
        "private_peak_mib": private,
        "private_start_mib": 80.0 if private else None,
        "tree_rss_peak_mib": 950.0,
        "resident_before": 0.0,
    }


def test_summary_takes_medians_of_both_epochs_and_the_largest_private_peak(
    sc: ModuleType,
) -> None:
    got = sc._summary([_run(10.0, 40.0, 300.0), _run(30.0, 20.0, 100.0), _run(20.0, 30.0, None)])
    assert (got["cells_per_s"], got["steady_cells_per_s"]) == (20.0, 30.0)
    assert got["private_peak_mib"] == 300.0 and got["tree_rss_peak_mib"] == 950.0
    # a cold cell reads one epoch: no steady state to report
    assert sc._summary([_run(10.0), _run(30.0)])["steady_cells_per_s"] is None
    assert sc._summary([_run(10.0), {"error": "boom"}]) == {
        "error": "boom", "runs": [_run(10.0), {"error": "boom"}],
    }  # fmt: skip


def test_annbatch_rows_ratios_and_its_copy_in_the_table(sc: ModuleType) -> None:
    def cell(warm_first: float, warm: float, cold: float, private: float) -> dict:
        return {
            "warm": sc._summary([_run(warm_first, warm, private)]),
            "cold": sc._summary([_run(cold, None, private / 2)]),
        }

    results = {
        "lk-csr": cell(45_000.0, 60_000.0, 30_000.0, 150.0),
        "annbatch": cell(18_000.0, 20_000.0, 40_000.0, 600.0),
        "scd-4-1024": cell(10_000.0, 12_000.0, 10_000.0, 1_000.0),
        "lk-csr-b4096": cell(100_000.0, 160_000.0, 50_000.0, 200.0),
        "annbatch-b4096": cell(30_000.0, 40_000.0, 45_000.0, 700.0),
    }
    disk = sc.disk_summary([{"bytes": 512_000_000, "bytes_per_s": 1.6e9}], 80_000)
    ceiling = disk["ceiling_cells_per_s"]
    assert ceiling == 250_000.0  # 80,000 cells in 512 MB at 1.6 GB/s: 0.32 s
    ratios = sc.ratios(results, ceiling)
    expected = {
        "loaderkit/annbatch warm @64": 3.0,  # the steady states, not the first epochs
        "loaderkit/annbatch warm @4096": 4.0,
        "loaderkit/annbatch cold @64": 0.75,
        "loaderkit/annbatch cold @4096": 50_000 / 45_000,
        "loaderkit/annbatch warm 1st epoch @64": 2.5,
        "loaderkit cold/ceiling": 0.12,
        "annbatch cold/ceiling": 0.16,
        "loaderkit/annbatch private memory": 0.25,  # the larger peak of warm and cold
        "loaderkit/scDataset 4-1024 private memory": 0.15,
        "loaderkit/scDataset 4-1024 warm": 5.0,
        "loaderkit/scDataset 4-1024 cold": 3.0,
    }
    assert {k: ratios[k] for k in expected} == pytest.approx(expected)
    assert ratios["lk-csr-2p/lk-csr warm"] is None  # not run
    sizes = sc.Sizes(files=4, cells=20_000, genes=20_000, nnz=800, compression="none")
    note = "(annbatch 0.3.1, converted in 28 s, lz4: 161 MB)"
    notes = {"annbatch": note, "": "annbatch's copy: /x/annbatch-lz4.zarr"}
    text = sc.table(sizes, "anndata", results, {}, ["warm", "cold"], notes, disk)
    assert "| loader | batch | warm, 2nd epoch | warm, 1st epoch | cold | cold / ceiling | " in text
    row = f"| annbatch defaults + shuffle, on its converted copy {note} | 64 | 20,000 | 18,000 | "
    # no file mix given, no random ceiling (no cold / random)
    assert row + "40,000 | 0.16 | — | 600 | 900 | — | 44.0 | — | 1.50 |" in text
    big = "| loaderkit, CSR batches | 4,096 | 160,000 | 100,000 | 50,000 | 0.20 | — | 200 | "
    assert big in text
    assert "\nannbatch's copy: /x/annbatch-lz4.zarr\n" in text
    start = "\nprivate memory at a child's start (torch imported, no loader built): 80-80 MiB\n"
    assert start in text
    assert "\ndisk: 1.60 GB/s reading the files' `data` + `indices` in order (512 MB " in text
    assert "the epoch's 80,000 cells in 0.32 s, the cold ceiling 250,000 cells/s\n" in text
    assert "- loaderkit/annbatch warm @64: 3.00x (target >= 3)" in text
    assert "- loaderkit/annbatch warm @4096: 4.00x (target >= 4)" in text
    assert "- loaderkit/annbatch cold @64: 0.75x (target >= 1.5)" in text
    assert "- loaderkit cold/ceiling: 0.12x (target >= 0.5)" in text
    assert "- loaderkit/annbatch private memory: 0.25x (target <= 0.5)" in text
    assert "- loaderkit/scDataset 4-1024 private memory: 0.15x (target <= 0.5)" in text
    assert "epochs that did not read" not in text  # no run said how many cells an epoch holds
    whole = {"cells": 80_000, "distinct_cells": 80_000, "epoch_cells": 80_000}
    short = {**whole, "cells": 77_824, "distinct_cells": 77_824}
    results["lk-csr"]["cold"]["runs"][0].update(whole)
    results["lk-csr-b4096"]["warm"]["runs"][0].update({**whole, "steady": short})
    text = sc.table(sizes, "anndata", results, {}, ["warm", "cold"], notes, disk)
    said = "\nepochs that did not read every cell once: lk-csr-b4096 warm, 2nd epoch: 77,824 "
    assert said + "cells (77,824 distinct) of 80,000\n" in text
    failed = {"annbatch-seq": "conversion failed: disk full"}
    text = sc.table(sizes, "anndata", {}, failed, ["warm"], {"annbatch-seq": "(conversion failed)"})
    assert "| annbatch defaults (store order), on its converted copy (conversion failed) | " in text
    assert "disk:" not in text and "cold / ceiling" in text


#: /proc/<pid>/smaps_rollup of a Linux 6.x process (its first line is the range of its mappings)
SMAPS_ROLLUP = """\
55fba1510000-7ffca5c80000 ---p 00000000 00:00 0                          [rollup]
Rss:              286720 kB
Pss:              201344 kB
Pss_Dirty:        150112 kB
Pss_Anon:         148000 kB
Pss_File:          51232 kB
Pss_Shmem:          2112 kB
Shared_Clean:     120000 kB
Shared_Dirty:          0 kB
Private_Clean:     10000 kB
Private_Dirty:    156720 kB
Referenced:       286720 kB
Anonymous:        150000 kB
KSM:                   0 kB
LazyFree:              0 kB
AnonHugePages:     40960 kB
ShmemPmdMapped:        0 kB
FilePmdMapped:         0 kB
Shared_Hugetlb:        0 kB
Private_Hugetlb:       0 kB
Swap:                  0 kB
SwapPss:               0 kB
Locked:                0 kB
"""


def test_smaps_rollup_parsed_and_private_memory_is_anonymous_plus_shmem_pss(
    sc: ModuleType,
) -> None:
    fields = sc.parse_smaps_rollup(SMAPS_ROLLUP)
    assert len(fields) == 22 and fields["Rss"] == 286720 and fields["Pss_File"] == 51232
    assert sc.private_kib(fields) == 148000 + 2112  # the mapped file pages are not counted
    before_5_8 = {k: v for k, v in fields.items() if not k.startswith("Pss_")}
    assert sc.private_kib(before_5_8) == 150000  # Anonymous
    assert sc.private_kib(sc.parse_smaps_rollup("")) is None
    assert sc.parse_smaps_rollup("Name:\tpython\nRss:  12 kB\nVmFlags: rd ex\n") == {"Rss": 12}


def test_tree_memory_counts_a_forked_childs_own_pages_and_shared_ones_once(
    sc: ModuleType,
) -> None:
    """A child forked with 128 MiB written by its parent (shared, copy-on-write) and 64 MiB of
    its own: the tree's private memory grows by the 64 MiB, not by 128 + 64."""
    if not Path(f"/proc/{os.getpid()}/smaps_rollup").exists():
        pytest.skip("no /proc/<pid>/smaps_rollup here")
    mib = 1 << 20
    held = np.ones(128 * mib, np.uint8)  # written: anonymous pages of this process
    alone = sc.TreeMemory(every=3600)
    alone.sample()
    read, write = os.pipe()
    go_read, go_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: pages of its own, then it waits to be told to go
        try:
            own = np.ones(64 * mib, np.uint8)
            os.write(write, b"x")
            os.read(go_read, 1)
            del own
        finally:
            os._exit(0)
    try:
        assert os.read(read, 1) == b"x"
        assert pid in sc.tree_pids(os.getpid())
        both = sc.TreeMemory(every=3600)
        both.sample()
    finally:
        os.write(go_write, b"x")
        os.waitpid(pid, 0)
        for fd in (read, write, go_read, go_write):
            os.close(fd)
    grew = (both.private_peak_kib - alone.private_peak_kib) / 1024
    assert 56 <= grew <= 100, grew  # its own 64 MiB; the shared 128 MiB once
    assert both.rss_peak_mib - alone.rss_peak_mib >= 128 + 56  # RSS counts the shared pages twice
    assert held.sum() == 128 * mib


def test_tree_memory_samples_while_it_runs(sc: ModuleType) -> None:
    if not Path(f"/proc/{os.getpid()}/smaps_rollup").exists():
        pytest.skip("no /proc/<pid>/smaps_rollup here")
    with sc.TreeMemory(every=0.01) as memory:
        before = memory.private_peak_mib
        assert memory.private_first_kib is not None and memory.private_first_kib > 0
        held = np.ones(96 << 20, np.uint8)
        time.sleep(0.1)
        del held  # gone before the last look: only a sample taken while it lived saw it
        time.sleep(0.02)
    assert memory.samples >= 4
    assert memory.private_peak_mib - before >= 90


def test_merge_ranges_and_batches_for(sc: ModuleType) -> None:
    assert sc.merge_ranges([]) == []
    assert sc.merge_ranges([(10, 5), (0, 10), (20, 0), (15, 1), (12, 2)]) == [(0, 16)]
    assert sc.merge_ranges([(0, 10), (11, 1)]) == [(0, 10), (11, 1)]  # a gap of one byte stays
    assert [sc.batches_for(b, 40) for b in (64, 128, 4096)] == [40, 20, 1]
    assert sc.batches_for(4096, 65) == 2 and sc.batches_for(64, 0) == 0


def test_ceiling_is_the_epochs_cells_over_the_time_its_bytes_take(sc: ModuleType) -> None:
    # the figures: 512 MB at 1.8 GB/s is 0.28 s for 80,000 cells
    assert sc.ceiling_cells_per_s(1.8e9, 512_000_000, 80_000) == pytest.approx(281_250)
    assert sc.ceiling_cells_per_s(0.0, 512_000_000, 80_000) is None
    assert sc.disk_summary([{"error": "EIO"}], 10) == {"error": "EIO", "runs": [{"error": "EIO"}]}
    assert sc.disk_line({"error": "EIO"}) == "disk: its sequential read failed: EIO"


def test_stored_ranges_are_the_data_and_indices_bytes_and_are_read_in_order(
    sc: ModuleType, tmp_path: Path
) -> None:
    pytest.importorskip("anndata")
    sizes = sc.Sizes(files=2, cells=300, genes=200, nnz=30, compression="none")
    paths, _ = sc.write_files(tmp_path, sizes)
    ranges = sc.stored_ranges(paths)
    assert {r[0] for r in ranges} == {str(p) for p in paths}
    stored = 0
    for path in paths:
        with h5py.File(path) as f:
            stored += f["X/data"].id.get_storage_size() + f["X/indices"].id.get_storage_size()
            mine = [(o, n) for p, o, n in ranges if p == str(path)]
            assert mine == sc.merge_ranges(mine)  # sorted, merged
            raw = path.read_bytes()
            got = b"".join(raw[o : o + n] for o, n in mine)
            values = f["X/data"][:].tobytes()  # uncompressed: the values lie as they are
            assert values in got and f["X/indices"][:].tobytes() in got
    assert sum(n for _, _, n in ranges) == stored == 2 * 300 * 30 * (4 + 4)
    sc.evict(paths)
    done = sc.read_sequentially(ranges, block=4096)
    assert done["bytes"] == stored and done["bytes_per_s"] > 0


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
    row = "| h5py, sorted batch, one read per cell | 64 | skipped: `no_such_module_here` not "
    assert row in captured.out
    assert "disk:" not in captured.out  # no loader read the files: the disk was not timed


def _script(args: list[str]) -> subprocess.CompletedProcess[str]:
    """benchmarks/single_cell.py run with ``args`` in a fresh interpreter."""
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / "single_cell.py"), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow  # 20 fresh processes that import torch: ~70 s on 2 cores
def test_quick_run_reads_every_cell_once_per_loader(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    loaders = "lk-csr,lk-dense,lk-csr-2p,lk-csr-2t,h5py,lk-csr-b4096"
    args = ["--quick", "--only", loaders, "--files", "3", "--cells", "2000", "--genes", "300"]
    args += ["--nnz", "20", "--batches", "0", "--compression", "none,gzip"]
    args += ["--cache", str(tmp_path), "--json", str(out)]
    result = _script(args)
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
                # one epoch: 6,000 cells, each once, in 94 batches of 64 (the last of 48), or
                # in 2 of 4,096 (the last of 1,904)
                epochs = [run, run["steady"]] if cache == "warm" else [run]
                for epoch in epochs:
                    assert (epoch["cells"], epoch["distinct_cells"]) == (6000, 6000)
                    assert epoch["batches"] == (2 if name == "lk-csr-b4096" else 94)
                    # 6 runs of 1,000 cells: a shuffled batch of 64 draws from nearly all
                    assert 5.0 < epoch["batch_mix"] <= 6.0, (name, cache)
                    # and their files as a full shuffle mixes them (loaderkit.batch_mix)
                    assert 0.8 < epoch["file_mix"] <= 1.0, (name, cache)
                assert (run["steady"] is None) == (cache == "cold")  # a cold run: one epoch
                assert run["cells_per_s"] > 0 and run["peak_rss_mib"] > 0
                # torch alone is more than 20 MiB of private memory; it was sampled
                assert run["private_peak_mib"] >= run["private_start_mib"] > 20
                assert run["memory_samples"] >= 2
                if cache == "warm" and run["resident_before"] is not None:
                    assert run["resident_before"] == 1.0
        disk = files["disk"]
        # the bytes of data + indices as stored: 6,000 cells x 20 values x (4 + 4) bytes
        raw = 6000 * 20 * 8
        if files["sizes"]["compression"] == "none":
            assert disk["bytes"] == raw
        else:
            assert 0 < disk["bytes"] < raw  # gzip: fewer bytes stored
        assert disk["bytes_per_s"] > 0
        assert disk["ceiling_cells_per_s"] == pytest.approx(
            6000 * disk["bytes_per_s"] / disk["bytes"]
        )
        ratios = files["ratios"]
        assert ratios["loaderkit cold/ceiling"] > 0
        assert ratios["lk-csr-2p/lk-csr warm"] > 0 and ratios["lk-csr-2t/lk-csr cold"] > 0
        assert ratios["loaderkit/scDataset 4-1024 warm"] is None  # not run
        workers = files["results"]["lk-csr-2p"]["warm"]["worker_peak_rss_mib"]
        assert workers > 0  # the worker processes' own peak


# ------------------------------------------------------------------ out of core


def _disk_module() -> ModuleType:
    """benchmarks/_disk.py, imported by path (as single_cell.py imports it, beside it)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module("_disk")


def test_the_benchmarks_docstring_examples_pass(sc: ModuleType) -> None:
    import doctest

    for module in (sc, _disk_module()):
        got = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert got.failed == 0 and got.attempted > 0, module.__name__


def test_pages_a_cell_touches_are_those_of_its_extents_laid_end_to_end() -> None:
    # a ragged array's rows lie one after another: count the pages each one really touches
    disk = _disk_module()
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 1600, 20_000) * 4  # 0-6,396 bytes, items of 4 bytes
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]) + 4 * 777  # the array's own offset
    real = np.where(lengths > 0, (starts + lengths - 1) // 4096 - starts // 4096 + 1, 0)
    assert disk.pages_per_extent(lengths, itemsize=4) == pytest.approx(real.mean(), rel=0.02)
    assert disk.pages_per_extent([], itemsize=4) == 0.0
    assert disk.random_ceiling(113_000, 0.0) is None


def test_cell_pages_reads_the_files_extents(sc: ModuleType, tmp_path: Path) -> None:
    pytest.importorskip("anndata")
    sizes = sc.Sizes(files=2, cells=300, genes=2000, nnz=900, compression="none")
    paths, _ = sc.write_files(tmp_path, sizes)
    # 900 values of 4 bytes and 900 column ids of 4 bytes a cell: 2 x (1 + 3,596 / 4,096)
    assert sc.cell_pages(paths) == pytest.approx(2 * (1 + 3596 / 4096))


def test_the_random_ceiling_without_fio_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = _disk_module()
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH with no fio on it
    got = disk.random_iops([tmp_path], seconds=1)
    assert got == {"error": "fio not found: the random ceiling needs it (Debian: apt install fio)"}


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed (apt install fio)")
def test_fio_measures_random_reads_of_the_files(tmp_path: Path) -> None:
    disk = _disk_module()
    path = tmp_path / "data.bin"
    path.write_bytes(os.urandom(8 << 20))
    got = disk.random_iops([path], seconds=0.5)
    assert "error" not in got, got
    assert got["iops"] > 0 and got["bytes_per_s"] == pytest.approx(got["iops"] * 4096, rel=0.05)
    assert (got["block"], got["depth"]) == (4096, 32) and got["tool"].startswith("fio")


def test_a_memory_limit_where_no_cgroup_can_be_made_is_refused_with_why(
    sc: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # what a machine without cgroup v1 and root answers (this one has both)
    @contextlib.contextmanager
    def unavailable(**_: object) -> Iterator[None]:
        raise sc._cgroups.CgroupUnavailable("no cgroup v1 memory hierarchy for this process")
        yield

    monkeypatch.setattr(sc._cgroups, "child_cgroup", unavailable)
    args = ["--only", "lk-csr", "--cells", "20", "--genes", "10", "--nnz", "2", "--files", "1"]
    assert sc.main([*args, "--cache", str(tmp_path), "--memory-limit", "512"]) == 2
    err = capsys.readouterr().err
    assert "--memory-limit 512: no memory cgroup can bound the runs here (no cgroup v1" in err
    assert "run without --memory-limit" in err


@pytest.mark.slow  # 3 fresh processes that import torch, each in a real memory cgroup
def test_a_memory_limited_run_reads_every_cell_inside_its_cgroup(tmp_path: Path) -> None:
    from tests.cgroups import child_cgroup

    with child_cgroup(memory_bytes=512 << 20):
        pass  # skipped here where no child memory cgroup can be made
    out = tmp_path / "result.json"
    loaders = "lk-csr,lk-block-16-fetch-16"
    args = ["--quick", "--only", loaders, "--files", "2", "--cells", "2000", "--genes", "300"]
    args += ["--nnz", "20", "--batches", "0", "--memory-limit", "512"]
    args += ["--cache", str(tmp_path), "--json", str(out)]
    result = _script(args)
    assert result.returncode == 0, result.stderr[-3000:]
    # these files are far smaller than the limit: the run says it does not count as out of core
    assert "(below 2.5x: not out of core enough)" in result.stderr
    assert "out of core: every run in a memory cgroup of 512 MiB of its own" in result.stdout
    assert "memory cgroups: peaks " in result.stdout
    (files,) = json.loads(out.read_text())["sets"]
    assert files["memory_limit_mib"] == 512 and files["stored_bytes"] == 4000 * 20 * 8
    for name in loaders.split(","):
        caches = files["results"][name]
        assert set(caches) == {"cold"}  # out of core, every epoch is a cold one
        (run,) = caches["cold"]["runs"]
        assert (run["cells"], run["distinct_cells"]) == (4000, 4000)
        group = run["cgroup"]
        assert group["limit_mib"] == 512
        # the cgroup held the child: torch's import alone is more than 20 MiB of it
        assert 20 < group["anon_peak_mib"] <= group["peak_mib"] <= 512
    disk = files["disk"]
    assert disk["pages_per_cell"] == pytest.approx(2 * (1 + 76 / 4096))
    if shutil.which("fio"):
        assert disk["random_ceiling_cells_per_s"] > 0
        assert files["ratios"]["lk-csr cold/random ceiling"] > 0
    else:
        assert disk["random_error"].startswith("fio not found")
        assert "random reads not measured: fio not found" in result.stdout
