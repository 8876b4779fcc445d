"""Never silently wrong: files that change, shrink or rot under a dataset.

Real files in ``tmp_path``, rewritten, truncated or damaged the way preprocessing re-runs,
full disks and bad sectors do it, read on every path (per item, batched with ``preadv``, memory
maps and HDF5 itself) in the main process and in real workers.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from loaderkit import HDF5FileError, HDF5SessionDataset, LoaderkitWarning, create_dataloader
from tests.hdf5.helpers import write_sessions

PATHS = {
    "contiguous": {},
    "chunked": {"chunks": 4},
    "gzip": {"chunks": 4, "compression": "gzip"},
}


def _rewrite(path: Path, rows: int, *, row_shape: tuple[int, ...] = (3, 4)) -> None:
    """Re-run 'preprocessing': the same file, fewer rows, and a second dataset after it."""
    with h5py.File(path, "w") as f:
        f.create_dataset("betas", data=np.ones((rows, *row_shape), "f4"))
        f.create_dataset("labels", data=np.full(200, -7, "i4"))


def _all_paths(ds: HDF5SessionDataset, n: int) -> list[Any]:
    """Read every way the dataset can read: per item and batched."""
    return [lambda: ds[n - 1], lambda: ds.__getitems__(list(range(n - 8, n)))]


@pytest.mark.parametrize("layout", list(PATHS))
@pytest.mark.parametrize("memory_map", [False, True])
def test_a_file_rewritten_with_fewer_rows_is_an_error_naming_what_changed(
    tmp_path: Path, layout: str, memory_map: bool
) -> None:
    (path,) = write_sessions(tmp_path, [50], **PATHS[layout])
    for read in range(2):
        ds = HDF5SessionDataset([path], key="betas", memory_map=memory_map)
        _rewrite(path, 40)
        reader = _all_paths(ds, 50)[read]
        with pytest.raises(HDF5FileError) as info:
            reader()
        message = str(info.value)
        assert "session 0" in message and str(path) in message
        assert "rows of 'betas' 50 -> 40" in message and "changed after the dataset" in message
        write_sessions(tmp_path, [50], **PATHS[layout])  # put it back for the next path


def test_a_file_rewritten_with_another_row_shape_is_an_error(tmp_path: Path) -> None:
    (path,) = write_sessions(tmp_path, [20])
    ds = HDF5SessionDataset([path], key="betas")
    _rewrite(path, 20, row_shape=(4, 3))
    with pytest.raises(HDF5FileError, match=r"row shape of 'betas' \(3, 4\) -> \(4, 3\)"):
        ds[3]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_changed_file_is_an_error_in_workers_too(tmp_path: Path, workers: int) -> None:
    paths = write_sessions(tmp_path, [30, 30])
    ds = HDF5SessionDataset(paths, key="betas")
    _rewrite(paths[1], 10)
    loader = create_dataloader(ds, batch_size=8, num_workers=workers)
    with pytest.raises(HDF5FileError, match="rows of 'betas' 30 -> 10"):
        for _ in loader:
            pass
    loader.close()


@pytest.mark.parametrize("layout", ["chunked", "gzip", "contiguous"])
def test_a_file_truncated_while_open_never_reads_as_zeros(tmp_path: Path, layout: str) -> None:
    (path,) = write_sessions(tmp_path, [64], **PATHS[layout])
    with HDF5SessionDataset([path], key="betas") as ds:
        assert ds.__getitems__([0, 1])  # the file is open now
        os.truncate(path, os.path.getsize(path) // 2)
        for read in (lambda: ds[63], lambda: ds.__getitems__(list(range(40, 64)))):
            with pytest.raises(HDF5FileError, match=r"truncated|changed"):
                read()


@pytest.mark.parametrize("workers", [0, 2])
def test_memory_mapped_file_truncated_between_epochs_is_an_error_not_sigbus(
    tmp_path: Path, workers: int
) -> None:
    paths = write_sessions(tmp_path, [64, 64])
    ds = HDF5SessionDataset(paths, key="betas", memory_map=True)
    loader = create_dataloader(
        ds, batch_size=16, num_workers=workers, persistent_workers=workers > 0
    )
    assert sum(len(b) for b in loader) == 128
    os.truncate(paths[1], os.path.getsize(paths[1]) - 1000)
    with pytest.raises(HDF5FileError) as info:
        for _ in loader:
            pass
    assert str(paths[1]) in str(info.value) and "truncated" in str(info.value)
    loader.close()


def test_hints_are_checked_not_matched_against_paths(tmp_path: Path) -> None:
    root = tmp_path / "block_design" / "lock_step"
    (path,) = write_sessions(root, [20])
    ds = HDF5SessionDataset([path], key="betas")
    os.truncate(path, 100)  # the superblock survives, the data does not
    with pytest.raises(HDF5FileError) as info:
        ds[5]
    message = str(info.value)
    assert "locking" not in message.lower() or "lock_step" in message  # no locking advice
    assert "h5py_options={'locking': False}" not in message
    assert "truncated" in message or "size" in message


def test_a_file_that_is_not_hdf5_says_so_by_its_signature(tmp_path: Path) -> None:
    path = tmp_path / "lock" / "s.h5"
    path.parent.mkdir()
    path.write_bytes(b"\x00" * 4096)
    with pytest.raises(HDF5FileError, match="no HDF5 signature") as info:
        HDF5SessionDataset([path], key="betas")
    assert "locking" not in str(info.value)


def _damage_chunk(path: Path, key: str, chunk: int) -> None:
    with h5py.File(path, "r") as f:
        info = f[key].id.get_chunk_info(chunk)
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + 5)
        byte = fh.read(1)
        fh.seek(info.byte_offset + 5)
        fh.write(bytes([byte[0] ^ 0xFF]))


def test_a_checksum_failure_says_checksum_and_names_the_damaged_rows(tmp_path: Path) -> None:
    path = tmp_path / "s.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset(
            "betas", data=np.arange(64, dtype="f4").reshape(16, 4), chunks=(4, 4), fletcher32=True
        )
    _damage_chunk(path, "betas", 2)  # rows 8..11
    ds = HDF5SessionDataset([path], key="betas")
    assert ds[0].tolist() == [0, 1, 2, 3]  # undamaged rows read
    for read in (lambda: ds[9], lambda: ds.__getitems__(list(range(16)))):
        with pytest.raises(HDF5FileError) as info:
            read()
        message = str(info.value)
        assert "checksum" in message and "rows 8..11" in message and "session 0" in message
        assert "modified, truncated or deleted" not in message
    assert ds.__getitems__([0, 1, 12])[2].tolist() == [48, 49, 50, 51]


def test_an_exception_in_transform_names_index_session_row_file(tmp_path: Path) -> None:
    paths = write_sessions(tmp_path, [5, 5])

    class Broken(HDF5SessionDataset):
        def transform(self, sample: Any, index: int) -> Any:
            if index == 7:
                raise ValueError("bad augmentation")
            return sample

    ds = Broken(paths, key="betas")
    for read in (lambda: ds[7], lambda: ds.__getitems__([6, 7])):
        with pytest.raises(ValueError, match="bad augmentation") as info:
            read()
        notes = "\n".join(getattr(info.value, "__notes__", []))
        assert "transform" in notes and "dataset index 7" in notes and "session 1" in notes
        assert "row 2" in notes and str(paths[1]) in notes and str(os.getpid()) in notes
    # fork: the dataset's class is local to the test
    loader = create_dataloader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork")
    with pytest.raises(ValueError, match="bad augmentation") as info:
        list(loader)
    assert "dataset index 7" in str(info.value) and "transform" in str(info.value)
    loader.close()


def test_the_same_file_twice_warns_naming_both_sessions_and_shares_one_handle(
    tmp_path: Path,
) -> None:
    (path,) = write_sessions(tmp_path, [6])
    link = tmp_path / "link.h5"
    link.symlink_to(path)
    with pytest.warns(LoaderkitWarning, match=r"sessions 'a' .* and 'b' .* are the same file"):
        ds = HDF5SessionDataset({"a": path, "b": link}, key="betas")
    assert len(ds) == 12 and ds.__getitems__([0, 6])[1].tolist() == ds[0].tolist()
    assert ds.handles.open_files == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "already open in the parent process" in workers
        loader = create_dataloader(ds, batch_size=4, num_workers=2)
        assert sum(len(b) for b in loader) == 12
        loader.close()


def test_an_exception_in_build_index_names_the_class_and_process(tmp_path: Path) -> None:
    paths = write_sessions(tmp_path, [3])

    class BadIndex(HDF5SessionDataset):
        def build_index(self) -> Any:
            raise RuntimeError("trial map missing")

    with pytest.raises(RuntimeError, match="trial map missing") as info:
        BadIndex(paths, key="betas")
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "BadIndex.build_index()" in notes and str(os.getpid()) in notes


_PERMISSION_CHECK = """
import sys
from loaderkit import HDF5FileError, HDF5SessionDataset
try:
    HDF5SessionDataset([sys.argv[1]], key="betas")
