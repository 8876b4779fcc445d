"""One Lightning Fabric run on 2 CPU processes (Fabric's own launcher).

    python -m tests.integrations.fabric_run OUT N

Builds a training and an evaluation loader after ``fabric.launch()`` (so the process group
exists), passes both to ``fabric.setup_dataloaders`` and writes, per rank, the sampler types
Fabric kept and the indices each loader yielded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lightning.fabric import Fabric

from loaderkit import create_dataloader
from tests.integrations.lit import IndexDataset


def main() -> None:
    out, n = Path(sys.argv[1]), int(sys.argv[2])
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    train = create_dataloader(IndexDataset(n), batch_size=4, training=True, seed=1)
    evaluation = create_dataloader(IndexDataset(n), batch_size=4, training=False)
    train, evaluation = fabric.setup_dataloaders(train, evaluation, move_to_device=False)
    record = {
        "train_sampler": type(train.sampler).__name__,
        "eval_sampler": type(evaluation.sampler).__name__,
        "train": [int(i) for batch in train for i in batch[0]],
        "eval": [int(i) for batch in evaluation for i in batch[0]],
    }
    (out / f"rank{fabric.global_rank}.json").write_text(json.dumps(record))
    fabric.barrier()


if __name__ == "__main__":
    main()
