"""Read paths: rows read outside h5py are bit-identical to h5py's, and every fallback is named.

Files are written by h5py (and hdf5plugin for LZ4, Zstd, Blosc); every batch and every single
row is compared byte for byte with what ``h5py`` reads from the same file.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

import loaderkit
from loaderkit import HDF5FileError, HDF5SessionDataset
from loaderkit.hdf5.read.chunkio import ReadPath
from loaderkit.hdf5.read.codecs import decoder, fletcher32

hdf5plugin = pytest.importorskip("hdf5plugin")

DTYPES = ["<f4", ">f8", "<i2", ">u4", "u1", "<c8"]


def _plugin(name: str) -> dict[str, Any]:
    if name == "lz4":
        pytest.importorskip("lz4.block")
        return dict(hdf5plugin.LZ4(nbytes=512))  # several LZ4 blocks per chunk
    if name == "zstd":
        pytest.importorskip("zstandard")
        return dict(hdf5plugin.Zstd(clevel=3))
    pytest.importorskip("blosc2")
    return dict(hdf5plugin.Blosc(cname="lz4", clevel=5, shuffle=hdf5plugin.Blosc.SHUFFLE))


LAYOUTS: dict[str, tuple[dict[str, Any], str]] = {
    "contiguous": ({}, "preadv"),
    "chunked": ({"chunks": (16, 24)}, "raw chunks"),
    "gzip1": ({"chunks": (16, 24), "compression": "gzip", "compression_opts": 1}, "decoded"),
    "gzip9": ({"chunks": (16, 24), "compression": "gzip", "compression_opts": 9}, "decoded"),
    "shuffle+gzip": ({"chunks": (16, 24), "compression": "gzip", "shuffle": True}, "decoded"),
    "fletcher32": ({"chunks": (16, 24), "fletcher32": True}, "decoded"),
    "shuffle+gzip+fletcher32": (
        {"chunks": (5, 10), "compression": "gzip", "shuffle": True, "fletcher32": True},
        "decoded",
    ),
    "edges": ({"chunks": (7, 10), "compression": "gzip"}, "decoded"),  # rows 100, width 24
}


def _write(path: Path, dtype: str, kwargs: dict[str, Any], rows: int = 100) -> np.ndarray:
    rng = np.random.default_rng(len(str(path)))
    data = (rng.standard_normal((rows, 24)) * 1000).astype(dtype)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, **kwargs)
    return data


def _same_as_h5py(path: Path, **options: Any) -> HDF5SessionDataset:
    """Read every row of ``path`` in batches, shuffled, and one by one; compare with h5py."""
    with h5py.File(path, "r") as f:
        stored = f["x"][...]
    ds = HDF5SessionDataset([path], key="x", **options)
    n = len(ds)
    order = np.random.default_rng(0).permutation(n).tolist()
    want = stored.astype(stored.dtype.newbyteorder("="))
    for batch in (order[:37], sorted(order[37:80]), order[80:] + order[:5]):
        got = np.stack(ds.__getitems__(batch))
        assert got.dtype == want.dtype
        assert got.tobytes() == want[batch].tobytes()
    singles = np.stack([np.asarray(ds[i]) for i in range(n)])
    assert singles.tobytes() == want.tobytes()
    return ds


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_layout_reads_what_h5py_reads(tmp_path: Path, layout: str, dtype: str) -> None:
    kwargs, kind = LAYOUTS[layout]
    path = tmp_path / "s.h5"
    _write(path, dtype, kwargs)
    with _same_as_h5py(path) as ds:
        path_ = ds.handles.io_paths()["x"]
        assert path_.kind.startswith(kind) or (kind == "preadv" and path_.kind == "memory map")
        assert path_.parallel


@pytest.mark.parametrize("plugin", ["lz4", "zstd", "blosc"])
@pytest.mark.parametrize("dtype", ["<f4", ">i8", "u1"])
def test_hdf5plugin_filters_read_what_h5py_reads(tmp_path: Path, plugin: str, dtype: str) -> None:
    path = tmp_path / "p.h5"
    _write(path, dtype, {"chunks": (16, 24), **_plugin(plugin)}, rows=333)
    with _same_as_h5py(path) as ds:
        assert ds.handles.io_paths()["x"].kind == "decoded chunks"


def test_blosc_chunks_stored_raw_are_read_through_the_filter_mask(tmp_path: Path) -> None:
    """Blosc is optional: a chunk it cannot shrink is stored as is, its mask bit set."""
    pytest.importorskip("blosc2")
    path = tmp_path / "m.h5"
    noise = np.random.default_rng(1).integers(0, 255, (64, 64), dtype=np.uint8)
    with h5py.File(path, "w") as f:
        d = f.create_dataset(
            "x", shape=(64, 64), dtype="u1", chunks=(16, 64), **hdf5plugin.Blosc(clevel=9)
        )
        d[:32] = noise[:32]  # random bytes: blosc gives up, the chunk is stored unfiltered
        d[32:] = 7
        masks = [d.id.get_chunk_info(k).filter_mask for k in range(d.id.get_num_chunks())]
    assert any(masks) and not all(masks)  # both kinds of chunk in the file
    with _same_as_h5py(path):
        pass


def test_unwritten_chunks_read_as_the_fill_value(tmp_path: Path) -> None:
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        for name, kwargs in (("x", {"compression": "gzip"}), ("y", {})):
            d = f.create_dataset(
                name, shape=(64, 8), dtype=">i4", chunks=(8, 4), fillvalue=-7, **kwargs
            )
            d[8:16] = np.arange(64).reshape(8, 8)
            d[40:41, 4:] = 5  # one chunk of a band written, its neighbour not
    for key in ("x", "y"):
        with h5py.File(path, "r") as f:
            want = f[key][...].astype("=i4")
            assert f[key].id.get_num_chunks() < 16
        with HDF5SessionDataset([path], key=key) as ds:
            assert ds.handles.io_paths()[key].parallel
            got = np.stack(ds.__getitems__(list(range(64))))
            assert got.tobytes() == want.tobytes()
            assert (got[0] == -7).all()


def test_a_damaged_fletcher32_chunk_is_an_error_naming_the_rows(tmp_path: Path) -> None:
    path = tmp_path / "d.h5"
    data = _write(path, "<f4", {"chunks": (16, 24), "fletcher32": True})
    with h5py.File(path, "r") as f:
        info = f["x"].id.get_chunk_info(1)  # rows 16..31
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + 10)
        byte = fh.read(1)
        fh.seek(info.byte_offset + 10)
        fh.write(bytes([byte[0] ^ 0xFF]))
    with HDF5SessionDataset([path], key="x") as ds:
        assert np.asarray(ds[3]).tobytes() == data[3].tobytes()  # other chunks read
        with pytest.raises(HDF5FileError, match=r"Fletcher-32.*rows 16\.\.31"):
            ds.__getitems__([2, 20])
        with h5py.File(path, "r") as f, pytest.raises(OSError):
            f["x"][20]  # h5py refuses the same chunk


def test_fletcher32_matches_hdf5(tmp_path: Path) -> None:
    """The checksum of every chunk HDF5 wrote, odd lengths included, is what we compute."""
    path = tmp_path / "c.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset("x", data=np.arange(999, dtype="u1"), chunks=(333,), fletcher32=True)
        d2 = f.create_dataset("z", data=np.zeros(50, "u1"), chunks=(25,), fletcher32=True)
        for dset in (d, d2):
            for k in range(dset.id.get_num_chunks()):
                _mask, raw = dset.id.read_direct_chunk(dset.id.get_chunk_info(k).chunk_offset)
                assert int.from_bytes(raw[-4:], "little") == fletcher32(raw[:-4])


def test_the_fallback_is_h5py_and_says_why(tmp_path: Path) -> None:
    path = tmp_path / "v.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("lzf", data=np.ones((32, 4), "f4"), chunks=(8, 4), compression="lzf")
        f.create_dataset("axis1", data=np.ones((4, 32), "f4"))
        f.create_dataset("scale", data=np.ones((32, 4), "f4"), chunks=(8, 4), scaleoffset=2)
        layout = h5py.VirtualLayout(shape=(32, 4), dtype="f4")
        layout[:] = h5py.VirtualSource(path, "lzf", shape=(32, 4))
        f.create_virtual_dataset("virtual", layout)
    cases = {
        "lzf": "filter 32000",
        "scale": "filter 6",
        "virtual": "virtual dataset",
    }
    for key, why in cases.items():
        with HDF5SessionDataset([path], key=key) as ds:
            got = ds.handles.io_paths()[key]
            assert got == ReadPath("h5py", got.reason)
            assert why in got.reason, (key, got.reason)
            assert not got.parallel
            assert np.stack(ds.__getitems__([0, 5, 31])).tolist() == [[1.0] * 4] * 3
    with HDF5SessionDataset([path], key="axis1", sample_axis=1) as ds:
        assert "axis 1" in ds.handles.io_paths()["axis1"].reason
    with HDF5SessionDataset([path], key="lzf", h5py_options={"driver": "core"}) as ds:
        assert ds.handles.io_paths()["lzf"].kind == "h5py"


def test_the_plan_names_the_read_path(tmp_path: Path) -> None:
    fast, slow = tmp_path / "g.h5", tmp_path / "l.h5"
    _write(fast, "<f4", {"chunks": (16, 24), "compression": "gzip"})
    _write(slow, "<f4", {"chunks": (16, 24), "compression": "lzf"})
    with HDF5SessionDataset([fast], key="x") as ds:
        loader = loaderkit.DataLoader(ds, batch_size=4)
        row = loader.plan["hdf5_reads"]
        assert row.value == "decoded chunks" and "gzip" in row.reason
        assert ds.handles.open_files == 0  # the plan left no file open in this process
    with HDF5SessionDataset([slow], key="x") as ds:
        row = loaderkit.DataLoader(ds, batch_size=4).plan["hdf5_reads"]
        assert row.value == "h5py" and "LZF" in row.reason and "serial" in row.reason


def test_unknown_filters_are_declined_by_name() -> None:
    assert decoder(32000, (), 4)[0] is None
    assert "LZF" in decoder(32000, (), 4)[1]
    for code in (1, 2, 3):
        assert decoder(code, (), 4)[0] is not None


def test_keys_mixed_paths_in_one_dataset(tmp_path: Path) -> None:
    path = tmp_path / "k.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset(
            "a",
            data=np.arange(96, dtype=">i2").reshape(32, 3),
            chunks=(4, 3),
            compression="gzip",
            shuffle=True,
        )
        f.create_dataset("b", data=np.arange(32, dtype="f8"))
        f.create_dataset(
            "c", data=np.arange(64, dtype="f4").reshape(32, 2), chunks=(8, 2), compression="lzf"
        )
    with HDF5SessionDataset([path], key=["a", "b", "c"]) as ds:
        kinds = {k: p.kind for k, p in ds.handles.io_paths().items()}
        assert kinds in (
            {"a": "decoded chunks", "b": "preadv", "c": "h5py"},
            {"a": "decoded chunks", "b": "memory map", "c": "h5py"},
        )
        for batch in ([0, 31, 7, 8, 9], list(itertools.chain(range(10, 20), [3]))):
            got = ds.__getitems__(batch)
            with h5py.File(path, "r") as f:
                for i, sample in zip(batch, got, strict=True):
                    assert sample["a"].tobytes() == f["a"][i].astype("=i2").tobytes()
                    assert sample["b"] == f["b"][i]
                    assert sample["c"].tobytes() == f["c"][i].tobytes()


def _gzip_sessions(tmp_path: Path, rows: int = 64) -> tuple[list[Path], np.ndarray]:
    data = np.arange(rows * 24, dtype="<f4").reshape(rows, 24)
    paths = []
    for s in range(2):
        path = tmp_path / f"g{s}.h5"
        with h5py.File(path, "w") as f:
            f.create_dataset("x", data=data + s, chunks=(8, 24), compression="gzip")
        paths.append(path)
    return paths, data


def _count_decodes(ds: HDF5SessionDataset, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Wrap every open file's decoders so that each decoded chunk is counted."""
    calls: list[int] = []
    for pos in range(2):
        ds.__getitems__([pos * 64])  # the file open, its chunk reader built
        reader = ds._reader.files.file_pool.peek(pos).chunked[0]
        wrapped = []
        for code, decode in reader.filters:
            wrapped.append((code, lambda data, decode=decode: (calls.append(1), decode(data))[1]))
        monkeypatch.setattr(reader, "filters", tuple(wrapped))
        reader.forget()
    return calls


