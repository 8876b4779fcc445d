"""``__getitems__`` overridden, calling the base through ``super().__getitems__``.

The base's batch passes through unchanged (``RebuiltGetItems`` copies it into a plain list),
for every readable type, batched and in loaders (where the override is what torch's fetcher
calls, in the worker).
"""

from __future__ import annotations

import pytest

from loaderkit import HDF5SessionDataset
from tests.hdf5.corpus import Case, expected_samples
from tests.hdf5.subclasses import (
    RebuiltGetItems,
    SuperGetItems,
    check_loader,
    check_reads,
    loader_params,
    open_as,
    readable,
)

pytestmark = pytest.mark.filterwarnings("ignore::loaderkit.errors.PerformanceHint")

CLASSES = [SuperGetItems, RebuiltGetItems]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", readable())
def test_super_getitems_gives_what_the_base_gives(
    corpus_cases: dict[str, Case], name: str, cls: type[HDF5SessionDataset]
) -> None:
    case = corpus_cases[name]
    with open_as(cls, case) as ds:
        check_reads(ds, expected_samples(case))


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize(("name", "workers", "context"), loader_params())
def test_super_getitems_in_loaders(
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
