"""The command line the benchmark scripts share: ``--quick`` and ``--json PATH``, a markdown
table on standard output, the numbers as JSON."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

__all__ = ["emit", "parser"]


def parser(doc: str, quick_help: str) -> argparse.ArgumentParser:
    """An argument parser with ``--quick`` and ``--json PATH``; add the script's own options."""
    result = argparse.ArgumentParser(description=doc.splitlines()[0])
    result.add_argument("--quick", action="store_true", help=quick_help)
    result.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    return result


def emit(data: dict[str, Any], table: str, json_path: str | None) -> None:
    """Print the table; write ``data`` as JSON when a path was given."""
    print(table)
    if json_path:
        Path(json_path).write_text(json.dumps(data, indent=2))
