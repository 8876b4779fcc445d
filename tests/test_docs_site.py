"""The MkDocs site builds strictly, and the API reference covers the whole public surface."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import loaderkit

ROOT = Path(__file__).resolve().parent.parent


def test_every_public_name_is_in_the_api_reference() -> None:
    text = (ROOT / "docs" / "api.md").read_text()
    documented = set(re.findall(r"^::: loaderkit\.(\w+)\s*$", text, re.M))
    # an alias (create_dataloader is DataLoader) is documented with the object it names
    aliases = {
        name
        for name in loaderkit.__all__
        if f"`{name}`" in text
        and any(getattr(loaderkit, name) is getattr(loaderkit, d, None) for d in documented)
    }
    missing = set(loaderkit.__all__) - {"__version__"} - documented - aliases
    assert not missing, f"add to docs/api.md: {sorted(missing)}"


def test_every_page_is_in_the_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in (ROOT / "docs").glob("*.md"):
        assert page.name in nav, f"{page.name} is not in mkdocs.yml's nav"


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path: Path) -> None:
    if shutil.which("mkdocs") is None and not _has_module("mkdocs"):
        pytest.fail("mkdocs is not installed: pip install '.[test]' installs it")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert (tmp_path / "site" / "api" / "index.html").exists()
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    for name in loaderkit.__all__:
        if name != "__version__":
            assert name in api


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None
