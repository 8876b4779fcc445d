"""Fixtures for the storage tests: a real S3 API on 127.0.0.1 (see ``s3server``), a bucket, and
a real HTTP server with Range support (``httpserver``) over a temporary directory."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.storage.httpserver import HTTPFileServer
from tests.storage.s3server import BUCKET, KEY, SECRET, S3Server, serving


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    with serving() as server:
        yield server


@dataclass
class Bucket:
    """A fresh bucket on the server, with helpers to put objects and name them."""

    server: S3Server
    name: str = BUCKET

    @property
    def options(self) -> dict[str, Any]:
        return {"endpoint_url": self.server.url, "key": KEY, "secret": SECRET}

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.server.url, region_name="us-east-1")

    def put(self, key: str, data: bytes) -> str:
        self.client().put_object(Bucket=self.name, Key=key, Body=data)
        return self.url(key)

    def url(self, key: str) -> str:
        return f"s3://{self.name}/{key}"


@pytest.fixture
def bucket(s3_server: S3Server) -> Iterator[Bucket]:
    from loaderkit.storage import filesystems

    s3_server.reset()
    filesystems.reset()
    made = Bucket(s3_server)
    made.client().create_bucket(Bucket=made.name)
    s3_server.requests.clear()
    yield made
    s3_server.throttle = 0.0


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    path = tmp_path / "cache"
    os.makedirs(path, mode=0o700)  # a cache directory others can write is refused
    return path


@pytest.fixture
def http_files(tmp_path: Path) -> Iterator[HTTPFileServer]:
    """An HTTP server (Range, HEAD, ETag, Last-Modified) over ``tmp_path / "www"``."""
    pytest.importorskip("aiohttp")  # fsspec's http filesystem
    from loaderkit.storage import filesystems

    filesystems.reset()
    root = tmp_path / "www"
    root.mkdir()
    server = HTTPFileServer(root)
    try:
        yield server
    finally:
        server.close()
