"""Which hooks a dataset class overrides, and so how it reads batches (``ReadMode``)."""

from __future__ import annotations

from torch.utils.data import Dataset

from loaderkit import HDF5SessionDataset
from loaderkit.hdf5.dataset.readmode import ReadMode, describe_read_path, read_mode
from loaderkit.hdf5.read.reader import SessionReader
from tests.hdf5.helpers import Scaled, ScaledRows


def _loaderkit_classes(cls: type) -> list[type]:
    return [c for c in cls.__mro__ if c.__module__.startswith("loaderkit")]


def test_the_dataset_is_one_class_and_the_reader_one() -> None:
    assert _loaderkit_classes(HDF5SessionDataset) == [HDF5SessionDataset]
    assert HDF5SessionDataset.__bases__ == (Dataset,)
    assert _loaderkit_classes(SessionReader) == [SessionReader]  # its files: a part


def test_the_read_mode_follows_the_hooks_overridden() -> None:
    assert read_mode(HDF5SessionDataset, HDF5SessionDataset) is ReadMode.FAST
    assert read_mode(Scaled, HDF5SessionDataset) is ReadMode.ITEM
    assert read_mode(ScaledRows, HDF5SessionDataset) is ReadMode.ROWS


def test_read_path_reasons() -> None:
    assert describe_read_path(ReadMode.ITEM, "Mine", False, True)[0] == "per-sample"
    assert "Mine overrides read_rows" in describe_read_path(ReadMode.ROWS, "Mine", False, True)[1]
    assert "then transform" in describe_read_path(ReadMode.FAST, "Mine", True, True)[1]
    assert "one batch tensor" in describe_read_path(ReadMode.FAST, "Mine", False, True)[1]
    assert "per-field" in describe_read_path(ReadMode.FAST, "Mine", False, False)[1]
