"""A Lightning run interrupted mid-epoch resumes from its checkpoint with exactly the samples of
the uninterrupted run (Lightning saves and restores ``loader.state_dict()`` itself)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

pl = pytest.importorskip("lightning.pytorch")

import torch  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

from loaderkit import DataLoader  # noqa: E402
from tests.integrations.lit import (  # noqa: E402
    BuilderDataModule,
    IndexDataset,
    RecordingModule,
    make_trainer,
)

N, BATCH, EPOCHS = 23, 4, 3  # 6 batches a pass, 18 steps in all


def builder(workers: int) -> Any:
    def build(stage: str, ds: Any) -> Any:
        return DataLoader(
            IndexDataset(N, draws=True),
            batch_size=BATCH,
            training=stage == "train",
            seed=5,
            sample_seeding=True,
            num_workers=workers,
        )

    return build


def fit(
    tmp_path: Path, workers: int, *, fail_at: int | None = None, ckpt: Path | None = None
) -> RecordingModule:
    module = RecordingModule(fail_at_step=fail_at)
    checkpoints = ModelCheckpoint(
        dirpath=tmp_path / "ckpt", filename="{step}", every_n_train_steps=3, save_top_k=-1
    )
    trainer = make_trainer(
        max_epochs=EPOCHS,
        enable_checkpointing=True,
        callbacks=[checkpoints],
        limit_val_batches=0,
    )
    datamodule = BuilderDataModule(builder(workers), N)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if fail_at is None:
            trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt)
        else:
            with pytest.raises(RuntimeError, match="boom"):
                trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt)
    not_resumable = [w for w in caught if "not resumable" in str(w.message)]
    assert not not_resumable, [str(w.message) for w in not_resumable]
    return module


@pytest.mark.parametrize(("before", "after"), [(2, 0), (0, 2)])
def test_fit_interrupted_mid_epoch_resumes_exactly(tmp_path: Path, before: int, after: int) -> None:
    reference = fit(tmp_path / "full", before)
    assert len(reference.batches) == EPOCHS * 6

    crashed = fit(tmp_path / "run", before, fail_at=10)  # dies in epoch 1, batch 4
    assert len(crashed.batches) == 10
    ckpt = tmp_path / "run" / "ckpt" / "step=9.ckpt"  # 3 batches of epoch 1 done
    assert ckpt.exists(), sorted(p.name for p in (tmp_path / "run" / "ckpt").iterdir())
    state = torch.load(ckpt, weights_only=True)["loops"]["fit_loop"]["state_dict"]
    (loader_state,) = state["combined_loader"]
    assert (loader_state["epoch"], loader_state["batches_yielded"]) == (1, 3)

    resumed = fit(tmp_path / "run", after, ckpt=ckpt)
    assert crashed.batches[:9] + resumed.batches == reference.batches
    # bit-identical samples, worker random draws included (sample_seeding=True)
    done = sum(len(b) for b in crashed.batches[:9])
    assert crashed.draws[:done] + resumed.draws == reference.draws
    epoch1 = sorted(i for b in crashed.batches[6:9] + resumed.batches[:3] for i in b)
    assert epoch1 == list(range(N))
