"""Two commits' speed side by side: every case of BASE against HEAD, in fresh processes.

Usage: python benchmarks/compare.py BASE [HEAD] [--rounds N] [--quick] [--only NAME ...]
[--json PATH] [--threshold R] [--fail-on-regression] [--list]

BASE and HEAD are git revisions (``origin/main``, ``HEAD``, ``HEAD~1``, a sha); HEAD left out
(or ``worktree``) is the working tree's ``src/`` as it is when the run starts, uncommitted
changes included (copied: later edits do not reach the run). A revision is exported with ``git
archive REV src | tar -x`` into a temporary folder: the repository's index, HEAD and working
tree are never touched.

Every case (``benchmarks/compare_cases.py`` lists and describes them: per-batch reads of
contiguous, gzip and NSD-layout rows in block and random order, a ``read`` subclass read per
item, the worker hand-off, the time to a loader's first batch, worker threads, a warm epoch of
remote files through a ``SessionCache``) runs in a fresh Python process (this interpreter, so
both sides share one venv) with ``PYTHONPATH=<that side's src>`` first; the child checks that
the ``loaderkit`` it imported is that side's and this script stops when it is not. Both sides
read the same files, written once into a temporary folder with plain h5py and numpy. Inside
the child: one warm-up pass, then the best of three timed passes (garbage collector off; a
pass under 0.2 s timed as several in a row) gives the case's rate, items/s, higher is better.

``--rounds`` rounds (default 5; ``--quick``: 3 rounds, smaller files), each running every case
on both sides one after the other, the side that goes first alternating between rounds (BASE
HEAD, HEAD BASE, ...), so both sides see the same moments of a shared machine. Per case: the
median rate of each side over the rounds, ``HEAD/BASE`` = the ratio of the medians, and each
round's own ratio. A case is flagged when the ratio of the medians is below ``--threshold``
(0.9) *and* a majority of the rounds' ratios are: slower by more than 10 %, and it repeats. A
case that cannot run on one side (a name or an argument that commit does not have, the remote
extra not installed) shows n/a there, with the reason below the table, and is never flagged.

Prints a markdown table (case | BASE | HEAD | HEAD/BASE | rounds < 0.9 | flag) and a last line
naming the flagged cases; ``--json PATH`` writes every number (each round's rates and ratios,
the files, the revisions). The exit status is 0 whatever was flagged, unless
``--fail-on-regression`` is given: then 1 when a case is flagged. A full run (5 rounds, 11
cases, 2 sides: 110 processes) takes about 12 minutes on 2 cores; ``--quick`` about 4.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

try:
    import _cli
    import compare_cases
except ImportError:  # imported as a module from elsewhere (tests)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _cli
    import compare_cases

__all__ = [
    "THRESHOLD",
    "WORKTREE",
    "CaseSummary",
    "SideResult",
    "format_rate",
    "is_flagged",
    "main",
    "median",
    "ratio",
    "render_table",
    "round_ratios",
    "side_order",
    "slower_rounds",
    "summarize",
    "summary_line",
]

THRESHOLD = 0.9
WORKTREE = "worktree"
ROUNDS = 5
QUICK_ROUNDS = 3
CASE_TIMEOUT_S = 600
CASES_SCRIPT = Path(__file__).resolve().parent / "compare_cases.py"


# ------------------------------------------------------------------ the numbers (pure)


@dataclass
class SideResult:
    """One side of one case over the rounds.

    Attributes:
        rates: Each round's rate, ``None`` for a round where the case did not run.
        unit: What a rate counts (``samples/s``, ``starts/s``).
        reason: Why the case did not run on this side (the first such round's reason).
    """

    rates: list[float | None] = field(default_factory=list)
    unit: str = "samples/s"
    reason: str | None = None


@dataclass
class CaseSummary:
    """One case, both sides, as the table shows it.

    Attributes:
        case: The case's name.
        unit: What the rates count.
        base: BASE's median rate, ``None`` where it never ran.
        head: HEAD's median rate, ``None`` where it never ran.
        ratio: ``head / base``, ``None`` where either is missing.
        round_ratios: Each round's ``head / base`` (rounds where both sides ran).
        slower: How many of ``round_ratios`` are below the threshold.
        flagged: Whether the case counts as a regression (see :func:`is_flagged`).
        base_reason: Why BASE did not run (``None`` when it did).
        head_reason: Why HEAD did not run (``None`` when it did).
    """

    case: str
    unit: str
    base: float | None
    head: float | None
    ratio: float | None
    round_ratios: list[float]
    slower: int
    flagged: bool
    base_reason: str | None = None
    head_reason: str | None = None


def median(values: Sequence[float | None]) -> float | None:
    """The median of the values that are not ``None``.

    Args:
        values: Rates, ``None`` for a round without one.

    Returns:
        The median, or ``None`` when no value is left.
    """
    present = [v for v in values if v is not None]
    return float(statistics.median(present)) if present else None


def ratio(head: float | None, base: float | None) -> float | None:
    """``head / base``, or ``None`` when either is missing or ``base`` is not positive.

    Args:
        head: HEAD's rate.
        base: BASE's rate.

    Returns:
        The ratio (above 1: HEAD is faster).
    """
    if head is None or base is None or not base > 0:
        return None
    return head / base


def round_ratios(base: Sequence[float | None], head: Sequence[float | None]) -> list[float]:
    """Each round's ``head / base``, for the rounds where both sides have a rate.

    Args:
        base: BASE's rate in each round.
        head: HEAD's rate in each round (same rounds, same order).

    Returns:
        The ratios, in round order.
    """
    ratios = (ratio(h, b) for b, h in zip(base, head, strict=True))
    return [r for r in ratios if r is not None]


def slower_rounds(ratios: Sequence[float], threshold: float = THRESHOLD) -> int:
    """How many of the rounds' ratios are below ``threshold``.

    Args:
        ratios: Each round's ``head / base``.
        threshold: The ratio below which a round counts as slower.

    Returns:
        The count.
    """
    return sum(1 for r in ratios if r < threshold)


def is_flagged(
    ratio_of_medians: float | None, ratios: Sequence[float], threshold: float = THRESHOLD
) -> bool:
    """Whether a case is a regression: slower than ``threshold`` overall and in most rounds.

    Args:
        ratio_of_medians: ``median(HEAD) / median(BASE)``; ``None`` (a side missing) is never
            flagged.
        ratios: Each round's ``head / base``.
        threshold: The ratio below which HEAD counts as slower.

    Returns:
        ``True`` when the ratio of the medians is below ``threshold`` and more than half of
        the rounds' ratios are too.
    """
    if ratio_of_medians is None or not ratios:
        return False
    return ratio_of_medians < threshold and 2 * slower_rounds(ratios, threshold) > len(ratios)


def summarize(
    case: str, base: SideResult, head: SideResult, threshold: float = THRESHOLD
) -> CaseSummary:
    """The table's row of one case from both sides' rounds.

    Args:
        case: The case's name.
        base: BASE's rounds.
        head: HEAD's rounds.
        threshold: See :func:`is_flagged`.

    Returns:
        The case's summary.
    """
    base_median, head_median = median(base.rates), median(head.rates)
    overall = ratio(head_median, base_median)
    ratios = round_ratios(base.rates, head.rates)
    return CaseSummary(
        case=case,
        unit=head.unit if head_median is not None else base.unit,
        base=base_median,
        head=head_median,
        ratio=overall,
        round_ratios=ratios,
        slower=slower_rounds(ratios, threshold),
        flagged=is_flagged(overall, ratios, threshold),
        base_reason=base.reason if base_median is None else None,
        head_reason=head.reason if head_median is None else None,
    )


def side_order(round_index: int) -> tuple[str, str]:
    """Which side runs first in a round: BASE in even rounds, HEAD in odd ones (ABBA).

    Args:
        round_index: The round, from 0.

    Returns:
        ``("base", "head")`` or ``("head", "base")``.
    """
    return ("base", "head") if round_index % 2 == 0 else ("head", "base")


def format_rate(rate: float | None) -> str:
    """A rate for the table: three significant figures at least, thousands separated.

    Args:
        rate: Items per second, ``None`` for n/a.

    Returns:
        The text (``"n/a"`` for ``None``).
    """
    if rate is None:
        return "n/a"
    if rate >= 100:
        return f"{rate:,.0f}"
    return f"{rate:.3g}"


def render_table(
    rows: Sequence[CaseSummary], base_label: str, head_label: str, threshold: float = THRESHOLD
) -> str:
    """The markdown table of every case, with the n/a reasons and the units under it.

    Args:
        rows: The cases' summaries, in the order to show.
        base_label: BASE's name in the header (a revision and its sha).
        head_label: HEAD's name in the header (``worktree`` or a revision).
        threshold: The threshold the ``rounds`` column counts against.

    Returns:
        The table and its notes, lines joined with newlines (no trailing newline).
    """
    lines = [
        f"| case | BASE {base_label} | HEAD {head_label} | HEAD/BASE | rounds < {threshold:g} "
        "| flag |",
        "|---|---:|---:|---:|---:|---|",
    ]
    notes = []
    for row in rows:
        if row.ratio is None:
            shown_ratio, rounds = "", ""
            missing = [side for side, r in (("BASE", row.base), ("HEAD", row.head)) if r is None]
            flag = f"n/a ({' and '.join(missing)})"
        else:
            shown_ratio = f"{row.ratio:.2f}"
            rounds = f"{row.slower}/{len(row.round_ratios)}"
            flag = "**SLOWER**" if row.flagged else ""
        lines.append(
            f"| {row.case} | {format_rate(row.base)} | {format_rate(row.head)} | {shown_ratio} "
            f"| {rounds} | {flag} |"
        )
        for side, reason in (("BASE", row.base_reason), ("HEAD", row.head_reason)):
            if reason:
                notes.append(f"- {row.case}: n/a on {side}: {reason}")
    others = [f"{row.case}: {row.unit}" for row in rows if row.unit != "samples/s"]
    legend = "rates: samples/s" + (f" ({'; '.join(others)})" if others else "")
    legend += ", higher is better; medians over the rounds"
    return "\n".join([*lines, "", legend, *notes])


def summary_line(rows: Sequence[CaseSummary], threshold: float = THRESHOLD) -> str:
    """The last line: which cases are flagged, out of how many compared.

    Args:
        rows: The cases' summaries.
        threshold: The threshold the flags used.

    Returns:
        One line.
    """
    compared = [row for row in rows if row.ratio is not None]
    flagged = [row.case for row in rows if row.flagged]
    skipped = len(rows) - len(compared)
    tail = f"; {skipped} n/a" if skipped else ""
    if not flagged:
        return (
            f"flagged: none ({len(compared)} cases compared, none below {threshold:g}x in a "
            f"majority of rounds{tail})"
        )
    return (
        f"flagged: {len(flagged)} of {len(compared)} cases slower than {threshold:g}x in a "
        f"majority of rounds: {', '.join(flagged)}{tail}"
    )


# ------------------------------------------------------------------ the run


@dataclass
class Side:
    """One side of the comparison: where its ``src`` is and what to call it."""

    name: str  # "base" or "head"
    label: str
    src: Path
    revision: str | None  # the revision asked for; None: the working tree
    sha: str | None
    results: dict[str, SideResult] = field(default_factory=dict)
    runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "--no-optional-locks", "-C", str(repo), *args],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"compare.py: git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def _export(repo: Path, revision: str, dest: Path) -> str:
    """``git archive REV src | tar -x -C dest``; returns the commit's sha."""
    sha = _git(repo, "rev-parse", "--verify", f"{revision}^{{commit}}")
    dest.mkdir(parents=True)
    archive = subprocess.Popen(
        ["git", "-C", str(repo), "archive", sha, "src"], stdout=subprocess.PIPE
    )
    untar = subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout)
    assert archive.stdout is not None
    archive.stdout.close()
    if archive.wait() != 0 or untar.returncode != 0:
        raise SystemExit(f"compare.py: could not export src/ of {revision} ({sha})")
    if not (dest / "src" / "loaderkit" / "__init__.py").is_file():
        raise SystemExit(f"compare.py: {revision} ({sha[:9]}) has no src/loaderkit/__init__.py")
    return sha


