"""The cases ``benchmarks/compare.py`` times: one case, one side, one fresh process.

Usage: python benchmarks/compare_cases.py CASE --root DIR [--quick] [--expect-src DIR]
       python benchmarks/compare_cases.py --list

``benchmarks/compare.py`` runs this script once per case, side and round with
``PYTHONPATH=<that side's src>`` first, so the ``loaderkit`` it imports is that commit's (with
``--expect-src`` it checks ``loaderkit.__file__`` lies under that folder and exits with status 3
when it does not). ``--root`` is the folder :func:`write_files` filled, once, for both sides
(plain h5py and numpy: the files never depend on the code being compared). Only loaderkit's
public API is used (``HDF5SessionDataset``, ``BlockShuffleSampler``, ``create_dataloader``,
``SessionCache``), names that exist at old and new commits alike.

Each case builds its dataset and loader, runs one untimed warm-up pass, then three timed passes
with the garbage collector off (a pass under 0.2 s is timed as several in a row, see
:func:`measure`); it prints one JSON line: ``rate`` = items per second of the best timed pass
(higher is better), or ``ok: false`` with the reason when the case cannot run on this side (a
name or an argument that does not exist at that commit, the remote extra not installed):
``compare.py`` shows such a side as n/a. Cases (batch 64 throughout):

- ``tiny-rows-block`` / ``tiny-rows-random``: ``ds.__getitems__(batch)`` over every batch of a
  pass over 8 sessions x 4,000 rows of 16 x 16 float32 (contiguous), in ``BlockShuffleSampler(ds,
  seed=0)``'s order or in ``torch.randperm``'s (seeded); samples/s. ``--quick``: 1,500 rows.
- ``small-rows-block`` / ``small-rows-random``: the same over 8 x 750 rows of 64 x 64 float32.
  ``--quick``: 300 rows.
- ``gzip-block``: the small rows in chunks of 8 rows, gzip level 1, block order.
- ``wide-rows-block``: NSD's layout, 8 sessions x 750 rows x 3,000 int16 with chunks ``(750, 1)``
  (one chunk per column, as ``benchmarks/nsd_layout.py`` writes them; the dataset's defaults),
  block order. ``--quick``: 4 sessions.
- ``subclass-read-item``: a subclass whose ``read(session, row)`` returns ``super().read(...) *
  2``, read per item (``ds[i]``) over the first 20,000 indices of a seeded random order of the
  tiny rows (``--quick``: 5,000): the per-sample path.
- ``handoff``: ``create_dataloader(ds, batch_size=64, num_workers=2, shuffle=False,
  persistent_workers=True)`` over the small rows; samples/s of a whole pass, the workers already
  running (what handing batches from workers to the main process costs).
- ``startup-first-batch``: the time from ``create_dataloader(ds, batch_size=64, num_workers=2,
  shuffle=True, seed=0)`` over the small rows to its first batch, as starts/s (1 / seconds).
- ``threads-epoch``: ``create_dataloader(ds, batch_size=64, num_workers=2,
  worker_method="thread", shuffle="block", seed=0, persistent_workers=True)`` over the tiny
  rows; samples/s of a pass (n/a where ``worker_method`` does not exist).
- ``remote-warm-epoch``: the small rows uploaded to moto's S3 server on 127.0.0.1 (started by
  this process, ``benchmarks/_s3.py``), read through s3fs and a ``SessionCache`` in a fresh
  folder by ``create_dataloader(ds, batch_size=64, num_workers=0, shuffle="block", seed=0)``:
  the warm-up pass fills the cache, the timed passes are warm epochs. n/a without the remote
  extra and moto.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import math
import random
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

try:
    import _workloads
except ImportError:  # imported as a module from elsewhere (tests)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _workloads

__all__ = [
    "CASES",
    "FILESETS",
    "NotAvailable",
    "Timed",
    "main",
    "measure",
    "write_files",
]

BATCH = 64
TIMED_PASSES = 3
MIN_TIMED_S = 0.2  # a shorter pass is timed as several in a row
WIDE_ROWS = 750  # NSD's trials per session
WIDE_COLUMNS = 3_000
WIDE_SESSIONS = 8
WIDE_QUICK_SESSIONS = 4
SUBCLASS_ITEMS = 20_000
SUBCLASS_QUICK_ITEMS = 5_000
REMOTE_EXTRA = "pip install 'loaderkit[remote]' 'moto[server]'"
REMOTE_BUCKET = "loaderkit-compare"
#: exit status of a child whose ``loaderkit`` is not the side's (compare.py stops at once)
WRONG_LOADERKIT = 3


# ------------------------------------------------------------------ the files


@dataclass(frozen=True)
class FileSet:
    """Session files every case of one layout reads (``root/<name>/betas_sessionNN.hdf5``).

    Attributes:
        name: Folder under the root.
        workload: The ``benchmarks/_workloads.py`` workload, or ``None`` for the wide rows.
        quick_rows: Rows per session in ``--quick`` runs (float32 workloads).
    """

    name: str
    workload: _workloads.Workload | None
    quick_rows: int = 0


FILESETS: dict[str, FileSet] = {
    "tiny-rows": FileSet("tiny-rows", _workloads.WORKLOADS["tiny-rows"], quick_rows=1_500),
    "small-rows": FileSet("small-rows", _workloads.WORKLOADS["small-rows"], quick_rows=300),
    "gzip-chunked": FileSet("gzip-chunked", _workloads.WORKLOADS["gzip-chunked"], quick_rows=300),
    "wide-rows": FileSet("wide-rows", None),
}


def _write_wide(folder: Path, sessions: int) -> list[Path]:
    """NSD-layout files: ``betas`` of 750 x 3,000 int16 with chunks ``(750, 1)``."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for session in range(sessions):
        rng = np.random.default_rng([28, session])
        data = rng.integers(-3000, 3000, size=(WIDE_ROWS, WIDE_COLUMNS), dtype=np.int16)
        data[:, 0] = np.arange(WIDE_ROWS)
        data[:, 1] = session
        path = folder / f"betas_session{session + 1:02d}.hdf5"
        with h5py.File(path, "w") as f:
            f.create_dataset("betas", data=data, chunks=(WIDE_ROWS, 1))
        paths.append(path)
    return paths


