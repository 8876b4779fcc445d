"""Samples seen / missing / duplicated per stage under Lightning DDP and Accelerate.

Runs the scenarios of ``tests/integrations`` (2 CPU processes each) for loaderkit and for torch's
DataLoader and prints one table, side by side:

    python tools/framework_matrix.py [--n 41] [--loaderkit-src DIR]

``--loaderkit-src`` puts another checkout's ``src`` first on ``PYTHONPATH`` (for example the
previous release, to show what a change fixed). Each row is one stage: ``seen`` distinct
samples, ``missing`` samples never seen, ``dup`` extra copies (padding or double reads), or the
error that stopped the run.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run(cmd: list[str], env: dict[str, str], out: Path) -> list[dict[str, Any]] | str:
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    files = sorted(out.glob("rank*.json"))
    if len(files) < 2:
        return f"run failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}"
    return [json.loads(f.read_text()) for f in files]


def _count(shards: list[list[int]], n: int) -> str:
    counts = Counter(i for shard in shards for i in shard)
    missing = n - len(set(counts) & set(range(n)))
    dup = sum(counts.values()) - len(counts)
    return f"{len(counts)} / {missing} / {dup}"


def lightning_rows(n: int, which: str, env: dict[str, str]) -> list[tuple[str, str]]:
    rows = []
    for uds in ("1", "0"):
        out = Path(tempfile.mkdtemp())
        cmd = [sys.executable, "-m", "tests.integrations.lightning_ddp", str(out), "hooks"]
        ranks = _run([*cmd, str(n), uds, which], dict(env, MASTER_PORT=str(_port())), out)
        label = f"Lightning DDP, use_distributed_sampler={uds == '1'}"
        if isinstance(ranks, str):
            rows.append((label, ranks))
            continue
        for key in ("fit:train:0", "fit:train:1", "fit:val:0", "validate:val:0", "test:test:0"):
            if any(key in r["seen"] for r in ranks):
                shards = [r["seen"].get(key, []) for r in ranks]
                rows.append((f"{label}: {key}", _count(shards, n)))
        if all("predict" in r for r in ranks):
            rows.append((f"{label}: predict", _count([r["predict"] for r in ranks], n)))
        errors = {r.get("error") for r in ranks} - {None}
        if errors:
            rows.append((f"{label}: stopped by", f"{sorted(errors)[0][:90]}"))
    return rows


def accelerate_rows(n: int, which: str, env: dict[str, str]) -> list[tuple[str, str]]:
    out = Path(tempfile.mkdtemp())
    mode = "torch" if which == "torch" else "prepared"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_port", str(_port()), "-m", "tests.integrations.accelerate_run",
           str(out), mode, str(n)]  # fmt: skip
    ranks = _run(cmd, env, out)
    label = "Accelerate prepare, 2 processes"
    if isinstance(ranks, str):
        return [(label, ranks)]
    rows = [(f"{label}: train epoch {e}", _count([r["train"][e] for r in ranks], n))
            for e in range(2)]  # fmt: skip
    rows.append((f"{label}: eval", _count([r["eval"] for r in ranks], n)))
    rows.append((f"{label}: gather_for_metrics", f"{len(ranks[0]['gathered'])} items"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=41)
    parser.add_argument("--loaderkit-src", type=Path, default=None)
    args = parser.parse_args()
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    if args.loaderkit_src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(args.loaderkit_src.resolve()), str(ROOT)])
    table: dict[str, dict[str, str]] = {}
    for which in ("torch", "loaderkit"):
        for label, value in lightning_rows(args.n, which, env) + accelerate_rows(
            args.n, which, env
        ):
            table.setdefault(label, {})[which] = value
    print(f"N = {args.n}; each cell: seen / missing / duplicated (across 2 ranks)\n")
    print("| stage | torch DataLoader | loaderkit |\n|---|---|---|")
    for label, cells in table.items():
        print(f"| {label} | {cells.get('torch', '-')} | {cells.get('loaderkit', '-')} |")


if __name__ == "__main__":
    main()
