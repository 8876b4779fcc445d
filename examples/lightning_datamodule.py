"""A Lightning DataModule over per-session HDF5 files, with loaderkit loaders in its hooks.

    python examples/lightning_datamodule.py [--root DIR] [--devices N] [--epochs N]
                                            [--workers N] [--sessions N] [--trials N]

Needs ``pip install "loaderkit[lightning]"``. ``--root`` is a directory of
``betas_sessionNN.hdf5`` files (``betas`` and ``labels``, as ``examples/train_hdf5.py`` reads);
without it a small set is generated in a temporary directory. ``--devices 2`` runs DDP on 2 CPU
processes with Lightning's own launcher: training shards are disjoint, and validation, test and
prediction see every trial exactly once across ranks (no padded duplicates). Shows:

* ``create_dataloader`` in the ``*_dataloader`` hooks, keyword arguments (Lightning rebuilds
  the loaders it shards or predicts with, from the arguments you passed);
* ``shuffle="block"`` for training: sequential reads, kept as is under DDP;
* ``LoaderkitCallback``: every loader the trainer used is closed when a stage ends or fails
  (worker processes and HDF5 files), which Lightning does not do by itself.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import psutil
import torch
import torch.distributed as dist

from loaderkit import HDF5SessionDataset, create_dataloader
from loaderkit.cli.demo import make_sessions
from loaderkit.integrations.lightning import LoaderkitCallback


class Trials(HDF5SessionDataset):
    """``(betas as float32, label, dataset index)`` per trial."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        positions, _ = self.handles.index_arrays()  # session position of every index, in order
        starts = np.searchsorted(positions, np.arange(len(self.session_ids)))
        self.first_index = {
            sid: int(start) for sid, start in zip(self.session_ids, starts, strict=True)
        }

    def read(self, session: Hashable, row: int) -> tuple[torch.Tensor, int, int]:
        betas = self.h5dataset(session)[row].astype(np.float32) / 300.0
        label = int(self.file(session)["labels"][row])
        return torch.from_numpy(betas), label, self.first_index[session] + row


class SessionData(pl.LightningDataModule):
    """Train on the first sessions, validate/test/predict on the last one."""

    def __init__(self, root: Path, workers: int) -> None:
        super().__init__()
        self.paths = sorted(root.glob("betas_session*.hdf5"))
        if len(self.paths) < 2:
            raise SystemExit(f"need at least 2 betas_session*.hdf5 files in {root}")
        self.workers = workers

    def train_dataloader(self) -> Any:
        return create_dataloader(
            Trials(self.paths[:-1], key="betas"),
            batch_size=64,
            shuffle="block",
            training=True,
            num_workers=self.workers,
            seed=0,
        )

    def _eval(self) -> Any:
        return create_dataloader(
            Trials(self.paths[-1:], key="betas"),
            batch_size=64,
            training=False,
            num_workers=self.workers,
        )

    def val_dataloader(self) -> Any:
        return self._eval()

    def test_dataloader(self) -> Any:
        return self._eval()

    def predict_dataloader(self) -> Any:
        return self._eval()


class Classifier(pl.LightningModule):
    def __init__(self, voxels: int, classes: int) -> None:
        super().__init__()
        self.model = torch.nn.Linear(voxels, classes)
        self.seen: dict[str, list[int]] = {"val": [], "test": []}

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        betas, labels, _ = batch
        loss = torch.nn.functional.cross_entropy(self.model(betas), labels)
        self.log("loss", loss, prog_bar=False)
        return loss

    def _evaluate(self, batch: Any, stage: str) -> None:
        betas, labels, index = batch
        self.seen[stage].extend(int(i) for i in index)
        accuracy = (self.model(betas).argmax(1) == labels).float().mean()
        self.log(f"{stage}_accuracy", accuracy, sync_dist=True, batch_size=len(labels))

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return batch[2]

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _across_ranks(values: list[int]) -> list[int]:
    if not (dist.is_available() and dist.is_initialized()):
        return values
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, values)
    return [v for part in gathered for v in part]


def _own_children(process: psutil.Process) -> list[psutil.Process]:
    """This rank's child processes: not the other ranks Lightning started (nor theirs).

    The other ranks may still run or may already have ended, so they are told apart by their
    ``LOCAL_RANK``, which this rank's DataLoader workers inherit from it.
    """
    mine = os.environ.get("LOCAL_RANK", "0")
    own = []
    for child in process.children(recursive=True):
        try:
            if "python" in child.name() and child.environ().get("LOCAL_RANK", mine) == mine:
                own.append(child)
        except psutil.Error:  # ended meanwhile
            continue
    return own


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=None)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--trials", type=int, default=256)
    args = parser.parse_args(argv)

    root = args.root
    if root is None:
        # Lightning re-runs this script for the other ranks: share the generated files.
        root = Path(os.environ.setdefault("LOADERKIT_EXAMPLE_ROOT", tempfile.mkdtemp()))
        if not any(root.glob("betas_session*.hdf5")):
            make_sessions(root, sessions=args.sessions, trials=args.trials, voxels=64)
    data = SessionData(root, args.workers)
    with Trials(data.paths[-1:], key="betas") as probe:
        held_out, voxels = len(probe), probe[0][0].numel()
        classes = int(probe.file(probe.session_ids[0])["labels"][:].max()) + 1
    pl.seed_everything(0, verbose=False)
    model = Classifier(voxels, max(classes, 2))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        max_epochs=args.epochs,
        callbacks=[LoaderkitCallback()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, datamodule=data)
    model.seen["test"].clear()
    results = trainer.test(model, datamodule=data, verbose=False)
    predictions = trainer.predict(model, datamodule=data) or []
    tested = _across_ranks(model.seen["test"])
    predicted = _across_ranks([int(i) for batch in predictions for i in batch])
    process = psutil.Process()
    open_h5 = [f.path for f in process.open_files() if f.path.endswith(".hdf5")]
    children = len(_own_children(process))
    if trainer.global_rank == 0:
        exact = sorted(tested) == list(range(held_out)) == sorted(predicted)
        print(f"test accuracy: {results[0]['test_accuracy']:.3f}")
        print(
            f"held-out trials: {held_out}; tested {len(tested)}, predicted {len(predicted)} "
            f"across {trainer.world_size} rank(s): {'exact' if exact else 'NOT exact'}"
        )
        print(f"HDF5 files open after the run: {len(open_h5)}")
        print(f"worker processes left: {children}")
        return 0 if exact and not open_h5 else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
