"""``read_rows`` overridden (batched-read opt-in), calling the base through ``super()``.

The base ``read_rows`` returns what per-row ``read`` gives, for every readable type, alone or
beside a ``read`` override that also calls its base; per item, batched and in loaders.
"""

from __future__ import annotations

import pytest

from loaderkit import HDF5SessionDataset
from tests.hdf5.corpus import Case, expected_samples
from tests.hdf5.subclasses import (
    SuperReadAndReadRows,
    SuperReadRows,
    check_loader,
    check_reads,
    loader_params,
    open_as,
    readable,
)

pytestmark = pytest.mark.filterwarnings("ignore::loaderkit.errors.PerformanceHint")

CLASSES = [SuperReadRows, SuperReadAndReadRows]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", readable())
def test_super_read_rows_gives_what_the_base_gives(
    corpus_cases: dict[str, Case], name: str, cls: type[HDF5SessionDataset]
) -> None:
    case = corpus_cases[name]
    with open_as(cls, case) as ds:
        assert ds.handles.read_path[0] == "runs"
        check_reads(ds, expected_samples(case))


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize(("name", "workers", "context"), loader_params())
def test_super_read_rows_in_loaders(
    corpus_cases: dict[str, Case],
    name: str,
    workers: int,
    context: str | None,
    cls: type[HDF5SessionDataset],
) -> None:
    case = corpus_cases[name]
    with open_as(cls, case) as ds:
        check_loader(
            ds, expected_samples(case), num_workers=workers, multiprocessing_context=context
        )
