"""``loaderkit rechunk``: copies with the key stored row by row, everything else as it was.

Real files with extra datasets, groups, attributes and links; compressed sources; refusals
(a missing key, the output directory holding a source, by path, symlink or hard link); a
failure in the middle of writing leaves no file under the final name; memory stays within
the block budget; the command line prints a table and exits 1 naming the file and key.
``.h5ad`` files written by anndata with gzip: a CSR group's values copied uncompressed,
anndata and loaderkit reading the copy as the source; CSC and damaged groups named.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import h5py
import hdf5plugin
import numpy as np
import pytest

from loaderkit import ConfigError, HDF5FileError, HDF5SessionDataset, PerformanceHint
from loaderkit.cli import build_parser, main
from loaderkit.hdf5 import RechunkResult, rechunk
from loaderkit.hdf5.convert.blockcopy import verify_copy as _verify
from tests.hdf5.helpers import write_wide

ROOT = Path(__file__).resolve().parents[3]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _rich_session(path: Path, *, compression: Any = None, dtype: str = "<i2") -> np.ndarray:
    """An NSD-like session file with more than the betas: groups, attributes, links."""
    betas = (np.arange(40 * 300).reshape(40, 300) % 3001 - 1500).astype(dtype)
    with h5py.File(path, "w") as f:
        f.attrs["subject"] = "subj01"
        f.attrs["scale"] = np.float32(300)
        f.attrs["runs"] = np.arange(12, dtype=">i4")
        f.attrs["empty"] = h5py.Empty("S1")
        d = f.create_dataset(
            "betas", data=betas, chunks=(40, 1), compression=compression, fillvalue=-7
        )
        d.attrs["units"] = np.bytes_(b"psc x 300")
        d.attrs["shape_note"] = "trials x voxels"
        meta = f.create_group("meta")
        meta.attrs["made_by"] = "matlab h5create"
        meta.create_dataset("trial_onsets", data=np.linspace(0, 1, 40), compression="gzip")
        meta.create_dataset("names", data=np.array([b"a", b"bb", b"ccc"]))
        deep = meta.create_group("deep/er")
        deep.create_dataset(
            "ragged",
            data=np.array([np.arange(3), np.arange(1)], dtype=object),
            dtype=h5py.vlen_dtype("i8"),
        )
        f["link_to_onsets"] = h5py.SoftLink("/meta/trial_onsets")
        f["elsewhere"] = h5py.ExternalLink("other.h5", "/x")
    return betas


def _attrs(obj: Any) -> dict[str, Any]:
    out = {}
    for name in obj.attrs:
        value = obj.attrs[name]
        dtype = None if isinstance(value, h5py.Empty) else obj.attrs.get_id(name).dtype
        out[name] = (
            repr(value) if isinstance(value, h5py.Empty) else np.asarray(value).tolist(),
            dtype,
        )
    return out


def test_the_copy_holds_everything_with_the_key_contiguous(tmp_path: Path) -> None:
    src_dir, out = tmp_path / "src", tmp_path / "rows"
    src_dir.mkdir()
    paths = [src_dir / f"betas_session{s:02d}.hdf5" for s in (1, 2)]
    betas = [_rich_session(p) for p in paths]
    before = [_digest(p) for p in paths]
    results = rechunk(paths, "betas", out)
    assert [r.target for r in results] == [out / p.name for p in paths]
    assert all(isinstance(r, RechunkResult) and r.layout == "contiguous" for r in results)
    assert [_digest(p) for p in paths] == before  # sources untouched
    assert sorted(os.listdir(out)) == [p.name for p in paths]  # no temporary left behind
    for path, want in zip(paths, betas, strict=True):
        with h5py.File(path) as a, h5py.File(out / path.name) as b:
            assert b["betas"].chunks is None and b["betas"].compression is None
            assert b["betas"].dtype == a["betas"].dtype and b["betas"].fillvalue == -7
            np.testing.assert_array_equal(b["betas"][...], want)
            for name in ["", "betas", "meta", "meta/deep/er"]:
                assert _attrs(b[name] if name else b) == _attrs(a[name] if name else a), name
            assert b.get("link_to_onsets", getlink=True).path == "/meta/trial_onsets"
            ext = b.get("elsewhere", getlink=True)
            assert (ext.filename, ext.path) == ("other.h5", "/x")
            assert b["meta/trial_onsets"].compression == "gzip"
            np.testing.assert_array_equal(b["meta/trial_onsets"][...], a["meta/trial_onsets"])
            assert [list(r) for r in b["meta/deep/er/ragged"][...]] == [[0, 1, 2], [0]]
            assert list(b["meta/names"][...]) == [b"a", b"bb", b"ccc"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", PerformanceHint)  # rows are whole now: no hint
        ds = HDF5SessionDataset([out / p.name for p in paths], key="betas")
    np.testing.assert_array_equal(ds[41], betas[1][1])
    ds.close()


@pytest.mark.parametrize(
    "layout",
    [
        dict(rows=30, row_shape=(5, 6, 4)),  # a volume: chunks (30, 1, 1, 1)
        dict(rows=40, row_shape=(200,), chunk_rows=16, dtype=">i2"),  # bands, big-endian
        dict(rows=40, row_shape=(120,), skip_chunk=True),  # an unwritten chunk: fill value
    ],
    ids=["volume", "bands-big-endian", "unwritten"],
)
def test_other_shapes_and_types(tmp_path: Path, layout: dict[str, Any]) -> None:
    paths, arrays = write_wide(tmp_path / "src", 2, **layout)
    results = rechunk(paths, "betas", tmp_path / "out", block_bytes=4096)  # many blocks
    for result, want in zip(results, arrays, strict=True):
        with h5py.File(result.source) as a, h5py.File(result.target) as b:
            assert b["betas"].dtype == a["betas"].dtype and b["betas"].chunks is None
            np.testing.assert_array_equal(b["betas"][...], want)


@pytest.mark.parametrize(
    "compression", ["gzip", hdf5plugin.Blosc(cname="lz4")], ids=["gzip", "blosc"]
)
def test_a_compressed_source_keeps_its_filters_in_chunks_of_whole_rows(
    tmp_path: Path, compression: Any
) -> None:
    src = tmp_path / "betas_session01.hdf5"
    kwargs = dict(compression) if isinstance(compression, hdf5plugin.Blosc) else {}
    betas = (np.arange(40 * 300).reshape(40, 300) % 3001).astype("<i2")
    with h5py.File(src, "w") as f:
        if kwargs:
            f.create_dataset("betas", data=betas, chunks=(40, 1), **kwargs)
        else:
            f.create_dataset("betas", data=betas, chunks=(40, 1), compression=compression)
        filters = f["betas"].id.get_create_plist().get_nfilters()
    [result] = rechunk([src], "betas", tmp_path / "out", chunk_bytes=600 * 8)
    assert result.layout == "chunks (8, 300)"
    with h5py.File(result.target) as f:
        d = f["betas"]
        assert d.chunks == (8, 300)  # whole rows, about chunk_bytes each
        assert d.id.get_create_plist().get_nfilters() == filters
        np.testing.assert_array_equal(d[...], betas)
    with pytest.raises(ConfigError, match=r"layout='contiguous'.*needs chunks"):
        rechunk([src], "betas", tmp_path / "out2", layout="contiguous")
    chunked = rechunk([src], "betas", tmp_path / "out3", layout="chunked")[0]
    assert chunked.layout == "chunks (40, 300)"  # 1 MiB holds every row


def test_uncompressed_sources_can_be_chunked_too(tmp_path: Path) -> None:
    paths, arrays = write_wide(tmp_path / "src", 1, 40, (300,))
    [result] = rechunk(paths, "betas", tmp_path / "out", layout="chunked", chunk_bytes=6000)
    with h5py.File(result.target) as f:
        assert f["betas"].chunks == (10, 300)
        np.testing.assert_array_equal(f["betas"][...], arrays[0])


def test_a_missing_key_names_the_file_and_writes_nothing(tmp_path: Path) -> None:
    good, _ = write_wide(tmp_path / "src", 1, 10, (50,))
    bad = tmp_path / "src" / "other.hdf5"
    with h5py.File(bad, "w") as f:
        f.create_dataset("data", data=np.zeros((3, 3)))
    out = tmp_path / "out"
    with pytest.raises(KeyError, match=r"other\.hdf5 has no dataset 'betas'.*'data'"):
        rechunk([*good, bad], "betas", out)
    assert not out.exists()  # checked before anything is written
    with h5py.File(bad, "a") as f:
        f.create_group("grp")
    with pytest.raises(KeyError, match=r"no dataset 'grp' \(a group\)"):
        rechunk([bad], "grp", out)


@pytest.mark.parametrize("how", ["same-dir", "symlinked-dir", "hard-link", "symlink"])
def test_it_refuses_to_write_over_a_source(tmp_path: Path, how: str) -> None:
    paths, _ = write_wide(tmp_path / "src", 2, 10, (50,))
    before = [_digest(p) for p in paths]
    out = tmp_path / "src"
    if how == "symlinked-dir":
        out = tmp_path / "alias"
        out.symlink_to(tmp_path / "src")
    elif how in ("hard-link", "symlink"):
        out = tmp_path / "out"
        out.mkdir()
        link = out / paths[1].name
        if how == "hard-link":
            os.link(paths[1], link)
        else:
            link.symlink_to(paths[1])
    with pytest.raises(ConfigError, match="refusing to write over a source"):
        rechunk(paths, "betas", out)
    assert [_digest(p) for p in paths] == before
    leftovers = [n for n in os.listdir(tmp_path / "src") if n.startswith(".")]
    assert leftovers == []


def test_an_existing_copy_is_kept_unless_overwrite(tmp_path: Path) -> None:
    paths, arrays = write_wide(tmp_path / "src", 1, 10, (50,))
    out = tmp_path / "out"
    out.mkdir()
    (out / paths[0].name).write_bytes(b"old copy")
    with pytest.raises(FileExistsError, match=r"already exists.*overwrite=True"):
        rechunk(paths, "betas", out)
    assert (out / paths[0].name).read_bytes() == b"old copy"
    rechunk(paths, "betas", out, overwrite=True)
    with h5py.File(out / paths[0].name) as f:
        np.testing.assert_array_equal(f["betas"][...], arrays[0])


def test_two_sources_with_one_name_are_refused(tmp_path: Path) -> None:
    a, _ = write_wide(tmp_path / "a", 1, 10, (50,))
    b, _ = write_wide(tmp_path / "b", 1, 10, (50,))
    with pytest.raises(ConfigError, match="have the same name"):
        rechunk([*a, *b], "betas", tmp_path / "out")


def test_a_failure_in_the_middle_leaves_no_final_file(tmp_path: Path) -> None:
    # a damaged chunk (Fletcher-32) half way through the source: the read fails mid-write
    src = tmp_path / "src" / "betas_session01.hdf5"
    src.parent.mkdir()
    betas = (np.arange(40 * 300).reshape(40, 300) % 999).astype("<i2")
    with h5py.File(src, "w") as f:
        d = f.create_dataset("betas", data=betas, chunks=(40, 1), fletcher32=True)
        offset = d.id.get_chunk_info_by_coord((0, 200)).byte_offset + 3
    with open(src, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))
    out = tmp_path / "out"
    seen: list[int] = []
    with pytest.raises(OSError):
        rechunk(
            [src], "betas", out, block_bytes=40 * 2 * 50, progress=lambda d, n, t: seen.append(n)
        )
    assert seen and seen[-1] < betas.nbytes  # it had started writing
    assert os.listdir(out) == []  # neither the final name nor a temporary

    # an interruption (Ctrl-C) while writing the second file
    paths, _ = write_wide(tmp_path / "more", 2, 40, (300,))

    def interrupt(description: str, done: int, total: int) -> None:
        if description.startswith(paths[1].name) and done > total // 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        rechunk(paths, "betas", tmp_path / "out2", block_bytes=40 * 2 * 20, progress=interrupt)
    assert os.listdir(tmp_path / "out2") == [paths[0].name]  # the first one, whole


def test_verification_names_what_differs(tmp_path: Path) -> None:
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    for path, value in ((a, 1), (b, 2)):
        with h5py.File(path, "w") as f:
            f.create_dataset("betas", data=np.zeros((4, 3)))
            f.create_dataset("meta/x", data=np.full(5, value))
            f.create_dataset("meta/scalar", data=f"v{value}")  # as anndata's uns strings
            f.attrs["v"] = value
    with h5py.File(a) as fa, h5py.File(b) as fb:
        with pytest.raises(
            HDF5FileError, match=r"attributes of '/'.*values of 'meta/scalar'.*values of 'meta/x'"
        ):
            _verify(fa, fb, "betas", 1 << 20, lambda *args: None)


_MEMORY = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from loaderkit.hdf5 import rechunk
    from tests.hdf5.helpers import _reset_peak_rss, peak_rss
    import psutil
    rss = psutil.Process().memory_info().rss
    _reset_peak_rss()
    block = int(sys.argv[4]) << 20
    rechunk([sys.argv[1]], "betas", sys.argv[2], block_bytes=block, layout=sys.argv[3])
    print(peak_rss() - rss)
    """
)


