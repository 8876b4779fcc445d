"""``build_index`` overridden, calling the base through ``super().build_index()``.

Returned as it is, the base's index gives every row (every readable type, per item, batched
and in loaders); a selection of it (every other row) gives those rows.
"""

from __future__ import annotations

import pytest

from tests.hdf5.corpus import Case, expected_samples
from tests.hdf5.subclasses import (
    EveryOtherRow,
    SuperBuildIndex,
    check_loader,
    check_reads,
    loader_params,
    open_as,
    readable,
)

pytestmark = pytest.mark.filterwarnings("ignore::loaderkit.errors.PerformanceHint")


@pytest.mark.parametrize("name", readable())
def test_super_build_index_gives_every_row(corpus_cases: dict[str, Case], name: str) -> None:
    case = corpus_cases[name]
    with open_as(SuperBuildIndex, case) as ds:
        check_reads(ds, expected_samples(case))


@pytest.mark.parametrize("name", readable())
def test_a_selection_of_the_base_index(corpus_cases: dict[str, Case], name: str) -> None:
    case = corpus_cases[name]
    with open_as(EveryOtherRow, case) as ds:
        check_reads(ds, expected_samples(case)[::2])


@pytest.mark.parametrize(("name", "workers", "context"), loader_params())
def test_a_selection_of_the_base_index_in_loaders(
    corpus_cases: dict[str, Case], name: str, workers: int, context: str | None
) -> None:
    case = corpus_cases[name]
    with open_as(EveryOtherRow, case) as ds:
        check_loader(
            ds, expected_samples(case)[::2], num_workers=workers, multiprocessing_context=context
        )