def test_decoded_chunks_are_kept_within_the_chunk_buffer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The raw path takes the place of HDF5's chunk buffer: a chunk is decoded once while kept."""
    paths, data = _gzip_sessions(tmp_path)
    with HDF5SessionDataset(paths, key="x") as ds:
        calls = _count_decodes(ds, monkeypatch)
        order = [3, 70, 12, 99, 5, 64, 30, 127]  # chunks 0, 1, 3 of each file, interleaved
        for _ in range(3):
            got = np.stack([np.asarray(x) for x in ds.__getitems__(order)])
            want = np.stack([data[i % 64] + i // 64 for i in order])
            np.testing.assert_array_equal(got, want)
        assert len(calls) == 6  # each chunk decoded once, then served from the buffer
        kept = ds._reader.files.file_pool.peek(0).chunked[0].decoded
        assert len(kept) == 3 and not next(iter(kept.values())).flags.writeable


def test_the_chunk_buffer_is_bounded_by_rdcc_nbytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths, data = _gzip_sessions(tmp_path)
    chunk = 8 * 24 * 4
    options = {"rdcc_nbytes": 2 * chunk}  # room for two decoded chunks per file
    with HDF5SessionDataset(paths, key="x", h5py_options=options) as ds:
        calls = _count_decodes(ds, monkeypatch)
        for _ in range(2):
            for row in (0, 8, 16, 0):  # 3 chunks cycling through a buffer of 2
                np.testing.assert_array_equal(np.asarray(ds[row]), data[row])
        reader = ds._reader.files.file_pool.peek(0).chunked[0]
        assert len(reader.decoded) == 2 and reader.buffer_bytes == 2 * chunk
        # pass 1: 4 decodes (0 was evicted by 16); pass 2: 0 is the thread's last chunk, then
        # 8, 16 and 0 again, each evicted before its turn (least recently used first)
        assert len(calls) == 7
    with HDF5SessionDataset(paths, key="x", h5py_options={"rdcc_nbytes": 0}) as ds:
        calls = _count_decodes(ds, monkeypatch)
        for row in (0, 8, 0, 8):
            np.testing.assert_array_equal(np.asarray(ds[row]), data[row])
        assert len(calls) == 4 and not ds._reader.files.file_pool.peek(0).chunked[0].decoded
