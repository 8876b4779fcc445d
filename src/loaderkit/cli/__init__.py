"""``loaderkit`` / ``python -m loaderkit``: info, doctor, bench, demo and rechunk.

The only module (with ``__main__``) that prints. Each command returns an exit code:

* ``info``: the platform as loaderkit sees it, software versions, recommended workers and a
  table of requested → safe worker counts;
* ``doctor``: pass/warn/fail checks with advice; exit 1 when any check warns or fails;
* ``bench``: loader configurations measured on a dataset (yours with ``--dataset
  module:Class``, else generated session files), with a recommendation;
* ``demo``: a self-contained run on generated NSD-like session files; exit 1 when a check
  fails;
* ``rechunk``: copies of session files with one dataset stored row by row, or an ``.h5ad``
  CSR matrix's values uncompressed, verified (``loaderkit.hdf5.convert.rechunk``); exit 1
  when a file cannot be rewritten;
* ``fetch`` and ``cache ls|du|clear``: a node's session cache (``loaderkit.cli.cache``, which
  prints too).

The folder is the command line, the top layer: this module (the parser and ``main``),
``cache`` (``fetch`` and ``cache``), ``bench`` (configurations measured side by side),
``demo`` (the demo job; ``make_sessions`` for the examples), ``doctor`` (checks with advice),
``__main__`` (``python -m loaderkit.cli``). Imports go down into every other layer; nothing
outside this folder imports it but ``loaderkit.__main__``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from loaderkit import __version__
from loaderkit.cli.cache import add_commands as add_cache_commands
from loaderkit.cli.doctor import (
    FAIL,
    PASS,
    WARN,
    run_checks,
    session_cache_report,
    software_versions,
)
from loaderkit.machine.platform import detect_platform
from loaderkit.plan import counted, wrap_column
from loaderkit.policy import recommended_num_workers, resolve_num_workers

__all__ = ["main"]

_REQUESTED_WORKERS: tuple[int | str, ...] = (0, 1, 2, 4, 8, 16, 32, "auto")


def _table(rows: Sequence[Sequence[object]], width: int = 100) -> str:
    """``rows`` (the first: headings) aligned, the last column wrapped to fit ``width``."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    start = sum(widths[:-1]) + 2 * (len(widths) - 1)
    if width - start < 30:  # too wide to wrap usefully: the last column as it is
        width = start + widths[-1]
    widths[-1] = min(widths[-1], width - start)
    lines = []
    for row in cells:
        head = "".join(c.ljust(w + 2) for c, w in zip(row[:-1], widths, strict=False))
        last = wrap_column(row[-1], width, start)
        lines.append((head + last[0]).rstrip())
        lines.extend(" " * start + part for part in last[1:])
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cmd_info(args: argparse.Namespace) -> int:
    platform = detect_platform()
    print(f"loaderkit {__version__}\n")
    print("Platform")
    print(platform.describe())
    print("\nSoftware")
    for name, version in software_versions().items():
        print(f"{name:<8}  {version}")
    print(f"\nstart method in effect: {platform.start_method} ({platform.start_method_source})")
    print(f"usable CPUs: {platform.usable_cpus} of {platform.cpu_count} ({platform.cpus_source})")
    if platform.memory_bytes is not None:
        print(f"memory: {platform.memory_bytes / 2**30:.2f} GiB ({platform.memory_source})")
    cuda = (
        f"yes, {counted(platform.cuda_device_count, 'device')}" if platform.cuda_available else "no"
    )
    print(f"CUDA: {cuda}")
    print(f"recommended num_workers: {recommended_num_workers(platform)}\n")
    rows: list[Sequence[object]] = [("requested", "safe", "why")]
    for requested in _REQUESTED_WORKERS:
        decision = resolve_num_workers(requested, platform)
        note = decision.reason
        if isinstance(decision.value, int) and decision.value > platform.usable_cpus:
            note += f"; more workers than usable CPUs ({platform.usable_cpus}): torch warns"
        rows.append((repr(requested), decision.value, note))
    print(_table(rows))
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    checks = run_checks(
        detect_platform(), max_open_files=args.max_open_files, cache=session_cache_report()
    )
    marks = {PASS: "PASS", WARN: "WARN", FAIL: "FAIL"}
    for check in checks:
        print(f"[{marks[check.status]}] {check.name}: {check.finding}")
        print(f"       {check.advice}")
    worst = {c.status for c in checks}
    summary = (
        "all checks passed"
        if worst == {PASS}
        else (
            f"{sum(c.status == WARN for c in checks)} warning(s), "
            f"{sum(c.status == FAIL for c in checks)} failure(s)"
        )
    )
    print(f"\n{summary}")
    return 0 if worst == {PASS} else 1


