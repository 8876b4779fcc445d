"""Train on per-session HDF5 files with HDF5SessionDataset, block shuffling and a prefetcher.

    python examples/train_hdf5.py [--root DIR] [--epochs N] [--workers N] [--device DEV]

``--root`` is a directory of ``betas_sessionNN.hdf5`` files with ``betas`` (trials x voxels,
int16 scaled by 300) and ``labels`` datasets; without it a small set is generated in a
temporary directory. Shows: a subclass with ``read``/``read_rows`` hooks (batched reads),
``shuffle="block"`` (sequential reads, batches still mix sessions), ``DevicePrefetcher`` (GPU
copies overlap compute; a pass-through on CPU) and ``LeakCheck`` (nothing left open).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from loaderkit import (
    DevicePrefetcher,
    HDF5SessionDataset,
    LeakCheck,
    create_dataloader,
    seed_everything,
)
from loaderkit.cli.demo import make_sessions


class BetaSessions(HDF5SessionDataset):
    """(betas in percent signal change as float32, label) per trial."""

    def read(self, session: Hashable, row: int) -> tuple[torch.Tensor, int]:
        betas = self.h5dataset(session)[row].astype(np.float32) / 300.0
        return torch.from_numpy(betas), int(self.file(session)["labels"][row])

    def read_rows(self, session: Hashable, start: int, stop: int) -> list[tuple[Any, int]]:
        # One slab read per run of consecutive rows instead of one read per row.
        betas = torch.from_numpy(self.h5dataset(session)[start:stop].astype(np.float32) / 300.0)
        labels = self.file(session)["labels"][start:stop]
        return [(betas[i], int(labels[i])) for i in range(stop - start)]


def train(root: Path, epochs: int, workers: int | str, device: torch.device) -> float:
    paths = sorted(root.glob("betas_session*.hdf5"))
    if not paths:
        raise SystemExit(f"no betas_session*.hdf5 files in {root}")
    dataset = BetaSessions(paths, key="betas", max_open_files=4)
    voxels = dataset[0][0].numel()
    classes = int(max(int(dataset.file(sid)["labels"][:].max()) for sid in dataset.files)) + 1
    dataset.close()
    model = torch.nn.Linear(voxels, classes).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02)

    loader = create_dataloader(
        dataset, batch_size=128, shuffle="block", training=True, num_workers=workers, seed=0
    )
    print(loader.describe(), end="\n\n")
    loss_value = float("nan")
    with DevicePrefetcher(loader, device) as batches:  # closes the loader on exit
        for epoch in range(epochs):
            total, seen = 0.0, 0
            for x, y in batches:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total += loss.item() * len(y)
                seen += len(y)
            loss_value = total / seen
            print(f"epoch {epoch}: loss {loss_value:.4f} over {seen} trials")
    return loss_value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, help="directory of betas_session*.hdf5 files")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", default="auto", help="an int or 'auto'")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sessions", type=int, default=8, help="sessions to generate")
    args = parser.parse_args(argv)
    workers = args.workers if args.workers == "auto" else int(args.workers)
    seed_everything(0)

    with LeakCheck() as check, tempfile.TemporaryDirectory() as tmp:
        root = args.root
        if root is None:
            root = Path(tmp)
            make_sessions(root, sessions=args.sessions)
        train(root, args.epochs, workers, torch.device(args.device))
    print(f"\nresources after training:\n{check.report}")
    return 0 if check.report is not None and not check.report.leaked() else 1


if __name__ == "__main__":
    sys.exit(main())
