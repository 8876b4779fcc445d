"""``stat_objects``: one listing per prefix, and errors that name the URL and the fix."""

from __future__ import annotations

import hashlib
import http.server
import os
import threading
from collections.abc import Iterator

import pytest

from loaderkit.errors import StorageAccessError
from loaderkit.storage import ObjectInfo, stat_objects
from tests.storage.conftest import Bucket
from tests.storage.httpserver import HTTPFileServer
from tests.storage.s3server import REFUSED_KEY


def test_one_listing_per_prefix_no_object_read(bucket: Bucket) -> None:
    urls = [bucket.put(f"a/s{i}.h5", bytes(10 + i)) for i in range(3)]
    urls += [bucket.put(f"b/s{i}.h5", bytes(20 + i)) for i in range(2)]
    bucket.server.requests.clear()
    infos = stat_objects(urls, bucket.options)
    assert list(infos) == urls
    assert [info.size for info in infos.values()] == [10, 11, 12, 20, 21]
    assert infos[urls[0]].etag == hashlib.md5(bytes(10)).hexdigest()
    assert infos[urls[0]].md5 == infos[urls[0]].etag
    assert infos[urls[0]].mtime is not None
    log = bucket.server.log()
    assert len(bucket.server.listings()) == 2 and len(log) == 2, log  # no HEAD, no GET


def test_identity_uses_etag_else_mtime() -> None:
    assert ObjectInfo("s3://b/k", 5, "abc").identity == "size=5;etag=abc"
    assert ObjectInfo("/x.h5", 5, None, 1.5).identity == "size=5;mtime=1.5"
    assert ObjectInfo("s3://b/k", 5, "0123456789abcdef0123456789abcdef-2").md5 is None


def test_a_missing_object_names_its_url(bucket: Bucket) -> None:
    bucket.put("a/s0.h5", b"x")
    with pytest.raises(FileNotFoundError, match=r"s3://loaderkit-test/a/s9\.h5: no such object"):
        stat_objects([bucket.url("a/s9.h5")], bucket.options)
    with pytest.raises(FileNotFoundError, match=r"s3://loaderkit-test/z/s9\.h5: no such object"):
        stat_objects([bucket.url("z/s9.h5")], bucket.options)


def test_a_missing_bucket_names_bucket_and_url(bucket: Bucket) -> None:
    url = "s3://no-such-bucket/a/s0.h5"
    missing = "the bucket 'no-such-bucket' does not exist"
    with pytest.raises(FileNotFoundError, match=missing) as info:
        stat_objects([url], bucket.options)
    assert url in str(info.value)


def test_refused_credentials_name_the_url_and_the_fix(bucket: Bucket) -> None:
    url = bucket.put("a/s0.h5", b"x")
    options = {**bucket.options, "key": REFUSED_KEY}
    with pytest.raises(StorageAccessError) as info:
        stat_objects([url], options)
    assert isinstance(info.value, PermissionError)
    assert url in str(info.value) and '{"anon": True}' in str(info.value)


class _Forbidden(http.server.BaseHTTPRequestHandler):
    def do_HEAD(self) -> None:
        self.send_response(403)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def forbidden_http() -> Iterator[str]:
    pytest.importorskip("aiohttp")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Forbidden)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_http_403_is_an_access_error(forbidden_http: str) -> None:
    url = f"{forbidden_http}/data/s0.h5"
    with pytest.raises(StorageAccessError, match=r"s0\.h5: the store refused access"):
        stat_objects([url])


def test_http_objects_are_keyed_by_etag_else_last_modified(http_files: HTTPFileServer) -> None:
    path = http_files.root / "s0.h5"
    path.write_bytes(b"a" * 100)
    url = f"{http_files.url}/s0.h5"
    info = stat_objects([url])[url]
    assert (info.size, info.etag) == (100, hashlib.md5(b"a" * 100).hexdigest())
    assert info.mtime is not None  # from Last-Modified (an HTTP date)
    http_files.etag = False  # a plain web server: Last-Modified only
    before = stat_objects([url])[url]
    path.write_bytes(b"b" * 100)  # same size, other bytes, a later mtime
    os.utime(path, (before.mtime + 5, before.mtime + 5))  # type: ignore[operator]
    after = stat_objects([url])[url]
    assert before.etag is None and before.mtime is not None
    assert after.identity != before.identity  # the cache fetches the new version
    assert [r.method for r in http_files.log()] == ["HEAD"] * 3  # no byte read
