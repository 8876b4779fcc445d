"""Run a function on a real torch.distributed (gloo) group of local processes.

Ranks are forked (fast) unless this process has initialised CUDA: a child forked after that
cannot use CUDA ("Cannot re-initialize CUDA in forked subprocess"), and on a GPU host earlier
tests in the same pytest process may have initialised it. Then ranks are spawned, which needs
the function run to be a module-level function importable by the child.
"""

from __future__ import annotations

import os
import pickle
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _entry(
    rank: int, fn: Callable[..., Any], world_size: int, port: int, out: str, args: tuple[Any, ...]
) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    try:
        result = fn(rank, world_size, *args)
        with open(Path(out) / f"rank{rank}.pkl", "wb") as handle:
            pickle.dump(result, handle)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def rank_start_method() -> str:
    """How ranks are started: ``"spawn"`` once CUDA is initialised in this process.

    Forked ranks could not use CUDA then; otherwise ``"fork"`` (about 40 times faster than
    spawn for these small groups).
    """
    return "spawn" if torch.cuda.is_initialized() else "fork"


def run_distributed(
    fn: Callable[..., Any],
    world_size: int,
    tmp_path: Path,
    *args: Any,
    start_method: str | None = None,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` processes; return results by rank.

    ``fn`` must be a module-level function (it is pickled under spawn). ``start_method``
    defaults to ``rank_start_method()``.
    """
    start_method = start_method or rank_start_method()
    out = tmp_path / f"dist-{free_port()}"
    out.mkdir()
    mp.start_processes(
        _entry,
        args=(fn, world_size, free_port(), str(out), args),
        nprocs=world_size,
        join=True,
        start_method=start_method,
    )
    results = []
    for rank in range(world_size):
        with open(out / f"rank{rank}.pkl", "rb") as handle:
            results.append(pickle.load(handle))
    return results
