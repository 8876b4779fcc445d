"""Inference over HDF5 session files: exact order, guaranteed cleanup, many loops.

    python examples/inference.py [--root DIR] [--loops N] [--workers N]

Evaluation loaders use ``training=False``: no shuffling, workers that exit with each pass.
Running the loop many times (as a training job's periodic validation does) must not leak
processes or file handles; ``LeakCheck(raise_on_leak=True)`` proves it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from loaderkit import HDF5SessionDataset, LeakCheck, create_dataloader
from loaderkit.cli.demo import make_sessions


def predict(
    dataset: HDF5SessionDataset, model: torch.nn.Module, workers: int | str
) -> torch.Tensor:
    """Predictions for every sample, in dataset order."""
    outputs = []
    with (
        create_dataloader(dataset, batch_size=256, training=False, num_workers=workers) as loader,
        torch.no_grad(),
    ):
        for betas in loader:
            outputs.append(model(betas.float() / 300.0).argmax(dim=1))
    return torch.cat(outputs)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, help="directory of betas_session*.hdf5 files")
    parser.add_argument("--loops", type=int, default=10, help="evaluation passes")
    parser.add_argument("--workers", default="2", help="an int or 'auto'")
    args = parser.parse_args(argv)
    workers = args.workers if args.workers == "auto" else int(args.workers)

    with tempfile.TemporaryDirectory() as tmp:
        root = args.root or Path(tmp)
        if args.root is None:
            make_sessions(root, sessions=4, trials=300)
        paths = sorted(root.glob("betas_session*.hdf5"))
        dataset = HDF5SessionDataset(paths, key="betas", max_open_files=2)
        model = torch.nn.Linear(dataset[0].shape[-1], 4)
        dataset.close()

        with LeakCheck(raise_on_leak=True) as check:
            first = predict(dataset, model, workers)
            for _ in range(args.loops - 1):
                assert torch.equal(predict(dataset, model, workers), first)
        print(f"{args.loops} passes x {len(first)} predictions, identical every time")
        print(f"class counts: {torch.bincount(first, minlength=4).tolist()}")
        print(f"resources after {args.loops} evaluation loops:\n{check.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
