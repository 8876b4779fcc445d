"""Descriptor budgets per process: each process has its own ``ulimit -n``, never one shared sum."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from loaderkit import ConfigError, DataLoader, HDF5SessionDataset, LoaderkitWarning
from loaderkit.policy.budgets import (
    FDS_MAIN_MARGIN,
    FDS_PER_WORKER,
    check_open_file_budget,
    fit_open_files,
    loader_fds,
)
from tests.conftest import fake_platform
from tests.hdf5.helpers import write_sessions
from tests.helpers import tiered

MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]

# One epoch under a soft limit of 64 descriptors, in a fresh interpreter: prints what it saw.
_EPOCH = textwrap.dedent(
    """
    import json, resource, sys
    import torch
    from loaderkit import DataLoader, HDF5SessionDataset
    from tests.hdf5.helpers import row_value

    root, workers, max_open = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    paths = sorted(__import__("pathlib").Path(root).glob("*.hdf5"))
    ds = HDF5SessionDataset(
        paths, key="betas", max_open_files=None if max_open == "none" else int(max_open)
    )
    loader = DataLoader(ds, batch_size=8, shuffle=True, seed=0, num_workers=workers)
    seen = []
    for batch in loader:
        seen.append(batch)
    values = torch.cat(seen)
    want = torch.stack(
        [torch.from_numpy(row_value(*map(int, ds.locate(i)))) for i in range(len(ds))]
    )
    order = lambda t: t.reshape(len(t), -1)[:, 0].argsort()
    ok = torch.equal(values[order(values)], want[order(want)])
    print(json.dumps({
        "soft": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        "rows": len(values), "expected": len(ds), "correct": ok,
        "max_open_files": ds.max_open_files,
    }))
    loader.close()
    """
)


def _epoch_under_ulimit(root: Path, workers: int, max_open: int | None) -> dict[str, object]:
    command = (
        f"ulimit -n 64 && {sys.executable} -c {_quote(_EPOCH)} {root} {workers} "
        f"{'none' if max_open is None else max_open}"
    )
    done = subprocess.run(
        ["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


# fast: refused (2 workers, default budget) and run (2 workers within 1 file each); 0 workers
# within 1 file runs the same budget check in this process (slow tier)
@pytest.mark.parametrize(
    ("workers", "max_open"), tiered([(2, None), (0, 1), (2, 1)], {(2, None), (2, 1)})
)
def test_forty_sessions_run_under_ulimit_64(tmp_path: Path, workers: int, max_open: int) -> None:
    """The issue's repro: refused before any worker started, although torch runs it."""
    write_sessions(tmp_path, [6] * 40)
    result = _epoch_under_ulimit(tmp_path, workers, max_open)
    assert result["soft"] == 64
    assert result["rows"] == result["expected"] == 240
    assert result["correct"] is True
    assert isinstance(result["max_open_files"], int) and result["max_open_files"] >= 1


def test_the_fit_is_per_process_not_a_sum() -> None:
    fds = loader_fds(8, main_fds=20)
    assert fds.main == 20 + FDS_MAIN_MARGIN + 8 * FDS_PER_WORKER
    # 9 processes x 200 files would be 1800 descriptors summed; each process holds ~360.
    budget = fit_open_files(200, 8, 1024, MIB, None, main_fds=20)
    assert budget.files == 200
    assert "per process, the main process holds 164 other descriptors" in budget.reason
    # Half the limit is full: what is left of the whole limit is used, down to 1.
    tight = fit_open_files(40, 2, 64, MIB, None, main_fds=8)
    assert tight.files == 64 - loader_fds(2, main_fds=8).most
    assert "whole soft limit" in tight.reason
    assert fit_open_files(40, 40, 64, MIB, None, main_fds=8).files == 1


def test_spawned_workers_do_not_inherit_the_main_process_descriptors() -> None:
    fork = loader_fds(4, main_fds=500, start_method="fork")
    spawn = loader_fds(4, main_fds=500, start_method="spawn")
    assert fork.worker > 500 > spawn.worker


def test_what_cannot_run_is_refused_with_advice_that_can_be_followed() -> None:
    explicit = check_open_file_budget(2, 1000, 1024, main_fds=10, hard_limit=1 << 20)
    assert explicit.level == "error"
    assert explicit.needed == 10 + FDS_MAIN_MARGIN + 2 * FDS_PER_WORKER + 1000
    text = explicit.message
    assert "set max_open_files <= " in text and "ulimit -n 4096" in text
    fits = int(text.split("set max_open_files <= ")[1].split()[0])
    assert check_open_file_budget(2, fits, 1024, main_fds=10).level != "error"
    # Fitted to one file and still over: no advice to lower max_open_files below 1.
    fitted = check_open_file_budget(40, 1, 256, main_fds=10, hard_limit=4096, fitted=True)
    assert fitted.level == "error"
    assert "even max_open_files=1" in fitted.message and "max_open_files <=" not in fitted.message
    workers = int(fitted.message.split("num_workers <= ")[1].split(";")[0])
    assert check_open_file_budget(workers, 1, 256, main_fds=10).level != "error"
    # A hard limit below what is needed: the advice says so instead of an impossible ulimit.
    capped = check_open_file_budget(0, 5000, 1024, main_fds=10, hard_limit=1024)
    assert "higher hard limit" in capped.message


def test_a_loader_that_cannot_run_is_refused_at_construction(tmp_path: Path) -> None:
    paths = write_sessions(tmp_path, [4] * 3)
    tiny = fake_platform(open_files_soft=48, open_files_hard=4096, open_fds=10)
    with pytest.raises(ConfigError, match=r"even max_open_files=1.*num_workers <= 1"):
        DataLoader(HDF5SessionDataset(paths, key="betas"), num_workers=2, platform=tiny)
    with pytest.warns(LoaderkitWarning, match="over half the limit"):
        loader = DataLoader(HDF5SessionDataset(paths, key="betas"), num_workers=0, platform=tiny)
    assert loader.dataset.max_open_files == 3
    loader.close()


def test_an_explicit_value_over_the_sessions_counts_the_sessions(tmp_path: Path) -> None:
    """max_open_files=500 over 3 sessions never opens more than 3 files."""
    paths = write_sessions(tmp_path, [4] * 3)
    platform = fake_platform(open_files_soft=256, open_fds=10)
    ds = HDF5SessionDataset(paths, key="betas", max_open_files=500)
    DataLoader(ds, num_workers=2, platform=platform).close()
