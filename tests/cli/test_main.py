"""The command line: info, doctor, argument errors (demo and bench in test_demo.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from loaderkit import __version__
from loaderkit.cli import main
from loaderkit.cli.doctor import FAIL, PASS, WARN, run_checks
from tests.conftest import LINUX_314, WINDOWS, fake_platform

VERSIONS = {"python": "3.11.7", "torch": "2.13.0", "h5py": "3.16.0", "HDF5": "2.0.0"}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loaderkit", *args], capture_output=True, text=True, timeout=120
    )


def test_info_prints_every_platform_field_and_the_worker_table(capsys) -> None:
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    from dataclasses import fields

    from loaderkit.machine.platform import PlatformInfo

    for field in fields(PlatformInfo):
        assert field.name in out
    for text in (
        "torch",
        "h5py",
        "HDF5",
        "start method in effect",
        "usable CPUs",
        "recommended num_workers",
        "requested",
        "safe",
        "'auto'",
    ):
        assert text in out
    assert max(len(line) for line in out.splitlines()) <= 100  # was 285 (torch_loader_args)
    assert "1 local rank," in out or "local ranks," in out  # counted in words, no "(s)"


def test_module_and_console_script_entry_points() -> None:
    result = _run("info")
    assert result.returncode == 0 and "recommended num_workers" in result.stdout
    version = _run("--version")
    assert version.stdout.strip() == f"loaderkit {__version__}"


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["frobnicate"], "frobnicate"),
        (["info", "--bogus"], "--bogus"),
        (["demo", "--workers", "many"], "many"),
        (["demo", "--epochs", "0"], "0"),
        (["bench", "--batch-sizes", "x"], "x"),
        ([], "required"),
    ],
)
def test_unknown_commands_and_bad_options_exit_non_zero_and_name_them(args, named, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code != 0
    assert named in capsys.readouterr().err


def test_doctor_exit_code_follows_the_checks(capsys) -> None:
    code = main(["doctor"])
    out = capsys.readouterr().out
    for name in (
        "start method",
        "workers",
        "/dev/shm",
        "open files",
        "CUDA",
        "versions",
        "HDF5 file locking",
    ):
        assert name in out
    statuses = {c.status for c in run_checks(fake_platform())}
    assert code == (0 if statuses == {PASS} else 1)
    assert ("all checks passed" in out) == (code == 0)


def test_doctor_checks_on_fake_platforms() -> None:
    def by_name(**fields):
        return {
            c.name: c for c in run_checks(fake_platform(**fields), versions=VERSIONS, environ={})
        }

    healthy = by_name(
        usable_cpus=8,
        cpu_count=8,
        shm_bytes=8 << 30,
        shm_free_bytes=8 << 30,
        open_files_soft=65536,
        open_files_hard=65536,
        local_world_size=None,
        is_windows=False,
    )
    assert {c.status for c in healthy.values()} == {PASS}

    docker = by_name(shm_bytes=64 << 20, shm_free_bytes=64 << 20)
    assert docker["/dev/shm"].status == WARN and "shm-size" in docker["/dev/shm"].advice

    tight = by_name(
        usable_cpus=64,
        cpu_count=64,
        open_files_soft=128,
        open_files_hard=4096,
        open_fds=10,
        local_world_size=None,
        is_windows=False,
    )
    assert tight["open files"].status == FAIL and "ulimit -n" in tight["open files"].advice

    pinned = by_name(usable_cpus=2, cpu_count=64, is_windows=False)
    assert pinned["workers"].status == WARN and "affinity" in pinned["workers"].advice

    windows = by_name(**WINDOWS)
    assert windows["workers"].status == WARN
    assert windows["/dev/shm"].status == PASS

    bad_fork = by_name(cuda_available=True, cuda_device_count=1, cuda_bad_fork=True)
    assert bad_fork["CUDA"].status == WARN and "forked" in bad_fork["CUDA"].finding
    assert "spawn" in bad_fork["CUDA"].advice
    gpu = by_name(cuda_available=True, cuda_device_count=1, cuda_bad_fork=False)
    assert gpu["CUDA"].status == PASS

    py314 = by_name(**LINUX_314)
    assert "forkserver" in py314["start method"].finding
    assert "pickle" in py314["start method"].advice

    old = {
        c.name: c
        for c in run_checks(
            fake_platform(),
            versions={**VERSIONS, "h5py": "3.9.0"},
            environ={"HDF5_USE_FILE_LOCKING": "FALSE"},
        )
    }
    assert old["versions"].status == WARN
    assert "HDF5_USE_FILE_LOCKING=FALSE" in old["HDF5 file locking"].finding
