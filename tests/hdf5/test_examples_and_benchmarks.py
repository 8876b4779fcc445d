"""The NSD example and the HDF5 read benchmark run (small) and return correct data."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType

import h5py
import numpy as np
import pytest

from loaderkit import PerformanceHint

ROOT = Path(__file__).resolve().parents[2]


def _load(relative: str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_nsd_example_runs(capsys: pytest.CaptureFixture[str], fork_default: None) -> None:
    # fork: the example is loaded from its path under a name workers cannot import
    nsd = _load("examples/nsd_dataset.py", "nsd_dataset_example")
    args = ["--sessions", "3", "--trials", "20", "--voxels", "300", "--workers", "2"]
    assert nsd.main([*args, "--epochs", "2"]) == 0
    out = capsys.readouterr().out
    assert "checked 60 samples over 2 epochs from 3 sessions" in out
    assert "max_session_bytes 36,000 (fits: all 3 sessions per process" in out


def test_nsd_example_uses_the_real_layout_and_super_read(tmp_path: Path) -> None:
    nsd = _load("examples/nsd_dataset.py", "nsd_dataset_example")
    files, stimulus, raw = nsd.make_fake_nsd(tmp_path, sessions=2, trials=30, voxels=40)
    with h5py.File(files[1]) as f:  # NSD's own: int16 x 300, one chunk per voxel
        assert f["betas"].dtype == np.int16 and f["betas"].chunks == (30, 1)
    assert "super().read(session, row)" in inspect.getsource(nsd.NSDBetas.read)
    with pytest.warns(PerformanceHint, match="30x read amplification"):
        ds = nsd.NSDBetas(files, stimulus=stimulus, trials_per_session=30)
    samples = ds.__getitems__(list(range(len(ds))))  # per item, through super().read()
    assert ds.budgets.held_info().loads == 2  # each session read once, not once per trial
    for i, sample in enumerate(samples):
        session, row = ds.locate(i)
        want = raw[session][row].astype(np.float32) / 300
        np.testing.assert_array_equal(sample["betas"], want)
        assert sample["trial"] == (session - 1) * 30 + row


def test_nsd_dataset_subset_and_errors(tmp_path: Path) -> None:
    nsd = _load("examples/nsd_dataset.py", "nsd_dataset_example")
    files, stimulus, raw = nsd.make_fake_nsd(tmp_path, sessions=2, trials=10, voxels=16)
    with pytest.warns(PerformanceHint):
        ds = nsd.NSDBetas(files, stimulus=stimulus, trials=[19, 3, 4], trials_per_session=10)
    assert [ds.locate(i) for i in range(3)] == [(2, 9), (1, 3), (1, 4)]
    sample = ds[0]
    assert sample["trial"] == 19 and sample["stimulus"] == stimulus[19]
    np.testing.assert_array_equal(sample["betas"], raw[2][9].astype(np.float32) / 300)
    batch = ds.__getitems__([1, 2, 0])
    assert [b["trial"] for b in batch] == [3, 4, 19]
    np.testing.assert_array_equal(batch[1]["betas"], raw[1][4].astype(np.float32) / 300)
    with pytest.raises(FileNotFoundError, match=r"\[3\]"), pytest.warns(PerformanceHint):
        nsd.NSDBetas(files, trials=[25], trials_per_session=10)


@pytest.mark.slow
def test_benchmark_quick_mode_returns_the_same_data(tmp_path: Path) -> None:
    bench = _load("benchmarks/hdf5_read.py", "hdf5_read_benchmark")
    results = bench.run_benchmark(quick=True, repeats=1, root=tmp_path)
    assert [w["workload"] for w in results["workloads"]] == [
        "small-rows",
        "tiny-rows",
        "gzip-chunked",
        "large-rows",
    ]
    for w in results["workloads"]:
        assert set(w["strategies"]) == set(bench.STRATEGIES)
        for name, res in w["strategies"].items():
            # Every value each strategy returned was compared with the in-memory copy.
            assert res["checked"] > 0 and res["mismatches"] == 0, (w["workload"], name)
            assert res["items_per_s"] > 0
            if res["max_open_files"] is not None:
                bound = res["max_open_files"] * res["fds_per_file"]
                assert res["max_open_files_seen"] <= bound
        assert w["strategies"]["unbounded-cache"]["max_open_files_seen"] == w["sessions"]
    table = bench.format_table(results)
    assert "| small-rows | loaderkit-block |" in table and "| target |" in table
    assert list(tmp_path.iterdir()) == []  # generated files removed