def _rows_session(path: Path) -> Path:
    """A 96 MB session stored in chunks of whole rows (3.2 MB each): blocks of 32 MiB."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        d = f.create_dataset("betas", (600, 80000), "<i2", chunks=(20, 80000))
        for lo in range(0, 600, 20):
            d[lo : lo + 20] = np.random.default_rng(lo).integers(-1500, 1500, (20, 80000))
    return path


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak RSS reset is Linux's")
# slow tier: copies of 96 MB files measured by peak RSS (rechunk's values and layout: fast above)
@pytest.mark.slow
@pytest.mark.parametrize(
    ("chunks", "layout", "block_mib", "slack_mib"),
    [
        # column chunks (600, 1): a block is at most 4,096 chunks (4.7 MiB), read raw
        ("columns", "contiguous", 8, 32),
        ("columns", "chunked", 8, 40),
        # chunks of whole rows: blocks of 32 MiB; verification compares two at once
        ("rows", "contiguous", 32, 32),
        ("rows", "chunked", 32, 32),
    ],
)
def test_memory_stays_within_the_block_budget(
    tmp_path: Path, chunks: str, layout: str, block_mib: int, slack_mib: int
) -> None:
    """A 96 MB session rewritten: the process grows by about 2 blocks, not by the file."""
    if chunks == "columns":
        path = write_wide(tmp_path / "src", 1, 600, (80000,))[0][0]
    else:
        path = _rows_session(tmp_path / "src" / "rows.h5")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    run = subprocess.run(
        [sys.executable, "-c", _MEMORY, str(path), str(tmp_path / "out"), layout, str(block_mib)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=False,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    grown = int(run.stdout.split()[-1])
    # two blocks (verification: the source's and the copy's) and a fixed 10-20 MiB (HDF5's
    # caches, staging and comparison slices); measured for rows: 72 and 83 MiB (133 MiB
    # when verification held four blocks and a comparison's temporary)
    assert grown < (2 * block_mib + slack_mib) << 20, grown >> 20


# ------------------------------------------------------------------ the command line


def test_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths, arrays = write_wide(tmp_path / "src", 2, 20, (100,))
    out = tmp_path / "out"
    code = main(["rechunk", "--key", "betas", "--out", str(out), "--no-progress", *map(str, paths)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "contiguous" in captured.out and "|" not in captured.out.splitlines()[0]
    assert "2 files rewritten and verified" in captured.out
    with h5py.File(out / paths[1].name) as f:
        np.testing.assert_array_equal(f["betas"][...], arrays[1])

    code = main(["rechunk", "--key", "nope", "--out", str(tmp_path / "o2"), str(paths[0])])
    err = capsys.readouterr().err
    assert code == 1 and "has no dataset 'nope'" in err and str(paths[0]) in err
    code = main(["rechunk", "--key", "betas", "--out", str(tmp_path / "src"), str(paths[0])])
    assert code == 1 and "refusing to write over a source" in capsys.readouterr().err

    text = build_parser().format_help()
    assert "rechunk" in text and "row by row" in text


def test_the_installed_command_shows_progress(tmp_path: Path) -> None:
    paths, _ = write_wide(tmp_path / "src", 1, 20, (100,))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "loaderkit",
            "rechunk",
            "--key",
            "betas",
            "--out",
            str(tmp_path / "out"),
            str(paths[0]),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "writing" in run.stderr and "verifying" in run.stderr  # tqdm bars, on stderr


# ------------------------------------------------------------------ .h5ad CSR groups


def _h5ad(path: Path, *, dense: bool = False, compression: str | None = "gzip") -> Path:
    """An ``.h5ad`` written by anndata: X (CSR, or dense), layers, raw, obs, var, obsm, uns."""
    anndata = pytest.importorskip("anndata")
    import pandas as pd
    import scipy.sparse as sp

    m = sp.random(700, 300, density=0.08, format="csr", dtype=np.float32, random_state=3)
    m.data = np.ceil(m.data * 20).astype(np.float32)
    m = sp.csr_matrix(sp.diags((np.arange(700) % 13 != 0).astype(np.float32)) @ m)
    m.eliminate_zeros()  # every 13th cell empty: spans of length 0
    obs = pd.DataFrame(
        {"cell_type": pd.Categorical(np.array(["B", "T", "NK"])[np.arange(700) % 3])},
        index=[f"c{i}" for i in range(700)],
    )
    obs["n_counts"] = np.asarray(m.sum(axis=1), np.float32).ravel()
    adata = anndata.AnnData(
        X=m.toarray() if dense else m,
        obs=obs,
        var=pd.DataFrame(index=[f"g{i}" for i in range(300)]),
    )
    adata.layers["counts"] = (m * 2).tocsr()
    adata.layers["dense"] = (m * 3).toarray()
    adata.obsm["X_pca"] = np.arange(700 * 4, dtype=np.float32).reshape(700, 4)
    adata.uns["note"] = {"what": "test", "values": np.arange(5)}
    adata.raw = adata
    path.parent.mkdir(parents=True, exist_ok=True)
    adata.write_h5ad(path, compression=compression)
    return path


def _assert_same_anndata(a: Any, b: Any) -> None:
    import pandas as pd
    import scipy.sparse as sp

    def same(x: Any, y: Any) -> None:
        assert type(x) is type(y) and x.dtype == y.dtype and x.shape == y.shape
        if sp.issparse(x):
            x, y = x.toarray(), y.toarray()
        np.testing.assert_array_equal(x, y)

    same(a.X, b.X)
    pd.testing.assert_frame_equal(a.obs, b.obs)
    pd.testing.assert_frame_equal(a.var, b.var)
    assert set(a.layers) == set(b.layers) and set(a.obsm) == set(b.obsm)  # anndata 0.13: None is X
    for name in a.layers:
        same(a.layers[name], b.layers[name])
    for name in a.obsm:
        same(a.obsm[name], b.obsm[name])
    assert a.uns["note"]["what"] == b.uns["note"]["what"]
    np.testing.assert_array_equal(a.uns["note"]["values"], b.uns["note"]["values"])
    same(a.raw.X, b.raw.X)
    pd.testing.assert_frame_equal(a.raw.var, b.raw.var)


def _filters(dset: h5py.Dataset) -> int:
    return int(dset.id.get_create_plist().get_nfilters())


@pytest.mark.parametrize("key", ["X", "layers/counts", "raw/X"])
def test_a_gzip_h5ad_csr_group_is_copied_with_its_values_uncompressed(
    tmp_path: Path, key: str
) -> None:
    anndata = pytest.importorskip("anndata")
    src = _h5ad(tmp_path / "src" / "pbmc.h5ad")
    with h5py.File(src) as f:
        assert _filters(f[f"{key}/data"]) > 0 and f[f"{key}/data"].chunks  # as stored: gzip
        nnz = f[f"{key}/data"].shape[0]
    seen: list[tuple[str, int, int]] = []
    (result,) = rechunk(
        [src], key, tmp_path / "out", block_bytes=4096, progress=lambda *a: seen.append(a)
    )
    assert result.key == key and result.shape == (700, 300)
    assert result.layout == "CSR values contiguous"
    with h5py.File(src) as f, h5py.File(result.target) as g:
        for name in ("data", "indices"):
            copy = g[f"{key}/{name}"]
            assert copy.chunks is None and _filters(copy) == 0  # raw bytes, one read a run
            assert copy.dtype == f[f"{key}/{name}"].dtype and copy.shape == (nnz,)
        assert result.nbytes == nnz * (g[f"{key}/data"].dtype.itemsize + copy.dtype.itemsize)
        indptr = g[f"{key}/indptr"]  # as it was: its chunks and gzip kept
        assert indptr.chunks == f[f"{key}/indptr"].chunks and _filters(indptr) > 0
        assert _attrs(g[key]) == _attrs(f[key])
        other = "raw/X" if key != "raw/X" else "X"  # the other matrices as they were
        assert _filters(g[f"{other}/data"]) > 0
    writes = [done for what, done, _ in seen if what.endswith("writing")]
    assert len(writes) > 10 and writes == sorted(writes)  # slices of at most 4 KiB
    _assert_same_anndata(anndata.read_h5ad(result.target), anndata.read_h5ad(src))

    want = anndata.read_h5ad(src)
    want = {"X": want.X, "layers/counts": want.layers["counts"], "raw/X": want.raw.X}[key]
    rows = np.arange(0, 700, 7)
    with (
        HDF5SessionDataset([src], key=key, sparse="dense") as before,
        HDF5SessionDataset([result.target], key=key, sparse="dense") as after,
    ):
        got = np.stack([np.asarray(after[int(i)]) for i in rows])
        np.testing.assert_array_equal(got, want[rows].toarray())
        np.testing.assert_array_equal(got, np.stack([np.asarray(before[int(i)]) for i in rows]))


def test_a_csr_group_in_chunks_keeps_its_maximum_shape(tmp_path: Path) -> None:
    anndata = pytest.importorskip("anndata")
    src = _h5ad(tmp_path / "src" / "a.h5ad")
    (result,) = rechunk([src], "X", tmp_path / "out", layout="chunked", chunk_bytes=8192)
    with h5py.File(src) as f, h5py.File(result.target) as g:
        data, stored = g["X/data"], f["X/data"]
        assert _filters(data) == 0 and data.chunks is not None
        assert data.chunks[0] % stored.chunks[0] == 0  # whole source chunks
        assert data.chunks[0] * 4 <= max(8192, 4 * stored.chunks[0])
        assert data.maxshape == stored.maxshape
    assert result.layout == f"CSR values chunks {data.chunks}"
    _assert_same_anndata(anndata.read_h5ad(result.target), anndata.read_h5ad(src))


def test_legacy_and_empty_csr_groups(tmp_path: Path) -> None:
    import scipy.sparse as sp

    from tests.hdf5.h5adfiles import matrix, write_csr, write_legacy

    legacy = write_legacy(tmp_path / "legacy.h5ad", matrix(1))
    (result,) = rechunk([legacy], "raw.X", tmp_path / "out")
    with h5py.File(result.target) as g:
        assert g["raw.X/data"].chunks is None and g["raw.X"].attrs["h5sparse_format"] == "csr"
    with HDF5SessionDataset([result.target], key="raw.X", sparse="dense") as ds:
        np.testing.assert_array_equal(ds[5], matrix(1)[5].toarray()[0])
    empty = write_csr(tmp_path / "empty.h5ad", sp.csr_matrix((4, 3), dtype=np.float32))
    (result,) = rechunk([empty], "X", tmp_path / "out")
    with h5py.File(result.target) as g:
        assert g["X/data"].shape == (0,) and g["X/indptr"][-1] == 0


def test_a_dense_h5ad_matrix_is_rewritten_as_any_dataset(tmp_path: Path) -> None:
    anndata = pytest.importorskip("anndata")
    src = _h5ad(tmp_path / "src" / "dense.h5ad", dense=True)
    (result,) = rechunk([src], "X", tmp_path / "out")
    with h5py.File(result.target) as g:  # compressed: chunks of whole rows, gzip kept
        assert g["X"].chunks[1] == 300 and _filters(g["X"]) > 0
    _assert_same_anndata(anndata.read_h5ad(result.target), anndata.read_h5ad(src))
    (result,) = rechunk([src], "layers/dense", tmp_path / "layer")
    _assert_same_anndata(anndata.read_h5ad(result.target), anndata.read_h5ad(src))


def test_matrix_groups_rechunk_cannot_copy_are_refused_by_name(tmp_path: Path) -> None:
    anndata = pytest.importorskip("anndata")
    import scipy.sparse as sp

    path = tmp_path / "csc.h5ad"
    anndata.AnnData(X=sp.random(20, 10, density=0.3, format="csc", dtype=np.float32)).write_h5ad(
        path
    )
    with pytest.raises(ConfigError, match=r"key 'X' of session 'csc.h5ad' .* CSC sparse matrix"):
        rechunk([path], "X", tmp_path / "out")
    with pytest.raises(KeyError, match=r"no dataset 'obs' \(a group\).*CSR matrix group"):
        rechunk([path], "obs", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_damaged_csr_source_is_named_and_nothing_is_written(tmp_path: Path) -> None:
    src = _h5ad(tmp_path / "src" / "a.h5ad")
    out = tmp_path / "out"
    # indptr past the stored values: refused before anything is written
    bad = tmp_path / "bad" / "a.h5ad"
    bad.parent.mkdir()
    bad.write_bytes(src.read_bytes())
    with h5py.File(bad, "r+") as f:
        f["X/indptr"][-1] = f["X/data"].shape[0] + 5
    with pytest.raises(HDF5FileError, match=r"key 'X' .*a\.h5ad.*row 699 ends at .* past"):
        rechunk([bad], "X", out)
    assert not out.exists()
    # a damaged gzip chunk half way through X/data: the read fails mid-write, named
    with h5py.File(src) as f:
        data = f["X/data"]
        info = data.id.get_chunk_info(data.id.get_num_chunks() // 2)
    with open(src, "r+b") as fh:
        fh.seek(info.byte_offset + info.size // 2)
        fh.write(bytes(64))
    seen: list[int] = []
    with pytest.raises(HDF5FileError, match=r"cannot read elements \d+\.\.\d+ of '/X/data'"):
        rechunk([src], "X", out, block_bytes=2048, progress=lambda d, n, t: seen.append(n))
    assert seen  # it had started writing
    assert os.listdir(out) == []  # neither the final name nor a temporary
    # a truncated file: named, with what to do
    cut = tmp_path / "cut" / "a.h5ad"
    cut.parent.mkdir()
    cut.write_bytes(bad.read_bytes()[: bad.stat().st_size * 2 // 3])
    with pytest.raises(HDF5FileError, match=r"cannot open .*cut/a\.h5ad as HDF5"):
        rechunk([cut], "X", out)


_CSR_MEMORY = textwrap.dedent(
    """
    import sys
    from loaderkit.hdf5 import rechunk
    from tests.hdf5.helpers import _reset_peak_rss, peak_rss
    import psutil
    rss = psutil.Process().memory_info().rss
    _reset_peak_rss()
    rechunk([sys.argv[1]], ["X", "layers/counts"], sys.argv[2], block_bytes=16 << 20)
    print(peak_rss() - rss)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak RSS reset is Linux's")