def write_files(root: Path, *, quick: bool = False) -> dict[str, dict[str, Any]]:
    """Write every file set under ``root`` (plain h5py and numpy); return their layouts."""
    layouts: dict[str, dict[str, Any]] = {}
    for name, fileset in FILESETS.items():
        folder = root / name
        if fileset.workload is None:
            sessions = WIDE_QUICK_SESSIONS if quick else WIDE_SESSIONS
            paths = _write_wide(folder, sessions)
            layouts[name] = {
                "sessions": sessions,
                "rows": WIDE_ROWS,
                "row_shape": [WIDE_COLUMNS],
                "dtype": "int16",
                "chunks": [WIDE_ROWS, 1],
            }
        else:
            workload = dataclasses.replace(fileset.workload, quick_rows=fileset.quick_rows)
            paths = _workloads.make_workload(folder, workload, quick=quick)
            layouts[name] = {
                "sessions": workload.sessions,
                "rows": workload.quick_rows if quick else workload.rows,
                "row_shape": list(workload.row_shape),
                "dtype": "float32",
                "chunks": None
                if workload.chunk_rows is None
                else [workload.chunk_rows, *workload.row_shape],
                "compression": workload.compression,
            }
        layouts[name]["bytes"] = sum(p.stat().st_size for p in paths)
    return layouts


def _paths(root: Path, fileset: str) -> list[str]:
    paths = sorted(str(p) for p in (root / fileset).glob("betas_session*.hdf5"))
    if not paths:
        raise FileNotFoundError(f"no betas_session*.hdf5 under {root / fileset}")
    return paths


# ------------------------------------------------------------------ timing


class NotAvailable(Exception):
    """The case cannot run here (a missing optional dependency); its message says why."""


@dataclass
class Timed:
    """One case, built: a pass to time and what one pass counts.

    Attributes:
        run: One pass. It may return its own elapsed seconds (a case that times only part of
            what it does); ``None``: the whole call is timed.
        items: Items one pass counts (samples, or 1 for a start).
        unit: What the rate counts per second (``samples/s``, ``starts/s``).
        close: Called once at the end (loaders, datasets, servers).
        repeat: Whether a short pass is timed as several in a row (see :func:`measure`).
    """

    run: Callable[[], float | None]
    items: int
    unit: str = "samples/s"
    close: list[Callable[[], Any]] = field(default_factory=list)
    repeat: bool = True


def _once(timed: Timed) -> float:
    started = time.perf_counter()
    own = timed.run()
    elapsed = time.perf_counter() - started
    return elapsed if own is None else own


def measure(
    timed: Timed, passes: int = TIMED_PASSES, min_seconds: float = MIN_TIMED_S
) -> dict[str, Any]:
    """One warm-up pass, then ``passes`` timed passes with the garbage collector off.

    A pass shorter than ``min_seconds`` (timed once more after the warm-up) is timed as that
    many passes in a row, the same number for every timed pass, so a pass of a few
    milliseconds does not measure the clock's and the scheduler's noise; cases with
    ``Timed.repeat`` false (a start) are timed one at a time.

    Returns:
        ``rate`` (items per second of the best timed pass), ``unit``, ``items`` per pass,
        ``repeats`` (passes per timed pass), ``warmup_seconds`` and ``pass_seconds`` (each
        timed pass's seconds, divided by ``repeats``).
    """
    warmup = _once(timed)
    repeats = 1
    if timed.repeat and min_seconds > 0:
        one = _once(timed)
        repeats = max(1, math.ceil(min_seconds / max(one, 1e-6)))
    seconds = []
    for _ in range(passes):
        gc.collect()
        gc.disable()
        try:
            elapsed = sum(_once(timed) for _ in range(repeats))
        finally:
            gc.enable()
        seconds.append(elapsed / repeats)
    return {
        "rate": timed.items / min(seconds),
        "unit": timed.unit,
        "items": timed.items,
        "repeats": repeats,
        "warmup_seconds": warmup,
        "pass_seconds": seconds,
    }


