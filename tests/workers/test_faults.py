"""Faults with real workers over real HDF5 files: errors arrive, nothing hangs, nothing leaks."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from loaderkit import HDF5SessionDataset, create_dataloader
from loaderkit.memory.resources import snapshot
from tests.helpers import (
    FailingSessions,
    child_pids,
    tiered,
    wait_children_gone,
    wait_workers_gone,
    workers_of,
    write_h5_sessions,
)


def _mentions_dead_worker(error: BaseException, pid: int, signal_name: str) -> bool:
    """loaderkit's error for a dead worker: a RuntimeError naming its pid and signal."""
    text = str(error)
    return (
        isinstance(error, RuntimeError)
        and f"DataLoader worker (pid(s) {pid})" in text
        and f"killed by signal {signal_name}" in text
    )


def _session_files_open(root) -> list[str]:
    return [p for p in snapshot(children=False).open_files if p.startswith(str(root))]


# a spawned worker's exception crosses the same queue as a forked one's; spawn in the slow tier
@pytest.mark.parametrize(
    ("method", "context"),
    tiered(
        [("thread", None), ("process", "fork"), ("process", "spawn")],
        {("thread", None), ("process", "fork")},
    ),
)
def test_worker_exception_keeps_type_and_names_session_path_and_index(
    tmp_path, method, context
) -> None:
    paths = write_h5_sessions(tmp_path)
    dataset = FailingSessions(paths, key="betas", bad_row=7)
    bad_index = 7  # row 7 of every session fails; in order, session 0's comes first
    before = workers_of(method)
    loader = create_dataloader(
        dataset,
        batch_size=4,
        num_workers=2,
        worker_method=method,
        multiprocessing_context=context,
        persistent_workers=True,
    )
    with pytest.raises(ValueError, match="corrupt trial 7") as info:
        for _ in loader:
            pass
    text = str(info.value) + "\n".join(getattr(info.value, "__notes__", []))
    if method == "thread":  # the dataset's own exception object, with a note
        assert "worker thread" in text
    else:  # torch's wrapper, original type kept
        assert "DataLoader worker process" in text
    assert f"dataset index {bad_index}" in text
    assert "session 0" in text and paths[0] in text
    loader.close()
    assert wait_workers_gone(method, before) == set()
    assert _session_files_open(tmp_path) == []


def test_exception_in_the_main_process_has_the_same_note(tmp_path) -> None:
    paths = write_h5_sessions(tmp_path)
    dataset = FailingSessions(paths, key="betas", bad_row=3)
    with pytest.raises(ValueError, match="corrupt trial 3") as info:
        list(create_dataloader(dataset, batch_size=5))
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "dataset index 3" in notes and paths[0] in notes


def test_sigkill_of_a_worker_is_an_error_not_a_hang(tmp_path) -> None:
    paths = write_h5_sessions(tmp_path, rows=400)
    dataset = HDF5SessionDataset(paths, key="betas", max_open_files=2)
    before = child_pids()
    loader = create_dataloader(dataset, batch_size=2, num_workers=2, persistent_workers=True)
    iterator = iter(loader)
    next(iterator)
    victim = sorted(child_pids() - before)[0]
    start = time.monotonic()
    # torch notices a dead worker through its SIGCHLD handler, its liveness check, or a queue
    # read that fails half-way (ConnectionResetError, or the resource sharer's EOFError, with no
    # pid): loaderkit turns each into one RuntimeError naming the pid and the signal.
    with pytest.raises(RuntimeError) as info:
        os.kill(victim, signal.SIGKILL)
        for _ in iterator:
            pass
    assert time.monotonic() - start < 30
    assert _mentions_dead_worker(info.value, victim, "SIGKILL"), str(info.value)
    loader.close()  # must not raise although a worker is already dead
    assert wait_children_gone(before) == set()
    assert _session_files_open(tmp_path) == []


def test_hanging_read_is_cut_by_timeout(tmp_path) -> None:
    paths = write_h5_sessions(tmp_path)
    dataset = FailingSessions(paths, key="betas", hang_row=2)
    before = child_pids()
    loader = create_dataloader(dataset, batch_size=2, num_workers=2, timeout=2)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="timed out after 2 seconds"):
        for _ in loader:
            pass
    assert time.monotonic() - start < 20
    loader.close()  # the hung worker is stopped, not waited for forever
    assert wait_children_gone(before, timeout=20) == set()
    assert _session_files_open(tmp_path) == []


def test_close_after_an_error_releases_main_process_handles(tmp_path) -> None:
    paths = write_h5_sessions(tmp_path)
    dataset = FailingSessions(paths, key="betas", bad_row=30)
    loader = create_dataloader(dataset, batch_size=8, num_workers=0)
    with pytest.raises(ValueError):
        list(loader)
    loader.close()  # calls dataset.close(): the main process's handles go too
    assert _session_files_open(tmp_path) == []
    assert torch.equal(torch.as_tensor(dataset[41]), torch.full((16,), 1001.0))
    dataset.close()
