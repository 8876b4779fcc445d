"""tests/conftest.py drops exactly one unraisable exception: torch's probe file unlinked twice."""

from __future__ import annotations

import gc
import os
import tempfile
import types

import pytest

from tests.conftest import _torch_probe_leftover


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_a_temporary_file_unlinked_twice_fails_no_test() -> None:
    f = tempfile.NamedTemporaryFile()  # noqa: SIM115 - its collection is the point
    os.unlink(f.name)  # as NamedTemporaryFile's own error path does under torch's SIGCHLD
    del f
    gc.collect()


def test_every_other_unraisable_exception_still_reaches_pytest() -> None:
    def unraisable(exc: BaseException, obj: object) -> object:
        return types.SimpleNamespace(exc_value=exc, object=obj)

    closer = tempfile._TemporaryFileCloser.__del__  # type: ignore[attr-defined]
    gone = FileNotFoundError(2, "No such file", os.path.join(tempfile.gettempdir(), "tmpx"))
    assert _torch_probe_leftover(unraisable(gone, closer))
    assert not _torch_probe_leftover(unraisable(ValueError("x"), closer))
    assert not _torch_probe_leftover(unraisable(gone, lambda: None))
    elsewhere = FileNotFoundError(2, "No such file", "/data/session.h5")
    assert not _torch_probe_leftover(unraisable(elsewhere, closer))
