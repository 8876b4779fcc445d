"""Fixtures shared by the HDF5 tests."""

from __future__ import annotations

import pytest

from tests.hdf5 import corpus
from tests.hdf5.corpus import Case


@pytest.fixture(scope="session")
def corpus_cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Case]:
    """Every corpus case, written once per test session (read-only for the tests)."""
    return corpus.write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture
def several_readers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every batch read as if another thread read a batch beside it (the GIL-sharing paths).

    One thread reads contiguous runs with a ``preadv`` each; where threads read at once, a
    batch's runs go to the kernel together (a ring, or page-cache copies that take turns).
    """
    from loaderkit.hdf5.read.reader import SessionReader

    monkeypatch.setattr(SessionReader, "threads_reading", lambda self: 2)
