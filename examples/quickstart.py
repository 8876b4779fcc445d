"""Quickstart: replace DataLoader(...) with create_dataloader(...).

    python examples/quickstart.py [--samples N] [--epochs N] [--workers N]

Trains a small classifier on synthetic data with training defaults (shuffled, persistent
seeded workers), evaluates it with evaluation defaults, prints what loaderkit chose, and
closes both loaders.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import torch
from torch.utils.data import Dataset

from loaderkit import create_dataloader, seed_everything, worker_rng


class NoisyBlobs(Dataset):
    """Two Gaussian blobs in 8 dimensions; each sample gets fresh random jitter."""

    def __init__(self, samples: int, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, 2, (samples,), generator=generator)
        self.points = torch.randn(samples, 8, generator=generator) + self.labels[:, None] * 1.5

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        jitter = torch.from_numpy(worker_rng().normal(0.0, 0.1, 8)).float()
        return self.points[i] + jitter, self.labels[i]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", default="auto", help="an int or 'auto'")
    args = parser.parse_args(argv)
    workers = args.workers if args.workers == "auto" else int(args.workers)

    seed_everything(0)
    train_set, val_set = NoisyBlobs(args.samples, seed=1), NoisyBlobs(args.samples // 4, seed=2)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

    # Before: DataLoader(train_set, batch_size=64, shuffle=True, num_workers=..., ...)
    with create_dataloader(
        train_set, batch_size=64, num_workers=workers, training=True, seed=0
    ) as train:
        print(train.describe(), end="\n\n")
        for epoch in range(args.epochs):
            total = 0.0
            for x, y in train:  # set_epoch and a new order every pass, automatically
                loss = torch.nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total += loss.item() * len(y)
            assert train.epoch == epoch  # the loader counts passes
            print(f"epoch {epoch}: loss {total / len(train_set):.4f}")

    with (
        create_dataloader(val_set, batch_size=256, num_workers=workers, training=False) as val,
        torch.no_grad(),
    ):
        correct = sum(int((model(x).argmax(1) == y).sum()) for x, y in val)
    accuracy = correct / len(val_set)
    print(f"validation accuracy: {accuracy:.1%}")
    return 0 if accuracy > 0.6 else 1


if __name__ == "__main__":
    sys.exit(main())