def _progress(enabled: bool) -> Any:
    """A tqdm progress wrapper for long loops (tqdm: small, pure Python, writes to stderr)."""
    if not enabled:
        return None
    from tqdm import tqdm

    def wrap(iterable: Any, description: str, total: int) -> Any:
        return tqdm(
            iterable, desc=description, total=total, leave=False, unit="batch", dynamic_ncols=True
        )

    return wrap


def _cmd_demo(args: argparse.Namespace) -> int:
    from loaderkit.cli.demo import run_demo

    report = run_demo(
        args.root,
        workers=args.workers,
        epochs=args.epochs,
        progress=_progress(not args.no_progress),
    )
    head = f"loaderkit demo: {report.samples} trials in session files under {report.root}"
    print("\n    ".join(wrap_column(head, 100, 4)) + "\n")
    print(report.plan)
    print()
    rows: list[Sequence[object]] = [("measure", "value")]
    rows.append(("training throughput", f"{report.train_samples_per_s:,.0f} samples/s"))
    rows.append(("evaluation throughput", f"{report.eval_samples_per_s:,.0f} samples/s"))
    rows.append(("loss per epoch", " -> ".join(f"{x:.3f}" for x in report.losses)))
    rows.append(("accuracy", f"{report.accuracy:.1%}"))
    rows.append(("max files open per process", report.max_files_open_per_process))
    rows.append(("max worker processes", report.max_worker_processes))
    print(_table(rows))
    print()
    for name, (passed, detail) in report.checks.items():
        check = f"[{'PASS' if passed else 'FAIL'}] {name}: {detail}"
        print("\n       ".join(wrap_column(check, 100, 7)))
    print("\ndemo passed" if report.ok else "\ndemo FAILED")
    return 0 if report.ok else 1


class _ByteBars:
    """tqdm bars for ``rechunk``'s ``progress(description, done, total)``: one per phase."""

    def __init__(self) -> None:
        self._bar: Any = None
        self._description = ""
        self._done = 0

    def __call__(self, description: str, done: int, total: int) -> None:
        from tqdm import tqdm

        if description != self._description:
            self.close()
            self._bar = tqdm(
                total=total,
                desc=description,
                unit="B",
                unit_scale=True,
                leave=False,
                dynamic_ncols=True,
            )
            self._description, self._done = description, 0
        self._bar.update(done - self._done)
        self._done = done

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        self._bar, self._description = None, ""


