"""Documentation stays runnable: every ```python block in docs/ executes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
SKIP = "# doc: not run"  # first line of a block that needs CUDA, torchrun or the real dataset


def _pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if BLOCK.search(p.read_text()))


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(DOCS)))
def test_python_blocks_run(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fork_default: None
) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__docs__"}
    ran = 0
    for i, block in enumerate(BLOCK.findall(page.read_text())):
        if block.lstrip().startswith(SKIP):
            continue
        code = compile(block, f"{page.name}[block {i}]", "exec")
        exec(code, namespace)  # blocks of one page share a namespace, like a reader's session
        ran += 1
    assert ran or all(b.lstrip().startswith(SKIP) for b in BLOCK.findall(page.read_text()))


def test_the_pages_with_code_are_found() -> None:
    pages = {p.name for p in _pages()}
    assert {"index.md", "reproducibility.md", "platforms.md", "hdf5.md"} <= pages
