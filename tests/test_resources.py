from __future__ import annotations

import subprocess
import sys

import pytest

from loaderkit import LoaderkitWarning, create_dataloader
from loaderkit.resources import LeakCheck, ResourceLeakError, compare, snapshot
from tests.helpers import SquareDataset


def test_snapshot_sees_files_descriptors_and_children(tmp_path) -> None:
    before = snapshot()
    path = tmp_path / "held.txt"
    path.write_text("x")
    handle = open(path)  # noqa: SIM115 - held open on purpose
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        after = snapshot()
        report = compare(before, after)
        assert report.fd_growth >= 1
        assert str(path) in report.new_open_files
        assert child.pid in {c.pid for c in report.new_children}
        assert report.leaked()
        assert "files still open" in str(report) and "processes still running" in str(report)
        assert "child processes" in after.describe()
    finally:
        handle.close()
        child.kill()
        child.wait()
    assert not compare(before, snapshot()).leaked()


def test_leak_check_warns_about_a_held_file(tmp_path) -> None:
    path = tmp_path / "leak.txt"
    path.write_text("x")
    with pytest.warns(LoaderkitWarning, match="files still open"):
        with LeakCheck(settle_s=0.2):
            handle = open(path)  # noqa: SIM115
    handle.close()


def test_leak_check_raises_about_a_stray_process() -> None:
    with pytest.raises(ResourceLeakError, match="processes still running"):
        with LeakCheck(raise_on_leak=True, settle_s=0.2):
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    child.kill()
    child.wait()


def test_leak_check_tolerances() -> None:
    blob = []
    with LeakCheck(rss_tolerance=1 << 40, settle_s=0) as check:
        blob.append(bytearray(32 << 20))
    assert check.report is not None and check.report.rss_growth > 0
    with pytest.warns(LoaderkitWarning, match="RSS"):
        with LeakCheck(rss_tolerance=1 << 20, settle_s=0):
            blob.append(bytearray(32 << 20))
            blob[-1][::4096] = b"x" * len(blob[-1][::4096])


def test_closed_loaders_leak_nothing() -> None:
    with LeakCheck(raise_on_leak=True) as check:
        for persistent in (False, True):
            for _ in range(3):
                with create_dataloader(
                    SquareDataset(8), batch_size=2, num_workers=2, persistent_workers=persistent
                ) as loader:
                    for _ in range(2):
                        list(loader)
    assert check.report.fd_growth <= 0 and not check.report.new_children


def test_leak_check_does_not_mask_exceptions() -> None:
    with pytest.raises(KeyError), LeakCheck(raise_on_leak=True, settle_s=0):
        raise KeyError("boom")


def test_multiprocessing_helpers_are_not_counted_as_leaks() -> None:
    # forkserver starts a server and a resource tracker that live until this process exits.
    with LeakCheck(raise_on_leak=True) as check:
        with create_dataloader(
            SquareDataset(4), num_workers=1, multiprocessing_context="forkserver"
        ) as loader:
            assert len(list(loader)) == 4
    helpers = [c for c in check.report.after.children if c.helper]
    assert all("python" in c.name or c.name for c in helpers)
    assert not check.report.new_children
