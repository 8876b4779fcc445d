"""A real S3 API on 127.0.0.1 for the storage tests: moto's WSGI app behind a middleware.

The middleware counts every request (method, key, Range), can slow object bodies down (to
kill a download mid-file) and can refuse one access key with S3's own 403 ``AccessDenied``
(moto does not check credentials). Importable by later integration tests (the HDF5 layer).
"""

from __future__ import annotations

import contextlib
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from werkzeug.serving import make_server

BUCKET = "loaderkit-test"
KEY = "testing"
SECRET = "testing"
REFUSED_KEY = "refused-key"

_DENIED = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
    b"<Message>Access Denied</Message></Error>"
)


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: str
    range: str | None


class S3Server:
    """moto's S3 served by werkzeug on 127.0.0.1, with a request log and a throttle."""

    def __init__(self) -> None:
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

        self._app = DomainDispatcherApplication(create_backend_app)
        self._lock = threading.Lock()
        self.requests: list[Request] = []
        self.throttle: float = 0.0  # seconds slept per 16 KiB of an object body
        self.active = 0  # object bodies being sent now
        self.peak = 0  # the most at once since the last reset
        self._server = make_server("127.0.0.1", 0, self, threaded=True)
        self.url = f"http://127.0.0.1:{self._server.server_port}"
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
        if not request.path.startswith("/moto-api"):
            with self._lock:
                self.requests.append(request)
        if f"Credential={REFUSED_KEY}/" in environ.get("HTTP_AUTHORIZATION", ""):
            start_response(
                "403 Forbidden",
                [("Content-Type", "application/xml"), ("Content-Length", str(len(_DENIED)))],
            )
            return [_DENIED]
        body = self._app(environ, start_response)
        if request.method == "GET" and not request.query and request.path.count("/") > 1:
            return self._counted(body, self.throttle)
        return body

    def _counted(self, body: Iterable[bytes], pause: float) -> Iterator[bytes]:
        """``body`` in 16 KiB pieces, ``pause`` s before each; counted in ``active`` until its
        last piece is handed out (a client that has every byte may send its next request
        before this generator is resumed once more)."""
        with self._lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
        counted = True
        try:
            pieces = (c[s : s + 16384] for c in body for s in range(0, max(len(c), 1), 16384))
            piece = next(pieces, None)
            while piece is not None:
                if pause:
                    time.sleep(pause)
                following = next(pieces, None)
                if following is None:
                    with self._lock:
                        self.active -= 1
                    counted = False
                yield piece
                piece = following
        finally:
            if counted:
                with self._lock:
                    self.active -= 1

    def reset(self) -> None:
        """Forget every bucket (moto) and every counted request."""
        urllib.request.urlopen(urllib.request.Request(f"{self.url}/moto-api/reset", method="POST"))
        with self._lock:
            self.requests.clear()
            self.peak = self.active
        self.throttle = 0.0

    def log(self) -> list[Request]:
        with self._lock:
            return list(self.requests)

    def object_gets(self, key: str, bucket: str = BUCKET) -> list[Request]:
        """GET requests for one object's bytes (Range or not)."""
        path = f"/{bucket}/{key}"
        return [r for r in self.log() if r.method == "GET" and r.path == path and not r.query]

    def listings(self, bucket: str = BUCKET) -> list[Request]:
        """ListObjects requests on a bucket."""
        return [
            r
            for r in self.log()
            if r.method == "GET" and r.path.rstrip("/") == f"/{bucket}" and "list-type" in r.query
        ]

    def close(self) -> None:
        self._server.shutdown()


@contextlib.contextmanager
def serving() -> Iterator[S3Server]:
    """moto's S3 server on 127.0.0.1, with dummy credentials in the environment meanwhile.

    Skips the test (or module) where moto's server or s3fs is not installed.
    """
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    with pytest.MonkeyPatch.context() as patch:
        for name, value in {
            "AWS_ACCESS_KEY_ID": KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_SESSION_TOKEN": "testing",
        }.items():
            patch.setenv(name, value)
        patch.delenv("AWS_PROFILE", raising=False)
        server = S3Server()
        try:
            yield server
        finally:
            server.close()
