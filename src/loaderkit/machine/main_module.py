r"""Whether the program's main module would run again in a spawned or forkserver worker.

Under ``spawn`` and ``forkserver`` (Python 3.14's Linux default), every new process imports the
parent's main module as ``__mp_main__`` before it runs anything else, so its top-level code runs
again there. A training script that builds and iterates a loader at top level, without an
``if __name__ == "__main__":`` guard around it, then starts workers from inside a worker's
bootstrapping (multiprocessing's raw ``RuntimeError``), or, under ``torchrun``, calls
``init_process_group`` a second time and hangs.

``find_unguarded_call`` reads the call stack once (detection); ``unguarded_line`` is the pure
part: whether a line of a module's source lies outside every ``__name__ == "__main__"`` guard.

Examples:
    >>> source = "import x\nif __name__ == '__main__':\n    run()\nrun()\n"
    >>> unguarded_line(source, 3), unguarded_line(source, 4)
    (False, True)
"""

from __future__ import annotations

import ast
import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

__all__ = ["MainRerun", "find_unguarded_call", "guard_example", "unguarded_line"]


@dataclass(frozen=True)
class MainRerun:
    """A file-backed main module whose top level is creating a loader outside a main guard.

    Attributes:
        file: The main module's file.
        line: The top-level line of that file that is running (the loader's creation, or the
            call that leads to it).
        text: That line's source text, stripped (empty when unreadable).
    """

    file: str
    line: int
    text: str = ""

    def where(self) -> str:
        """``file:line`` (and the line's text)."""
        text = f" ({self.text})" if self.text else ""
        return f"{self.file}:{self.line}{text}"


def _is_main_test(node: ast.expr) -> bool:
    """``__name__ == "__main__"`` in either order."""
    if not (isinstance(node, ast.Compare) and len(node.ops) == 1):
        return False
    if not isinstance(node.ops[0], ast.Eq):
        return False
    sides = [node.left, node.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    mains = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(mains) == 1


@functools.lru_cache(maxsize=16)
def _guarded_ranges(source: str) -> tuple[tuple[int, int], ...]:
    """Line ranges (first, last) of the bodies of top-level ``if __name__ == "__main__":``."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ()
    ranges = []
    for node in tree.body:
        if isinstance(node, ast.If) and _is_main_test(node.test) and node.body:
            first = node.body[0].lineno
            last = max(getattr(n, "end_lineno", None) or n.lineno for n in node.body)
            ranges.append((first, last))
    return tuple(ranges)


def unguarded_line(source: str, line: int) -> bool:
    r"""Whether top-level line ``line`` of ``source`` runs outside every main guard.

    Args:
        source: The module's source text.
        line: A 1-based line number of top-level code that is running.

    Returns:
        True when the line is not inside the body of a top-level
        ``if __name__ == "__main__":`` (so a spawned worker importing the module runs it).

    Examples:
        >>> unguarded_line("if '__main__' == __name__:\n    go()\n", 2)
        False
    """
    return not any(first <= line <= last for first, last in _guarded_ranges(source))


def _main_frame(frame: FrameType | None, main_globals: dict[str, object]) -> FrameType | None:
    """The frame running the main module's top-level code, if it is on the stack."""
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is main_globals:
            return frame
        frame = frame.f_back
    return None


def find_unguarded_call(frame: FrameType | None = None) -> MainRerun | None:
    """The main module's unguarded top-level line that leads to this call, if any.

    Returns ``None`` when the main module has no file (``python -c``, a notebook, a REPL:
    nothing is re-imported), when its top level is not on the call stack (the loader is made
    from a function called inside a guard, a thread, a framework callback), or when the line
    lies inside an ``if __name__ == "__main__":`` guard.

    Args:
        frame: Where to start walking up (default: the caller's frame).

    Examples:
        >>> find_unguarded_call() is None  # under pytest, __main__ is pytest's, not on the stack
        True
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not path:
        return None
    start = frame if frame is not None else sys._getframe(1)
    top = _main_frame(start, main.__dict__)
    if top is None:
        return None
    try:
        source = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None  # a frozen or compiled main: nothing to show, nothing re-run from source
    line = top.f_lineno
    if not unguarded_line(source, line):
        return None
    lines = source.splitlines()
    text = lines[line - 1].strip() if 0 < line <= len(lines) else ""
    return MainRerun(str(Path(path).resolve()), line, text)


def guard_example(rerun: MainRerun) -> str:
    """How to guard the script's top level (text for messages).

    Examples:
        >>> print(guard_example(MainRerun("/x/train.py", 7, "loader = create_dataloader(ds)")))
        def main():
            ...  # everything from train.py:7 on, e.g. loader = create_dataloader(ds)
        <BLANKLINE>
        if __name__ == "__main__":
            main()
    """
    name = Path(rerun.file).name
    example = f", e.g. {rerun.text}" if rerun.text else ""
    return (
        "def main():\n"
        f"    ...  # everything from {name}:{rerun.line} on{example}\n"
        "\n"
        'if __name__ == "__main__":\n'
        "    main()"
    )
