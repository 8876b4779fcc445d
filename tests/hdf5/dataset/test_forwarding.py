"""The dataset is one class holding its parts; old cache names warn and answer as the new ones.

``HDF5SessionDataset`` has no loaderkit base class: its reader, accessors, budgets and cache
view are objects it holds, and its public names forward to them with the part's docstring.
``cache`` / ``cache_stats`` (the node ``SessionCache`` and its counters) are now
``session_cache`` / ``session_cache_stats``; ``cache_info`` (open files) is
``handle_cache_info``: each old name emits a ``LoaderkitDeprecationWarning`` naming the new one
and returns the same thing.
"""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch.utils.data import Dataset

from loaderkit import HDF5SessionDataset, LoaderkitDeprecationWarning, SessionCache
from loaderkit.errors import LoaderkitWarning
from loaderkit.hdf5.dataset.accessors import SessionAccess
from loaderkit.hdf5.dataset.budgeting import SessionBudgets
from loaderkit.hdf5.meta.index import check_index
from loaderkit.hdf5.read.reader import SessionReader
from loaderkit.hdf5.read.strategy import ReadMode, describe_read_path
from loaderkit.hdf5.remote.cachedsessions import CachedSessions, session_positions
from tests.hdf5.helpers import write_sessions


@pytest.fixture
def paths(tmp_path: Path) -> list[Path]:
    return write_sessions(tmp_path / "data", (5, 3))


def _loaderkit_classes(cls: type) -> list[type]:
    return [c for c in cls.__mro__ if c.__module__.startswith("loaderkit")]


def test_the_dataset_is_one_class_and_the_reader_two() -> None:
    assert _loaderkit_classes(HDF5SessionDataset) == [HDF5SessionDataset]
    assert HDF5SessionDataset.__bases__ == (Dataset,)
    assert len(_loaderkit_classes(SessionReader)) == 2


def test_parts_are_held_and_forwarded_with_their_docs(paths: list[Path]) -> None:
    with HDF5SessionDataset(paths, key="betas") as ds:
        assert isinstance(ds._access, SessionAccess)
        assert isinstance(ds._budgets, SessionBudgets)
        assert isinstance(ds._cached, CachedSessions)
        assert ds._access.reader is ds._reader is ds._budgets.reader is ds._cached.reader
        assert HDF5SessionDataset.file_budget.__doc__ == SessionBudgets.file_budget.__doc__
        assert HDF5SessionDataset.file.__doc__ == SessionAccess.file.__doc__
        assert HDF5SessionDataset.open_files.__doc__ == vars(SessionAccess)["open_files"].__doc__
        assert ds.session_ids == (0, 1) and ds.open_files == 0
        ds[6]
        assert ds.open_files == 1 and ds.handle_cache_info().opens == 1


def test_old_cache_names_warn_and_answer_as_the_new_ones(paths: list[Path], tmp_path: Path) -> None:
    assert issubclass(LoaderkitDeprecationWarning, LoaderkitWarning)
    cache = SessionCache(tmp_path / "cache", room_timeout=20)
    with HDF5SessionDataset(paths, key="betas", cache=cache) as ds:
        np.testing.assert_array_equal(ds[0], ds[0])
        with pytest.warns(LoaderkitDeprecationWarning, match=r"\.session_cache\b"):
            old_cache = ds.cache
        assert old_cache is ds.session_cache is cache
        with pytest.warns(LoaderkitDeprecationWarning, match=r"\.session_cache_stats\b"):
            old_stats = ds.cache_stats()
        assert old_stats is not None
        # the disk's free bytes move with every other process writing on it
        new_stats = dataclasses.replace(ds.session_cache_stats(), free_bytes=old_stats.free_bytes)
        assert old_stats == new_stats
        assert old_stats.misses >= 1
        with pytest.warns(LoaderkitDeprecationWarning, match=r"\.handle_cache_info\b"):
            old_info = ds.cache_info()
        assert old_info == ds.handle_cache_info() and old_info.opens >= 1


def test_old_names_without_a_cache(paths: list[Path]) -> None:
    with HDF5SessionDataset(paths, key="betas") as ds:
        with pytest.warns(LoaderkitDeprecationWarning, match="session_cache"):
            assert ds.cache is None
        with pytest.warns(LoaderkitDeprecationWarning, match="session_cache_stats"):
            assert ds.cache_stats() is None
        assert ds.session_cache is None and ds.session_cache_stats() is None
        assert ds.prefetch_watcher() is None and ds.cache_plan(2) == []
        assert ds.shuffle_hint() is None
        assert ds.cached_open_files(2) is None


class _OwnCache(HDF5SessionDataset):
    """A subclass with an attribute of its own named ``cache``, set before and after init."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.cache = {"before": 1}
        super().__init__(*args, **kwargs)
        self.cache["after"] = 2


def test_a_subclass_keeps_its_own_cache_attribute(paths: list[Path]) -> None:
    with _OwnCache(paths, key="betas") as ds:  # no warning: warnings are errors here
        assert ds.cache == {"before": 1, "after": 2}
        clone = pickle.loads(pickle.dumps(ds))
        assert clone.cache == {"before": 1, "after": 2}
        np.testing.assert_array_equal(clone[7], ds[7])
        clone.close()


def test_pickled_parts_share_the_reader_and_the_index(paths: list[Path]) -> None:
    with HDF5SessionDataset(paths, key="betas") as ds:
        clone = pickle.loads(pickle.dumps(ds))
        assert clone._access.reader is clone._reader is clone._cached.reader
        assert clone._access.keys is clone._key is clone._cached.keys
        assert clone.index_arrays()[1].tolist() == ds.index_arrays()[1].tolist()
        assert clone.locate(6) == (1, 1)
        clone.close()


def test_session_positions_and_check_index() -> None:
    keys = np.array([0, 1, 1 << 36, (1 << 36) + 1], np.int64)
    assert session_positions(keys, np.array([0, 2, 3])).tolist() == [0, 1, 1]
    assert session_positions(keys, np.array([-1, 4])).tolist() == [1, -1]
    assert session_positions(keys, np.array([0.5])).tolist() == [-1]
    assert check_index(-4, 4) == 0
    with pytest.raises(IndexError, match="index 4 is out of range for a dataset of 4"):
        check_index(4, 4)
    with pytest.raises(TypeError, match="must be integers, got str"):
        check_index("1", 4)


def test_read_path_reasons() -> None:
    assert describe_read_path(ReadMode.ITEM, "Mine", False, True)[0] == "per-sample"
    assert "Mine overrides read_rows" in describe_read_path(ReadMode.ROWS, "Mine", False, True)[1]
    assert "then transform" in describe_read_path(ReadMode.FAST, "Mine", True, True)[1]
    assert "one batch tensor" in describe_read_path(ReadMode.FAST, "Mine", False, True)[1]
    assert "per-field" in describe_read_path(ReadMode.FAST, "Mine", False, False)[1]
