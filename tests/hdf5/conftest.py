"""Fixtures shared by the HDF5 tests."""

from __future__ import annotations

import pytest

from tests.hdf5 import corpus
from tests.hdf5.corpus import Case


@pytest.fixture(scope="session")
def corpus_cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Case]:
    """Every corpus case, written once per test session (read-only for the tests)."""
    return corpus.write_corpus(tmp_path_factory.mktemp("corpus"))
