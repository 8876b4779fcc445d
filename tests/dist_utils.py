"""Run a function on a real torch.distributed (gloo) group of local processes."""

from __future__ import annotations

import os
import pickle
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def run_distributed(
    fn: Callable[..., Any], world_size: int, tmp_path: Path, *args: Any, start_method: str = "fork"
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` processes; return results by rank.

    ``fn`` must be a module-level function (it is pickled under spawn).
    """
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
