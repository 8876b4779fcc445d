"""A recording LightningModule and DataModule shared by the in-process and DDP Lightning tests.

Every sample is ``(index, features)``; the module records the indices each stage sees, per
epoch, so tests can count samples seen, missing and duplicated.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import Dataset

Builder = Callable[[str, Dataset], Any]


class IndexDataset(Dataset):
    """Sample ``i`` is ``(i, [i, i, i, i])``; ``close()`` is counted (loaderkit calls it)."""

    def __init__(self, n: int, draws: bool = False) -> None:
        self.n = n
        self.draws = draws
        self.closed = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, ...]:
        sample = (torch.tensor(i), torch.full((4,), float(i)))
        if self.draws:  # a draw from the worker's torch stream (per worker and rank)
            return (*sample, torch.rand(()))
        return sample

    def close(self) -> None:
        self.closed += 1


def split(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``(indices, features)`` of a batch: a tuple batch, or rows whose first value is the index
    (HDF5 test files store each row's global index in every column)."""
    if isinstance(batch, torch.Tensor):
        flat = batch.reshape(len(batch), -1).float()
        return flat[:, 0].long(), flat[:, :4]
    return batch[0], batch[1]


class RecordingModule(pl.LightningModule):
    """Records ``{"<fn>:<kind>:<epoch>": [indices...]}`` and worker random draws."""

    def __init__(self, fail_at_step: int | None = None) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.seen: dict[str, list[int]] = defaultdict(list)
        self.fail_at_step = fail_at_step
        self.batches: list[list[int]] = []  # training batches, in order
        self.draws: list[float] = []

    def _record(self, kind: str, idx: torch.Tensor) -> None:
        fn = str(getattr(self.trainer.state.fn, "value", self.trainer.state.fn))
        epoch = self.current_epoch if fn == "fit" else 0
        self.seen[f"{fn}:{kind}:{epoch}"].extend(int(i) for i in idx)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.fail_at_step is not None and self.global_step >= self.fail_at_step:
            raise RuntimeError("boom in training_step")
        idx, x = split(batch)
        self._record("train", idx)
        self.batches.append([int(i) for i in idx])
        if isinstance(batch, (list, tuple)) and len(batch) > 2:  # worker random draws
            self.draws.extend(float(v) for v in batch[2])
        return self.layer(x).mean()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._record("val", split(batch)[0])

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._record("test", split(batch)[0])

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return split(batch)[0]

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class BuilderDataModule(pl.LightningDataModule):
    """Builds every loader in its hook, as users write DataModules, with ``build(stage, ds)``."""

    def __init__(self, build: Builder, n: int, dataset: Dataset | None = None) -> None:
        super().__init__()
        self.build = build
        self.n = n
        self.dataset = dataset
        self.returned: dict[str, Any] = {}

    def _loader(self, stage: str) -> Any:
        ds = self.dataset if self.dataset is not None else IndexDataset(self.n)
        loader = self.build(stage, ds)
        self.returned[stage] = loader
        return loader

    def train_dataloader(self) -> Any:
        return self._loader("train")

    def val_dataloader(self) -> Any:
        return self._loader("val")

    def test_dataloader(self) -> Any:
        return self._loader("test")

    def predict_dataloader(self) -> Any:
        return self._loader("predict")


def make_trainer(**kwargs: Any) -> pl.Trainer:
    """A quiet CPU trainer (no logger, checkpoints, progress bar or sanity check)."""
    options: dict[str, Any] = dict(
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    options.update(kwargs)
    return pl.Trainer(**options)


def flat_predictions(predictions: Any) -> list[int]:
    """Indices returned by ``trainer.predict`` (a list of batch tensors)."""
    return [int(i) for batch in predictions or [] for i in batch]


def dump(path: Path, record: dict[str, Any]) -> None:
    path.write_text(json.dumps(record))
