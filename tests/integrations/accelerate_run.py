"""One Accelerate run on 2 CPU processes, launched with torchrun.

    torchrun --nproc_per_node 2 -m tests.integrations.accelerate_run OUT MODE N

``Accelerator(cpu=True)`` (gloo); every rank writes ``OUT/rank<r>.json`` with the indices its
training loader saw per epoch, its evaluation loader saw, what ``gather_for_metrics``
returned, the warnings loaderkit raised, and which loaderkit features the prepared loader has.
Modes:

* ``prepared``: ``create_dataloader`` after ``Accelerator()`` (``distributed="auto"``),
  training and evaluation loaders passed to ``accelerator.prepare``;
* ``torch``: the same with torch's ``DataLoader`` (the reference);
* ``own_shards``: ``distributed=True``, not prepared (loaderkit's shards, model prepared);
* ``unprepared_auto``: ``distributed="auto"`` iterated without ``prepare``;
* ``sample_seeding``: ``sample_seeding=True`` under Accelerate.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader as TorchDataLoader

from loaderkit import LoaderkitWarning, create_dataloader
from tests.integrations.lit import IndexDataset


def _indices(loader: Any) -> list[int]:
    return [int(i) for batch in loader for i in batch[0]]


def main() -> None:
    out, mode, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    accelerator = Accelerator(cpu=True)
    record: dict[str, Any] = {"rank": accelerator.process_index}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LoaderkitWarning)
        if mode == "torch":
            train = TorchDataLoader(IndexDataset(n), batch_size=4, shuffle=True)
            evaluation = TorchDataLoader(IndexDataset(n), batch_size=4)
        else:
            distributed: Any = True if mode == "own_shards" else "auto"
            train = create_dataloader(
                IndexDataset(n),
                batch_size=4,
                training=True,
                seed=3,
                distributed=distributed,
                sample_seeding=mode == "sample_seeding",
            )
            evaluation = create_dataloader(
                IndexDataset(n), batch_size=4, training=False, distributed=distributed
            )
            record["plan"] = train.describe()
        model = torch.nn.Linear(4, 1)
        if mode in ("prepared", "torch", "sample_seeding"):
            model, train, evaluation = accelerator.prepare(model, train, evaluation)
        else:
            model = accelerator.prepare(model)
        record["survives"] = {
            name: hasattr(train, name) for name in ("close", "plan", "epoch", "set_epoch")
        }
        epochs = []
        for epoch in range(2):
            if hasattr(train, "set_epoch"):
                train.set_epoch(epoch)
            epochs.append(_indices(train))
        record["train"] = epochs
        record["eval"] = _indices(evaluation)
        gathered: list[int] = []
        if mode in ("prepared", "torch", "sample_seeding"):
            for batch in evaluation:
                gathered.extend(int(i) for i in accelerator.gather_for_metrics(batch[0]))
        else:  # exact shards differ in length: gather once, not per batch
            shards: list[Any] = [None] * accelerator.num_processes
            torch.distributed.all_gather_object(shards, record["eval"])
            gathered = [i for shard in shards for i in shard]
        record["gathered"] = gathered
        for loader in (train, evaluation):
            if hasattr(loader, "close"):
                loader.close()
    record["warnings"] = [str(w.message) for w in caught if w.category is LoaderkitWarning]
    (out / f"rank{accelerator.process_index}.json").write_text(json.dumps(record))
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
    # Tearing down Accelerate's gloo group (end_training, or interpreter exit) sometimes hangs
    # for minutes on this 2-CPU machine, with torch's DataLoader as with loaderkit's; every
    # rank has written its results and passed a barrier by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
