"""The benchmark scripts run in --quick mode and write their JSON (no timing is asserted).

benchmarks/hdf5_read.py has its own data-checking test in tests/hdf5/.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _run(script: str, tmp_path: Path) -> dict:
    out = tmp_path / "result.json"
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "|---" in result.stdout  # a markdown table
    return json.loads(out.read_text())


@pytest.mark.slow
def test_loader_overhead(tmp_path: Path) -> None:
    data = _run("loader_overhead.py", tmp_path)
    assert [row["ratio"] > 0 for row in data["overhead"]] == [True, True]
    assert data["end_to_end"]["naive_items_per_s"] > 0
    assert data["end_to_end"]["loaderkit_items_per_s"] > 0


def test_sample_seeding(tmp_path: Path) -> None:
    data = _run("sample_seeding.py", tmp_path)
    assert set(data["results"]) == {"num_workers=0", "num_workers=1"}


def test_transfer(tmp_path: Path) -> None:
    data = _run("transfer.py", tmp_path)
    assert data  # without CUDA: the CPU pass-through measurements


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU host it runs the whole suite")
def test_gpu_check_script_stops_where_there_is_no_cuda() -> None:
    script = BENCHMARKS.parent / "tools" / "gpu_check.sh"
    result = subprocess.run(
        ["bash", str(script), "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "run this on a CUDA host" in result.stderr
    assert "full test suite" not in result.stdout


def test_resume(tmp_path: Path) -> None:
    data = _run("resume.py", tmp_path)
    for result in data["results"].values():
        scenarios = result["scenarios"]
        assert set(scenarios) == {"fresh start", "resume at 90 %", "replay to 90 %"}
        assert result["skipped"] == int(0.9 * result["batches_per_pass"])
        assert all(s["ms_to_first_batch"] > 0 for s in scenarios.values())