def _batches(order: Any) -> list[list[int]]:
    indices = [int(i) for i in order]
    return [indices[i : i + BATCH] for i in range(0, len(indices), BATCH)]


def _seeded_order(n: int) -> list[int]:
    import torch

    generator = torch.Generator()
    generator.manual_seed(0)
    return [int(i) for i in torch.randperm(n, generator=generator)]


def _loader_pass(loader: Any) -> Callable[[], float | None]:
    def run() -> None:
        for _ in loader:
            pass

    return run


# ------------------------------------------------------------------ the cases


def _getitems(root: Path, fileset: str, order: str) -> Timed:
    from loaderkit import BlockShuffleSampler, HDF5SessionDataset

    ds = HDF5SessionDataset(_paths(root, fileset), key="betas")
    if order == "block":
        batches = _batches(iter(BlockShuffleSampler(ds, seed=0)))
    else:
        batches = _batches(_seeded_order(len(ds)))

    def run() -> None:
        for batch in batches:
            ds.__getitems__(batch)

    return Timed(run, sum(map(len, batches)), close=[ds.close])


def _subclass(root: Path, quick: bool) -> Timed:
    from loaderkit import HDF5SessionDataset

    class Doubled(HDF5SessionDataset):
        def read(self, session: Any, row: int) -> Any:
            return super().read(session, row) * 2

    ds = Doubled(_paths(root, "tiny-rows"), key="betas")
    order = _seeded_order(len(ds))[: SUBCLASS_QUICK_ITEMS if quick else SUBCLASS_ITEMS]

    def run() -> None:
        for i in order:
            ds[i]

    return Timed(run, len(order), close=[ds.close])


def _handoff(root: Path) -> Timed:
    from loaderkit import HDF5SessionDataset, create_dataloader

    ds = HDF5SessionDataset(_paths(root, "small-rows"), key="betas")
    loader: Any = create_dataloader(
        ds, batch_size=BATCH, num_workers=2, shuffle=False, persistent_workers=True
    )
    return Timed(_loader_pass(loader), len(ds), close=[loader.close, ds.close])


def _startup(root: Path) -> Timed:
    from loaderkit import HDF5SessionDataset, create_dataloader

    ds = HDF5SessionDataset(_paths(root, "small-rows"), key="betas")

    def run() -> float:
        started = time.perf_counter()
        loader: Any = create_dataloader(ds, batch_size=BATCH, num_workers=2, shuffle=True, seed=0)
        batches = iter(loader)
        first = next(batches)
        elapsed = time.perf_counter() - started
        assert first is not None
        del batches, first
        loader.close()
        return elapsed

    return Timed(run, 1, unit="starts/s", close=[ds.close], repeat=False)


def _threads(root: Path) -> Timed:
    from loaderkit import HDF5SessionDataset, create_dataloader

    ds = HDF5SessionDataset(_paths(root, "tiny-rows"), key="betas")
    try:
        loader: Any = create_dataloader(
            ds,
            batch_size=BATCH,
            num_workers=2,
            worker_method="thread",
            shuffle="block",
            seed=0,
            persistent_workers=True,
        )
    except BaseException:
        ds.close()
        raise
    return Timed(_loader_pass(loader), len(ds), close=[loader.close, ds.close])


