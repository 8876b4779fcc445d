"""``loaderkit rechunk``: copies with the key stored row by row, everything else as it was.

Real files with extra datasets, groups, attributes and links; compressed sources; refusals
(a missing key, the output directory holding a source, by path, symlink or hard link); a
failure in the middle of writing leaves no file under the final name; memory stays within
the block budget; the command line prints a table and exits 1 naming the file and key.
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
from loaderkit.hdf5.convert.rechunk import _verify
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
            f.attrs["v"] = value
    with h5py.File(a) as fa, h5py.File(b) as fb:
        with pytest.raises(HDF5FileError, match=r"attributes of '/'.*values of 'meta/x'"):
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
    rechunk([sys.argv[1]], "betas", sys.argv[2], block_bytes=8 << 20, layout=sys.argv[3])
    print(peak_rss() - rss)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak RSS reset is Linux's")
# slow tier: copies of 64 MB files measured by peak RSS (rechunk's values and layout: fast above)
@pytest.mark.slow
@pytest.mark.parametrize("layout", ["contiguous", "chunked"])
def test_memory_stays_within_the_block_budget(tmp_path: Path, layout: str) -> None:
    """A 96 MB session rewritten with 8 MiB blocks: the process grows by tens of MB."""
    paths, _ = write_wide(tmp_path / "src", 1, 600, (80000,))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    run = subprocess.run(
        [sys.executable, "-c", _MEMORY, str(paths[0]), str(tmp_path / layout), layout],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=False,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    grown = int(run.stdout.split()[-1])
    assert grown < 80 << 20, grown  # blocks of 8 MiB (a few alive) and HDF5's own state


# ------------------------------------------------------------------ the command line


def test_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths, arrays = write_wide(tmp_path / "src", 2, 20, (100,))
    out = tmp_path / "out"
    code = main(["rechunk", "--key", "betas", "--out", str(out), "--no-progress", *map(str, paths)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "contiguous" in captured.out and "|" not in captured.out.splitlines()[0]
    assert "2 file(s) rewritten and verified" in captured.out
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


def test_an_h5ad_sparse_matrix_is_refused_by_name_and_its_data_copies_intact(
    tmp_path: Path,
) -> None:
    anndata = pytest.importorskip("anndata")
    from tests.hdf5.h5adfiles import matrix, write_current, write_legacy

    current = write_current(tmp_path / "current.h5ad", matrix(0))
    legacy = write_legacy(tmp_path / "legacy.h5ad", matrix(1))
    for path, key, encoding in (
        (current, "X", "csr_matrix"),
        (legacy, "raw.X", r"csr \(h5sparse\)"),
    ):
        want = rf"{key!r} in {path} is an AnnData sparse matrix \({encoding}\), not a dataset"
        with pytest.raises(ConfigError, match=want):
            rechunk([path], key, tmp_path / "out")
        assert main(["rechunk", "--key", key, "--out", str(tmp_path / "cli"), str(path)]) != 0
        assert not (tmp_path / "out" / path.name).exists()
    # one dataset of the group (values) is rewritten as any dataset: the file stays a valid
    # .h5ad whose rows anndata and loaderkit read as before
    (result,) = rechunk([current], "X/data", tmp_path / "data")  # chunks: data can grow
    want = anndata.read_h5ad(current).X.toarray()
    assert np.array_equal(anndata.read_h5ad(result.target).X.toarray(), want)
    with HDF5SessionDataset([result.target], key="X", sparse="dense") as ds:
        assert np.array_equal(np.stack([ds[i] for i in range(len(ds))]), want)
