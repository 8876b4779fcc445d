"""The benchmark scripts run in --quick mode and write their JSON (no timing is asserted).

Those runs are the slow tier (each test marked); the pure functions of ``benchmarks/compare.py``
(ratios, flags, the table) are tested in the fast tier. benchmarks/hdf5_read.py has its own
data-checking test in tests/hdf5/.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"

# the benchmarks' quick runs: several seconds each (CI runs them on torch 2.13 only), so every
# test that runs a benchmark is marked slow; the pure-function tests below are fast
slow = pytest.mark.slow


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


@slow
def test_loader_overhead(tmp_path: Path) -> None:
    data = _run("loader_overhead.py", tmp_path)
    assert [row["ratio"] > 0 for row in data["overhead"]] == [True, True]
    assert data["end_to_end"]["naive_items_per_s"] > 0
    assert data["end_to_end"]["loaderkit_items_per_s"] > 0


@slow
def test_sample_seeding(tmp_path: Path) -> None:
    data = _run("sample_seeding.py", tmp_path)
    assert set(data["results"]) == {"num_workers=0", "num_workers=1"}


@slow
def test_sparse_feed(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    result = subprocess.run(
        [
            *(sys.executable, str(BENCHMARKS / "sparse_feed.py"), "--quick", "--device", "cpu"),
            *("--workers", "0", "--genes", "500", "--nnz", "40", "--json", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["equal"] and {row["form"] for row in data["rows"]} == {"csr", "dense"}
    assert all(row["cells_per_s"] > 0 for row in data["rows"])


@slow
def test_transfer(tmp_path: Path) -> None:
    data = _run("transfer.py", tmp_path)
    assert data  # without CUDA: the CPU pass-through measurements


@slow
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


@slow
def test_resume(tmp_path: Path) -> None:
    data = _run("resume.py", tmp_path)
    for result in data["results"].values():
        scenarios = result["scenarios"]
        assert set(scenarios) == {"fresh start", "resume at 90 %", "replay to 90 %"}
        assert result["skipped"] == int(0.9 * result["batches_per_pass"])
        assert all(s["ms_to_first_batch"] > 0 for s in scenarios.values())


@slow
def test_feed(tmp_path: Path) -> None:
    data = _run("feed.py", tmp_path)
    prefetched = {"loaderkit default + DevicePrefetcher", "loaderkit block + DevicePrefetcher"}
    loaders = {
        "open-per-item",
        "LRU of 5 handles",
        "never-closed cache",
        "loaderkit default",
        "loaderkit max_open_files=8",
        "loaderkit block",
        "loaderkit default, threads",
        "loaderkit block, threads",
        "loaderkit block, torch's hand-off",
        "loaderkit block + sample_seeding",
        *prefetched,
        "compute only",
    }
    if not prefetched <= set(data["loaders"]):  # only where DevicePrefetcher refuses the device
        assert any("DevicePrefetcher" in note for note in data["notes"])
        loaders -= prefetched
    assert set(data["loaders"]) == loaders
    assert data["workers"] == [0, 2]
    assert data["device"] == "cpu"
    assert data["persistent_workers"] is True
    columns = {
        "workers",
        "loader",
        "max_open_files",
        "samples_per_s",
        "vs_seeds_fix",
        "vs_never_closed",
        "vs_compute_only",
        "most_hdf5_open",
        "peak_rss_mib",
    }
    for workers in data["workers"]:
        rows = {row["loader"]: row for row in data["rows"] if row["workers"] == workers}
        assert set(rows) == loaders
        assert len(rows) == len([row for row in data["rows"] if row["workers"] == workers])
        processes = max(workers, 1)  # with workers, the main process opens no file
        for name, row in rows.items():
            assert columns <= set(row)
            assert row["samples_per_s"] > 0
            assert row["peak_rss_mib"] > 0
            assert isinstance(row["most_hdf5_open"], int)
            assert row["most_hdf5_open"] >= 0
            assert row["most_hdf5_fds"] >= row["most_hdf5_open"]  # >= 1 descriptor per file
            assert row["vs_compute_only"] is None  # no-op CPU consumer: no ceiling
            assert len(row["pass_samples_per_s"]) == data["repeats"] * data["passes"]
            if name == "compute only":
                assert row["vs_seeds_fix"] is None
                assert row["vs_never_closed"] is None
                assert row["max_open_files"] == 0
                assert row["most_hdf5_open"] == 0
            else:
                assert row["vs_seeds_fix"] > 0
                assert row["vs_never_closed"] > 0
                assert row["batches_per_pass"] == data["batches_per_pass"]
        assert rows["open-per-item"]["vs_seeds_fix"] == 1.0
        assert rows["open-per-item"]["max_open_files"] == 1
        assert rows["open-per-item"]["most_hdf5_open"] <= processes
        assert rows["LRU of 5 handles"]["max_open_files"] == 5
        assert rows["LRU of 5 handles"]["most_hdf5_open"] <= 5 * processes
        assert rows["never-closed cache"]["vs_never_closed"] == 1.0
        assert rows["never-closed cache"]["max_open_files"] is None
        assert rows["loaderkit max_open_files=8"]["max_open_files"] == 8
        for name in loaders - {"open-per-item", "LRU of 5 handles", "never-closed cache"}:
            if name != "compute only":
                assert rows[name]["max_open_files"] >= 1


@slow
def test_handoff(tmp_path: Path) -> None:
    data = _run("handoff.py", tmp_path)
    rows = data["results"]
    assert set(rows) == {
        "main process only",
        "torch hand-off",
        "torch hand-off + one more copy",
        "loaderkit slots",
        "loaderkit slots + one more copy",
        "loaderkit slots, loop keeps every batch",
    }
    assert rows["main process only"]["ratio"] == 1.0
    assert all(r["samples_per_s"] > 0 and r["us_per_batch"] > 0 for r in rows.values())
    hdf5 = data["hdf5"]
    assert set(hdf5["results"]) == {
        "main process only",
        "torch path, 1 worker",
        "slots, 1 worker",
        "torch path, 2 workers",
        "slots, 2 workers",
        "torch path, 2 workers, loop keeps every batch",
        "slots, 2 workers, loop keeps every batch",
    }
    kept = hdf5["kept_every_batch"]
    assert kept["changed"] == 0 and kept["pooled"] > 0
    assert kept["pooled"] + kept["fallback"] == kept["batches"]
    assert kept["copied_out"] > 0 and kept["keep_vs_drop"] > 0  # kept batches copied out here


@slow
def test_copy_on_read(tmp_path: Path) -> None:
    data = _run("copy_on_read.py", tmp_path)
    rows = {row["loader"]: row for row in data["rows"]}
    assert set(rows) == {
        "torch DataLoader, list",
        "loaderkit, list",
        "loaderkit, SharedSequence",
        "torch DataLoader, SharedSequence",
        "torch DataLoader, list, gc.freeze()",
        "torch DataLoader, SharedSequence, gc.freeze()",
    }
    for row in rows.values():
        assert row["uss_first_batch_mib"] > 0 and row["uss_epoch_mib"] > 0
        assert row["samples_per_s"] > 0 and row["vs_torch_list"] > 0
        assert len(row["rounds"]) == data["rounds"]
    assert rows["torch DataLoader, list"]["vs_torch_list"] == 1.0
    assert rows["loaderkit, list"]["vs_loaderkit_list"] == 1.0
    # memory, not time: the workers reading the list hold a copy of it, the remedy's do not
    assert (
        rows["loaderkit, SharedSequence"]["uss_epoch_mib"]
        < rows["loaderkit, list"]["uss_epoch_mib"] - 0.5 * data["list_mib"]
    )
    assert data["shared_sequence_mib"] < data["list_mib"]
    assert data["walk_ms"] > 0
    assert data["hint"].startswith(f"dataset.items: list of {data['items']:,} tuples")


@slow
def test_parallel_reads(tmp_path: Path) -> None:
    data = _run("parallel_reads.py", tmp_path)
    assert data["quick"] is True
    rows = {(row["workload"], row["path"]): row for row in data["rows"]}
    workloads = ("contiguous", "gzip-chunked", "chunked", "nsd")
    paths = ("h5py, locked", "loaderkit")
    assert set(rows) == {(w, p) for w in workloads for p in paths} | {("control", "zlib only")}
    assert rows["gzip-chunked", "loaderkit"]["read_path"] == "decoded chunks"
    assert rows["chunked", "loaderkit"]["read_path"] == "raw chunks"
    assert all(row["ratio"] > 0 for row in rows.values())


@slow
def test_nsd_layout(tmp_path: Path) -> None:
    data = _run("nsd_layout.py", tmp_path)
    assert data["quick"] is True
    assert data["layout"]["chunks"] == [750, 1] and data["layout"]["dtype"] == "int16"
    rows = {row["row"]: row for row in data["rows"]}
    assert set(rows) == {
        "each session read whole once",
        "seeds' dataset, 2 workers",
        "loaderkit shuffle=True, 0 workers",
        "loaderkit shuffle=True, 2 workers",
        "loaderkit shuffle=True, max_session_bytes=0, 0 workers",
        "loaderkit shuffle=True, max_session_bytes=0, 2 workers",
        'loaderkit shuffle="block", 0 workers',
        'loaderkit shuffle="block", 2 workers',
        "after rechunk: shuffle=True, 2 workers",
        "after rechunk --layout chunked: shuffle=True, 2 workers",
    }
    trials = data["layout"]["sessions"] * data["layout"]["trials"]
    for name, row in rows.items():
        assert row["samples_per_s"] > 0 and row["vs_bound"] > 0 and row["vs_seeds"] > 0
        if name.startswith(("loaderkit", "after")):  # every sample of the pass checked
            assert row["checked_samples"] == row["timed_samples"] == trials, name
    assert rows["seeds' dataset, 2 workers"]["checked_samples"] == 2 * 64
    assert rows["each session read whole once"]["vs_bound"] == 1.0
    assert rows["loaderkit shuffle=True, 2 workers"]["max_session_bytes"] > 0  # in the plan
    assert rows["loaderkit shuffle=True, max_session_bytes=0, 2 workers"]["max_session_bytes"] == 0
    assert [t["target"].split(" >=")[0] for t in data["targets"]] == [
        "block, 0 workers",
        "shuffle=True, 2 workers",
        "after rechunk, shuffle=True, 2 workers",
    ]
    assert data["rechunk_seconds"] > 0 and "real_size" not in data


@slow
def test_remote(tmp_path: Path) -> None:
    data = _run("remote.py", tmp_path)
    assert data["quick"] is True
    assert data["layout"]["chunks"] == [750, 1] and data["layout"]["dtype"] == "int16"
    assert [t["row"] for t in data["targets"]] == [
        "first epoch, empty cache",
        "second epoch, cache warm",
        "naive: h5py.File(s3fs.open(url))",
        "max_bytes = 1/4 of the data: bytes per epoch",
        "max_bytes = 1/4 of the data: peak directory",
        "2 ranks x 2 workers, one node",
        "construction over 40 sessions, second",
    ]
    sessions, data_bytes = data["layout"]["sessions"], data["layout"]["data_bytes"]
    epochs = data["epochs"]
    assert epochs["same_order_everywhere"] and epochs["values_checked"] > 0
    # the first epoch fetches each session whole once (metadata came at construction), the
    # second fetches nothing
    assert epochs["requests_first"]["get"] == sessions
    assert epochs["requests_first"]["bytes"] == data_bytes
    assert epochs["requests_second"].get("get", 0) == 0
    assert epochs["requests_second"]["bytes"] == 0
    assert data["naive"]["samples_per_s"] > 0 and data["naive"]["ratio"] > 0
    quarter = data["quarter"]
    assert quarter["max_bytes"] == data_bytes // 4
    assert max(quarter["bytes_per_epoch"]) <= 1.05 * data_bytes
    assert quarter["peak_dir_bytes"] <= quarter["peak_bound"]
    ranks = data["ranks"]
    assert ranks["whole_gets_per_object"] == [1] * sessions  # once per node
    assert ranks["whole_object_bytes"] == data_bytes
    first, second = data["construction"]["runs"]
    assert first["requests"].get("get", 0) == 0  # the index from range reads only
    assert first["requests"]["range"] >= data["construction"]["sessions"]
    assert second["requests"].get("range", 0) == second["requests"].get("get", 0) == 0
    assert second["requests"]["list"] == first["requests"]["list"] >= 1  # listing only


@slow
def test_threads(tmp_path: Path) -> None:
    data = _run("threads.py", tmp_path)
    assert set(data["throughput"]) == {"contiguous", "gzip-chunked", "NSD layout"}
    for cells in data["throughput"].values():
        assert set(cells) == {"0 workers", "2 processes (fork)", "1 thread", "2 threads"}
        assert all(c["samples_per_s"] > 0 for c in cells.values())
        assert all(c["later_samples_per_s"] > 0 for c in cells.values())  # workers kept
        assert all(len(c["later_rounds"]) == 2 for c in cells.values())  # side by side
    assert all(s > 0 for s in data["first_batch_s"].values())
    # the later passes of a full run: every configuration in one fresh process, per round
    files = tmp_path / "files"
    write = (
        "import sys, json; sys.path.insert(0, sys.argv[1]); import threads; "
        "print(json.dumps(threads.write(__import__('pathlib').Path(sys.argv[2]), "
        "'contiguous', True)))"
    )
    made = subprocess.run(
        [sys.executable, "-c", write, str(BENCHMARKS), str(files)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    spec = json.dumps({"paths": json.loads(made.stdout), "rounds": 2, "slice_s": 0.0})
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "threads.py"), "--interleaved", spec],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    rounds = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(rounds) == set(data["throughput"]["contiguous"])
    assert all(len(r) == 2 and min(r) > 0 for r in rounds.values())


# ------------------------------------------- benchmarks/compare.py: BASE against HEAD


def _compare() -> ModuleType:
    """benchmarks/compare.py, imported by path (it imports no loaderkit: the children do)."""
    spec = importlib.util.spec_from_file_location("compare_benchmark", BENCHMARKS / "compare.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["compare_benchmark"] = module
    spec.loader.exec_module(module)
    return module


def test_compare_median_and_ratio_skip_missing_rounds() -> None:
    compare = _compare()
    assert compare.median([3.0, None, 1.0, 2.0]) == 2.0
    assert compare.median([None, None]) is None
    assert compare.ratio(50.0, 100.0) == 0.5
    assert compare.ratio(None, 100.0) is None
    assert compare.ratio(50.0, None) is None
    assert compare.ratio(50.0, 0.0) is None
    # per round, only where both sides ran
    assert compare.round_ratios([100.0, None, 100.0], [80.0, 90.0, None]) == [0.8]


def test_compare_flags_only_a_slowdown_that_repeats() -> None:
    compare = _compare()
    assert compare.slower_rounds([0.5, 0.95, 0.89, 0.9]) == 2  # 0.9 itself is not slower
    # slower overall and in 3 of 5 rounds: flagged
    assert compare.is_flagged(0.8, [0.8, 0.8, 0.85, 1.0, 1.0])
    # slower overall but in 2 of 5 rounds only (one bad stretch of the machine): not flagged
    assert not compare.is_flagged(0.85, [0.5, 0.5, 1.0, 1.0, 0.95])
    # half the rounds is not a majority
    assert not compare.is_flagged(0.8, [0.8, 0.8, 1.0, 1.0])
    # a majority of slow rounds but the medians within the threshold: not flagged
    assert not compare.is_flagged(0.92, [0.85, 0.88, 0.89, 1.2, 1.3])
    assert not compare.is_flagged(None, [0.5, 0.5, 0.5])  # a side missing
    assert not compare.is_flagged(0.5, [])  # no round with both sides
    assert compare.is_flagged(0.8, [0.8], threshold=0.9)  # one round: it is the majority
    assert not compare.is_flagged(0.8, [0.8, 0.8], threshold=0.75)  # the threshold is used


def test_compare_abba_order_alternates_the_first_side() -> None:
    compare = _compare()
    orders = [compare.side_order(i) for i in range(4)]
    assert orders == [("base", "head"), ("head", "base")] * 2


def test_compare_summary_and_table_show_na_sides_with_their_reason() -> None:
    compare = _compare()
    side = compare.SideResult
    rows = [
        compare.summarize(
            "tiny-rows-block",
            side([100.0, 100.0, 100.0]),
            side([80.0, 85.0, 120.0]),
        ),
        compare.summarize("handoff", side([100.0, 110.0, 90.0]), side([95.0, 105.0, 100.0])),
        compare.summarize(
            "threads-epoch",
            side([None, None, None], reason="TypeError: unexpected keyword 'worker_method'"),
            side([200.0, 210.0, 190.0]),
        ),
        compare.summarize(
            "startup-first-batch", side([20.0, 21.0], "starts/s"), side([10.0, 11.0], "starts/s")
        ),
    ]
    tiny, handoff, threads, startup = rows
    assert tiny.base == 100.0 and tiny.head == 85.0 and tiny.ratio == pytest.approx(0.85)
    assert tiny.round_ratios == pytest.approx([0.8, 0.85, 1.2])
    assert tiny.slower == 2 and tiny.flagged
    assert handoff.ratio == 1.0 and not handoff.flagged
    assert threads.base is None and threads.ratio is None and not threads.flagged
    assert threads.base_reason == "TypeError: unexpected keyword 'worker_method'"
    assert threads.head_reason is None and threads.head == 200.0
    assert startup.flagged and startup.unit == "starts/s"

    table = compare.render_table(rows, "f1c9b8f", "worktree")
    lines = table.splitlines()
    assert lines[0] == ("| case | BASE f1c9b8f | HEAD worktree | HEAD/BASE | rounds < 0.9 | flag |")
    assert lines[1].startswith("|---|")
    assert "| tiny-rows-block | 100 | 85 | 0.85 | 2/3 | **SLOWER** |" in lines
    assert "| handoff | 100 | 100 | 1.00 | 0/3 |  |" in lines
    assert "| threads-epoch | n/a | 200 |  |  | n/a (BASE) |" in lines
    assert "| startup-first-batch | 20.5 | 10.5 | 0.51 | 2/2 | **SLOWER** |" in lines
    assert any("startup-first-batch: starts/s" in line for line in lines)
    assert "- threads-epoch: n/a on BASE: TypeError: unexpected keyword 'worker_method'" in lines

    last = compare.summary_line(rows)
    assert last == (
        "flagged: 2 of 3 cases slower than 0.9x in a majority of rounds: "
        "tiny-rows-block, startup-first-batch; 1 n/a"
    )
    assert compare.summary_line(rows[1:2]).startswith("flagged: none (1 cases compared")


def test_compare_rates_are_formatted_for_the_table() -> None:
    compare = _compare()
    assert compare.format_rate(None) == "n/a"
    assert compare.format_rate(1234567.8) == "1,234,568"
    assert compare.format_rate(23.456) == "23.5"
    assert compare.format_rate(0.5) == "0.5"


@slow
def test_compare_last_commit_against_the_working_tree(tmp_path: Path) -> None:
    # two cases, one round: a few child processes (~20 s); timing is not asserted
    out = tmp_path / "compare.json"
    only = ["--only", "tiny-rows-block", "--only", "tiny-rows-random"]
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / "compare.py"), "HEAD", "--quick", "--rounds", "1",
         *only, "--json", str(out)],
        capture_output=True, text=True, timeout=300, cwd=BENCHMARKS.parent,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "|---" in result.stdout and result.stdout.strip().splitlines()[-1].startswith("flagged")
    data = json.loads(out.read_text())
    assert data["rounds"] == 1 and data["quick"] is True
    assert data["base"]["revision"] == "HEAD" and len(data["base"]["sha"]) == 40
    assert data["head"]["revision"] is None and data["head"]["label"].startswith("worktree")
    assert set(data["cases"]) == {"tiny-rows-block", "tiny-rows-random"}
    for case in data["cases"].values():
        assert case["base"] > 0 and case["head"] > 0
        assert case["ratio"] > 0 and len(case["round_ratios"]) == 1
        # each side's own copy: HEAD exported, the working tree's src/ copied
        assert "/base/src/loaderkit/" in case["base_runs"][0]["loaderkit"]
        assert "/head/src/loaderkit/" in case["head_runs"][0]["loaderkit"]


@slow
def test_job_limits(tmp_path: Path) -> None:
    data = _run("job_limits.py", tmp_path)
    if "unavailable" in data:
        pytest.skip(data["unavailable"])
    job = [row for row in data["rows"] if row["view"] == "seen as the job"]
    assert len(job) == 4 and all(row["exit"] == 0 for row in job), job
    assert all(row["peak_anon_mib"] < data["limit_mib"] for row in job)
    assert all(row["samples"] == 6 * 750 for row in job)
    alone = [r for r in data["rows"] if r["view"] == "seen as the machine" and r["workers"] == 0]
    assert all(row["exit"] in (137, -9) for row in alone), alone  # every session held: killed