@pytest.mark.slow  # two 80 MB gzip CSR groups copied and verified, measured by peak RSS
def test_a_csr_copy_stays_within_the_block_budget(tmp_path: Path) -> None:
    """X and layers/counts in one copy with 16 MiB blocks: the process grows by about 2."""
    rng = np.random.default_rng(0)
    nnz, cells = 10_000_000, 20_000
    src = tmp_path / "big.h5ad"
    with h5py.File(src, "w") as f:  # anndata's CSR group, gzip values written in slices
        x = f.create_group("X")
        x.attrs.update({"encoding-type": "csr_matrix", "encoding-version": "0.1.0"})
        x.attrs["shape"] = np.array([cells, 5000])
        for name, dtype in (("data", "f4"), ("indices", "i4")):
            d = x.create_dataset(
                name, (nnz,), dtype, chunks=(16384,), compression="gzip", maxshape=(None,)
            )
            for lo in range(0, nnz, 1 << 20):
                hi = min(nnz, lo + (1 << 20))
                d[lo:hi] = rng.integers(0, 5000, hi - lo).astype(dtype)
        x.create_dataset("indptr", data=np.linspace(0, nnz, cells + 1).astype(np.int64))
        f.copy(x, f.create_group("layers"), name="counts")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    run = subprocess.run(
        [sys.executable, "-c", _CSR_MEMORY, str(src), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=False,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    grown = int(run.stdout.split()[-1])
    # 160 MB of values; two 16 MiB blocks (verification), HDF5's own state (measured 48 MiB)
    assert grown < (2 * 16 + 32) << 20, grown >> 20
    with h5py.File(tmp_path / "out" / "big.h5ad") as f:
        for key in ("X", "layers/counts"):
            assert f[f"{key}/data"].chunks is None and f[f"{key}/indices"].shape == (nnz,)


def test_the_command_line_rewrites_a_csr_group(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    anndata = pytest.importorskip("anndata")
    src = _h5ad(tmp_path / "src" / "a.h5ad")
    out = tmp_path / "out"
    code = main(["rechunk", "--key", "X", "--out", str(out), "--no-progress", str(src)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "CSR values contiguous" in captured.out and "700x300" in captured.out
    _assert_same_anndata(anndata.read_h5ad(out / "a.h5ad"), anndata.read_h5ad(src))
    with pytest.raises(SystemExit) as exited:
        main(["rechunk", "--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "CSR matrix group" in text and "uncompressed" in text


# ------------------------------------------------------------------ several keys, one copy


def test_several_keys_are_rewritten_in_one_copy(tmp_path: Path) -> None:
    anndata = pytest.importorskip("anndata")
    src = _h5ad(tmp_path / "src" / "pbmc.h5ad")
    out = tmp_path / "out"
    seen: list[tuple[str, int, int]] = []
    results = rechunk([src], ["X", "layers/counts"], out, progress=lambda *a: seen.append(a))
    assert [r.key for r in results] == ["X", "layers/counts"]  # one result per file and key
    assert {r.target for r in results} == {out / "pbmc.h5ad"} and os.listdir(out) == ["pbmc.h5ad"]
    assert results[0].seconds == results[1].seconds  # one copy: the file's time
    with h5py.File(src) as f, h5py.File(out / "pbmc.h5ad") as g:
        for key in ("X", "layers/counts"):
            for name in ("data", "indices"):
                assert g[f"{key}/{name}"].chunks is None and _filters(g[f"{key}/{name}"]) == 0
            assert _attrs(g[key]) == _attrs(f[key])
        assert _filters(g["raw/X/data"]) > 0  # not a key: as stored
    total = sum(r.nbytes for r in results)
    assert {t for _, _, t in seen} == {total}  # one pass over both keys' values
    writes = [d for what, d, _ in seen if what.endswith("writing")]
    assert writes == sorted(writes) and writes[-1] == total
    _assert_same_anndata(anndata.read_h5ad(out / "pbmc.h5ad"), anndata.read_h5ad(src))
    rows = np.arange(0, 700, 3)
    with (
        HDF5SessionDataset([src], key="layers/counts", sparse="dense") as before,
        HDF5SessionDataset([out / "pbmc.h5ad"], key="layers/counts", sparse="dense") as after,
    ):
        got = np.stack([np.asarray(after[int(i)]) for i in rows])
        np.testing.assert_array_equal(got, np.stack([np.asarray(before[int(i)]) for i in rows]))
    # a single key as a one-element sequence: the same as the string
    (one,) = rechunk([src], ["raw/X"], tmp_path / "raw")
    assert one.key == "raw/X" and one.layout == "CSR values contiguous"


def test_several_dense_keys_and_a_missing_one(tmp_path: Path) -> None:
    src = tmp_path / "src" / "s.h5"
    src.parent.mkdir()
    a = np.arange(40 * 30, dtype="f4").reshape(40, 30)
    with h5py.File(src, "w") as f:
        f.create_dataset("a", data=a, chunks=(40, 1))
        f.create_dataset("grp/b", data=a[:, :7] * 2, chunks=(5, 7), compression="gzip")
        f.create_dataset("c", data=np.arange(4))
        f.create_dataset("d", data=a[:, :1], chunks=(8, 1))  # raw chunks, blocks of rows
    out = tmp_path / "out"
    with pytest.raises(KeyError, match=r"s\.h5 has no dataset 'grp/nope'"):
        rechunk([src], ["a", "grp/nope"], out)
    assert not out.exists()  # refused before anything is written
    results = rechunk([src], ["a", "/grp/b", "d"], out, block_bytes=64, chunk_bytes=400)
    assert [(r.key, r.layout) for r in results] == [
        ("a", "contiguous"),
        ("grp/b", "chunks (14, 7)"),
        ("d", "contiguous"),
    ]
    with h5py.File(out / "s.h5") as g:
        np.testing.assert_array_equal(g["a"][...], a)
        np.testing.assert_array_equal(g["grp/b"][...], a[:, :7] * 2)
        np.testing.assert_array_equal(g["d"][...], a[:, :1])
        assert g["grp/b"].compression == "gzip" and g["c"][3] == 3


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        (["X", "/X"], r"key 'X' is given twice"),
        (["X", "X/data"], r"'X/data' is inside 'X'"),
        ([], r"no key given"),
    ],
)
def test_repeated_and_nested_keys_are_refused(
    tmp_path: Path, keys: list[str], message: str
) -> None:
    src = _h5ad(tmp_path / "src" / "a.h5ad")
    with pytest.raises(ConfigError, match=message):
        rechunk([src], keys, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_command_line_takes_several_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    anndata = pytest.importorskip("anndata")
    src = _h5ad(tmp_path / "src" / "a.h5ad")
    out = tmp_path / "out"
    args = ["rechunk", "--key", "X", "--key", "layers/counts", "--out", str(out), "--no-progress"]
    code = main([*args, str(src)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    lines = captured.out.splitlines()
    assert sum("CSR values contiguous" in line for line in lines) == 2
    assert any("layers/counts" in line for line in lines)
    assert "1 file rewritten and verified" in captured.out
    _assert_same_anndata(anndata.read_h5ad(out / "a.h5ad"), anndata.read_h5ad(src))
    code = main(["rechunk", "--key", "X", "--key", "X", "--out", str(tmp_path / "o2"), str(src)])
    assert code == 1 and "given twice" in capsys.readouterr().err
