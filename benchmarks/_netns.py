"""A link shaped in the kernel for the remote benchmark: two network namespaces and a veth pair.

``KernelLink`` makes two namespaces of its own (``lk<pid>s``: the S3 server, ``lk<pid>c``: the
benchmark), joins them with a veth pair (``10.77.<n>.1`` on the server's side, ``.2`` on the
client's, a /30 that exists only inside these namespaces), and shapes the server's side in the
kernel: ``tc qdisc tbf`` paces what the server sends at the bandwidth; ``netem`` delays each
direction by half the latency (one round trip = the latency) where the kernel has it, else
``server_sleeps`` is set and the server sleeps the latency before each request (a kernel built
without ``sch_netem`` and no modules to load, as in some containers). Then this process's main
thread joins the client namespace (``setns``): every thread, worker and rank it starts
afterwards reads through the shaped link, and the server (``_s3.Network(netns=...)``) runs in
its own namespace. Nothing else on the machine sees the link; ``close`` (and process exit)
deletes both namespaces, which removes the veth pair and its qdiscs.

Needs root, ``ip`` and ``tc`` (``apt-get install iproute2``) and Linux's ``setns``.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import shutil
import subprocess
from pathlib import Path

__all__ = ["KernelLink", "available", "enter"]

CLONE_NEWNET = 0x40000000


def available() -> str:
    """Why a kernel link cannot be made here (``""``: it can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, tc)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} missing: apt-get install iproute2"
    return ""


def enter(name: str) -> None:
    """Move the calling thread into the network namespace ``name`` (``ip netns`` named)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"setns({name}): {os.strerror(error)}")
    finally:
        os.close(fd)


def _run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True, timeout=30)


class KernelLink:
    """The namespaces, the veth pair and the qdiscs (see the module's docstring).

    Args:
        bandwidth: Bytes per second the server's side sends.
        latency: Seconds of one round trip (half on each side's ``netem``).
    """

    def __init__(self, bandwidth: float, latency: float) -> None:
        why = available()
        if why:
            raise RuntimeError(f"a kernel-shaped link {why}")
        pid = os.getpid()
        self.server_ns = f"lk{pid}s"
        self.client_ns = f"lk{pid}c"
        subnet = pid % 250 + 1
        self.server_ip = f"10.77.{subnet}.1"
        self.client_ip = f"10.77.{subnet}.2"
        self.bandwidth = bandwidth
        self.latency = latency
        self._closed = False
        atexit.register(self.close)
        try:
            self._make(pid)
        except BaseException:
            self.close()
            raise

    def _make(self, pid: int) -> None:
        server_if, client_if = f"lk{pid}s0", f"lk{pid}c0"
        for ns in (self.server_ns, self.client_ns):
            _run("ip", "netns", "add", ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        # made in the client namespace, one end moved: never an interface in the root one
        _run(
            "ip", "-n", self.client_ns, "link", "add", client_if,
            "type", "veth", "peer", "name", server_if, "netns", self.server_ns,
        )  # fmt: skip
        for ns, name, ip in (
            (self.server_ns, server_if, self.server_ip),
            (self.client_ns, client_if, self.client_ip),
        ):
            _run("ip", "-n", ns, "addr", "add", f"{ip}/30", "dev", name)
            _run("ip", "-n", ns, "link", "set", name, "up")
        rate = f"{int(self.bandwidth * 8)}bit"
        half = f"{self.latency * 1e3 / 2:.3f}ms"
        burst = str(max(int(self.bandwidth / 250), 64 * 1024))  # 4 ms of bytes, >= 64 KiB
        tbf = ["tbf", "rate", rate, "burst", burst, "latency", "100ms"]
        server_tc = ["ip", "netns", "exec", self.server_ns, "tc", "qdisc", "add", "dev", server_if]
        client_tc = ["ip", "netns", "exec", self.client_ns, "tc", "qdisc", "add", "dev", client_if]
        netem = ["netem", "delay", half, "limit", "100000"]
        try:  # server -> client: netem (half the round trip), then tbf (the bandwidth)
            _run(*server_tc, "root", "handle", "1:", *netem)
            _run(*server_tc, "parent", "1:1", "handle", "10:", *tbf)
            _run(*client_tc, "root", *netem)
            self.server_sleeps = False
            delay = f"netem delay {half} each way"
        except subprocess.CalledProcessError:  # no sch_netem in this kernel
            _run(*server_tc, "root", *tbf)
            self.server_sleeps = True
            delay = (
                f"no netem in this kernel: the server sleeps {self.latency * 1e3:g} ms per request"
            )
        self.describe = (
            f"veth {client_if} ({self.client_ip}, ns {self.client_ns}) <-> {server_if} "
            f"({self.server_ip}, ns {self.server_ns}); server side tbf rate {rate} burst "
            f"{burst}; {delay}"
        )

    def qdisc_stats(self) -> str:
        """``tc -s qdisc`` on the server's side (bytes sent, drops, overlimits)."""
        out = subprocess.run(
            ["ip", "netns", "exec", self.server_ns, "tc", "-s", "qdisc"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        return out.stdout

    def close(self) -> None:
        """Delete both namespaces (their veth pair and qdiscs go with them); idempotent."""
        if self._closed:
            return
        self._closed = True
        for ns in (self.client_ns, self.server_ns):
            if Path(f"/var/run/netns/{ns}").exists():
                subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