def _side(name: str, revision: str | None, repo: Path, tmp: Path) -> Side:
    if revision is None or revision == WORKTREE:
        # a copy taken now: edits made while the rounds run do not change what is measured
        head = _git(repo, "rev-parse", "--short", "HEAD")
        dirty = bool(_git(repo, "status", "--porcelain", "--", "src"))
        shutil.copytree(
            repo / "src", tmp / name / "src", ignore=shutil.ignore_patterns("__pycache__")
        )
        label = f"{WORKTREE} ({head}{' + changes' if dirty else ''})"
        return Side(name, label, tmp / name / "src", None, None)
    sha = _export(repo, revision, tmp / name)
    short = sha[:7]
    label = revision if short.startswith(revision) else f"{revision} ({short})"
    return Side(name, label, tmp / name / "src", revision, sha)


def _run_child(case: str, side: Side, root: Path, quick: bool) -> dict[str, Any]:
    """One case on one side in a fresh process; its JSON line (``ok: false`` on any failure)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(side.src), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
    )
    env["PYTHONHASHSEED"] = "0"
    command = [sys.executable, str(CASES_SCRIPT), case, "--root", str(root)]
    command += ["--expect-src", str(side.src), *(["--quick"] if quick else [])]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=CASE_TIMEOUT_S, cwd=root, env=env
        )
    except subprocess.TimeoutExpired:
        return {"ok": False, "phase": "run", "reason": f"timed out after {CASE_TIMEOUT_S} s"}
    if done.returncode == compare_cases.WRONG_LOADERKIT:
        raise SystemExit(f"compare.py: {side.label}: {done.stderr.strip()}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        return {"ok": False, "phase": "run", "reason": f"the process failed: {tail[0][:300]}"}
    return dict(json.loads(lines[-1]))


def _cannot_set_up(runs: Sequence[dict[str, Any]]) -> bool:
    """Whether earlier rounds show the case cannot be built on this side (never ran, and the
    first try failed while setting up or importing)."""
    return (
        bool(runs)
        and not any(run.get("ok") for run in runs)
        and runs[0].get("phase") in ("setup", "import")
    )


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    doc = __doc__ or ""
    cli = _cli.parser(doc, "3 rounds and smaller files (a few minutes)")
    cli.add_argument("base", nargs="?", help="the revision to compare against (origin/main)")
    cli.add_argument(
        "head", nargs="?", default=None, help=f"the revision compared (default: the {WORKTREE})"
    )
    cli.add_argument(
        "--rounds", type=int, help=f"rounds (default {ROUNDS}, --quick {QUICK_ROUNDS})"
    )
    cli.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        choices=list(compare_cases.CASES),
        help="run only this case (repeatable)",
    )
    cli.add_argument(
        "--threshold", type=float, default=THRESHOLD, help="flag below this HEAD/BASE ratio"
    )
    cli.add_argument(
        "--fail-on-regression",
        action="store_true",
        help="exit with status 1 when a case is flagged",
    )
    cli.add_argument("--list", action="store_true", help="print the cases' names and stop")
    args = cli.parse_args(argv)
    if not args.list and args.base is None:
        cli.error("BASE is needed (a revision: origin/main, HEAD, a sha)")
    if args.rounds is not None and args.rounds < 1:
        cli.error("--rounds must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module's docstring); returns the exit status."""
    args = _arguments(argv)
    if args.list:
        print("\n".join(compare_cases.CASES))
        return 0
    cases = [c for c in compare_cases.CASES if not args.only or c in args.only]
    rounds = args.rounds or (QUICK_ROUNDS if args.quick else ROUNDS)
    repo = Path(_git(CASES_SCRIPT.parent, "rev-parse", "--show-toplevel"))
    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="loaderkit-compare-"))
    try:
        sides = {
            "base": _side("base", args.base, repo, tmp),
            "head": _side("head", args.head, repo, tmp),
        }
        root = tmp / "files"
        layouts = compare_cases.write_files(root, quick=args.quick)
        for side in sides.values():
            side.results = {case: SideResult() for case in cases}
            side.runs = {case: [] for case in cases}
        for index in range(rounds):
            print(f"round {index + 1}/{rounds}", file=sys.stderr, flush=True)
            for case in cases:
                for name in side_order(index):
                    side = sides[name]
                    result = side.results[case]
                    if _cannot_set_up(side.runs[case]):
                        # it could not be set up before: it cannot now (a missing name, extra)
                        result.rates.append(None)
                        side.runs[case].append({"ok": False, "skipped": True})
                        continue
                    run = _run_child(case, side, root, args.quick)
                    side.runs[case].append(run)
                    if run.get("ok"):
                        result.rates.append(float(run["rate"]))
                        result.unit = str(run.get("unit", result.unit))
                    else:
                        result.rates.append(None)
                        result.reason = result.reason or str(run.get("reason"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    elapsed = time.perf_counter() - started
    base, head = sides["base"], sides["head"]
    rows = [summarize(c, base.results[c], head.results[c], args.threshold) for c in cases]
    table = render_table(rows, base.label, head.label, args.threshold)
    last = summary_line(rows, args.threshold)
    data = {
        "base": {k: getattr(base, k) for k in ("label", "revision", "sha")},
        "head": {k: getattr(head, k) for k in ("label", "revision", "sha")},
        "rounds": rounds,
        "quick": args.quick,
        "threshold": args.threshold,
        "seconds": elapsed,
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
        },
        "files": layouts,
        "cases": {
            row.case: {
                **asdict(row),
                "base_rates": base.results[row.case].rates,
                "head_rates": head.results[row.case].rates,
                "base_runs": base.runs[row.case],
                "head_runs": head.runs[row.case],
            }
            for row in rows
        },
        "flagged": [row.case for row in rows if row.flagged],
    }
    header = (
        f"{base.label} -> {head.label}: {len(cases)} cases x {rounds} rounds"
        f"{' (--quick)' if args.quick else ''}, {elapsed / 60:.1f} min"
    )
    _cli.emit(_finite(data), f"{header}\n\n{table}\n\n{last}", args.json)
    return 1 if args.fail_on_regression and data["flagged"] else 0


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as ``None`` (strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


if __name__ == "__main__":
    raise SystemExit(main())
