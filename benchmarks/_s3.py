"""A real S3 API on 127.0.0.1 for the remote benchmark, and a throttling proxy in front of it.

- :class:`Network`: a child process (forked) that serves moto's S3 (its WSGI app) with
  werkzeug on 127.0.0.1 behind a middleware that logs every request (method, key, query,
  ``Range``) and counts the body bytes it sends for each object, and runs the proxy below in
  front of it. In its own process, the server and the proxy take nothing from the measured
  process's interpreter (its GIL); the log and the counts come back over a pipe.
- :class:`ThrottleProxy`: a threaded TCP proxy on 127.0.0.1 that forwards to the server,
  sleeps ``latency`` seconds before each HTTP request it forwards and paces the bytes it sends
  back at ``bandwidth`` bytes/s, shared by every connection (one link). It stops by itself
  after ``max_seconds`` or ``max_connections``, whichever comes first.

Nothing here listens anywhere but 127.0.0.1. moto checks no credentials: any key works (the
benchmark sets dummy ones in the environment, as s3fs's own tests do).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from werkzeug.serving import make_server

__all__ = ["KEY", "SECRET", "Network", "Request", "ThrottleProxy", "dummy_credentials"]

KEY = "benchmark"
SECRET = "benchmark"
_SLACK = 0.002  # seconds a reply may run ahead of the link before the pacer sleeps
_CATCH_UP = 0.02  # seconds behind the link a busy reply may catch up (oversleeping)
_CHUNK = 1 << 18
_METHODS = (b"GET ", b"HEAD ", b"PUT ", b"POST ", b"DELETE ")


def dummy_credentials() -> None:
    """Dummy AWS settings in this process's environment (inherited by ranks and workers)."""
    os.environ.update(
        AWS_ACCESS_KEY_ID=KEY,
        AWS_SECRET_ACCESS_KEY=SECRET,
        AWS_DEFAULT_REGION="us-east-1",
    )
    os.environ.pop("AWS_PROFILE", None)
    os.environ.pop("AWS_SESSION_TOKEN", None)


@dataclass(frozen=True)
class Request:
    """One request the server answered."""

    method: str
    path: str
    query: str
    range: str | None

    @property
    def kind(self) -> str:
        """``list``, ``get`` (whole object), ``range`` (ranged GET), ``head``, ``put``, ... ."""
        if "list-type" in self.query or self.path.strip("/").count("/") < 1:
            return "list" if self.method == "GET" else f"{self.method.lower()} bucket"
        if self.method == "GET":
            return "range" if self.range else "get"
        return self.method.lower()


class _Recorder:
    """moto's S3 served by werkzeug on 127.0.0.1, with a request log and bytes per object."""

    def __init__(self, host: str = "127.0.0.1", latency: float = 0.0) -> None:
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
        self._app = DomainDispatcherApplication(create_backend_app)
        self._latency = latency  # slept before each request (a link without netem)
        self._lock = threading.Lock()
        self._requests: list[Request] = []
        self._bytes: Counter[str] = Counter()
        self._server = make_server(host, 0, self, threaded=True)
        self.port = int(self._server.server_port)
        self.url = f"http://{host}:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        request = Request(
            environ["REQUEST_METHOD"],
            environ.get("PATH_INFO", ""),
            environ.get("QUERY_STRING", ""),
            environ.get("HTTP_RANGE"),
        )
        with self._lock:
            self._requests.append(request)
        if self._latency:
            time.sleep(self._latency)
        body = self._app(environ, start_response)
        if request.kind in ("get", "range"):
            return self._counted(body, request.path)
        return body

    def _counted(self, body: Iterable[bytes], path: str) -> Iterator[bytes]:
        for chunk in body:
            with self._lock:
                self._bytes[path] += len(chunk)
            yield chunk

    def clear(self) -> None:
        """Forget the counted requests and bytes."""
        with self._lock:
            self._requests.clear()
            self._bytes.clear()

    def log(self) -> list[Request]:
        """Every request since the last :meth:`clear`."""
        with self._lock:
            return list(self._requests)

    def bytes_served(self) -> dict[str, int]:
        """Body bytes sent per object path (``/bucket/key``) since the last :meth:`clear`."""
        with self._lock:
            return dict(self._bytes)

    def counts(self) -> dict[str, int]:
        """Requests by kind (``list``, ``get``, ``range``, ``head``, ...)."""
        return dict(Counter(r.kind for r in self.log()))

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Pacer:
    """One link of ``bandwidth`` bytes/s: each chunk waits for its slot on the link."""

    def __init__(self, bandwidth: float) -> None:
        self.bandwidth = float(bandwidth)
        self._lock = threading.Lock()
        self._free_at = 0.0

    def take(self, n: int) -> None:
        """Wait until ``n`` more bytes fit the link (sleeping only once ahead by > 2 ms: a
        sleep per small chunk would cost more than the chunk; the average rate stays B)."""
        with self._lock:
            now = time.perf_counter()
            # a late sleeper catches up (the link was busy, not idle), an idle link does not
            start = self._free_at if now - self._free_at < _CATCH_UP else now
            self._free_at = start + n / self.bandwidth
            until = self._free_at
        delay = until - time.perf_counter()
        if delay > _SLACK:
            time.sleep(delay)


