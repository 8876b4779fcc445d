"""``h5dataset(session, name)`` serves any dataset of a session's file.

Looked up once per process and handle, cached with the handle and closed with it; a name the
file does not have is a ``KeyError`` listing its datasets; a dataset HDF5 cannot open is an
``HDF5FileError`` naming the file. A subclass reading its label from a second dataset works as
``self.file(session)[name]`` does, in the main process and in workers (fork and spawn).
"""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from loaderkit import HDF5FileError, HDF5SessionDataset, create_dataloader
from loaderkit.errors import MissingKeyError
from tests.hdf5.helpers import row_value, write_sessions
from tests.hdf5.subclasses import WithStimIds
from tests.helpers import tiered

ROWS = (10, 7)


def stim_ids(session: int, rows: int) -> np.ndarray:
    """Trial ids of a session: distinct across sessions and rows."""
    return (session * 1000 + np.arange(rows) * 7).astype("i8")


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two sessions: ``betas``, ``stim_ids`` and a group ``meta`` holding ``onsets``."""
    out = write_sessions(tmp_path_factory.mktemp("stim"), ROWS)
    for s, (path, rows) in enumerate(zip(out, ROWS, strict=True)):
        with h5py.File(path, "a") as f:
            f.create_dataset("stim_ids", data=stim_ids(s, rows))
            f.create_dataset("meta/onsets", data=np.arange(rows) * 0.5)
    return out


def test_any_dataset_of_the_file_is_served_and_cached(paths: list[Path]) -> None:
    with HDF5SessionDataset(paths, key="betas") as ds:
        stim = ds.h5dataset(1, "stim_ids")
        assert isinstance(stim, h5py.Dataset)
        np.testing.assert_array_equal(stim[()], ds.file(1)["stim_ids"][()])
        np.testing.assert_array_equal(stim[()], stim_ids(1, ROWS[1]))
        assert ds.h5dataset(1, "stim_ids") is stim  # looked up once per handle
        assert ds.h5dataset(0, "meta/onsets")[3] == 1.5  # nested paths too
        assert ds.h5dataset(0, "betas") is ds.h5dataset(0)  # a key's dataset, as before
        assert ds.handles.open_files == 2


def test_keys_by_name_and_by_path(paths: list[Path]) -> None:
    with HDF5SessionDataset(paths, key={"x": "betas", "y": "stim_ids"}) as ds:
        assert ds.h5dataset(0, "y") is ds.h5dataset(0, "stim_ids")
        assert ds.h5dataset(0, "x").name == "/betas"
        assert ds.h5dataset(0).name == "/betas"


def test_closed_with_its_handle_and_looked_up_again(paths: list[Path]) -> None:
    ds = HDF5SessionDataset(paths, key="betas", max_open_files=1)
    first = ds.h5dataset(0, "stim_ids")
    assert first.id.valid
    ds.h5dataset(1, "stim_ids")  # evicts session 0's file
    assert not first.id.valid
    again = ds.h5dataset(0, "stim_ids")
    assert again is not first and again.id.valid and again[2] == 14
    ds.close()
    assert not again.id.valid and ds.handles.open_files == 0
    assert ds.h5dataset(0, "stim_ids")[2] == 14  # reopened on use
    ds.close()


def test_a_name_the_file_lacks_is_a_key_error_listing_its_datasets(paths: list[Path]) -> None:
    with HDF5SessionDataset(paths, key="betas") as ds:
        with pytest.raises(KeyError) as info:
            ds.h5dataset(0, "stim_idz")
        assert isinstance(info.value, MissingKeyError)
        message = str(info.value)
        assert "'stim_idz'" in message and str(paths[0]) in message and "session 0" in message
        assert "'betas'" in message and "'stim_ids'" in message and "'meta/onsets'" in message
        with pytest.raises(KeyError, match="is a group"):
            ds.h5dataset(0, "meta")
        with pytest.raises(KeyError, match="unknown session"):
            ds.h5dataset(5, "stim_ids")
        with pytest.raises(TypeError, match="h5dataset"):
            ds.h5dataset(0, 3)  # type: ignore[arg-type]


def test_a_dataset_hdf5_cannot_open_is_an_error_naming_the_file(
    paths: list[Path], tmp_path: Path
) -> None:
    path = tmp_path / "rotten.h5"
    path.write_bytes(paths[0].read_bytes())
    with h5py.File(path, "r") as f:
        header = h5py.h5o.get_info(f["stim_ids"].id).addr
    ds = HDF5SessionDataset([path], key="betas")
    before = os.stat(path)
    with open(path, "r+b") as fh:  # its object header rots; size and time unchanged
        fh.seek(header)
        fh.write(bytes(64))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    with pytest.raises(HDF5FileError) as info:
        ds.h5dataset(0, "stim_ids")
    message = str(info.value)
    assert str(path) in message and "session 0" in message and "'stim_ids'" in message
    assert "h5check" in message and info.value.__cause__ is not None
    assert ds[3].shape == (3, 4)  # the key's rows still read
    ds.close()


def _expected(ds: HDF5SessionDataset) -> list[tuple[np.ndarray, int]]:
    out = []
    for i in range(len(ds)):
        session, row = ds.locate(i)
        out.append((row_value(int(session), row), int(ds.file(session)["stim_ids"][row])))
    ds.close()
    return out


# fast: this process and forked workers; spawned workers unpickle the subclass by path as
# tests/hdf5/dataset/test_workers.py's fast spawn cell does (slow tier)
@pytest.mark.parametrize(
    ("workers", "context"),
    tiered(
        [(0, None), (2, "fork"), (2, "spawn")],
        {(0, None), (2, "fork")},
        ids=["main", "fork", "spawn"],
    ),
)
def test_a_subclass_reading_a_second_dataset_in_loaders(
    paths: list[Path], workers: int, context: str | None
) -> None:
    ds = WithStimIds(paths, key="betas")
    want = _expected(ds)
    assert ds[12]["stim"] == want[12][1] == 1000 + 2 * 7
    loader = create_dataloader(
        ds, batch_size=4, num_workers=workers, multiprocessing_context=context
    )
    with loader:
        got = [(b["betas"], b["stim"]) for b in loader]
    betas = torch.cat([b for b, _ in got]).numpy()
    stims = torch.cat([s for _, s in got]).tolist()
    np.testing.assert_array_equal(betas, np.stack([b for b, _ in want]))
    assert stims == [s for _, s in want]
    ds.close()


def test_the_handles_part_answers_from_the_reader(paths: list[Path]) -> None:
    """``SessionHandles`` reads its reader: session ids, the index and the open files."""
    with HDF5SessionDataset(paths, key="betas") as ds:
        handles = ds.handles
        assert handles.reader is ds._reader and ds.session_ids == (0, 1)
        assert ds._reader.files.position(1) == 1
        with pytest.raises(KeyError, match=r"unknown session 'x'; sessions: \[0, 1\]"):
            ds._reader.files.position("x")
        assert handles.io_paths(0).keys() == {"betas"}
        pos, rows = handles.index_arrays()
        assert pos.tolist() == [0] * ROWS[0] + [1] * ROWS[1] and not rows.flags.writeable
