"""Real child cgroups (v1, as root): run a process inside a job's limits, measure its memory.

``child_cgroup(memory_bytes=..., cpu_quota=...)`` makes a child of this process's own memory
and CPU cgroups (the paths ``/proc/self/cgroup`` names, as ``loaderkit.machine.cgroups``
finds them), writes the limits and removes the children after; ``ChildCgroup.run`` starts a
command inside them and samples the memory cgroup's anonymous memory (the processes' private
memory and shared memory: what the kernel cannot reclaim) while it runs. Where the cgroup
files are not writable (not root, cgroup v2 without delegation, no cgroups), ``child_cgroup``
raises ``CgroupUnavailable`` with the reason (the tests skip on it: ``tests/cgroups.py``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from loaderkit.machine.cgroups import cgroup_levels

__all__ = ["CgroupUnavailable", "ChildCgroup", "Run", "child_cgroup"]


class CgroupUnavailable(RuntimeError):
    """No child cgroup can be made here (the message says why)."""


@dataclass(frozen=True)
class Run:
    """How a command ended inside a child cgroup.

    Attributes:
        returncode: Its exit status (137 or -9: killed, e.g. by the kernel's OOM killer).
        stdout: What it printed.
        stderr: What it wrote to stderr.
        peak_bytes: ``memory.max_usage_in_bytes``: the cgroup's peak, page cache included.
        peak_anon: The most anonymous memory sampled (``total_active_anon`` +
            ``total_inactive_anon``, every 20 ms): private and shared memory, no page cache.
        failcnt: ``memory.failcnt``: how often the limit was hit (reclaiming page cache too).
    """

    returncode: int
    stdout: str
    stderr: str
    peak_bytes: int
    peak_anon: int
    failcnt: int


@dataclass
class ChildCgroup:
    """A child memory cgroup (and CPU cgroup) of this process's own; ``run`` starts in both."""

    memory: Path | None
    cpu: Path | None

    def run(self, argv: Sequence[str], *, timeout: float, env: dict[str, str] | None = None) -> Run:
        """Run ``argv`` inside the cgroups; its anonymous memory sampled while it runs."""
        procs = [str(d / "cgroup.procs") for d in (self.memory, self.cpu) if d is not None]
        script = 'for f in $LK_CGROUP_PROCS; do echo $$ > "$f"; done; exec "$@"'
        environ = dict(os.environ if env is None else env, LK_CGROUP_PROCS=" ".join(procs))
        peak = [0]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], self.anon())
                done.wait(0.02)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            proc = subprocess.run(
                ["sh", "-c", script, "sh", *argv],
                env=environ,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        finally:
            done.set()
            sampler.join()
        return Run(
            proc.returncode,
            proc.stdout,
            proc.stderr,
            self._int("memory.max_usage_in_bytes"),
            peak[0],
            self._int("memory.failcnt"),
        )

    def anon(self) -> int:
        """Anonymous memory charged to the memory cgroup now (0 where there is none)."""
        if self.memory is None:
            return 0
        try:
            text = (self.memory / "memory.stat").read_text()
        except OSError:
            return 0
        stat = dict(line.split() for line in text.splitlines() if line.count(" ") == 1)
        return int(stat.get("total_active_anon", 0)) + int(stat.get("total_inactive_anon", 0))

    def _int(self, name: str) -> int:
        if self.memory is None:
            return 0
        return int((self.memory / name).read_text().strip() or 0)


def _make_child(controller: str, settings: dict[str, str]) -> Path:
    found = cgroup_levels(controller)
    if found is None or found[0] != 1:
        raise CgroupUnavailable(f"no cgroup v1 {controller} hierarchy for this process")
    own = found[1][0][1]
    child = own / f"loaderkit-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        child.mkdir()
    except OSError as exc:
        raise CgroupUnavailable(f"cannot make a child {controller} cgroup in {own}: {exc}") from exc
    try:
        for name, value in settings.items():
            (child / name).write_text(value)
    except OSError as exc:
        _remove(child)
        raise CgroupUnavailable(
            f"cannot write the {controller} cgroup's limits in {child}: {exc}"
        ) from exc
    return child


def _remove(child: Path) -> None:
    for _ in range(100):  # the processes that ran there leave it as they are reaped
        try:
            child.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)


@contextlib.contextmanager
def child_cgroup(
    *, memory_bytes: int | None = None, cpu_quota: float | None = None
) -> Iterator[ChildCgroup]:
    """Children of this process's memory and CPU cgroups with these limits, removed after.

    Args:
        memory_bytes: ``memory.limit_in_bytes`` of a child memory cgroup (``None``: none made).
        cpu_quota: CPUs of a child CPU cgroup's quota (``cpu.cfs_quota_us`` over a period of
            100,000 µs; ``None``: none made).
    """
    memory = cpu = None
    try:
        if memory_bytes is not None:
            memory = _make_child("memory", {"memory.limit_in_bytes": str(memory_bytes)})
        if cpu_quota is not None:
            cpu = _make_child(
                "cpu",
                {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": str(int(cpu_quota * 100000))},
            )
        yield ChildCgroup(memory, cpu)
    finally:
        for child in (memory, cpu):
            if child is not None:
                _remove(child)
