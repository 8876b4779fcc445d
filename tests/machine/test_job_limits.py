"""A process inside a job's limits: real child cgroups (v1, as root) of this test's own.

The made-up trees of ``test_cgroups.py`` cover the layouts; here the kernel's own files are
read by a fresh interpreter started inside a child memory cgroup and a child CPU cgroup
(``tests.cgroups``), as a Slurm job's or a container's process is. Skipped where the cgroup
files are not writable.
"""

from __future__ import annotations

import json
import sys

from tests.cgroups import child_cgroup

GIB = 1 << 30

REPORT = """
import json
from loaderkit import create_dataloader, detect_platform, recommended_num_workers

class Memory:
    def __len__(self):
        return 2
    def __getitem__(self, i):
        return detect_platform().memory_bytes

p = detect_platform()
with create_dataloader(list(range(8)), num_workers="auto") as auto:
    workers = auto.num_workers
with create_dataloader(Memory(), num_workers=1, multiprocessing_context="fork") as loader:
    in_worker = [int(x) for batch in loader for x in batch]
print(json.dumps({
    "memory": p.memory_bytes, "memory_source": p.memory_source, "cpus": p.usable_cpus,
    "quota": p.cpu_quota, "cpus_source": p.cpus_source,
    "recommended": recommended_num_workers(p), "auto": workers, "in_worker": in_worker,
}))
"""


def _report(**limits: float) -> dict:
    with child_cgroup(**limits) as group:  # type: ignore[arg-type]
        run = group.run([sys.executable, "-c", REPORT], timeout=120)
        assert run.returncode == 0, run.stderr
        found = json.loads(run.stdout.strip().splitlines()[-1])
        found["group"] = group
        return found


def test_a_memory_limit_below_the_root_is_the_process_memory() -> None:
    limit = 3 * GIB // 2
    found = _report(memory_bytes=limit)
    assert found["memory"] == limit
    child = found["group"].memory
    assert found["memory_source"].startswith("cgroup v1 /")
    assert found["memory_source"].endswith(f"/{child.name} memory.limit_in_bytes")
    assert found["in_worker"] == [limit, limit]  # a worker shares its parent's cgroup


def test_a_cpu_quota_of_half_a_cpu_is_one_cpu_and_no_worker_processes() -> None:
    found = _report(cpu_quota=0.5)
    assert (found["cpus"], found["quota"]) == (1, 0.5)
    assert "cpu.cfs_quota_us" in found["cpus_source"]
    assert found["recommended"] == 0 and found["auto"] == 0
