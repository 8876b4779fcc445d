"""Distributed data parallel training over HDF5 session files, runnable on CPU.

    torchrun --nproc_per_node=2 examples/ddp_train.py [--epochs N] [--workers N] [--root DIR]

Every rank builds the same loaders; loaderkit shards them (``distributed="auto"``):
training reads disjoint shuffled blocks per rank and steps in lockstep, evaluation
(``training=False``) sees every trial exactly once across ranks, so summed counts give the
exact accuracy. Uses gloo on CPU and NCCL when every rank has a GPU.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from loaderkit import HDF5SessionDataset, create_dataloader, seed_everything
from loaderkit.cli.demo import make_sessions


class BetaSessions(HDF5SessionDataset):
    """(betas as float32 / 300, label) per trial; batched through read_rows."""

    def read(self, session: Hashable, row: int) -> tuple[torch.Tensor, int]:
        betas = self.h5dataset(session)[row].astype(np.float32) / 300.0
        return torch.from_numpy(betas), int(self.file(session)["labels"][row])

    def read_rows(self, session: Hashable, start: int, stop: int) -> list[tuple[Any, int]]:
        betas = torch.from_numpy(self.h5dataset(session)[start:stop].astype(np.float32) / 300.0)
        labels = self.file(session)["labels"][start:stop]
        return [(betas[i], int(labels[i])) for i in range(stop - start)]


def shared_root(requested: Path | None) -> tuple[Path, bool]:
    """A directory every rank agrees on (rank 0 creates a temporary one and broadcasts it)."""
    if requested is not None:
        return requested, False
    holder = [tempfile.mkdtemp(prefix="loaderkit-ddp-") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(holder, src=0)
    return Path(holder[0]), True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, help="directory of betas_session*.hdf5 files")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", default="auto", help="an int or 'auto' (per rank)")
    parser.add_argument("--sessions", type=int, default=8)
    args = parser.parse_args(argv)
    workers = args.workers if args.workers == "auto" else int(args.workers)

    use_cuda = torch.cuda.is_available() and torch.cuda.device_count() >= int(
        os.environ.get("LOCAL_WORLD_SIZE", "1")
    )
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
    seed_everything(0)  # identical on every rank: loaderkit still gives ranks different streams

    root, temporary = shared_root(args.root)
    try:
        if temporary and rank == 0:
            make_sessions(root, sessions=args.sessions)
        dist.barrier()  # files exist before any rank opens them
        paths = sorted(root.glob("betas_session*.hdf5"))
        dataset = BetaSessions(paths, key="betas", max_open_files=4)
        voxels = dataset[0][0].numel()
        dataset.close()  # nothing open in the parent before workers fork

        model = DistributedDataParallel(torch.nn.Linear(voxels, 4).to(device))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
        train = create_dataloader(
            dataset, batch_size=64, shuffle="block", training=True, num_workers=workers, seed=0
        )
        if rank == 0:
            print(train.describe(), end="\n\n", flush=True)
        with train:
            for epoch in range(args.epochs):
                stats = torch.zeros(2, device=device)  # [loss sum, samples] on this rank
                for x, y in train:
                    x, y = x.to(device), y.to(device)
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    stats += torch.stack(
                        [loss.detach() * len(y), torch.tensor(float(len(y)), device=device)]
                    )
                dist.all_reduce(stats)
                if rank == 0:
                    print(
                        f"epoch {epoch}: mean loss {stats[0] / stats[1]:.4f} over "
                        f"{int(stats[1])} samples on {world} ranks",
                        flush=True,
                    )

        # Exact evaluation: every trial on exactly one rank, so summed counts are exact.
        counts = torch.zeros(2, device=device)
        with (
            create_dataloader(
                dataset, batch_size=256, training=False, num_workers=workers
            ) as evaluation,
            torch.no_grad(),
        ):
            for x, y in evaluation:
                x, y = x.to(device), y.to(device)
                counts += torch.tensor(
                    [float((model(x).argmax(1) == y).sum()), float(len(y))], device=device
                )
        dist.all_reduce(counts)
        ok = int(counts[1]) == len(dataset)
        if rank == 0:
            print(
                f"accuracy {counts[0] / counts[1]:.1%} over {int(counts[1])} trials "
                f"(dataset: {len(dataset)}; each seen exactly once: {ok})",
                flush=True,
            )
        dist.barrier()
    finally:
        if temporary and rank == 0:
            shutil.rmtree(root, ignore_errors=True)
        dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