def _size_text(nbytes: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{nbytes} B"


def _cmd_rechunk(args: argparse.Namespace) -> int:
    from loaderkit.hdf5.convert.rechunk import rechunk

    bars = None if args.no_progress else _ByteBars()
    try:
        results = rechunk(
            args.files,
            args.key,
            args.out,
            layout=args.layout,
            chunk_bytes=args.chunk_bytes,
            overwrite=args.overwrite,
            progress=bars,
        )
    except (OSError, KeyError, ValueError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"loaderkit rechunk: {message}", file=sys.stderr)
        return 1
    finally:
        if bars is not None:
            bars.close()
    rows: list[Sequence[object]] = [("file", "copy", "key", "shape", "layout", "size", "seconds")]
    for r in results:
        rows.append(
            (
                r.source,
                r.target,
                r.key,
                "x".join(map(str, r.shape)),
                r.layout,
                _size_text(r.nbytes),
                f"{r.seconds:.1f}",
            )
        )
    print(_table(rows))
    files = len({r.source for r in results})
    print(f"\n{counted(files, 'file')} rewritten and verified under {args.out}")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from loaderkit.cli.bench import run_bench
    from loaderkit.errors import ConfigError

    try:
        kwargs = json.loads(args.kwargs) if args.kwargs else {}
    except json.JSONDecodeError as exc:
        print(f"loaderkit bench: --kwargs is not valid JSON: {exc}", file=sys.stderr)
        return 2
    if not isinstance(kwargs, dict):
        print("loaderkit bench: --kwargs must be a JSON object", file=sys.stderr)
        return 2
    try:
        report = run_bench(
            args.dataset, kwargs, args.root, args.workers, args.batch_sizes, args.batches
        )
    except ConfigError as exc:
        print(f"loaderkit bench: {exc}", file=sys.stderr)
        return 2
    print(
        f"loaderkit bench: {report.dataset}, {report.samples} samples, "
        f"{args.batches} batches per pass, 2 passes per configuration\n"
    )
    best = report.best
    rows: list[Sequence[object]] = [
        (
            "num_workers",
            "batch_size",
            "persistent",
            "1st batch s",
            "2nd pass 1st batch s",
            "samples/s",
            "vs best",
            "worker USS MiB (growth)",
        )
    ]
    for r in report.results:
        rows.append(
            (
                r.num_workers,
                r.batch_size,
                r.persistent_workers,
                f"{r.first_batch_s:.3f}",
                f"{r.second_pass_first_batch_s:.3f}",
                f"{r.samples_per_s:,.0f}",
                f"{r.samples_per_s / best.samples_per_s:.2f}" if best else "-",
                "-"
                if r.worker_uss_mib is None or r.worker_uss_growth_mib is None
                else f"{r.worker_uss_mib:.0f} ({r.worker_uss_growth_mib:+.0f})",
            )
        )
    print(_table(rows))
    if best is not None:
        print(
            f"\nrecommended: create_dataloader(dataset, batch_size={best.batch_size}, "
            f"num_workers={best.num_workers}, persistent_workers={best.persistent_workers})"
        )
        note = report.noise_note()
        if note:
            print(note)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report.as_dict(), handle, indent=2)
    return 0