except HDF5FileError as exc:
    assert exc.errno == 13, exc.errno
    assert isinstance(exc.__cause__, PermissionError), repr(exc.__cause__)
    assert "permission denied" in str(exc) and "locking" not in str(exc), str(exc)
    print("ok")
"""


def test_a_permission_error_keeps_its_errno(tmp_path: Path) -> None:
    (path,) = write_sessions(tmp_path, [3])
    path.chmod(0)
    command = [sys.executable, "-c", _PERMISSION_CHECK, str(path)]
    if os.geteuid() == 0:  # root reads any file: drop the capabilities that let it
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: no permission error to provoke")
        caps = "-dac_override,-dac_read_search"
        command = [setpriv, "--bounding-set", caps, "--inh-caps", caps, *command]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    finally:
        path.chmod(0o644)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_a_virtual_dataset_with_a_missing_source_is_an_error_not_fill_values(
    tmp_path: Path,
) -> None:
    for i in range(2):
        with h5py.File(tmp_path / f"src{i}.h5", "w") as f:
            f["x"] = np.arange(4) + 10 * i
    layout = h5py.VirtualLayout(shape=(8,), dtype="i8")
    for i in range(2):
        layout[i * 4 : (i + 1) * 4] = h5py.VirtualSource(f"src{i}.h5", "x", shape=(4,))
    with h5py.File(tmp_path / "v.h5", "w") as f:
        f.create_virtual_dataset("v", layout, fillvalue=-1)
    ds = HDF5SessionDataset([tmp_path / "v.h5"], key="v")
    assert [int(ds[i]) for i in range(8)] == [0, 1, 2, 3, 10, 11, 12, 13]
    ds.close()
    (tmp_path / "src1.h5").unlink()
    with pytest.raises(HDF5FileError, match=r"source files \['src1.h5'\]"):
        ds[5]  # reopened: the source is gone
    with pytest.raises(HDF5FileError, match=r"virtual dataset whose source files \['src1.h5'\]"):
        HDF5SessionDataset([tmp_path / "v.h5"], key="v")
