"""``__getitem__`` overridden, calling the base through ``super().__getitem__``.

Every readable type, per item and batched (one ``self[i]`` per sample), in loaders, and the
base's errors (an index out of range is an ``IndexError``) unchanged.
"""

from __future__ import annotations

import pytest

from tests.hdf5.corpus import Case, expected_samples
from tests.hdf5.subclasses import (
    SuperGetItem,
    check_loader,
    check_reads,
    loader_params,
    open_as,
    readable,
)

pytestmark = pytest.mark.filterwarnings("ignore::loaderkit.errors.PerformanceHint")


@pytest.mark.parametrize("name", readable())
def test_super_getitem_gives_what_the_base_gives(corpus_cases: dict[str, Case], name: str) -> None:
    case = corpus_cases[name]
    with open_as(SuperGetItem, case) as ds:
        assert ds.handles.read_path[0] == "per-sample"
        check_reads(ds, expected_samples(case))


@pytest.mark.parametrize(("name", "workers", "context"), loader_params())
def test_super_getitem_in_loaders(
    corpus_cases: dict[str, Case], name: str, workers: int, context: str | None
) -> None:
    case = corpus_cases[name]
    with open_as(SuperGetItem, case) as ds:
        check_loader(
            ds, expected_samples(case), num_workers=workers, multiprocessing_context=context
        )


def test_the_base_errors_come_through(corpus_cases: dict[str, Case]) -> None:
    case = corpus_cases["num_f4_le_contig"]
    with open_as(SuperGetItem, case) as ds:
        with pytest.raises(IndexError, match="out of range"):
            ds[len(ds)]
        with pytest.raises(TypeError, match="integers"):
            ds["0"]  # type: ignore[index]