def _int_at_least(minimum: int) -> Any:
    """An argparse type: an int >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected an integer >= {minimum}, got {text!r}"
            ) from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value

    return parse


def _int_list_at_least(minimum: int) -> Any:
    parse = _int_at_least(minimum)
    return lambda text: [parse(part) for part in text.split(",") if part.strip()]


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


def _add_info(commands: Any) -> None:
    """``loaderkit info``."""
    info = commands.add_parser("info", help="platform, versions and recommended workers")
    info.set_defaults(run=_cmd_info)


def _add_doctor(commands: Any) -> None:
    """``loaderkit doctor``."""
    doctor = commands.add_parser("doctor", help="check this machine, with advice")
    doctor.add_argument(
        "--max-open-files",
        type=_positive_int,
        default=8,
        help="HDF5 files open per process to budget for (default 8)",
    )
    doctor.set_defaults(run=_cmd_doctor)


def _add_bench(commands: Any) -> None:
    """``loaderkit bench``: the dataset, the configurations, how long."""
    bench = commands.add_parser("bench", help="measure loader configurations on a dataset")
    bench.add_argument(
        "--dataset",
        metavar="MODULE:CLASS",
        help="your map-style dataset class (default: generated session files)",
    )
    bench.add_argument("--kwargs", metavar="JSON", help="keyword arguments for the class")
    bench.add_argument(
        "--root", metavar="DIR", help="where generated files go (default: a temporary directory)"
    )
    bench.add_argument(
        "--workers",
        type=_int_list_at_least(0),
        metavar="N,N,...",
        help="worker counts to try (default: 0, 1, 2 and the recommended)",
    )
    bench.add_argument(
        "--batch-sizes",
        type=_int_list_at_least(1),
        default=[32, 128],
        metavar="N,N,...",
        help="batch sizes to try (default: 32,128)",
    )
    bench.add_argument(
        "--batches",
        type=_positive_int,
        default=50,
        help="batches timed per configuration (default 50)",
    )
    bench.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    bench.set_defaults(run=_cmd_bench)


def _add_demo(commands: Any) -> None:
    """``loaderkit demo``."""
    demo = commands.add_parser("demo", help="a self-contained run on generated session files")
    demo.add_argument(
        "--root", metavar="DIR", help="where generated files go (default: a temporary directory)"
    )
    demo.add_argument(
        "--workers", type=_non_negative_int, default=2, help="worker processes (default 2)"
    )
    demo.add_argument("--epochs", type=_positive_int, default=3, help="training epochs (default 3)")
    demo.add_argument("--no-progress", action="store_true", help="no progress bars")
    demo.set_defaults(run=_cmd_demo)


def _add_rechunk(commands: Any) -> None:
    """``loaderkit rechunk``: the files, the key, where the copies go, the layout."""
    from loaderkit.hdf5.convert.rechunk import CHUNK_BYTES, LAYOUTS

    rechunk = commands.add_parser(
        "rechunk",
        help="copy session files with datasets (or .h5ad CSR matrices) stored row by row",
        description=(
            "Write, for each FILE, a copy with the same name under DIR with KEY stored row by "
            "row (contiguous, or chunks of whole rows when the source is compressed), every "
            "other object and attribute copied, values verified; a failure leaves nothing "
            "under the final name, and a source is never written to. A KEY that is an .h5ad "
            "CSR matrix group (X, layers/NAME, raw/X) gets its data and indices stored "
            "uncompressed (contiguous; --layout chunked: uncompressed chunks), indptr and the "
            "rest as they are: anndata reads the copy as before, with no plugin, and "
            "loaderkit reads its rows raw, several times faster than from gzip. Give --key "
            "once per key (--key X --key layers/counts): all are rewritten in one copy."
        ),
    )
    rechunk.add_argument("files", nargs="+", metavar="FILE", help="session files to rewrite")
    rechunk.add_argument(
        "--key",
        required=True,
        action="append",
        help="the dataset to store row by row, or a CSR matrix group (e.g. X) to uncompress; "
        "repeat it for several keys, rewritten in one copy (each key once)",
    )
    rechunk.add_argument("--out", required=True, metavar="DIR", help="where the copies go")
    rechunk.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="auto",
        help="auto (default): contiguous unless the source is compressed or can grow, then "
        "chunks of whole rows; a CSR group's values: contiguous unless chunked",
    )
    rechunk.add_argument(
        "--chunk-bytes",
        type=_positive_int,
        default=CHUNK_BYTES,
        help=f"bytes per chunk of whole rows for chunked copies (default {CHUNK_BYTES})",
    )
    rechunk.add_argument(
        "--overwrite", action="store_true", help="replace copies already in DIR (never a source)"
    )
    rechunk.add_argument("--no-progress", action="store_true", help="no progress bars")
    rechunk.set_defaults(run=_cmd_rechunk)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests)."""
    parser = argparse.ArgumentParser(
        prog="loaderkit",
        description="PyTorch data loading that is correct by default.",
    )
    parser.add_argument("--version", action="version", version=f"loaderkit {__version__}")
    commands = parser.add_subparsers(
        dest="command", metavar="{info,doctor,bench,demo,rechunk,fetch,cache}"
    )
    commands.required = True

    for add in (_add_info, _add_doctor, _add_bench, _add_demo, _add_rechunk):
        add(commands)
    add_cache_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``loaderkit`` and ``python -m loaderkit``.

    Args:
        argv: Arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit code.

    Examples:
        >>> main(["info"])  # doctest: +SKIP
        0
    """
    args = build_parser().parse_args(argv)
    return int(args.run(args))
