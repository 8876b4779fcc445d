"""HDF5SessionDataset over ``http://`` URLs: a real HTTP server with Range support on 127.0.0.1.

The server (``tests.storage.httpserver``) counts every request: the index comes from HEADs and
Range GETs only, a second construction sends only the HEADs, samples equal the local files'.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from loaderkit import DataLoader, HDF5SessionDataset, SessionCache
from tests.hdf5 import remotefiles as files
from tests.hdf5.remotefiles import rows
from tests.storage.httpserver import HTTPFileServer

SESSIONS = 3


@pytest.fixture(scope="module")
def web(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HTTPFileServer]:
    pytest.importorskip("aiohttp")  # fsspec's http filesystem
    pytest.importorskip("fsspec")
    root = tmp_path_factory.mktemp("www")
    for s in range(SESSIONS):
        files.write_session(root / f"betas_session{s:02d}.hdf5", s)
    server = HTTPFileServer(root)
    try:
        yield server
    finally:
        server.close()


def _names() -> list[str]:
    return [f"betas_session{s:02d}.hdf5" for s in range(SESSIONS)]


@pytest.mark.parametrize("etag", [True, False], ids=["etag", "last-modified"])
def test_http_urls_index_from_range_reads_and_read_like_local_files(
    web: HTTPFileServer, tmp_path: Path, etag: bool
) -> None:
    web.etag = etag  # without: the object's version is its size and Last-Modified
    names = _names()
    urls = [f"{web.url}/{name}" for name in names]
    paths = [str(web.root / name) for name in names]
    cache = SessionCache(tmp_path / "cache", room_timeout=20)
    web.requests.clear()
    ds = HDF5SessionDataset(urls, key="x", cache=cache)
    assert len(ds) == SESSIONS * files.ROWS and ds.files == dict(enumerate(urls))
    for name in names:
        gets = web.gets(name)
        assert gets and all(r.range is not None for r in gets)  # no whole GET
        size = (web.root / name).stat().st_size
        fetched = sum(int(b) - int(a) + 1 for a, b in (r.range[6:].split("-") for r in gets))  # type: ignore[index]
        assert fetched < size
    assert cache.ls() == []
    web.requests.clear()
    again = HDF5SessionDataset(urls, key="x", cache=cache)  # records kept: HEADs only
    assert {r.method for r in web.log()} == {"HEAD"} and len(web.log()) == SESSIONS
    local = HDF5SessionDataset(paths, key="x")
    order = np.random.default_rng(0).permutation(len(ds))[:40].tolist()
    assert np.array_equal(np.stack(again.__getitems__(order)), np.stack(local.__getitems__(order)))
    with DataLoader(ds, batch_size=16, shuffle=True, seed=1) as loader:
        got = [rows(batch) for batch in loader]
    with DataLoader(local, batch_size=16, shuffle=True, seed=1) as loader:
        assert got == [rows(batch) for batch in loader]
    assert all(web.whole_gets(name) == 1 for name in names)  # each downloaded once
    listed = sorted(cache.ls(), key=lambda entry: entry.url)
    assert all((entry.etag is not None) == etag for entry in listed)  # MD5-verified when given
    assert [entry.size for entry in listed] == [(web.root / name).stat().st_size for name in names]
    for dataset in (ds, again, local):
        dataset.close()
    web.etag = True
