"""``transform`` overridden, calling the base through ``super().transform``.

Batched reads are kept (the plan says so); per item, batched, in loaders, and with
``sample_seeding=True`` (the seeded batched path).
"""

from __future__ import annotations

import pytest

from tests.hdf5.corpus import Case, expected_samples
from tests.hdf5.subclasses import (
    SuperTransform,
    check_loader,
    check_reads,
    loader_params,
    open_as,
    readable,
)

pytestmark = pytest.mark.filterwarnings("ignore::loaderkit.errors.PerformanceHint")


@pytest.mark.parametrize("name", readable())
def test_super_transform_gives_what_the_base_gives(
    corpus_cases: dict[str, Case], name: str
) -> None:
    case = corpus_cases[name]
    with open_as(SuperTransform, case) as ds:
        assert ds.handles.read_path[0] == "batch-native"
        check_reads(ds, expected_samples(case))


@pytest.mark.parametrize(("name", "workers", "context"), loader_params())
def test_super_transform_in_loaders(
    corpus_cases: dict[str, Case], name: str, workers: int, context: str | None
) -> None:
    case = corpus_cases[name]
    with open_as(SuperTransform, case) as ds:
        check_loader(
            ds, expected_samples(case), num_workers=workers, multiprocessing_context=context
        )


@pytest.mark.parametrize("workers", [0, 2])
def test_super_transform_with_sample_seeding(corpus_cases: dict[str, Case], workers: int) -> None:
    case = corpus_cases["num_i2_be_gzip"]
    with open_as(SuperTransform, case) as ds:
        check_loader(ds, expected_samples(case), num_workers=workers, seed=0, sample_seeding=True)
