"""``HDF5SessionDataset``: construction, reads, errors, handles, fork, pickling and close."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import pickle
import threading
import warnings
from pathlib import Path

import h5py
import numpy as np
import psutil
import pytest
import torch
from torch.utils.data import default_collate

from loaderkit.errors import ConfigError, LoaderkitError, LoaderkitWarning
from loaderkit.hdf5 import (
    FilePoolInfo,
    HDF5FileError,
    HDF5SessionDataset,
    SampleIndex,
    default_chunk_buffer,
)
from loaderkit.hdf5.meta.diagnose import open_failure
from tests.hdf5.helpers import (
    EveryOther,
    FailingRead,
    Scaled,
    ScaledRows,
    Shuffled,
    Transformed,
    expected,
    hdf5_fds,
    row_value,
    write_sessions,
)


@pytest.fixture
def paths(tmp_path: Path) -> list[Path]:
    return write_sessions(tmp_path, [5, 7, 4])


@pytest.fixture(params=["contiguous", "chunked", "gzip"])
def layout_paths(request: pytest.FixtureRequest, tmp_path: Path) -> list[Path]:
    kwargs = {
        "contiguous": {},
        "chunked": {"chunks": 3},
        "gzip": {"chunks": 4, "compression": "gzip"},
    }[request.param]
    return write_sessions(tmp_path, [9, 0, 13, 6], **kwargs)


# ---------------------------------------------------------------- basics


def test_index_values_and_locate(layout_paths: list[Path]) -> None:
    with HDF5SessionDataset(layout_paths, key="betas", max_open_files=2) as ds:
        assert len(ds) == 9 + 13 + 6  # the empty session is skipped
        assert ds.locate(0) == (0, 0)
        assert ds.locate(9) == (2, 0)  # session 1 is empty
        assert ds.locate(-1) == (3, 5)
        for i in range(len(ds)):
            np.testing.assert_array_equal(ds[i], expected(ds, i))
        np.testing.assert_array_equal(ds[-1], row_value(3, 5))
        assert ds.files == {i: p for i, p in enumerate(layout_paths)}
        assert all(isinstance(p, Path) for p in ds.files.values())
        assert ds.handles.open_files <= 2
        assert ds.handles.sample_nbytes == 3 * 4 * 4
    assert Scaled(layout_paths, key="betas").handles.sample_nbytes is None


def test_index_errors(paths: list[Path]) -> None:
    ds = HDF5SessionDataset(paths, key="betas")
    n = len(ds)
    for bad in (n, -n - 1, 10**9):
        with pytest.raises(IndexError, match=str(bad)):
            ds[bad]
        with pytest.raises(IndexError):
            ds.locate(bad)
        with pytest.raises(IndexError, match=str(bad)):
            ds.__getitems__([0, bad])
    with pytest.raises(TypeError):
        ds[1.5]  # type: ignore[index]


def test_mapping_with_string_ids_and_autodetected_key(tmp_path: Path) -> None:
    p = write_sessions(tmp_path, [2, 3])
    ds = HDF5SessionDataset({"ses-b": p[1], "ses-a": p[0]})
    assert ds.key == "betas"
    assert ds.session_ids == ("ses-b", "ses-a")
    assert ds.locate(0) == ("ses-b", 0)
    assert ds.locate(3) == ("ses-a", 0)
    np.testing.assert_array_equal(ds[3], row_value(0, 0))
    assert ds.file("ses-a").filename == str(p[0])
    with pytest.raises(KeyError, match="ses-c"):
        ds.file("ses-c")


def test_getitems_matches_getitem(layout_paths: list[Path]) -> None:
    ds = HDF5SessionDataset(layout_paths, key="betas", max_open_files=2)
    n = len(ds)
    rng = np.random.default_rng(0)
    batches = [
        list(range(n)),  # one long run per session
        rng.permutation(n).tolist(),  # nothing to coalesce
        [3, 4, 5, 20, 21, 0, 1, 2, 2, 2, -1, -2],  # runs, duplicates, negatives
        list(range(n - 1, -1, -1)),  # reversed runs
        [7],
        [],
        np.array([10, 11, 12, 1], dtype=np.int32),
        [torch.tensor(4), torch.tensor(5)],
    ]
    for batch in batches:
        got = ds.__getitems__(batch)
        want = [ds[int(i)] for i in batch]
        assert isinstance(got, list) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(g, w)
        if batch is not batches[5]:
            torch.testing.assert_close(default_collate(got), default_collate(want))
    assert ds.handles.open_files <= 2


def test_scalar_rows_and_int_dtype(tmp_path: Path) -> None:
    for s in range(2):
        with h5py.File(tmp_path / f"s{s}.h5", "w") as f:
            f.create_dataset("label", data=np.arange(s * 100, s * 100 + 10, dtype=">i2"))
    ds = HDF5SessionDataset(sorted(tmp_path.glob("*.h5")), key="label")
    assert ds[12] == 102 and isinstance(ds[12], np.generic)
    got = ds.__getitems__([11, 12, 13, 0])
    assert [int(x) for x in got] == [101, 102, 103, 0]
    assert default_collate(got).tolist() == [101, 102, 103, 0]


def test_other_layouts_fall_back_to_hdf5(tmp_path: Path) -> None:
    p = write_sessions(tmp_path, [6, 6])
    with HDF5SessionDataset(p, key="betas", h5py_options={"driver": "core"}) as ds:
        assert ds.file(0).driver == "core"
        got = ds.__getitems__([5, 0, 1, 2, 7])
        for g, i in zip(got, [5, 0, 1, 2, 7], strict=True):
            np.testing.assert_array_equal(g, expected(ds, i))


# ---------------------------------------------------------------- validation


def test_construction_errors(tmp_path: Path, paths: list[Path]) -> None:
    with pytest.raises(FileNotFoundError, match=r"session 1: file .*nope\.h5"):
        HDF5SessionDataset([paths[0], tmp_path / "nope.h5"], key="betas")
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"this is not an HDF5 file" * 10)
    with pytest.raises(OSError, match=r"session 'j'.*junk\.h5") as info:
        HDF5SessionDataset({"a": paths[0], "j": junk}, key="betas")
    assert isinstance(info.value, LoaderkitError)
    with pytest.raises(KeyError, match=r"session 0: .* no dataset 'nope'.*\['betas'\]"):
        HDF5SessionDataset(paths, key="nope")
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ConfigError, match="max_open_files"):
            HDF5SessionDataset(paths, key="betas", max_open_files=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="read-only"):
        HDF5SessionDataset(paths, key="betas", h5py_options={"mode": "a"})
    with pytest.raises(ConfigError, match="wrap it in a list"):
        HDF5SessionDataset(str(paths[0]), key="betas")
    with pytest.raises(ConfigError, match="empty"):
        HDF5SessionDataset([], key="betas")
    with pytest.raises(ConfigError, match="rejected by h5py"):
        HDF5SessionDataset(paths, key="betas", h5py_options={"no_such_option": 1})


def test_key_none_with_several_datasets(tmp_path: Path) -> None:
    p = write_sessions(tmp_path, [3], extra={"stim": np.arange(3)})
    with pytest.raises(ConfigError, match=r"2 datasets.*betas.*stim.*key="):
        HDF5SessionDataset(p)


def test_row_shape_and_dtype_mismatch(tmp_path: Path) -> None:
    a = write_sessions(tmp_path / "a", [3])
    b = write_sessions(tmp_path / "b", [3], row_shape=(5,))
    with pytest.raises(ConfigError, match=r"session 0 .* \(3, 4\).*session 1 .* \(5,\).*read\(\)"):
        HDF5SessionDataset([a[0], b[0]], key="betas")
    c = write_sessions(tmp_path / "c", [3], dtype="f8")
    with pytest.raises(ConfigError, match="float64"):
        HDF5SessionDataset([a[0], c[0]], key="betas")
    ds = Scaled([a[0], b[0]], key="betas")  # read() overridden: allowed
    assert ds[3].shape == (5,)
    assert [x.shape for x in ds.__getitems__([0, 3])] == [(3, 4), (5,)]


def test_hints_are_checked_not_guessed(tmp_path: Path) -> None:
    # a path full of trigger words: hints come from checks of the file, never from text
    root = tmp_path / "block_design_lock_filter_signature"
    root.mkdir()
    empty = root / "empty.h5"
    empty.write_bytes(b"")
    assert open_failure(str(empty)) == ("the file is empty (0 bytes)", None)
    text = root / "notes.h5"
    text.write_bytes(b"not hdf5 at all" * 100)
    hint, error = open_failure(str(text))
    assert "no HDF5 signature" in hint and error is None
    (good,) = write_sessions(root, [3])
    assert open_failure(str(good)) == ("", None)  # nothing established: no hint


# ---------------------------------------------------------------- options


def test_chunk_buffer_defaults_and_explicit_options(tmp_path: Path) -> None:
    contiguous = write_sessions(tmp_path / "c", [4])
    chunked = write_sessions(tmp_path / "z", [40], chunks=8, compression="gzip")
    with HDF5SessionDataset(contiguous, key="betas") as ds:
        assert ds.file(0).id.get_access_plist().get_cache()[2] == 0
    with HDF5SessionDataset(chunked, key="betas") as ds:
        layout = ds.layout(0)
        assert layout is not None and layout.chunk_rows == 8 and layout.compression == ("gzip",)
        want = default_chunk_buffer(layout)
        _, nslots, nbytes, _ = ds.file(0).id.get_access_plist().get_cache()
        assert (nslots, nbytes) == (want["rdcc_nslots"], want["rdcc_nbytes"])
        assert nbytes >= layout.chunk_bytes
    one_row_chunks = layout._replace(chunk_rows=1, chunk_bytes=9 << 20)
    assert default_chunk_buffer(one_row_chunks)["rdcc_nbytes"] == 1 << 20
    opts = {"rdcc_nbytes": 3 << 20, "rdcc_nslots": 1009, "locking": False}
    with HDF5SessionDataset(chunked, key="betas", h5py_options=opts) as ds:
        fapl = ds.file(0).id.get_access_plist()
        assert fapl.get_cache()[1:3] == (1009, 3 << 20)
        assert not fapl.get_file_locking()[0]
        assert ds.file(0).mode == "r"


def test_stdio_driver_warns(paths: list[Path]) -> None:
    with pytest.warns(LoaderkitWarning, match="stdio"):
        HDF5SessionDataset(paths, key="betas", h5py_options={"driver": "stdio"})


# ---------------------------------------------------------------- cache behaviour


def test_lru_statistics_and_bound(tmp_path: Path) -> None:
    p = write_sessions(tmp_path, [2, 2, 2])
    ds = HDF5SessionDataset(p, key="betas", max_open_files=2)
    assert ds.handles.file_pool_info() == FilePoolInfo(
        0, 0, 0, 0, 0, 2
    )  # nothing left open by __init__
    for i in (0, 1, 2, 0, 4, 1, 0, 2):  # sessions 0 0 1 0 2 0 0 1
        ds[i]
        assert ds.handles.open_files <= 2
        assert len(hdf5_fds(tmp_path)) <= 2
    info = ds.handles.file_pool_info()
    # misses: s0, s1, s2 (evicts s1), s1 again (evicts s2)
    assert (info.hits, info.misses, info.evictions, info.opens) == (4, 4, 2, 4)
    assert info.open_files == 2
    ds.close()
    assert ds.handles.open_files == 0 and hdf5_fds(tmp_path) == []


def test_close_restores_fd_baseline(layout_paths: list[Path], tmp_path: Path) -> None:
    gc.collect()  # datasets of earlier tests may still hold files until collected
    before = len(psutil_fds())
    ds = HDF5SessionDataset(layout_paths, key="betas", max_open_files=8)
    assert len(psutil_fds()) == before  # the index is built with every file closed again
    ds.__getitems__(list(range(len(ds))))
    assert len(hdf5_fds(tmp_path)) == 3
    ds.close()
    assert len(psutil_fds()) == before
    ds[0]  # usable after close
    with ds:
        pass
    assert len(psutil_fds()) == before
    ds[0]
    del ds
    gc.collect()
    assert len(psutil_fds()) == before


def psutil_fds() -> list[int]:
    return [f.fd for f in psutil.Process().open_files()]


def test_custom_index_closes_files_opened_while_building(tmp_path: Path) -> None:
    p = write_sessions(tmp_path, [5, 4])
    ds = EveryOther(p, key="betas")
    assert ds.handles.open_files == 0 and hdf5_fds(tmp_path) == []
    assert len(ds) == 2 + 3
    assert [ds.locate(i) for i in range(len(ds))] == [(1, 0), (1, 2), (0, 0), (0, 2), (0, 4)]
    for i, got in enumerate(ds.__getitems__(list(range(len(ds))))):
        np.testing.assert_array_equal(got, expected(ds, i))


def test_build_index_return_forms(tmp_path: Path) -> None:
    p = write_sessions(tmp_path, [3, 3])

    class Arr(HDF5SessionDataset):
        def build_index(self) -> np.ndarray:
            return np.array([[1, 2], [0, 0]])

    class Named(HDF5SessionDataset):
        def build_index(self) -> SampleIndex:
            return SampleIndex(np.array([1, 1]), np.array([0, 1]))

    class Bad(HDF5SessionDataset):
        def build_index(self) -> list[tuple[int, int]]:
            return [(5, 0)]

    class TooFar(HDF5SessionDataset):
        def build_index(self) -> list[tuple[int, int]]:
            return [(0, 0), (1, 3)]

    assert [Arr(p, key="betas").locate(i) for i in range(2)] == [(1, 2), (0, 0)]
    with pytest.raises(ConfigError, match=r"entry 1 asks for row 3 of session 1.* has 3 rows"):
        TooFar(p, key="betas")
    assert Named(p, key="betas").locate(1) == (1, 1)
    with pytest.raises(ConfigError, match="session 5"):
        Bad(p, key="betas")


# ---------------------------------------------------------------- pickling


def test_pickle_ships_no_handles_and_large_index_is_small(tmp_path: Path) -> None:
    n = 1_000_000
    for s in range(2):
        with h5py.File(tmp_path / f"s{s}.h5", "w") as f:
            f.create_dataset("x", data=np.arange(n // 2, dtype=np.uint8))
    ds = HDF5SessionDataset(sorted(tmp_path.glob("*.h5")), key="x")
    assert len(ds) == n
    ds[0], ds[n - 1]  # handles open in this process
    blob = pickle.dumps(ds)
    assert len(blob) < 20_000  # a million samples, run-length encoded
    clone = pickle.loads(blob)
    assert clone.handles.open_files == 0 and clone.handles.file_pool_info().opens == 0
    assert len(clone) == n and clone.locate(n - 1) == (1, n // 2 - 1)
    assert clone[n - 1] == (n // 2 - 1) % 256
    clone.close()
    ds.close()


def test_pickle_of_unordered_index(tmp_path: Path) -> None:
    p = write_sessions(tmp_path, [50, 50])
    ds = Shuffled(p, key="betas")
    clone = pickle.loads(pickle.dumps(ds))
    assert [clone.locate(i) for i in range(500)] == [ds.locate(i) for i in range(500)]


# ---------------------------------------------------------------- subclass hooks


def test_read_override_keeps_per_item_semantics(paths: list[Path]) -> None:
    ds = Scaled(paths, key="betas")
    got = ds.__getitems__([0, 1, 7])
    for g, i in zip(got, [0, 1, 7], strict=True):
        assert g.dtype == np.float64
        np.testing.assert_array_equal(g, expected(ds, i) * 2)


def test_read_rows_opt_in_is_batched(paths: list[Path]) -> None:
    ds = ScaledRows(paths, key="betas")
    ScaledRows.calls = 0
    batch = [5, 6, 7, 8, 0, 1, 2, 15]
    got = ds.__getitems__(batch)
    assert ScaledRows.calls == 3  # runs 5-8, 0-2, 15
    for g, i in zip(got, batch, strict=True):
        np.testing.assert_array_equal(g, expected(ds, i) * 2)


def test_getitem_override_is_respected_by_batched_reads(paths: list[Path]) -> None:
    ds = Transformed(paths, key="betas")
    for g, i in zip(ds.__getitems__([0, 1, 2, 9]), [0, 1, 2, 9], strict=True):
        np.testing.assert_array_equal(g, expected(ds, i) + 0.5)


def test_errors_in_read_keep_type_and_gain_context(paths: list[Path]) -> None:
    ds = FailingRead(paths, key="betas")
    ds[0]
    with pytest.raises(ValueError, match="bad sample") as info:
        ds[6]  # session 1, row 1
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "dataset index 6" in notes and "session 1" in notes and str(paths[1]) in notes
    with pytest.raises(ValueError, match="bad sample"):
        ds.__getitems__([0, 1])
    assert ds[0].shape == (3, 4)  # still usable


# ---------------------------------------------------------------- threads


@pytest.mark.slow  # a soak: many threads over a 1-file LRU (thread safety: fast tests above)
def test_threads_hammering_a_small_lru(tmp_path: Path) -> None:
    p = write_sessions(tmp_path, [30, 30, 30, 30, 30], chunks=4)
    p2 = write_sessions(tmp_path / "contig", [30, 30, 30, 30, 30])
    for files in (p, p2):
        ds = HDF5SessionDataset(files, key="betas", max_open_files=2)
        errors: list[BaseException] = []
        most_open = []

        def work(
            seed: int,
            ds: HDF5SessionDataset = ds,
            errors: list[BaseException] = errors,
            most_open: list[int] = most_open,
        ) -> None:
            rng = np.random.default_rng(seed)
            try:
                for _ in range(150):
                    if rng.random() < 0.5:
                        i = int(rng.integers(len(ds)))
                        np.testing.assert_array_equal(ds[i], expected(ds, i))
                    else:
                        batch = rng.integers(0, len(ds), 8).tolist()
                        for g, i in zip(ds.__getitems__(batch), batch, strict=True):
                            np.testing.assert_array_equal(g, expected(ds, i))
                    most_open.append(ds.handles.open_files)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert max(most_open) <= 2
        assert len(hdf5_fds(tmp_path)) <= 2
        assert ds.handles.file_pool_info().evictions > 0
        ds.close()


# ---------------------------------------------------------------- files that change mid-run


@pytest.mark.parametrize("chunks", [None, 2])
def test_file_deleted_mid_run(tmp_path: Path, chunks: int | None) -> None:
    p = write_sessions(tmp_path, [4, 4, 4], chunks=chunks)
    ds = HDF5SessionDataset(p, key="betas", max_open_files=1)
    ds[0]
    ds[4]  # evicts session 0
    p[0].unlink()
    with pytest.raises(FileNotFoundError, match=rf"session 0: file {p[0]}") as info:
        ds[1]
    assert "dataset index 1" in "\n".join(getattr(info.value, "__notes__", []))
    with pytest.raises(FileNotFoundError, match="session 0"):
        ds.__getitems__([8, 9, 2, 3])
    np.testing.assert_array_equal(ds[9], expected(ds, 9))  # other sessions keep working
    assert ds.handles.open_files == 1


@pytest.mark.parametrize("chunks", [None, 2])
def test_file_truncated_while_open(tmp_path: Path, chunks: int | None) -> None:
    p = write_sessions(tmp_path, [400, 4], chunks=chunks)
    ds = HDF5SessionDataset(p, key="betas", max_open_files=2)
    ds[0], ds[400]
    os.truncate(p[0], 4096)
    with pytest.raises(OSError, match=rf"session 0 \({p[0]}\) for dataset index 399") as info:
        ds[399]
    assert isinstance(info.value, HDF5FileError)
    assert ds.handles.open_files == 1  # the broken handle was closed and dropped
    with pytest.raises(OSError, match="session 0"):
        ds.__getitems__([401, 398, 399])
    np.testing.assert_array_equal(ds[401], expected(ds, 401))


# ---------------------------------------------------------------- fork


def _child_read(ds: HDF5SessionDataset, index: int, queue: mp.Queue) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        before = ds.handles.open_files
        stats = ds.handles.file_pool_info()
        value = ds[index]
        ok = bool(np.array_equal(value, expected(ds, index)))
    queue.put(
        (
            before,
            stats.opens,
            ok,
            [(w.category.__name__, str(w.message)) for w in caught],
        )
    )


def test_fork_child_drops_inherited_handles(paths: list[Path]) -> None:
    ctx = mp.get_context("fork")
    ds = HDF5SessionDataset(paths, key="betas")
    ds[0], ds[5], ds[12]  # open in the parent
    assert ds.handles.open_files == 3
    queue = ctx.Queue()
    proc = ctx.Process(target=_child_read, args=(ds, 6, queue))
    proc.start()
    before, opens, ok, caught = queue.get(timeout=60)
    proc.join(timeout=60)
    assert proc.exitcode == 0
    assert before == 0 and opens == 0 and ok
    assert caught == []  # our own inherited handles are not "foreign"
    np.testing.assert_array_equal(ds[6], expected(ds, 6))  # the parent's handles still work
    assert ds.handles.file_pool_info().opens == 3


def test_fork_child_warns_about_foreign_handles(paths: list[Path]) -> None:
    ctx = mp.get_context("fork")
    ds = HDF5SessionDataset(paths, key="betas")
    queue = ctx.Queue()
    with h5py.File(paths[1], "r"):
        proc = ctx.Process(target=_child_read, args=(ds, 6, queue))
        proc.start()
        _, _, ok, caught = queue.get(timeout=60)
        proc.join(timeout=60)
    assert ok
    assert [c for c, _ in caught] == ["LoaderkitWarning"]
    assert str(paths[1]) in caught[0][1] and "forked" in caught[0][1]


def test_fork_while_another_thread_holds_the_cache_lock(paths: list[Path]) -> None:
    ctx = mp.get_context("fork")
    ds = HDF5SessionDataset(paths, key="betas")
    ds[0]
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with ds.lock:
            held.set()
            release.wait(timeout=60)

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(timeout=60)
    try:
        queue = ctx.Queue()
        proc = ctx.Process(target=_child_read, args=(ds, 6, queue))
        proc.start()
        _, _, ok, _ = queue.get(timeout=60)  # the child got a fresh lock: no deadlock
        proc.join(timeout=60)
    finally:
        release.set()
        thread.join()
    assert ok and proc.exitcode == 0


@pytest.mark.parametrize("chunks", [None, (1, 64, 64), (2, 256, 256)])
def test_large_rows_batched(tmp_path: Path, chunks: tuple[int, ...] | None) -> None:
    paths = []
    for s in range(2):
        data = np.arange(6 * 256 * 256, dtype=np.float32).reshape(6, 256, 256) + s * 1e7
        paths.append(tmp_path / f"s{s}.h5")
        with h5py.File(paths[-1], "w") as f:
            f.create_dataset("x", data=data, chunks=chunks)
    if chunks == (1, 64, 64):  # one row in 16 chunks: works, slowly, and says so
        with pytest.warns(LoaderkitWarning, match="spans 16 chunks"):
            ds = HDF5SessionDataset(paths, key="x", max_open_files=1)
    else:
        ds = HDF5SessionDataset(paths, key="x", max_open_files=1)
    assert ds.handles.sample_nbytes == 256 * 1024
    for batch in ([0, 1, 2, 3, 4, 5, 6, 7], [7, 2, 3, 9, 0, 11, 1], [4, 4, 10, 5]):
        got = ds.__getitems__(batch)
        for g, i in zip(got, batch, strict=True):
            np.testing.assert_array_equal(g, ds[i])
        torch.testing.assert_close(default_collate(got), default_collate([ds[i] for i in batch]))


# ------------------------------------------------------------------ the class's surface


def _public_names(cls: type) -> set[str]:
    """Methods and properties ``cls`` defines itself, not ``_``-prefixed."""
    return {name for name in vars(cls) if not name.startswith("_")}


#: The constructor's arguments, read-only on the class (``cache`` stays free for subclasses).
ARGUMENTS = {
    "files",
    "key",
    "fields",
    "sample_axis",
    "max_open_files",
    "h5py_options",
    "memory_map",
    "max_session_bytes",
    "storage_options",
    "sparse",
    "genes",
    "join",
}
#: Released in 0.1.0 and moved to a part: each warns for one release.
MOVED = {"cache_info", "open_files", "sample_nbytes", "index_arrays"}


def test_the_class_shows_what_a_subclass_author_uses() -> None:
    own = _public_names(HDF5SessionDataset) - ARGUMENTS - MOVED
    assert own == {
        *("read", "read_rows", "build_index", "transform"),  # the hooks
        *("file", "h5dataset", "layout", "lock"),  # the helpers a hook calls
        *("locate", "session_ids", "close"),
        *("handles", "budgets", "cached_sessions"),  # the parts
        "loader_support",  # what the loader asks
    }
    assert len(own) <= 15
    assert all(isinstance(vars(HDF5SessionDataset)[name], property) for name in ARGUMENTS)
    # the hooks come first on the API page (members in source order)
    order = [name for name in vars(HDF5SessionDataset) if name in own]
    assert order[:4] == ["read", "read_rows", "build_index", "transform"]


def test_constructor_arguments_are_read_only(tmp_path: Path) -> None:
    paths = write_sessions(tmp_path, [5, 3])
    with HDF5SessionDataset(paths, key="betas", max_open_files=2) as ds:
        assert ds.key == "betas" and ds.max_open_files == 2 and ds.sample_axis == 0
        assert list(ds.files) == [0, 1] and ds.memory_map is False and ds.fields is None
        for name in ARGUMENTS:
            with pytest.raises(AttributeError):
                setattr(ds, name, None)
        ds.budgets.set_open_files(1)  # the value in use lives on the part; the attribute reads it
        assert ds.max_open_files == 1 and ds.budgets.open_files_requested == 2


def test_parts_read_the_one_reader_and_its_index(tmp_path: Path) -> None:
    paths = write_sessions(tmp_path, [5, 3])
    with HDF5SessionDataset(paths, key="betas") as ds:
        reader = ds._reader
        assert ds.handles.reader is ds.budgets.reader is ds.cached_sessions.reader is reader
        assert not reader.index.flags.writeable and len(ds) == reader.index.shape[0] == 8
        assert ds.handles.open_files == 0
        clone = pickle.loads(pickle.dumps(ds))
        assert clone.handles.reader is clone._reader is clone.cached_sessions.reader
        np.testing.assert_array_equal(clone._reader.index, reader.index)
        assert clone.locate(6) == (1, 1)
        np.testing.assert_array_equal(clone[7], expected(ds, 7))
        clone.close()
        ds[6]
        assert ds.handles.open_files == 1 and ds.handles.file_pool_info().opens == 1
        with pytest.raises(KeyError, match=r"unknown session 'x'; sessions: \[0, 1\]"):
            ds.file("x")


def test_released_names_that_moved_warn_and_answer_the_same(tmp_path: Path) -> None:
    from loaderkit import LoaderkitDeprecationWarning

    paths = write_sessions(tmp_path, [5, 3])
    with HDF5SessionDataset(paths, key="betas") as ds:
        ds[0]
        with pytest.warns(LoaderkitDeprecationWarning, match=r"now \S+\.handles\.file_pool_info"):
            assert ds.cache_info() == ds.handles.file_pool_info()
        with pytest.warns(LoaderkitDeprecationWarning, match="handles.open_files"):
            assert ds.open_files == 1
        with pytest.warns(LoaderkitDeprecationWarning, match="handles.sample_nbytes"):
            assert ds.sample_nbytes == ds.handles.sample_nbytes
        with pytest.warns(LoaderkitDeprecationWarning, match="handles.index_arrays"):
            assert ds.index_arrays()[1].tolist() == ds.handles.index_arrays()[1].tolist()
    import loaderkit.hdf5

    with pytest.warns(LoaderkitDeprecationWarning, match=r"now loaderkit\.hdf5\.FilePoolInfo"):
        assert loaderkit.hdf5.CacheInfo is FilePoolInfo
    with pytest.warns(LoaderkitDeprecationWarning, match=r"now loaderkit\.hdf5\.default_chunk_buf"):
        assert loaderkit.hdf5.default_chunk_cache is default_chunk_buffer
    # the new names answer without a warning (warnings are errors here)
    assert ds.handles.file_pool_info().open_files == 0
    assert loaderkit.hdf5.FilePoolInfo is FilePoolInfo
    assert loaderkit.hdf5.default_chunk_buffer is default_chunk_buffer
    with pytest.raises(AttributeError, match="has no attribute 'HandleCacheInfo'"):
        loaderkit.hdf5.HandleCacheInfo  # noqa: B018 - unreleased, renamed without an alias


class _OwnCache(HDF5SessionDataset):
    """A subclass with attributes of its own named ``cache`` and ``open_files``."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.cache = {"before": 1}
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.cache["after"] = 2
        self.open_files = ["mine"]