class ThrottleProxy:
    """A TCP proxy on 127.0.0.1: ``latency`` s per HTTP request, replies paced at ``bandwidth``.

    Args:
        upstream_port: The server's port on 127.0.0.1.
        bandwidth: Bytes per second, shared by all connections.
        latency: Seconds slept before each request is forwarded.
        max_seconds: The proxy stops accepting and closes every connection after this long.
        max_connections: ... or after this many connections.
    """

    def __init__(
        self,
        upstream_port: int,
        bandwidth: float,
        latency: float,
        *,
        max_seconds: float = 1800.0,
        max_connections: int = 20_000,
        netns: tuple[str, str] | None = None,
    ) -> None:
        self.upstream_port = upstream_port
        self.latency = float(latency)
        self._pacer = _Pacer(bandwidth)
        self._deadline = time.monotonic() + max_seconds
        self._max_connections = max_connections
        self.connections = 0
        self.requests = 0
        self.bytes_down = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sockets: set[socket.socket] = set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = int(self._listener.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set() and time.monotonic() < self._deadline:
            if self.connections >= self._max_connections:
                break
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                break
            self.connections += 1
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            except OSError:
                client.close()
                continue
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.settimeout(1.0)
            with self._lock:
                self._sockets.update((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()
        self._stop.set()
        self._close_all()

    def _pump(self, src: socket.socket, dst: socket.socket, requests: bool) -> None:
        try:
            while not self._stop.is_set() and time.monotonic() < self._deadline:
                try:
                    data = src.recv(_CHUNK)
                except TimeoutError:
                    continue
                if not data:
                    break
                if requests:
                    if data.startswith(_METHODS):  # a new request on this connection
                        with self._lock:
                            self.requests += 1
                        if self.latency:
                            time.sleep(self.latency)
                else:
                    self._pacer.take(len(data))
                    with self._lock:
                        self.bytes_down += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()
                with self._lock:
                    self._sockets.discard(sock)

    def _close_all(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def close(self) -> None:
        """Stop accepting and close every connection."""
        self._stop.set()
        self._thread.join(timeout=5)
        self._close_all()


def _serve(
    conn: Any,
    bandwidth: float,
    latency: float,
    max_seconds: float,
    limit: int,
    netns: tuple[str, str, float] | None = None,
) -> None:
    """The child: the server and the proxy until told to stop, or ``max_seconds``.

    ``netns``: ``(namespace, address, latency)``: the server alone, in that network namespace on
    that address, behind a link the kernel shapes (``_netns.KernelLink``), no proxy; it sleeps
    ``latency`` seconds before each request when the kernel cannot delay packets (no netem).
    """
    import sys

    sys.setswitchinterval(0.0002)  # a woken pump gets the GIL from moto's thread at once
    if netns is not None:
        import _netns

        _netns.enter(netns[0])
    server = _Recorder(netns[1], netns[2]) if netns is not None else _Recorder()
    proxy: ThrottleProxy | None = None
    if netns is None:
        proxy = ThrottleProxy(
            server.port, bandwidth, latency, max_seconds=max_seconds, max_connections=limit
        )
    conn.send((server.url, server.url if proxy is None else f"http://127.0.0.1:{proxy.port}"))
    deadline = time.monotonic() + max_seconds
    try:
        while time.monotonic() < deadline:
            if not conn.poll(0.5):
                continue
            what = conn.recv()
            if what == "stop":
                break
            if what == "clear":
                server.clear()
                conn.send(None)
            elif what == "log":
                conn.send((server.log(), server.bytes_served()))
            elif what == "proxy":
                conn.send(
                    {"connections": proxy.connections, "requests": proxy.requests,
                     "bytes": proxy.bytes_down}
                    if proxy is not None
                    else {"connections": 0, "requests": 0, "bytes": 0}
                )  # fmt: skip
    except (EOFError, OSError):
        pass  # the parent is gone
    finally:
        if proxy is not None:
            proxy.close()
        server.close()


class Network:
    """moto's S3 and the throttling proxy in a child process; both on 127.0.0.1.

    ``url`` is the server itself (uploads), ``proxy_url`` the throttled way to it (reads).
    With ``netns=(namespace, address, latency)`` the server runs in that namespace behind a link the
    kernel shapes, and ``proxy_url`` is ``url`` (no proxy). The child stops at :meth:`close`,
    when this process dies, or after ``max_seconds``.
    """

    def __init__(
        self,
        bandwidth: float,
        latency: float,
        *,
        max_seconds: float = 1800.0,
        max_connections: int = 20_000,
        netns: tuple[str, str, float] | None = None,
    ) -> None:
        import multiprocessing

        context = multiprocessing.get_context("fork")
        self._conn, child = context.Pipe()
        self._process = context.Process(
            target=_serve,
            args=(child, bandwidth, latency, max_seconds, max_connections, netns),
            daemon=True,
        )
        self._process.start()
        child.close()
        if not self._conn.poll(120):
            self._process.kill()
            raise RuntimeError("the S3 server did not start in 2 minutes")
        self.url, self.proxy_url = self._conn.recv()
        self._lock = threading.Lock()

    def _ask(self, what: str) -> Any:
        with self._lock:
            self._conn.send(what)
            return self._conn.recv()

    def clear(self) -> None:
        """Forget the counted requests and bytes."""
        self._ask("clear")

    def log(self) -> list[Request]:
        """Every request since the last :meth:`clear`."""
        return list(self._ask("log")[0])

    def bytes_served(self) -> dict[str, int]:
        """Body bytes sent per object path (``/bucket/key``) since the last :meth:`clear`."""
        return dict(self._ask("log")[1])

    def counts(self) -> dict[str, int]:
        """Requests by kind (``list``, ``get``, ``range``, ``head``, ...)."""
        return dict(Counter(r.kind for r in self.log()))

    @property
    def pid(self) -> int | None:
        """The child's process id."""
        return self._process.pid

    def cpu_seconds(self) -> float:
        """CPU time the server and the proxy (the child process) used so far."""
        import psutil

        times = psutil.Process(self._process.pid).cpu_times()
        return float(times.user + times.system)

    def proxy_stats(self) -> dict[str, int]:
        """Connections, requests and bytes sent back by the proxy since it started."""
        return dict(self._ask("proxy"))

    def close(self) -> None:
        """Stop the child (killed if it does not stop in 10 s)."""
        try:
            with self._lock:
                self._conn.send("stop")
        except OSError:
            pass
        self._process.join(timeout=10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._conn.close()
