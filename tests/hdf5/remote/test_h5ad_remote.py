"""``.h5ad`` CSR keys over object stores and through the node cache (moto's S3 on 127.0.0.1).

The same files on disk and in the bucket (anndata's current encoding uncompressed and gzip,
the legacy ``h5sparse`` one): rows read through the cache equal the local files' rows, the
metadata (``indptr`` checked, var index) is read with range requests once and kept, workers
read from the cache, a damaged cached copy is fetched again, and mixed or damaged files are
refused by URL.
"""

from __future__ import annotations

import functools
import json
import os
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch

from loaderkit import DataLoader, HDF5SessionDataset, SessionCache
from loaderkit.errors import CacheRepairWarning, ConfigError, HDF5FileError
from tests.hdf5 import remotefiles as files
from tests.hdf5.remotefiles import Remote
from tests.storage.s3server import serving

anndata = pytest.importorskip("anndata")
pytest.importorskip("scipy.sparse")

from tests.hdf5.h5adfiles import GENE_NAMES, matrix, write_current, write_legacy  # noqa: E402

#: name -> how it is written: current encoding (chunked), current gzip, legacy gzip.
WRITERS = {
    "cells0.h5ad": lambda p: write_current(p, matrix(0)),
    "cells1.h5ad": lambda p: write_current(p, matrix(1), compression="gzip"),
    "cells2.h5ad": lambda p: write_legacy(p, matrix(2)),
}


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Remote]:
    root = tmp_path_factory.mktemp("h5ad-remote")
    with serving() as server:
        remote = Remote(server, root)
        remote.client().create_bucket(Bucket=files.BUCKET)
        for name, write in WRITERS.items():
            path = write(root / name)
            remote.paths.append(str(path))
            remote.urls.append(remote.put(name, path))
            remote.sizes.append(os.path.getsize(path))
        server.requests.clear()
        yield remote


@pytest.fixture(scope="module")
def truth(s3: Remote) -> np.ndarray:
    return np.concatenate([anndata.read_h5ad(p).X.toarray() for p in s3.paths])


def _cache(tmp_path: Path, **kwargs: Any) -> SessionCache:
    return SessionCache(tmp_path / "cache", room_timeout=20, **kwargs)


def _remote(s3: Remote, cache: SessionCache, **kwargs: Any) -> HDF5SessionDataset:
    return HDF5SessionDataset(s3.urls, key="X", storage_options=s3.options, cache=cache, **kwargs)


def _dense(batch: Any) -> np.ndarray:
    return batch.to_dense().numpy() if batch.layout != torch.strided else batch.numpy()


def _epoch(ds: HDF5SessionDataset, **kwargs: Any) -> list[np.ndarray]:
    with DataLoader(ds, batch_size=64, shuffle=True, seed=7, **kwargs) as loader:
        return [_dense(batch) for batch in loader]


def test_metadata_is_read_with_range_requests_once_and_kept(
    s3: Remote, tmp_path: Path, truth: np.ndarray
) -> None:
    cache = _cache(tmp_path)
    s3.server.requests.clear()
    ds = _remote(s3, cache)
    assert len(ds) == truth.shape[0] and ds.handles.n_vars == len(GENE_NAMES)
    assert ds.handles.var_names == GENE_NAMES
    assert all(s3.whole_gets(url) == 0 and s3.range_gets(url) for url in s3.urls)
    records = sorted((cache.dir / "meta").glob("*.json"))
    assert len(records) == len(s3.urls) and cache.ls() == []  # nothing fetched whole yet
    kept = [json.loads(r.read_text()) for r in records]
    assert all("CSRGroup" in json.dumps(k) for k in kept)
    s3.server.requests.clear()
    again = _remote(s3, cache, sparse="dense")  # kept records: one listing, no object read
    assert [(r.method, r.path) for r in s3.server.log()] == [("GET", f"/{files.BUCKET}")]
    for i in (0, 17, 199, 200, 401, len(again) - 1):
        assert np.array_equal(again[i], truth[i])
    ds.close()
    again.close()


@pytest.mark.parametrize("sparse", ["csr", "dense", "tokens"])
def test_rows_equal_the_local_files_in_every_form(s3: Remote, tmp_path: Path, sparse: str) -> None:
    genes = ["gene7", "gene3", "gene40"] if sparse == "dense" else None
    local = HDF5SessionDataset(s3.paths, key="X", sparse=sparse, genes=genes)
    ds = _remote(s3, _cache(tmp_path), sparse=sparse, genes=genes)
    order = np.random.default_rng(0).permutation(len(ds))[:150].tolist()
    got, want = ds.__getitems__(order), local.__getitems__(order)
    for a, b in zip(got, want, strict=True):
        if sparse == "tokens":
            assert all(torch.equal(a[k], b[k]) for k in ("genes", "values"))
        elif sparse == "csr":
            assert torch.equal(a.to_dense(), b.to_dense())
        else:
            assert np.array_equal(a, b) and a.shape == (3,)
    assert ds.handles.read_path == local.handles.read_path
    ds.close()
    local.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_loaders_read_what_local_files_give(
    s3: Remote, tmp_path: Path, truth: np.ndarray, workers: int
) -> None:
    reference = _epoch(HDF5SessionDataset(s3.paths, key="X"), num_workers=workers)
    ds = _remote(s3, _cache(tmp_path))
    s3.server.requests.clear()
    got = _epoch(ds, num_workers=workers, multiprocessing_context="fork" if workers else None)
    assert len(got) == len(reference)
    assert all(np.array_equal(a, b) for a, b in zip(got, reference, strict=True))
    rows = np.concatenate(got)
    assert np.array_equal(np.sort(rows, axis=0), np.sort(truth, axis=0))  # every row once
    assert all(s3.whole_gets(url) == 1 for url in s3.urls)  # each fetched once
    ds.close()


