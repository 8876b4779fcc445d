"""A real HTTP server on 127.0.0.1 serving a directory with Range support (``http://`` URLs).

Threaded (``http.server.ThreadingHTTPServer``), HTTP/1.1 with keep-alive, ``HEAD`` and ``GET``,
one ``Range: bytes=a-b`` (or ``a-`` or ``-n``) per request answered with ``206`` and
``Content-Range``, ``Content-Length``, ``ETag`` (the file's MD5, quoted: what S3 gives for a
single-part upload), ``Last-Modified`` and ``Accept-Ranges: bytes``. It counts every request
(method, path, Range) and can slow bodies down (``throttle`` seconds per 16 KiB) so that a test
can kill a download mid-file. Only 127.0.0.1; nothing outside the served directory.
"""

from __future__ import annotations

import email.utils
import hashlib
import os
import re
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
_BLOCK = 16384


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    range: str | None


class HTTPFileServer:
    """Serves ``root`` at ``self.url`` from a daemon thread until ``close()``."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()
        self.requests: list[Request] = []
        self.throttle = 0.0
        self.etag = True  # False: Last-Modified only (a plain web server's static files)
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass  # quiet

            def do_HEAD(self) -> None:
                server._serve(self, body=False)

            def do_GET(self) -> None:
                server._serve(self, body=True)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def _serve(self, handler: BaseHTTPRequestHandler, body: bool) -> None:
        name = handler.path.split("?", 1)[0].lstrip("/")
        wanted = handler.headers.get("Range")
        with self._lock:
            self.requests.append(Request(handler.command, "/" + name, wanted))
        path = (self.root / name).resolve()
        if self.root not in path.parents or not path.is_file():
            handler.send_response(404)
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        data = path.read_bytes()
        size = len(data)
        start, stop, status = 0, size, 200
        if wanted:
            match = _RANGE.match(wanted.strip())
            if match is None or not any(match.groups()):
                handler.send_response(416)
                handler.send_header("Content-Length", "0")
                handler.end_headers()
                return
            first, last = match.groups()
            if first:
                start, stop = int(first), min(int(last) + 1 if last else size, size)
            else:
                start, stop = max(size - int(last), 0), size
            if start >= size or start >= stop:
                handler.send_response(416)
                handler.send_header("Content-Range", f"bytes */{size}")
                handler.send_header("Content-Length", "0")
                handler.end_headers()
                return
            status = 206
        handler.send_response(status)
        handler.send_header("Content-Type", "application/octet-stream")
        handler.send_header("Accept-Ranges", "bytes")
        handler.send_header("Content-Length", str(stop - start))
        if status == 206:
            handler.send_header("Content-Range", f"bytes {start}-{stop - 1}/{size}")
        if self.etag:
            digest = hashlib.md5(data, usedforsecurity=False).hexdigest()
            handler.send_header("ETag", f'"{digest}"')
        mtime = os.stat(path).st_mtime
        handler.send_header("Last-Modified", email.utils.formatdate(mtime, usegmt=True))
        handler.end_headers()
        if not body:
            return
        pause = self.throttle
        try:
            for offset in range(start, stop, _BLOCK):
                handler.wfile.write(data[offset : min(offset + _BLOCK, stop)])
                if pause:
                    time.sleep(pause)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away (a killed download)

    def log(self) -> list[Request]:
        with self._lock:
            return list(self.requests)

    def gets(self, name: str) -> list[Request]:
        """GET requests for one file (``name`` relative to the root)."""
        return [r for r in self.log() if r.method == "GET" and r.path == "/" + name]

    def whole_gets(self, name: str) -> int:
        """GETs of the whole file (no Range): downloads."""
        return sum(r.range is None for r in self.gets(name))

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
