"""Contracts the package promises and nothing else checks: typed (py.typed), runnable docs."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import loaderkit

ROOT = Path(__file__).resolve().parent.parent


def _modules() -> list[str]:
    names = pkgutil.walk_packages(loaderkit.__path__, prefix="loaderkit.")
    return sorted(info.name for info in names if not info.name.endswith(".__main__"))  # run the CLI


@pytest.mark.parametrize("name", ["loaderkit", *_modules()])
def test_docstring_examples_run(name: str) -> None:
    if name == "loaderkit.integrations.lightning":
        pytest.importorskip("lightning")
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in finder.find(module, name, globs=dict(vars(module))):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"


# slow tier: a cold mypy run over the package takes about 35 s (CONTRIBUTING.md: `mypy`)
@pytest.mark.slow
def test_mypy_reports_no_errors() -> None:
    if shutil.which("mypy") is None and importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (it is in the test extra)")
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
