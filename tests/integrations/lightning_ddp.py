"""One Lightning DDP run (2 CPU processes, gloo, Lightning's own subprocess launcher).

Run as ``python -m tests.integrations.lightning_ddp OUT SCENARIO N USE_DISTRIBUTED_SAMPLER
[LOADER]`` from the repository root; every rank writes ``OUT/rank<r>.json`` with the indices
each stage saw, the predictions, and what the loaders Lightning iterated look like.
``LOADER`` is ``loaderkit`` (default) or ``torch`` (the same run with torch's DataLoader, for
side-by-side figures). Scenarios:

* ``hooks``: ``create_dataloader`` in every hook (training: seeded shuffle; eval:
  ``training=False``);
* ``block``: ``shuffle="block"`` over an ``HDF5SessionDataset`` for training;
* ``batch_sampler``: a user ``BatchSampler`` in every hook;
* ``outside``: loaders built at top level, before the process group, and passed to
  ``trainer.fit``/``predict`` (Lightning's attribute-path rebuild);
* ``fail``: HDF5 sessions, persistent workers, and ``training_step`` raises.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import psutil
from torch.utils.data import BatchSampler, SequentialSampler
from torch.utils.data import DataLoader as TorchDataLoader

from loaderkit import DataLoader, HDF5SessionDataset, create_dataloader

try:
    from loaderkit.integrations.lightning import LoaderkitCallback
except ImportError:  # loaderkit 0.1 had none: lets tools/framework_matrix.py measure it
    LoaderkitCallback = None  # type: ignore[assignment,misc]
from loaderkit.order.seeding import WorkerInit
from tests.integrations.lit import (
    BuilderDataModule,
    IndexDataset,
    RecordingModule,
    dump,
    flat_predictions,
    make_trainer,
)


def _describe(loader: Any) -> dict[str, Any]:
    if loader is None:
        return {}
    out = {
        "type": type(loader).__name__,
        "sampler": type(loader.sampler).__name__,
        "batch_sampler": type(loader.batch_sampler).__name__,
    }
    if isinstance(loader, DataLoader):
        wif = loader.worker_init_fn
        out.update(
            seed=loader.seed,
            training=loader.training,
            distributed=getattr(loader, "distributed", None),
            owns_generator=loader.owns_generator,
            nested_worker_init=isinstance(wif, WorkerInit) and isinstance(wif.user_fn, WorkerInit),
            worker_init_rank=getattr(wif, "rank", None),
        )
    return out


def _own_descendants(proc: psutil.Process) -> list[psutil.Process]:
    """This rank's descendants: rank 1 is a child of rank 0 (Lightning's launcher), but its
    workers are its own (they may still be shutting down while rank 0 looks)."""
    out = []
    for child in proc.children():
        try:
            if child.environ().get("LOCAL_RANK", "0") != "0":
                continue  # another rank, not this rank's worker
        except psutil.Error:
            pass
        out.append(child)
        out.extend(child.children(recursive=True))
    return out


def _hdf5_dataset(root: Path, sessions: int, rows: int) -> HDF5SessionDataset:
    """Session files whose row values are the row's global index (written by rank 0)."""
    paths = [root / f"s{s}.h5" for s in range(sessions)]
    done = root / "written"
    if not done.exists():
        for s, path in enumerate(paths):
            tmp = path.with_suffix(".tmp")
            with h5py.File(tmp, "w") as f:
                idx = np.arange(s * rows, (s + 1) * rows, dtype=np.float32)
                f["x"] = np.repeat(idx[:, None], 4, axis=1)
            tmp.rename(path)
        done.touch()
    return HDF5SessionDataset(paths, key="x")


def main() -> None:
    out, scenario, n, uds = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
    which = sys.argv[5] if len(sys.argv) > 5 else "loaderkit"
    rank_hint = int(os.environ.get("LOCAL_RANK", "0"))
    callbacks: list[Any] = [LoaderkitCallback()] if LoaderkitCallback is not None else []
    dataset: Any = None

    def build(stage: str, ds: Any) -> Any:
        if which == "torch":
            return TorchDataLoader(ds, batch_size=4, shuffle=stage == "train")
        if scenario == "batch_sampler":
            return create_dataloader(
                ds,
                batch_sampler=BatchSampler(SequentialSampler(ds), 4, False),
                training=stage == "train",
            )
        if scenario == "block" and stage == "train":
            return create_dataloader(ds, batch_size=4, shuffle="block", seed=5)
        if scenario == "fail":  # persistent workers holding session files
            return create_dataloader(
                ds, batch_size=4, training=stage == "train", seed=7, num_workers=1
            )
        return create_dataloader(ds, batch_size=4, training=stage == "train", seed=7)

    if scenario in ("block", "fail"):
        root = out / "h5"
        root.mkdir(exist_ok=True)
        while rank_hint != 0 and not (root / "written").exists():
            time.sleep(0.05)
        dataset = _hdf5_dataset(root, sessions=n // 16, rows=16)
    record: dict[str, Any] = {}
    trainer = make_trainer(
        strategy="ddp", devices=2, use_distributed_sampler=uds, callbacks=callbacks
    )
    model = RecordingModule(fail_at_step=2 if scenario == "fail" else None)
    try:
        if scenario == "outside":
            # Built before trainer.fit starts the process group: Lightning rebuilds them
            # from their attributes.
            def user_init(worker_id: int) -> None:
                pass

            train = create_dataloader(
                IndexDataset(n, draws=True),
                batch_size=4,
                training=True,
                seed=7,
                num_workers=1,
                worker_init_fn=user_init,
                force_zero_workers_on_windows=False,
            )
            val = create_dataloader(IndexDataset(n), batch_size=4, training=False, seed=7)
            trainer.fit(model, train_dataloaders=train, val_dataloaders=val)
            record["used_train"] = _describe(trainer.train_dataloader)
            record["used_val"] = _describe(trainer.val_dataloaders)
            predictions = trainer.predict(model, dataloaders=val)
            record["used_predict"] = _describe(trainer.predict_dataloaders)
        else:
            dm = BuilderDataModule(build, n, dataset=dataset)
            trainer.fit(model, datamodule=dm)
            record["used_train"] = _describe(trainer.train_dataloader)
            record["used_val"] = _describe(trainer.val_dataloaders)
            trainer.validate(model, datamodule=dm, verbose=False)
            trainer.test(model, datamodule=dm, verbose=False)
            record["used_test"] = _describe(trainer.test_dataloaders)
            predictions = trainer.predict(model, datamodule=dm)
            record["used_predict"] = _describe(trainer.predict_dataloaders)
        record["predict"] = flat_predictions(predictions)
    except Exception as exc:  # recorded for the test to assert on
        record["error"] = f"{type(exc).__name__}: {exc}"
    record["rank"] = trainer.global_rank
    record["seen"] = dict(model.seen)
    record["batches"] = model.batches
    record["draws"] = model.draws
    proc = psutil.Process()
    record["pid"] = proc.pid
    record["children"] = [c.pid for c in _own_descendants(proc)]
    record["h5_open"] = sorted(f.path for f in proc.open_files() if f.path.endswith(".h5"))
    dump(out / f"rank{trainer.global_rank}.json", record)


if __name__ == "__main__":
    main()
