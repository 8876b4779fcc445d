"""Preempted mid-epoch, resumed from a checkpoint: the same training run, to the last bit.

    python examples/resume_training.py [--root DIR] [--epochs N] [--stop-at STEP]
                                       [--workers N] [--resume-workers N]

Trains a small model on per-session HDF5 files three times, each in a fresh loader:

1. uninterrupted, for ``--epochs`` epochs;
2. the same, stopped at step ``--stop-at`` (mid-epoch) after saving a checkpoint with the
   model, the optimizer and ``loader.state_dict()``;
3. resumed from that checkpoint with ``--resume-workers`` workers (another machine, a debug
   run), continuing mid-epoch.

It then checks that the resumed run saw exactly the samples of the uninterrupted one and ends
with bit-identical weights. Shows: an ``HDF5SessionDataset`` with a random ``transform``
(augmentation, seeded per sample with ``sample_seeding=True``, still read in batches),
``state_dict``/``load_state_dict`` through ``torch.save``/``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from loaderkit import DataLoader, HDF5SessionDataset, worker_rng
from loaderkit.cli.demo import make_sessions


class Augmented(HDF5SessionDataset):
    """Betas as float32 with random scaling and noise: augmentation drawn per sample."""

    def transform(self, sample: Any, index: int) -> torch.Tensor:
        scale = 1.0 + 0.1 * worker_rng().standard_normal()
        betas = torch.from_numpy(sample.astype(np.float32) / 300.0) * scale
        return betas + 0.01 * torch.randn(betas.shape)


def make_loader(paths: list[Path], workers: int) -> DataLoader:
    return DataLoader(
        Augmented(paths, key="betas"),
        batch_size=16,
        training=True,
        seed=0,
        sample_seeding=True,
        num_workers=workers,
    )


def fresh_model(width: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


def train(
    paths: list[Path],
    epochs: int,
    workers: int,
    *,
    stop_at: int | None = None,
    checkpoint: Path | None = None,
    resume: Path | None = None,
) -> tuple[torch.nn.Module, list[float]]:
    """Train; save a checkpoint and stop at ``stop_at``; or continue from ``resume``."""
    loader = make_loader(paths, workers)
    model, optimizer = fresh_model(int(np.prod(loader.dataset[0].shape)))
    step, sums = 0, []
    if resume is not None:
        state = torch.load(resume, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])  # continues mid-epoch, skipping nothing twice
        step = state["step"]
    with loader:
        for _ in range(loader.epoch, epochs):  # the next pass's epoch: 0, or the resumed one
            for batch in loader:
                loss = model(batch.flatten(1)).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                sums.append(float(batch.sum()))
                step += 1
                if step == stop_at and checkpoint is not None:
                    torch.save(
                        {
                            "model": model.state_dict(),
                            "optimizer": optimizer.state_dict(),
                            "loader": loader.state_dict(),
                            "step": step,
                        },
                        checkpoint,
                    )
                    return model, sums  # preempted
    return model, sums


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, help="directory of betas_sessionNN.hdf5 files")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--stop-at", type=int, default=13, help="step to preempt at")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--resume-workers", type=int, default=0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.root or Path(tmp)
        if args.root is None:
            make_sessions(root, sessions=3, trials=40, voxels=32)
        paths = sorted(root.glob("betas_session*.hdf5"))
        reference, all_sums = train(paths, args.epochs, args.workers)
        checkpoint = Path(tmp) / "checkpoint.pt"
        _, head = train(
            paths, args.epochs, args.workers, stop_at=args.stop_at, checkpoint=checkpoint
        )
        resumed, tail = train(paths, args.epochs, args.resume_workers, resume=checkpoint)
    same_batches = head + tail == all_sums
    same_weights = all(
        torch.equal(a, b)
        for a, b in zip(reference.state_dict().values(), resumed.state_dict().values(), strict=True)
    )
    print(f"uninterrupted: {len(all_sums)} steps; preempted at step {len(head)}, ", end="")
    print(f"resumed for {len(tail)}")
    print(f"resumed run saw the same batches: {same_batches}")
    print(f"final weights bit-identical: {same_weights}")
    return 0 if same_batches and same_weights else 1


if __name__ == "__main__":
    sys.exit(main())