def test_local_paths_with_a_cache_are_copied(s3: Remote, tmp_path: Path, truth: np.ndarray) -> None:
    cache = _cache(tmp_path)
    with HDF5SessionDataset(s3.paths, key="X", sparse="dense", cache=cache) as ds:
        assert np.array_equal(np.stack([ds[i] for i in range(len(ds))]), truth)
        assert sorted(entry.url for entry in cache.ls()) == sorted(s3.paths)


def test_a_rows_layout_cache_reads_the_same_rows(
    s3: Remote, tmp_path: Path, truth: np.ndarray
) -> None:
    cache = _cache(tmp_path, layout="rows")
    with _remote(s3, cache, sparse="dense") as ds:
        got = np.concatenate(_epoch(ds))
        assert np.array_equal(np.sort(got, axis=0), np.sort(truth, axis=0))
        assert [entry.layout for entry in cache.ls()] == ["rows"] * len(s3.urls)


def _damage(path: Path, how: str) -> None:
    time.sleep(0.02)  # past the filesystem's timestamp granularity
    if how == "truncate":
        os.truncate(path, path.stat().st_size // 3)
        return
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        f.write(os.urandom(2048))


def _record_repairs(path: Path, worker_id: int) -> None:
    """A worker's ``CacheRepairWarning``s, every one, appended to ``path`` (any start method)."""

    def show(message: Any, category: Any, *args: Any, **kwargs: Any) -> None:
        if issubclass(category, CacheRepairWarning):
            with open(path, "a") as f:
                f.write(f"{message}\n")

    warnings.simplefilter("always", CacheRepairWarning)
    warnings.showwarning = show


@pytest.mark.parametrize(("how", "workers"), [("truncate", 0), ("middle", 2)])
def test_a_damaged_cached_copy_is_fetched_again_once(
    s3: Remote, tmp_path: Path, how: str, workers: int
) -> None:
    reference = _epoch(HDF5SessionDataset(s3.paths, key="X"))
    cache = _cache(tmp_path)
    with _remote(s3, cache) as ds:
        ds.__getitems__(list(range(len(ds))))
    (entry,) = [entry for entry in cache.ls() if entry.url == s3.urls[1]]
    _damage(entry.path, how)
    s3.server.requests.clear()
    # the process that first opens the damaged copy repairs it and warns: the main process
    # (its prefetch) or a worker, whose warnings its worker_init_fn records
    in_workers = tmp_path / "worker-repairs.txt"
    init = {"worker_init_fn": functools.partial(_record_repairs, in_workers)} if workers else {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CacheRepairWarning)
        got = _epoch(_remote(s3, cache), num_workers=workers, **init)
    assert all(np.array_equal(a, b) for a, b in zip(got, reference, strict=True))
    assert [s3.whole_gets(url) for url in s3.urls] == [0, 1, 0]
    repaired = [str(w.message) for w in caught if issubclass(w.category, CacheRepairWarning)]
    if in_workers.exists():
        repaired += in_workers.read_text().splitlines()
    assert repaired and all(s3.urls[1] in message for message in repaired)


def test_mixed_encodings_var_mismatch_and_damage_are_named_by_url(
    s3: Remote, tmp_path: Path
) -> None:
    dense = tmp_path / "dense.h5ad"
    anndata.AnnData(X=matrix(3).toarray()).write_h5ad(dense)
    renamed = tmp_path / "renamed.h5ad"
    other = anndata.read_h5ad(s3.paths[0])
    other.var_names = ["x" + n if n == "gene9" else n for n in GENE_NAMES]
    other.write_h5ad(renamed)
    broken = write_legacy(tmp_path / "broken.h5ad", matrix(4), compression=None)
    with h5py.File(broken, "r+") as f:
        f["X/indptr"][4] = f["X/indptr"][6]
    urls = {p.name: s3.put(f"odd/{p.name}", p) for p in (dense, renamed, broken)}
    cache = _cache(tmp_path)

    def build(*names: str) -> None:
        HDF5SessionDataset(list(names), key="X", storage_options=s3.options, cache=cache)

    with pytest.raises(ConfigError, match=rf"{urls['dense.h5ad']}\) is not a CSR matrix"):
        build(s3.urls[0], urls["dense.h5ad"])
    with pytest.raises(ConfigError, match=rf"{s3.urls[0]}\) is a CSR matrix, but not in"):
        build(urls["dense.h5ad"], s3.urls[0])
    with pytest.raises(ConfigError, match=rf"{urls['renamed.h5ad']}.*position 9 holds 'xgene9'"):
        build(s3.urls[0], urls["renamed.h5ad"])
    with pytest.raises(HDF5FileError, match=rf"{urls['broken.h5ad']}.*row 4 ends before"):
        build(s3.urls[0], urls["broken.h5ad"])
    # a local file beside the URLs, read in place: checked the same way
    with pytest.raises(ConfigError, match=rf"{dense}\) is not a CSR matrix"):
        HDF5SessionDataset([s3.urls[0], dense], key="X", storage_options=s3.options, cache=cache)
