"""The disk's random-read ceiling, measured by fio, and what it bounds for rows stored as extents.

A shuffled epoch out of core reads each row where it lies: a CSR cell is two extents (its values
and its column ids), a dense row one. With the page cache too small to hold the corpus, every
extent costs the 4 KiB pages it touches, read at random, so the disk's random 4 KiB rate at a
deep queue bounds the rows a second any loader can serve from the files as stored:
``random_ceiling(iops, pages_per_row)``. ``random_iops`` measures that rate with fio
(``--direct=1 --rw=randread --bs=4k --iodepth=32``, the libaio engine, over the benchmark's own
files, read-only); where fio is missing it says so (Debian: ``apt install fio``) instead of a
figure. ``pages_per_extent`` is the mean count of pages an extent of a given length touches when
it starts anywhere on an item boundary, which is how rows of a ragged array fall on pages.

>>> round(pages_per_extent([3200, 3200], itemsize=4), 3)
1.78
>>> round(random_ceiling(113_000, 3.56))
31742
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["PAGE", "pages_per_extent", "random_ceiling", "random_iops"]

PAGE = 4096


def pages_per_extent(lengths: Iterable[int], *, itemsize: int, page: int = PAGE) -> float:
    """The mean number of ``page``-byte pages an extent of each length touches, its start
    anywhere on an ``itemsize`` boundary: ``1 + (length - itemsize) / page`` (0 for an empty
    extent: nothing is read).

    Args:
        lengths: The extents' lengths in bytes (a cell's nonzeros x its item size).
        itemsize: The stored item's size in bytes; an extent starts on a multiple of it.
        page: The page size.

    Example:
        >>> pages_per_extent([0, 4096], itemsize=4)
        0.99951171875
    """
    sizes = np.asarray(list(lengths) if not isinstance(lengths, np.ndarray) else lengths)
    if sizes.size == 0:
        return 0.0
    sizes = sizes.astype(np.float64)
    pages = np.where(sizes > 0, 1.0 + (sizes - itemsize) / page, 0.0)
    return float(pages.mean())


def random_ceiling(iops: float, pages_per_row: float) -> float | None:
    """Rows a second when every page a row touches is one random read at ``iops``.

    Example:
        >>> random_ceiling(100_000, 2.0)
        50000.0
        >>> random_ceiling(100_000, 0.0) is None
        True
    """
    return iops / pages_per_row if pages_per_row > 0 else None


def random_iops(
    paths: Sequence[Path],
    *,
    block: int = PAGE,
    depth: int = 32,
    seconds: float = 5.0,
) -> dict[str, Any]:
    """The disk's random-read rate over ``paths`` (read-only, ``O_DIRECT``): fio's IOPS.

    Args:
        paths: Files to read (the benchmark's corpus: the disk it lies on, its extents).
        block: Bytes a read.
        depth: Reads outstanding (fio's ``--iodepth``, the libaio engine).
        seconds: How long fio reads (``--runtime``, time based).

    Returns:
        ``{"iops", "bytes_per_s", "block", "depth", "seconds", "tool"}``, or ``{"error": why}``
        where fio is missing or fails (the message says how to install it).
    """
    fio = shutil.which("fio")
    if fio is None:
        return {"error": "fio not found: the random ceiling needs it (Debian: apt install fio)"}
    argv = [
        fio,
        "--name=random-ceiling",
        "--readonly",
        f"--filename={':'.join(str(p).replace(':', chr(92) + ':') for p in paths)}",
        "--rw=randread",
        f"--bs={block}",
        f"--iodepth={depth}",
        "--ioengine=libaio",
        "--direct=1",
        "--time_based",
        f"--runtime={seconds:g}",
        "--output-format=json",
    ]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"fio did not finish: {exc}"}
    if done.returncode:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"error": f"fio exited with {done.returncode}: {tail[:300]}"}
    read = json.loads(done.stdout[done.stdout.index("{") :])["jobs"][0]["read"]
    version = subprocess.run([fio, "--version"], capture_output=True, text=True).stdout.strip()
    return {
        "iops": float(read["iops"]),
        "bytes_per_s": float(read["bw_bytes"]),
        "block": block,
        "depth": depth,
        "seconds": seconds,
        "tool": version,
    }