def _remote(root: Path) -> Timed:
    try:
        import _s3
        import boto3  # type: ignore[import-untyped]
        import s3fs  # type: ignore[import-untyped]  # noqa: F401  (loaderkit reads through it)
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication  # noqa: F401
    except ImportError as exc:
        raise NotAvailable(f"{REMOTE_EXTRA} ({exc})") from exc
    from loaderkit import HDF5SessionDataset, SessionCache, create_dataloader

    closers: list[Callable[[], Any]] = []
    work = Path(tempfile.mkdtemp(prefix="remote-", dir=root))
    closers.append(lambda: shutil.rmtree(work, ignore_errors=True))
    try:
        _s3.dummy_credentials()
        # the server itself, not its throttling proxy: a warm epoch reads the cache, not the link
        server = _s3.Network(1e12, 0.0, max_seconds=1800)
        closers.insert(0, server.close)
        client = boto3.client("s3", endpoint_url=server.url, region_name="us-east-1")
        client.create_bucket(Bucket=REMOTE_BUCKET)
        urls = []
        for path in _paths(root, "small-rows"):
            name = Path(path).name
            client.upload_file(path, REMOTE_BUCKET, f"small-rows/{name}")
            urls.append(f"s3://{REMOTE_BUCKET}/small-rows/{name}")
        options = {
            "key": _s3.KEY,
            "secret": _s3.SECRET,
            "client_kwargs": {"endpoint_url": server.url, "region_name": "us-east-1"},
        }
        ds = HDF5SessionDataset(
            urls, key="betas", storage_options=options, cache=SessionCache(work / "cache")
        )
        closers.insert(0, ds.close)
        loader: Any = create_dataloader(
            ds, batch_size=BATCH, num_workers=0, shuffle="block", seed=0
        )
        closers.insert(0, loader.close)
    except BaseException:
        _close_all(closers)
        raise
    return Timed(_loader_pass(loader), len(ds), close=closers)


#: case name -> its builder (``root``, ``quick``) -> :class:`Timed`
CASES: dict[str, Callable[[Path, bool], Timed]] = {
    "tiny-rows-block": lambda root, quick: _getitems(root, "tiny-rows", "block"),
    "tiny-rows-random": lambda root, quick: _getitems(root, "tiny-rows", "random"),
    "small-rows-block": lambda root, quick: _getitems(root, "small-rows", "block"),
    "small-rows-random": lambda root, quick: _getitems(root, "small-rows", "random"),
    "gzip-block": lambda root, quick: _getitems(root, "gzip-chunked", "block"),
    "wide-rows-block": lambda root, quick: _getitems(root, "wide-rows", "block"),
    "subclass-read-item": _subclass,
    "handoff": lambda root, quick: _handoff(root),
    "startup-first-batch": lambda root, quick: _startup(root),
    "threads-epoch": lambda root, quick: _threads(root),
    "remote-warm-epoch": lambda root, quick: _remote(root),
}


# ------------------------------------------------------------------ the child


def _close_all(closers: list[Callable[[], Any]]) -> None:
    for close in closers:
        with contextlib.suppress(Exception):
            close()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, NotAvailable):
        return str(exc)
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """loaderkit's advice (PerformanceHint ...) is not what is compared: silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _check_loaderkit(expect_src: str | None) -> str:
    """Import loaderkit; exit with :data:`WRONG_LOADERKIT` when it is not under ``expect_src``."""
    import loaderkit

    where = Path(loaderkit.__file__ or "").resolve()
    if expect_src is not None:
        src = Path(expect_src).resolve()
        if not where.is_relative_to(src):
            print(
                f"compare_cases: loaderkit was imported from {where}, not from {src}: "
                "PYTHONPATH does not put this side's src first",
                file=sys.stderr,
            )
            raise SystemExit(WRONG_LOADERKIT)
    return str(where)


def run_case(name: str, root: Path, quick: bool) -> dict[str, Any]:
    """Build the case, measure it, close it; the result (``ok: false`` and why on failure)."""
    random.seed(0)
    np.random.seed(0)
    import torch

    torch.manual_seed(0)
    result: dict[str, Any] = {"case": name, "ok": False}
    phase = "setup"
    timed: Timed | None = None
    try:
        with _quiet():
            timed = CASES[name](root, quick)
            phase = "run"
            result.update(measure(timed))
        result["ok"] = True
    except Exception as exc:
        result.update(phase=phase, reason=_reason(exc))
        if phase == "run" or not isinstance(exc, (NotAvailable, ImportError, TypeError)):
            result["traceback"] = traceback.format_exc()[-3000:]
    finally:
        if timed is not None:
            with _quiet():
                _close_all(timed.close)
    return result


def main(argv: list[str] | None = None) -> int:
    """The child's command line: one case, one JSON line on standard output."""
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("case", nargs="?", choices=sorted(CASES))
    cli.add_argument("--root", type=Path, help="the folder write_files filled")
    cli.add_argument("--quick", action="store_true", help="the quick runs' sizes")
    cli.add_argument("--expect-src", help="fail unless loaderkit is imported from under it")
    cli.add_argument("--list", action="store_true", help="print the case names and stop")
    args = cli.parse_args(argv)
    if args.list:
        print("\n".join(CASES))
        return 0
    if args.case is None or args.root is None:
        cli.error("CASE and --root are needed")
    result: dict[str, Any] = {"case": args.case}
    try:
        result["loaderkit"] = _check_loaderkit(args.expect_src)
    except Exception as exc:  # this side cannot import loaderkit at all
        result.update(ok=False, phase="import", reason=_reason(exc))
    else:
        result.update(run_case(args.case, args.root, args.quick))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
