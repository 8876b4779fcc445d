from __future__ import annotations

import dataclasses
import multiprocessing
import os
import subprocess
import sys
from typing import Any

import pytest
import torch

from loaderkit import PlatformInfo, detect_platform, recommended_num_workers
from loaderkit.machine.platform import (
    default_start_method,
    process_cpus,
    process_memory,
    resolve_start_method,
)


def test_detect_platform_reads_this_machine() -> None:
    info = detect_platform()
    assert isinstance(info, PlatformInfo)
    assert info.usable_cpus == process_cpus()[0] <= len(os.sched_getaffinity(0))
    assert (info.memory_bytes, info.memory_source) == process_memory()
    assert info.cpu_count == os.cpu_count()
    assert info.cuda_available == torch.cuda.is_available()
    assert info.torch_version == torch.__version__
    assert info.python_version[:2] == sys.version_info[:2]
    assert info.is_windows is (sys.platform == "win32")
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert info.open_files_soft == (None if soft == resource.RLIM_INFINITY else soft)
    if os.path.isdir("/dev/shm"):
        assert info.shm_bytes and info.shm_bytes > 0


def test_platform_info_is_frozen() -> None:
    info = detect_platform()
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.usable_cpus = 99  # type: ignore[misc]
    assert "usable_cpus" in info.describe()


def test_usable_cpus_follow_affinity() -> None:
    before = os.sched_getaffinity(0)
    if len(before) < 2:
        pytest.skip("needs two CPUs")
    try:
        os.sched_setaffinity(0, {min(before)})
        assert detect_platform().usable_cpus == 1
    finally:
        os.sched_setaffinity(0, before)
    assert detect_platform().usable_cpus == len(before)


@pytest.mark.parametrize(
    ("os_name", "version", "expected"),
    [
        ("Windows", (3, 11, 0), "spawn"),
        ("Darwin", (3, 11, 0), "spawn"),
        ("Darwin", (3, 14, 0), "spawn"),
        ("Linux", (3, 11, 7), "fork"),
        ("Linux", (3, 13, 1), "fork"),
        ("Linux", (3, 14, 0), "forkserver"),
        ("FreeBSD", (3, 14, 2), "forkserver"),
    ],
)
def test_default_start_method(os_name: str, version: tuple[int, ...], expected: str) -> None:
    assert default_start_method(os_name, version) == expected


def test_start_method_precedence_argument_then_global_then_default() -> None:
    spawn_ctx = multiprocessing.get_context("spawn")
    assert resolve_start_method(spawn_ctx, "fork", "fork") == ("spawn", "argument")
    assert resolve_start_method("forkserver", "spawn", "fork") == ("forkserver", "argument")
    assert resolve_start_method(None, "spawn", "fork") == ("spawn", "global")
    assert resolve_start_method(None, None, "forkserver") == ("forkserver", "default")
    assert resolve_start_method(torch.multiprocessing, None, "fork")[1] == "argument"
    with pytest.raises(TypeError):
        resolve_start_method(3.5, None, "fork")


def test_detect_platform_takes_the_context_argument() -> None:
    assert detect_platform("spawn").start_method == "spawn"
    assert detect_platform("spawn").start_method_source == "argument"
    ctx = multiprocessing.get_context("forkserver")
    assert detect_platform(ctx).start_method == "forkserver"


