"""A process's memory and CPU limits on its own cgroup path, read from made-up trees.

Each test lays out a ``/proc/self`` (``cgroup``, ``mountinfo``) and a cgroup filesystem under
``tmp_path`` as the kernel shows them for v2, v1, hybrid hosts, Slurm's nested job / step /
task layouts and a container without a cgroup namespace, and reads it with
``loaderkit.machine.cgroups``. Real cgroups of this machine: ``test_job_limits.py``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import loaderkit.machine.platform as platform_module
from loaderkit import create_dataloader, detect_platform
from loaderkit.machine.cgroups import (
    CgroupMount,
    cgroup_levels,
    cpu_quota,
    memory_limit,
    parse_mountinfo,
    parse_proc_cgroup,
    quota_cpus,
)

GIB = 1 << 30
PHYSICAL = 512 * GIB  # a shared cluster node
V1_UNLIMITED = "9223372036854771712"

V1_MOUNTS = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
"""
V2_MOUNTS = "29 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


def lay_out(tmp: Path, proc_cgroup: str, mountinfo: str | None, files: dict[str, str]) -> Path:
    """A made-up ``/proc/self`` and cgroup tree under ``tmp``; returns the ``proc`` folder.

    ``files`` maps a path below the filesystem's root (``sys/fs/cgroup/memory/slurm/...``)
    to its contents; every folder on the way is made.
    """
    proc = tmp / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(proc_cgroup)
    if mountinfo is not None:
        (proc / "mountinfo").write_text(mountinfo)
    for name, text in files.items():
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return proc


# ------------------------------------------------------------------ parsing


def test_proc_cgroup_names_each_controller_and_the_unified_path() -> None:
    text = "12:memory:/slurm/uid_0/job_7\n4:cpu,cpuacct:/slurm/uid_0/job_7\n1:name=systemd:/x\n"
    text += "0::/user.slice\n"
    found = parse_proc_cgroup(text)
    assert found == {
        "memory": "/slurm/uid_0/job_7",
        "cpu": "/slurm/uid_0/job_7",
        "cpuacct": "/slurm/uid_0/job_7",
        "": "/user.slice",
    }
    assert parse_proc_cgroup("garbage\n\n") == {}


def test_mountinfo_lists_cgroup_hierarchies_with_their_controllers() -> None:
    mounts = parse_mountinfo(
        V1_MOUNTS + V2_MOUNTS.replace("/sys/fs/cgroup ", "/sys/fs/cgroup/unified ")
    )
    assert mounts == [
        CgroupMount(1, "/", "/sys/fs/cgroup/cpu,cpuacct", frozenset({"cpu", "cpuacct"})),
        CgroupMount(1, "/", "/sys/fs/cgroup/memory", frozenset({"memory"})),
        CgroupMount(1, "/", "/sys/fs/cgroup/systemd", frozenset({"xattr"})),
        CgroupMount(2, "/", "/sys/fs/cgroup/unified"),
    ]
    escaped = "50 31 0:40 /docker/a\\040b /mnt/my\\040cgroup rw - cgroup cgroup rw,memory\n"
    assert parse_mountinfo(escaped)[0] == CgroupMount(
        1, "/docker/a b", "/mnt/my cgroup", frozenset({"memory"})
    )


def test_a_quota_rounds_up_to_whole_cpus() -> None:
    assert [quota_cpus(q) for q in (0.01, 0.5, 1.0, 1.5, 4.0, 4.0000001)] == [1, 1, 1, 2, 4, 4]


# ------------------------------------------------------------------ cgroup v2


