"""loaderkit demo and loaderkit bench, run for real on small sizes."""

from __future__ import annotations

import json

import pytest

from loaderkit.cli import demo, main
from loaderkit.order.seeding import DeterminismReport


def test_demo_runs_and_passes_its_checks(tmp_path, capsys) -> None:
    code = main(
        ["demo", "--root", str(tmp_path), "--workers", "2", "--epochs", "2", "--no-progress"]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert sorted(p.name for p in tmp_path.iterdir())[0] == "betas_session01.hdf5"
    for check in ("learning", "files open", "worker processes", "determinism", "cleanup"):
        assert f"[PASS] {check}" in out
    assert "training throughput" in out and "samples/s" in out
    assert "BlockShuffleSampler" in out  # the plan is shown
    assert "demo passed" in out
    assert max(len(line) for line in out.splitlines()) <= 100  # a terminal split in two
    assert "\nterms:\n" in out and "slot pool" in out.split("\nterms:\n")[1]


def test_demo_in_a_temporary_directory_with_progress_bars(capsys) -> None:
    assert main(["demo", "--workers", "0", "--epochs", "1"]) == 0
    captured = capsys.readouterr()
    assert "train epoch 1" in captured.err  # tqdm writes to stderr
    assert "demo passed" in captured.out


def test_demo_exits_non_zero_when_a_check_fails(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(
        demo,
        "check_determinism",
        lambda make, epochs: DeterminismReport(False, epochs, 0, "epoch 0, batch 0"),
    )
    assert (
        main(["demo", "--root", str(tmp_path), "--workers", "0", "--epochs", "1", "--no-progress"])
        == 1
    )
    assert "[FAIL] determinism" in capsys.readouterr().out


def test_bench_on_a_user_dataset(tmp_path, capsys) -> None:
    out_json = tmp_path / "bench.json"
    code = main(
        [
            "bench",
            "--dataset",
            "tests.helpers:SquareDataset",
            "--kwargs",
            '{"n": 48}',
            "--workers",
            "0,1",
            "--batch-sizes",
            "4,8",
            "--batches",
            "3",
            "--json",
            str(out_json),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "recommended: create_dataloader(dataset, batch_size=" in out
    data = json.loads(out_json.read_text())
    assert data["samples"] == 48
    assert len(data["results"]) == 2 * 1 + 2 * 2  # 0 workers: not persistent; 1: both
    assert data["recommended"] in data["results"]
    for result in data["results"]:  # workers' USS: measured with workers only
        if result["num_workers"]:
            assert result["worker_uss_mib"] > 0 and result["worker_uss_growth_mib"] is not None
        else:
            assert result["worker_uss_mib"] is None and result["worker_uss_growth_mib"] is None
    assert "worker USS MiB (growth)" in out


def test_bench_on_generated_files(tmp_path, capsys) -> None:
    assert (
        main(
            [
                "bench",
                "--root",
                str(tmp_path),
                "--workers",
                "0",
                "--batch-sizes",
                "16",
                "--batches",
                "2",
            ]
        )
        == 0
    )
    assert "generated session files" in capsys.readouterr().out
    assert any(tmp_path.glob("betas_session*.hdf5"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dataset", "no_such_module_xyz:Data"], "cannot import"),
        (["--dataset", "tests.helpers"], "MODULE:CLASS"),
        (["--dataset", "tests.helpers:Missing"], "has no 'Missing'"),
        (["--dataset", "tests.helpers:SquareDataset", "--kwargs", "{bad"], "not valid JSON"),
        (["--dataset", "tests.helpers:SquareDataset", "--kwargs", "[1]"], "JSON object"),
        (["--dataset", "tests.helpers:SquareDataset", "--kwargs", '{"zzz": 1}'], "cannot build it"),
    ],
)
def test_bench_errors_name_the_problem(args, message, capsys) -> None:
    assert main(["bench", *args]) == 2
    assert message in capsys.readouterr().err


def test_bench_says_when_the_best_is_within_noise_of_another() -> None:
    from loaderkit.cli.bench import NOISE, BenchReport, _result

    close = BenchReport("d", 10, [_result(0, 6379.0), _result(2, 6383.0), _result(1, 5000.0)])
    assert close.best is not None and close.best.num_workers == 2
    assert [r.num_workers for r in close.within_noise()] == [0]
    note = close.noise_note()
    assert note is not None and "num_workers=0 at 6,379 samples/s vs 6,383" in note
    assert "fewer workers" in note and close.as_dict()["within_noise"][0]["num_workers"] == 0
    apart = BenchReport("d", 10, [_result(0, 1000.0), _result(2, 1000.0 / (1 - NOISE) + 1)])
    assert apart.within_noise() == [] and apart.noise_note() is None
    assert BenchReport("d", 0).noise_note() is None
