"""Compare the junit results of run.sh: counts per variant and tests whose outcome differs.

Usage: python tools/torch_suite/compare.py OUT_DIR
Reads OUT_DIR/{torch,class,function}.xml; prints counts, then for each loaderkit variant the
tests that passed on torch and did not pass on it (with the end of the failure), and the
reverse.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def load(path: Path) -> dict[str, tuple[str, str]]:
    results = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
        outcome, text = "passed", ""
        for kind in ("failure", "error", "skipped"):
            element = case.find(kind)
            if element is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[kind]
                text = f"{element.get('message') or ''}\n{element.text or ''}"
                break
        results[name] = (outcome, text)
    return results


def main(out: Path) -> int:
    runs = {
        v: load(out / f"{v}.xml")
        for v in ("torch", "class", "function")
        if (out / f"{v}.xml").exists()
    }
    for variant, results in runs.items():
        counts: dict[str, int] = {}
        for outcome, _ in results.values():
            counts[outcome] = counts.get(outcome, 0) + 1
        print(
            f"{variant:9s} {len(results)} tests  "
            + "  ".join(f"{k}={counts[k]}" for k in sorted(counts))
        )
    base = runs.get("torch", {})
    worse = 0
    for variant in ("class", "function"):
        if variant not in runs:
            continue
        print(f"\n== passed on torch, not on {variant} ==")
        for name, (outcome, text) in sorted(runs[variant].items()):
            if base.get(name, ("?", ""))[0] == "passed" and outcome != "passed":
                worse += 1
                print(f"--- {name}: {outcome}")
                print("\n".join(text.strip().splitlines()[-8:]))
        print(f"\n== passed on {variant}, not on torch ==")
        for name, (outcome, _) in sorted(runs[variant].items()):
            if outcome == "passed" and base.get(name, ("?", ""))[0] != "passed":
                print(f"+++ {name}")
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else ".")))