def test_global_start_method_is_seen_in_a_fresh_interpreter() -> None:
    code = (
        "import multiprocessing as mp; mp.set_start_method('spawn');"
        "from loaderkit import detect_platform; p = detect_platform();"
        "print(p.start_method, p.start_method_source)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["spawn", "global"]


def test_default_start_method_is_the_interpreters_default() -> None:
    info = detect_platform()
    if multiprocessing.get_start_method(allow_none=True) is None:
        assert info.start_method_source == "default"
        assert info.start_method == multiprocessing.get_context().get_start_method()


def test_local_world_size_from_launcher_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert detect_platform().local_world_size == 4
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert detect_platform().local_world_size is None


def test_recommended_num_workers(make_platform) -> None:
    p32 = make_platform(usable_cpus=32, is_windows=False, local_world_size=None)
    assert recommended_num_workers(p32) == 8  # capped
    assert recommended_num_workers(p32, local_world_size=4) == 7
    assert recommended_num_workers(p32, local_world_size=8) == 3
    assert recommended_num_workers(make_platform(usable_cpus=2, is_windows=False)) == 1
    assert recommended_num_workers(make_platform(usable_cpus=1, is_windows=False)) == 0
    assert recommended_num_workers(p32, local_world_size=32) == 0  # one CPU a rank
    per_node = make_platform(usable_cpus=16, is_windows=False, local_world_size=8)
    assert recommended_num_workers(per_node) == 1
    windows = make_platform(usable_cpus=16, is_windows=True, os_name="Windows")
    assert recommended_num_workers(windows) == 0
    assert recommended_num_workers(windows, force_zero_workers_on_windows=False) == 8


def test_recommended_num_workers_detects_by_default() -> None:
    assert recommended_num_workers() == recommended_num_workers(detect_platform())


# ---------------------------------------------------------------- CUDA in a forked child


def test_platform_reports_torch_bad_fork_check(monkeypatch: pytest.MonkeyPatch) -> None:
    assert detect_platform().cuda_bad_fork is bool(torch.cuda._is_in_bad_fork())
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: True)
    info = detect_platform()
    assert info.cuda_bad_fork is True and info.cuda_usable is False
    assert "cuda_bad_fork" in info.describe()


def test_hand_made_platforms_keep_working_without_the_new_field() -> None:
    fields = {f.name: getattr(detect_platform(), f.name) for f in dataclasses.fields(PlatformInfo)}
    del fields["cuda_bad_fork"]
    info = PlatformInfo(**{**fields, "cuda_available": True, "cuda_device_count": 1})
    assert info.cuda_bad_fork is False and info.cuda_usable is True


def _child_after_cuda_init(bad_fork: bool, conn: Any) -> None:
    """In a forked child: pretend the parent had initialised CUDA, then build a loader."""
    try:
        # What a CUDA host looks like from a child forked after torch.cuda.init() in the
        # parent: devices visible, torch's bad-fork flag set.
        torch.cuda.is_available = lambda: True  # type: ignore[assignment]
        torch.cuda.device_count = lambda: 1  # type: ignore[assignment]
        torch.cuda._is_in_bad_fork = lambda: bad_fork  # type: ignore[attr-defined]
        from loaderkit import create_dataloader
        from tests.helpers import SquareDataset

        seen_bad_fork = detect_platform().cuda_bad_fork
        loader = create_dataloader(SquareDataset(16), batch_size=8, num_workers=2)
        entry = loader.plan["pin_memory"]
        batches = 0
        if bad_fork:  # the case: iterating must not touch CUDA
            with loader:
                batches = len(list(loader))
        conn.send((seen_bad_fork, entry.value, entry.reason, batches))
    except BaseException as exc:  # report anything to the parent
        conn.send(repr(exc))
    finally:
        conn.close()


@pytest.mark.parametrize("bad_fork", [True, False])
def test_forked_child_after_cuda_init_does_not_pin(bad_fork: bool) -> None:
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_child_after_cuda_init, args=(bad_fork, child))
    process.start()
    child.close()
    try:
        assert parent.poll(60), "the child did not answer"
        result = parent.recv()
    finally:
        process.join(10)
        parent.close()
    assert process.exitcode == 0
    assert isinstance(result, tuple), result
    seen_bad_fork, pinned, reason, batches = result
    assert seen_bad_fork is bad_fork
    if bad_fork:
        assert pinned is False and "forked" in reason
        assert batches == 2
    else:
        assert pinned is True and "CUDA is available" in reason