def test_a_subclass_keeps_its_own_attributes_of_common_names(tmp_path: Path) -> None:
    paths = write_sessions(tmp_path, [5, 3])
    with _OwnCache(paths, key="betas") as ds:  # no warning: warnings are errors here
        assert ds.cache == {"before": 1, "after": 2} and ds.open_files == ["mine"]
        clone = pickle.loads(pickle.dumps(ds))
        assert clone.cache == {"before": 1, "after": 2}
        np.testing.assert_array_equal(clone[7], ds[7])
        clone.close()


def test_the_loader_support_answers_from_the_parts(tmp_path: Path) -> None:
    from loaderkit.support import LoaderShape, support_of

    paths = write_sessions(tmp_path, [5, 3], chunks=2)
    with HDF5SessionDataset(paths, key="betas") as ds:
        support = support_of(ds)
        assert support.thread_safe and support.read_path() == ds.handles.read_path
        index = support.session_index()
        assert index.sessions == 2 and index.chunk_rows.tolist() == [2, 2]
        assert index.positions.tolist() == [0] * 5 + [1] * 3
        assert index.rows.tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
        fitted = support.fit(LoaderShape(processes=2, open_files_soft=1024))
        rows = {entry.name: entry for entry in fitted.entries}
        assert rows["max_open_files"].value == ds.max_open_files == 2
        assert "hdf5_reads" in rows and fitted.hints == ()
        resources = support.resources()
        assert resources.open_files == 2 and resources.fitted and resources.held_bytes == 0
        assert support.prefetch_watcher() is None and support.cache_stats() is None
        seeded: list[int] = []
        batch = support.read_seeded([6, 1], seeded.append)
        assert [np.asarray(x).tolist() for x in batch] == [
            np.asarray(ds[6]).tolist(),
            np.asarray(ds[1]).tolist(),
        ]
        assert seeded == []  # nothing random happens without transform: nothing seeded