def test_v2_slurm_job_limit_below_the_root_is_found(tmp_path: Path) -> None:
    job = "system.slice/slurmstepd.scope/job_7"
    base = "sys/fs/cgroup"
    proc = lay_out(
        tmp_path,
        f"0::/{job}/step_0/user/task_0\n",
        V2_MOUNTS,
        {
            f"{base}/memory.max": "max",  # the root has none (a real root has no such file)
            f"{base}/{job}/memory.max": str(3 * GIB // 2),
            f"{base}/{job}/memory.high": "max",
            f"{base}/{job}/cpu.max": "400000 100000",
            f"{base}/{job}/step_0/memory.max": "max",
            f"{base}/{job}/step_0/cpu.max": "max 100000",
            f"{base}/{job}/step_0/user/task_0/memory.high": str(2 * GIB),
        },
    )
    limit = memory_limit(PHYSICAL, proc=proc, root=tmp_path)
    assert limit is not None and limit.value == 3 * GIB // 2
    assert limit.source == f"cgroup v2 /{job} memory.max"
    quota = cpu_quota(proc=proc, root=tmp_path)
    assert quota is not None and quota.value == 4.0 and quota.path == f"/{job}"
    assert quota.source == f"cgroup v2 /{job} cpu.max"


def test_v2_memory_high_counts_where_it_is_the_lowest(tmp_path: Path) -> None:
    proc = lay_out(
        tmp_path,
        "0::/user.slice/app.scope\n",
        V2_MOUNTS,
        {
            "sys/fs/cgroup/user.slice/memory.max": str(8 * GIB),
            "sys/fs/cgroup/user.slice/app.scope/memory.high": str(6 * GIB),
            "sys/fs/cgroup/user.slice/app.scope/memory.max": "max",
        },
    )
    limit = memory_limit(PHYSICAL, proc=proc, root=tmp_path)
    assert limit is not None and (limit.value, limit.file) == (6 * GIB, "memory.high")
    assert limit.path == "/user.slice/app.scope"


def test_v2_max_everywhere_is_no_limit(tmp_path: Path) -> None:
    proc = lay_out(
        tmp_path,
        "0::/a/b\n",
        V2_MOUNTS,
        {
            "sys/fs/cgroup/a/memory.max": "max",
            "sys/fs/cgroup/a/b/memory.max": "max",
            "sys/fs/cgroup/a/b/memory.high": "max",
            "sys/fs/cgroup/a/b/cpu.max": "max 100000",
        },
    )
    assert memory_limit(PHYSICAL, proc=proc, root=tmp_path) is None
    assert cpu_quota(proc=proc, root=tmp_path) is None


# ------------------------------------------------------------------ cgroup v1


def test_v1_slurm_nested_job_step_task(tmp_path: Path) -> None:
    job = "slurm/uid_0/job_7"
    memory, cpu = "sys/fs/cgroup/memory", "sys/fs/cgroup/cpu,cpuacct"
    proc = lay_out(
        tmp_path,
        f"10:memory:/{job}/step_0/task_0\n4:cpu,cpuacct:/{job}/step_0\n1:name=systemd:/\n",
        V1_MOUNTS,
        {
            f"{memory}/memory.limit_in_bytes": V1_UNLIMITED,
            f"{memory}/slurm/memory.limit_in_bytes": V1_UNLIMITED,
            f"{memory}/slurm/uid_0/memory.limit_in_bytes": V1_UNLIMITED,
            f"{memory}/{job}/memory.limit_in_bytes": str(3 * GIB // 2),
            f"{memory}/{job}/step_0/memory.limit_in_bytes": str(2 * GIB),
            f"{memory}/{job}/step_0/task_0/memory.limit_in_bytes": V1_UNLIMITED,
            f"{cpu}/cpu.cfs_quota_us": "-1",
            f"{cpu}/cpu.cfs_period_us": "100000",
            f"{cpu}/{job}/cpu.cfs_quota_us": "50000",
            f"{cpu}/{job}/cpu.cfs_period_us": "100000",
            f"{cpu}/{job}/step_0/cpu.cfs_quota_us": "-1",
            f"{cpu}/{job}/step_0/cpu.cfs_period_us": "100000",
        },
    )
    found = cgroup_levels("memory", proc=proc, root=tmp_path)
    assert found is not None and found[0] == 1
    assert [path for path, _ in found[1]] == [
        f"/{job}/step_0/task_0",
        f"/{job}/step_0",
        f"/{job}",
        "/slurm/uid_0",
        "/slurm",
        "/",
    ]
    limit = memory_limit(PHYSICAL, proc=proc, root=tmp_path)
    assert limit is not None and limit.value == 3 * GIB // 2
    assert limit.source == f"cgroup v1 /{job} memory.limit_in_bytes"
    quota = cpu_quota(proc=proc, root=tmp_path)
    assert quota is not None and quota.value == 0.5
    assert quota.source == f"cgroup v1 /{job} cpu.cfs_quota_us"


def test_a_limit_at_or_above_physical_memory_is_no_limit(tmp_path: Path) -> None:
    proc = lay_out(
        tmp_path,
        "4:memory:/big\n",
        V1_MOUNTS,
        {"sys/fs/cgroup/memory/big/memory.limit_in_bytes": str(PHYSICAL * 2)},
    )
    assert memory_limit(PHYSICAL, proc=proc, root=tmp_path) is None
    assert memory_limit(PHYSICAL * 2, proc=proc, root=tmp_path) is None  # equal: none
    unknown = memory_limit(None, proc=proc, root=tmp_path)  # physical unknown: it counts
    assert unknown is not None and unknown.value == PHYSICAL * 2


def test_hybrid_host_reads_memory_from_v1_beside_an_empty_unified_tree(tmp_path: Path) -> None:
    mounts = V1_MOUNTS + V2_MOUNTS.replace("/sys/fs/cgroup ", "/sys/fs/cgroup/unified ")
    proc = lay_out(
        tmp_path,
        "4:memory:/job\n3:cpu,cpuacct:/\n0::/\n",
        mounts,
        {
            "sys/fs/cgroup/memory/job/memory.limit_in_bytes": str(GIB),
            "sys/fs/cgroup/unified/cgroup.procs": "",
        },
    )
    limit = memory_limit(PHYSICAL, proc=proc, root=tmp_path)
    assert limit is not None and limit.version == 1 and limit.value == GIB


def test_a_container_without_a_cgroup_namespace_reads_its_own_mounted_cgroup(
    tmp_path: Path,
) -> None:
    # docker on a v1 host: /proc/self/cgroup names the host's path, the mount shows that
    # cgroup at its mount point
    mounts = "35 31 0:32 /docker/abc123 /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n"
    proc = lay_out(
        tmp_path,
        "4:memory:/docker/abc123\n",
        mounts,
        {"sys/fs/cgroup/memory/memory.limit_in_bytes": str(4 * GIB)},
    )
    limit = memory_limit(PHYSICAL, proc=proc, root=tmp_path)
    assert limit is not None and limit.value == 4 * GIB and limit.path == "/docker/abc123"


def test_without_mountinfo_the_usual_layout_is_read(tmp_path: Path) -> None:
    proc = lay_out(
        tmp_path,
        "4:memory:/job\n",
        None,
        {"sys/fs/cgroup/memory/job/memory.limit_in_bytes": str(GIB)},
    )
    limit = memory_limit(PHYSICAL, proc=proc, root=tmp_path)
    assert limit is not None and limit.value == GIB


def test_unreadable_or_damaged_files_are_no_limit_there(tmp_path: Path) -> None:
    memory = "sys/fs/cgroup/memory"
    proc = lay_out(
        tmp_path,
        "4:memory:/a/b/c\n3:cpu,cpuacct:/a\n",
        V1_MOUNTS,
        {
            f"{memory}/a/memory.limit_in_bytes": str(2 * GIB),
            f"{memory}/a/b/memory.limit_in_bytes": "not a number",
            f"{memory}/a/b/c/placeholder": "",
            "sys/fs/cgroup/cpu,cpuacct/a/cpu.cfs_quota_us": "50000",
            # no cpu.cfs_period_us beside it: no quota can be computed
        },
    )
    (tmp_path / memory / "a/b/c/memory.limit_in_bytes").mkdir()  # reading it fails
    limit = memory_limit(PHYSICAL, proc=proc, root=tmp_path)
    assert limit is not None and limit.path == "/a" and limit.value == 2 * GIB
    assert cpu_quota(proc=proc, root=tmp_path) is None


def test_no_cgroups_at_all(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    assert memory_limit(PHYSICAL, proc=proc, root=tmp_path) is None  # no /proc/self/cgroup
    (proc / "cgroup").write_text("4:memory:/x\n")
    (proc / "mountinfo").write_text("1 0 8:1 / / rw - ext4 /dev/sda1 rw\n")
    assert cgroup_levels("memory", proc=proc, root=tmp_path) is None  # none mounted


# ------------------------------------------------------------------ into the plan


def test_a_job_limit_reaches_platform_info_the_budgets_and_the_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = "slurm/uid_0/job_7"
    proc = lay_out(
        tmp_path,
        f"10:memory:/{job}\n4:cpu,cpuacct:/{job}\n",
        V1_MOUNTS,
        {
            f"sys/fs/cgroup/memory/{job}/memory.limit_in_bytes": str(3 * GIB // 2),
            f"sys/fs/cgroup/cpu,cpuacct/{job}/cpu.cfs_quota_us": "50000",
            f"sys/fs/cgroup/cpu,cpuacct/{job}/cpu.cfs_period_us": "100000",
        },
    )
    monkeypatch.setattr(
        platform_module,
        "memory_limit",
        lambda physical: memory_limit(physical, proc=proc, root=tmp_path),
    )
    monkeypatch.setattr(platform_module, "cpu_quota", lambda: cpu_quota(proc=proc, root=tmp_path))
    info = detect_platform()
    assert info.memory_bytes == 3 * GIB // 2
    assert info.memory_source == f"cgroup v1 /{job} memory.limit_in_bytes"
    assert (info.usable_cpus, info.cpu_quota) == (1, 0.5)
    assert info.cpus_source.startswith(f"cgroup v1 /{job} cpu.cfs_quota_us")
    assert platform_module.memory_bytes() == 3 * GIB // 2
    with create_dataloader(list(range(8)), num_workers="auto", platform=info) as loader:
        rows = loader.plan
        assert loader.num_workers == 0  # one CPU: no worker processes
        assert "cpu.cfs_quota_us" in rows["num_workers"].reason
        assert rows["memory"].value == "1.50 GiB"
        assert f"/{job} memory.limit_in_bytes" in rows["memory"].reason
        assert rows["cpus"].value == 1
        assert f"/{job}" in loader.describe()


def test_a_hand_made_platform_says_its_figures_were_given() -> None:
    info = dataclasses.replace(detect_platform(), memory_bytes=GIB, memory_source="given")
    with create_dataloader(list(range(4)), platform=info) as loader:
        row = loader.plan["memory"]
        assert row.value == "1.00 GiB" and row.reason.startswith("given")


def test_info_and_doctor_say_the_job_limits() -> None:
    from loaderkit.cli.doctor import run_checks

    job = dataclasses.replace(
        detect_platform(),
        memory_bytes=3 * GIB // 2,
        memory_source="cgroup v1 /slurm/uid_0/job_7 memory.limit_in_bytes",
        usable_cpus=1,
        cpu_count=64,
        cpu_quota=0.5,
        cpus_source="cgroup v1 /slurm/uid_0/job_7 cpu.cfs_quota_us: a quota of 0.5 CPU(s)",
        local_world_size=None,
    )
    checks = {check.name: check for check in run_checks(job)}
    assert checks["memory"].finding == (
        "1.50 GiB (cgroup v1 /slurm/uid_0/job_7 memory.limit_in_bytes)"
    )
    assert "fitted to it" in checks["memory"].advice
    workers = checks["workers"]
    assert workers.status == "warn" and "cpu.cfs_quota_us" in workers.finding
    assert "-> 0" in workers.finding and "CPU quota" in workers.advice
