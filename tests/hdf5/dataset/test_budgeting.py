"""max_open_files fitted to the machine: every session when descriptors and memory allow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from loaderkit import ConfigError, DataLoader, HDF5SessionDataset, LoaderkitWarning
from loaderkit.policy.budgets import (
    FDS_MAIN_MARGIN,
    FDS_PER_WORKER,
    FILE_OVERHEAD_BYTES,
    fit_open_files,
)
from loaderkit.support import LoaderShape
from tests.conftest import fake_platform
from tests.hdf5.helpers import hdf5_fds, write_sessions

MIB = 1 << 20


# ------------------------------------------------------------------ the arithmetic


def test_all_sessions_when_they_fit() -> None:
    budget = fit_open_files(16, 8, 1024, 9 * MIB, 24 << 30)
    assert budget.files == 16
    assert budget.reason.startswith("all 16 sessions per process")
    assert "9 processes x 16 files" in budget.reason


def test_descriptor_bound() -> None:
    # each process has its own limit: the busiest one (the main process, which holds every
    # worker's queues) decides, not the sum over processes
    soft = 1024
    budget = fit_open_files(1000, 8, soft, MIB, 1 << 40, main_fds=20)
    assert budget.files == soft // 2 - (20 + FDS_MAIN_MARGIN + 8 * FDS_PER_WORKER)
    assert "of 1000 sessions per process" in budget.reason and "per process" in budget.reason
    assert "half the soft limit 1024" in budget.reason
    assert fit_open_files(200, 8, soft, MIB, 1 << 40, main_fds=20).files == 200


def test_memory_bound() -> None:
    budget = fit_open_files(64, 3, None, 9 * MIB, 2 << 30)  # 1/16 of 2 GiB = 128 MiB
    assert budget.files == (128 * MIB) // (4 * 9 * MIB)
    assert "128 MiB (0.0625 of 2.00 GiB)" in budget.reason


def test_never_below_one_and_unbounded_without_limits() -> None:
    assert fit_open_files(10, 100, 64, MIB, None).files == 1
    assert fit_open_files(10, 100, None, MIB, None).files == 10


# ------------------------------------------------------------------ the dataset


def test_dataset_default_fits_this_process(tmp_path: Path) -> None:
    paths = write_sessions(tmp_path, [4] * 12)
    ds = HDF5SessionDataset(paths, key="betas")
    assert ds.budgets.open_files_requested is None
    assert ds.max_open_files == 12  # every session: far under any limit here
    assert ds.budgets.file_memory_bytes == FILE_OVERHEAD_BYTES  # contiguous: no chunk buffer
    explicit = HDF5SessionDataset(paths, key="betas", max_open_files=3)
    assert explicit.max_open_files == 3 and explicit.budgets.open_files_requested == 3


def test_chunked_files_count_their_chunk_buffer(tmp_path: Path) -> None:
    paths = write_sessions(tmp_path, [40] * 3, chunks=8, compression="gzip")
    ds = HDF5SessionDataset(paths, key="betas")
    assert ds.budgets.file_memory_bytes == 8 * MIB + FILE_OVERHEAD_BYTES  # HDF5's 8 MiB minimum
    small = ds.budgets.file_budget(LoaderShape(7, memory_bytes=512 * MIB))  # 32 MiB for 8 x 9 MiB
    assert small.files == 1
    custom = HDF5SessionDataset(paths, key="betas", h5py_options={"rdcc_nbytes": 32 * MIB})
    assert custom.budgets.file_memory_bytes == 32 * MIB + FILE_OVERHEAD_BYTES


def test_bad_values_are_refused(tmp_path: Path) -> None:
    paths = write_sessions(tmp_path, [4])
    with pytest.raises(ConfigError, match="max_open_files must be >= 1"):
        HDF5SessionDataset(paths, key="betas", max_open_files=0)
    ds = HDF5SessionDataset(paths, key="betas")
    with pytest.raises(ConfigError, match="max_open_files must be an int"):
        ds.budgets.set_open_files(2.5)  # type: ignore[arg-type]


# ------------------------------------------------------------------ the loader


def _loader(paths: list[Path], **kwargs: Any) -> DataLoader:
    options: dict[str, Any] = dict(batch_size=8, shuffle=True, seed=0, num_workers=2)
    max_open = options.pop("max_open_files", kwargs.pop("max_open_files", None))
    options.update(kwargs)
    return DataLoader(HDF5SessionDataset(paths, key="betas", max_open_files=max_open), **options)


def test_the_plan_shows_the_arithmetic_for_this_loader(tmp_path: Path) -> None:
    paths = write_sessions(tmp_path, [6] * 40)
    platform = fake_platform(open_files_soft=96, open_fds=10, memory_bytes=64 << 30)
    with pytest.warns(LoaderkitWarning, match="over half the limit"):  # fits, but only just
        loader = _loader(paths, num_workers=3, platform=platform)
    entry = loader.plan["max_open_files"]
    assert entry.value == loader.dataset.max_open_files < 40
    assert (
        "22 of 40 sessions per process" in entry.reason
        and "<= 96 (the whole soft limit" in entry.reason
    )
    loader.close()


def test_an_explicit_value_wins(tmp_path: Path) -> None:
    paths = write_sessions(tmp_path, [6] * 10)
    loader = _loader(paths, max_open_files=3)
    assert loader.dataset.max_open_files == 3
    entry = loader.plan["max_open_files"]
    assert (entry.requested, entry.value) == (3, 3)
    assert entry.reason.startswith("as given (unset would give 10: all 10 sessions")
    loader.close()


def _open_in_worker(_: Any) -> Any:
    info = torch.utils.data.get_worker_info()
    return info.dataset.handles.file_pool_info() if info is not None else None


def test_uniform_shuffle_with_defaults_never_reopens_a_file(tmp_path: Path) -> None:
    """Every worker keeps every session open: no file is closed and opened again."""
    paths = write_sessions(tmp_path, [10] * 16)
    loader = _loader(paths, num_workers=2, persistent_workers=True)
    assert loader.dataset.max_open_files == 16
    for _ in range(2):
        for _ in loader:
            pass
    worker_files = {len(hdf5_fds(tmp_path))}
    loader.close()
    assert worker_files == {0}  # the main process holds none (workers did the reading)

    probe = _loader(
        paths, num_workers=2, persistent_workers=True, collate_fn=_open_in_worker, batch_size=4
    )
    infos = [info for _ in range(2) for info in probe]
    probe.close()
    assert all(info.evictions == 0 for info in infos)
    assert max(info.open_files for info in infos) == 16
    assert {info.max_open_files for info in infos} == {16}


def test_the_budgets_part_reads_its_reader(tmp_path: Path) -> None:
    """``DatasetBudgets`` answers from the reader it holds: bounds set there are seen at once."""
    paths = write_sessions(tmp_path, [6, 4], chunks=2)
    with HDF5SessionDataset(paths, key="betas", max_open_files=1, memory_map=True) as ds:
        budgets = ds.budgets
        assert budgets.reader is ds._reader
        assert budgets.fds_per_file == 1  # chunked rows: nothing memory-mapped
        assert budgets.file_memory_bytes > 0
        budgets.set_open_files(2)  # the part applies the bound to the reader's file pool
        pool = ds._reader.files.file_pool
        assert pool.max_open == 2 == ds.max_open_files  # the attribute reads it
        assert budgets.open_files_requested == 1  # what was given stays what was given
        with pytest.raises(ConfigError, match="max_open_files"):
            budgets.set_open_files(0)
        assert budgets.held_capacity is None  # no key's rows span many chunks
        entry = budgets.fit_open_files(LoaderShape(processes=4, open_files_soft=1024))
        assert entry.requested == 1 and entry.value == 1 and "as given" in entry.reason
        assert ds.max_open_files == 2  # an explicit value is never refitted
