"""Documentation stays runnable: every ```python block of README.md and docs/ runs on its own.

A block runs alone, as a reader who copies only that block runs it: its own imports and
definitions, nothing from the blocks before it. What a block may take from the page is the files
its setup blocks wrote (a block whose first line is ``# doc: setup ...``, which the page tells
the reader to run first). Blocks that need CUDA, torchrun or a real corpus start with
``# doc: not run``.

The fast tier runs each block in a fresh namespace of this process, in a copy of the directory
the page's setup blocks wrote; the slow tier runs each in a fresh interpreter (``python -``,
as a pasted session), so nothing a test process set up (imports, the start method) helps.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
SKIP = "# doc: not run"  # first line of a block that needs CUDA, torchrun or the real dataset
SETUP = "# doc: setup"  # first line of a block that writes the files later blocks read


def _pages() -> list[Path]:
    pages = sorted(p for p in DOCS.rglob("*.md") if BLOCK.search(p.read_text()))
    return [ROOT / "README.md", *pages]


def _blocks(page: Path) -> list[str]:
    return BLOCK.findall(page.read_text())


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else page.name


CASES = [
    pytest.param(page, i, id=f"{_name(page)}[{i}]")
    for page in _pages()
    for i, block in enumerate(_blocks(page))
    if not block.lstrip().startswith(SKIP)
]


def _run_here(page: Path, index: int, block: str) -> None:
    """``block`` in a fresh namespace of this process, in the current directory."""
    code = compile(block, f"{_name(page)}[block {index}]", "exec")
    exec(code, {"__name__": "__docs__"})


#: Seconds a block may run alone before its threads' stacks are dumped and it fails (below the
#: tier's per-test timeout, so a hang is reported with where it waits).
BLOCK_SECONDS = 200


def _run_alone(page: Path, index: int, block: str, where: Path) -> None:
    """``block`` in a fresh interpreter (read from stdin, as a pasted session) in ``where``."""
    child = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=where,
        text=True,
    )
    try:
        _, stderr = child.communicate(block, timeout=BLOCK_SECONDS)
    except subprocess.TimeoutExpired:
        child.send_signal(signal.SIGABRT)  # faulthandler writes every thread's stack
        _, stderr = child.communicate(timeout=60)
        raise AssertionError(
            f"{_name(page)}[block {index}] still ran after {BLOCK_SECONDS} s:\n{stderr[-6000:]}"
        ) from None
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, f"{_name(page)}[block {index}] failed:\n{stderr[-3000:]}"


_SETUP_DIRS: dict[tuple[Path, bool], Path] = {}


def _page_dir(
    page: Path, alone: bool, factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """A directory holding what the page's setup blocks wrote (run once per page and mode)."""
    if (page, alone) not in _SETUP_DIRS:
        where = factory.mktemp(f"setup-{page.stem}")
        for i, block in enumerate(_blocks(page)):
            if block.lstrip().startswith(SETUP):
                if alone:
                    _run_alone(page, i, block, where)
                else:
                    monkeypatch.chdir(where)
                    _run_here(page, i, block)
        _SETUP_DIRS[page, alone] = where
    return _SETUP_DIRS[page, alone]


def _prepare(
    page: Path,
    alone: bool,
    factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> Path:
    setup = _page_dir(page, alone, factory, monkeypatch)
    where = tmp_path / "page"
    shutil.copytree(setup, where)  # a block may change the files (one damages one on purpose)
    return where


@pytest.mark.parametrize(("page", "index"), CASES)
def test_block_runs_in_a_fresh_namespace(
    page: Path,
    index: int,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    fork_default: None,
) -> None:
    block = _blocks(page)[index]
    where = _prepare(page, False, tmp_path_factory, monkeypatch, tmp_path)
    if block.lstrip().startswith(SETUP):
        return  # it ran, alone, where the page's directory was written
    monkeypatch.chdir(where)
    _run_here(page, index, block)


@pytest.mark.slow
@pytest.mark.parametrize(("page", "index"), CASES)
def test_block_runs_in_a_fresh_interpreter(
    page: Path,
    index: int,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    block = _blocks(page)[index]
    where = _prepare(page, True, tmp_path_factory, monkeypatch, tmp_path)
    if block.lstrip().startswith(SETUP):
        return  # it ran in its own interpreter where the page's directory was written
    _run_alone(page, index, block, where)


def test_the_pages_with_code_are_found() -> None:
    pages = {p.name for p in _pages()}
    assert {"README.md", "index.md", "reproducibility.md", "platforms.md", "hdf5.md"} <= pages


def test_a_block_that_needs_an_earlier_one_fails_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check can fail: a block using a name only an earlier block defined is caught."""
    page = tmp_path / "page.md"
    page.write_text("```python\nvalue = 3\n```\n\ntext\n\n```python\nassert value == 3\n```\n")
    monkeypatch.chdir(tmp_path)
    first, second = _blocks(page)
    _run_here(page, 0, first)
    with pytest.raises(NameError, match="value"):
        _run_here(page, 1, second)


def test_a_block_that_hangs_is_reported_with_where_it_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys.modules[__name__], "BLOCK_SECONDS", 3)
    page = tmp_path / "page.md"
    block = "import time\n\n\ndef waits():\n    time.sleep(600)\n\n\nwaits()\n"
    with pytest.raises(AssertionError, match=r"(?s)still ran after 3 s.*in waits"):
        _run_alone(page, 0, block, tmp_path)
