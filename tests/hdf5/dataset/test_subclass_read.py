"""``read`` overridden, calling the base through ``super().read()``.

The base ``read`` behaves exactly as when it is not overridden: the same samples for every
readable type (one key or several), per item, batched and in loaders (0 and 2 workers, fork
and spawn); a type no torch dtype holds is a ``ConfigError`` naming the type at the call of
the base ``read`` (not at construction: an override may convert such rows itself).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch

from loaderkit import ConfigError, create_dataloader
from tests.hdf5.corpus import Case, case_names, expected_samples
from tests.hdf5.subclasses import (
    RawBytesRead,
    ScaledRead,
    SuperRead,
    check_loader,
    check_reads,
    load,
    loader_params,
    open_as,
    readable,
)
from tests.helpers import tiered

pytestmark = pytest.mark.filterwarnings("ignore::loaderkit.errors.PerformanceHint")


@pytest.mark.parametrize("name", readable())
def test_super_read_gives_what_the_base_gives(corpus_cases: dict[str, Case], name: str) -> None:
    case = corpus_cases[name]
    with open_as(SuperRead, case) as ds:
        check_reads(ds, expected_samples(case))


@pytest.mark.parametrize(("name", "workers", "context"), loader_params(spawn_fast=True))
def test_super_read_in_loaders(
    corpus_cases: dict[str, Case], name: str, workers: int, context: str | None
) -> None:
    case = corpus_cases[name]
    with open_as(SuperRead, case) as ds:
        check_loader(
            ds, expected_samples(case), num_workers=workers, multiprocessing_context=context
        )


# ------------------------------------------------------------------ the issue's own override


def write_betas(root: Path, sessions: int = 2, trials: int = 10, voxels: int = 6) -> list[Path]:
    """NSD-like files: int16 betas x300, chunks of one voxel's trials."""
    paths = []
    for s in range(sessions):
        path = root / f"betas_session{s + 1:02d}.hdf5"
        values = (np.arange(trials * voxels).reshape(trials, voxels) + 10 * s) * 300
        with h5py.File(path, "w") as f:
            f.create_dataset("betas", data=values.astype("<i2"), chunks=(trials, 1))
        paths.append(path)
    return paths


def scaled(sessions: int = 2, trials: int = 10, voxels: int = 6) -> list[np.ndarray]:
    return [
        (np.arange(voxels) + t * voxels + 10 * s).astype(np.float32)
        for s in range(sessions)
        for t in range(trials)
    ]


def test_the_issues_override_per_item_and_batched(tmp_path: Path) -> None:
    with ScaledRead(write_betas(tmp_path), key="betas") as ds:
        want = scaled()
        for i, expected in enumerate(want):
            got = ds[i]
            assert got.dtype == np.float32
            np.testing.assert_array_equal(got, expected)
        batch = ds.__getitems__([13, 2, 2, 19])
        for got, i in zip(batch, [13, 2, 2, 19], strict=True):
            np.testing.assert_array_equal(got, want[i])
        assert ds.handles.read_path[0] == "per-sample"


# fast: in this process, in forked workers; spawn and forkserver pickle the subclass as the
# spawn cell of test_super_read_in_loaders does (slow tier)
@pytest.mark.parametrize(
    ("workers", "context"),
    tiered([(0, None), (2, "fork"), (2, "spawn"), (2, "forkserver")], {(0, None), (2, "fork")}),
)
def test_the_issues_override_in_loaders(tmp_path: Path, workers: int, context: str | None) -> None:
    want = torch.from_numpy(np.stack(scaled()))
    with ScaledRead(write_betas(tmp_path), key="betas") as ds:
        loader = create_dataloader(
            ds, batch_size=8, num_workers=workers, multiprocessing_context=context
        )
        with loader:
            got = torch.cat(load(loader))
    torch.testing.assert_close(got, want)


# ------------------------------------------------------------------ types torch cannot hold


@pytest.mark.parametrize("name", case_names("refuse"))
def test_the_base_read_refuses_at_its_call_naming_the_type(
    corpus_cases: dict[str, Case], name: str
) -> None:
    case = corpus_cases[name]
    with open_as(SuperRead, case) as ds:  # constructed: the override may convert the rows
        reads: list[Any] = [
            lambda: ds[0],
            lambda: ds.__getitems__([0, 1]),
            lambda: ds.read("s", 0),
            lambda: load(create_dataloader(ds, batch_size=2)),
        ]
        for read in reads:
            with pytest.raises(ConfigError) as info:
                read()
            message = str(info.value)
            assert case.key in message, message
            assert any(word in message.lower() for word in case.match), (case.match, message)


@pytest.mark.parametrize("name", ["refuse_longdouble", "refuse_opaque"])
def test_an_override_that_converts_such_rows_itself_works(
    corpus_cases: dict[str, Case], name: str
) -> None:
    case = corpus_cases[name]
    with h5py.File(case.path, "r") as f:
        raw = [np.ascontiguousarray(row).tobytes() for row in f[case.key][()]]
    with open_as(RawBytesRead, case) as ds:
        assert [ds[i].tobytes() for i in range(len(ds))] == raw
        batches = load(create_dataloader(ds, batch_size=4, num_workers=2))
    assert b"".join(bytes(b.numpy().tobytes()) for b in batches) == b"".join(raw)


def test_sessions_whose_rows_differ_are_refused_at_the_base_reads_call(tmp_path: Path) -> None:
    paths = [tmp_path / "a.h5", tmp_path / "b.h5"]
    for path, shape in zip(paths, [(4, 3), (4, 5)], strict=True):
        with h5py.File(path, "w") as f:
            f.create_dataset("x", data=np.ones(shape, "f4"))
    with pytest.raises(ConfigError):  # the default read: at construction, as before
        SuperRead.__mro__[1](paths, key="x")
    with SuperRead(paths, key="x") as ds:
        with pytest.raises(ConfigError) as info:
            ds[0]
        assert "'x'" in str(info.value), info.value
