"""loaderkit loaders inside a real Lightning Trainer on one device (in this process)."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest

pl = pytest.importorskip("lightning.pytorch")

import psutil  # noqa: E402
import torch  # noqa: E402
from lightning.fabric.utilities.exceptions import MisconfigurationException  # noqa: E402
from torch.utils.data import DataLoader as TorchDataLoader  # noqa: E402

from loaderkit import DataLoader, HDF5SessionDataset, create_dataloader  # noqa: E402
from loaderkit.integrations import close_loaders  # noqa: E402
from loaderkit.integrations.lightning import LoaderkitCallback  # noqa: E402
from loaderkit.memory.resources import worker_processes  # noqa: E402
from loaderkit.order.seeding import WorkerInit  # noqa: E402
from tests.hdf5.helpers import hdf5_fds, write_sessions  # noqa: E402
from tests.integrations.lit import (  # noqa: E402
    BuilderDataModule,
    IndexDataset,
    RecordingModule,
    flat_predictions,
    make_trainer,
)

N = 23


def build_create_kw(stage: str, ds: Any) -> Any:
    return create_dataloader(ds, batch_size=4, training=stage == "train", seed=7)


def build_class_kw(stage: str, ds: Any) -> Any:
    return DataLoader(ds, batch_size=4, training=stage == "train", seed=7, num_workers=1)


def build_class_dataset_positional(stage: str, ds: Any) -> Any:
    return DataLoader(ds, batch_size=4, shuffle=stage == "train", seed=7)


BUILDERS = {
    "create_dataloader(kw)": build_create_kw,
    "DataLoader(kw, 1 worker)": build_class_kw,
    "DataLoader(ds, shuffle=...)": build_class_dataset_positional,
}


def _orders(build: Any, epochs: int) -> list[list[int]]:
    """The training order loaderkit itself gives for passes 0..epochs-1."""
    loader = build("train", IndexDataset(N))
    with loader:
        return [[int(i) for idx, _ in loader for i in idx] for _ in range(epochs)]


@pytest.mark.parametrize("name", list(BUILDERS))
def test_fit_validate_test_predict_one_device(name: str) -> None:
    build = BUILDERS[name]
    dm = BuilderDataModule(build, N)
    model = RecordingModule()
    trainer = make_trainer()
    trainer.fit(model, datamodule=dm)
    trainer.validate(model, datamodule=dm, verbose=False)
    trainer.test(model, datamodule=dm, verbose=False)
    predictions = trainer.predict(model, datamodule=dm)

    expected = _orders(build, 2)
    for epoch in range(2):
        seen = model.seen[f"fit:train:{epoch}"]
        assert seen == expected[epoch]  # loaderkit's own (seed, epoch) order
        assert sorted(seen) == list(range(N))
        assert sorted(model.seen[f"fit:val:{epoch}"]) == list(range(N))
    assert expected[0] != expected[1]
    assert model.seen["validate:val:0"] == list(range(N))
    assert model.seen["test:test:0"] == list(range(N))
    assert flat_predictions(predictions) == list(range(N))  # every sample once, in order
    used = trainer.predict_dataloaders
    assert isinstance(used, DataLoader)  # rebuilt by Lightning, still loaderkit's
    assert used is not dm.returned["predict"]
    assert used.plan["shuffle"].value is False
    assert used.seed == 7


def test_positional_arguments_fail_in_predict_exactly_as_torch_does() -> None:
    """Lightning rebuilds predict loaders from the recorded call: torch's DataLoader(ds, 4)
    fails there too, so loaderkit keeps parity (everything after ``dataset`` by keyword)."""
    outcomes = {}
    for cls in (TorchDataLoader, DataLoader):
        dm = BuilderDataModule(lambda stage, ds, cls=cls: cls(ds, 4), N)
        try:
            make_trainer().predict(RecordingModule(), datamodule=dm)
            outcomes[cls.__module__] = "ok"
        except MisconfigurationException as exc:
            outcomes[cls.__module__] = type(exc).__name__ + ("batch_size" in str(exc)) * "!"
    assert set(outcomes.values()) == {"MisconfigurationException!"}


def test_loader_passed_to_fit_survives_the_attribute_rebuild() -> None:
    """Built outside the hooks, then rebuilt by Lightning from its attributes (predict)."""

    # fork: user_init is local to the test (a spawn-like default could not send it)
    def user_init(worker_id: int) -> None:
        torch.manual_seed(1234 + worker_id)

    loader = create_dataloader(
        IndexDataset(N),
        batch_size=4,
        training=False,
        seed=3,
        num_workers=1,
        worker_init_fn=user_init,
        distributed=False,
        force_zero_workers_on_windows=False,
        sample_seeding=True,
        worker_method="process",
        multiprocessing_context="fork",
    )
    trainer = make_trainer()
    predictions = trainer.predict(RecordingModule(), dataloaders=loader)
    assert flat_predictions(predictions) == list(range(N))
    rebuilt = trainer.predict_dataloaders
    assert isinstance(rebuilt, DataLoader) and rebuilt is not loader
    for name in (
        "seed",
        "training",
        "sample_seeding",
        "distributed",
        "force_zero_workers_on_windows",
        "num_workers",
        "worker_method",
    ):
        assert getattr(rebuilt, name) == getattr(loader, name), name
    assert isinstance(rebuilt.worker_init_fn, WorkerInit)
    assert rebuilt.worker_init_fn.user_fn is user_init  # not WorkerInit(WorkerInit(...))
    loader.close()
    rebuilt.close()


def test_seed_owned_generator_still_reseeds_after_attribute_rebuild() -> None:
    loader = create_dataloader(IndexDataset(N), batch_size=4, training=True, seed=11)
    rebuilt = DataLoader(
        **{
            k: getattr(loader, k)
            for k in ("dataset", "batch_size", "generator", "seed", "training", "worker_init_fn")
        }
    )
    assert rebuilt.owns_generator
    first = [[int(i) for idx, _ in rebuilt for i in idx] for _ in range(2)]
    reference = _orders(
        lambda s, ds: create_dataloader(ds, batch_size=4, training=True, seed=11), 2
    )
    assert first == reference


def _hdf5_builder(root: Path) -> Any:
    paths = write_sessions(root, [24, 16, 8])

    def build(stage: str, _ds: Any) -> Any:
        # one dataset per loader, as a DataModule building in its hooks has
        return create_dataloader(
            HDF5SessionDataset(paths),
            batch_size=4,
            training=stage == "train",
            num_workers=2,
            seed=1,
        )

    return build


def test_ten_predict_loops_leave_no_descriptor_or_process(tmp_path: Path) -> None:
    build = _hdf5_builder(tmp_path)
    model = RecordingModule()
    trainer = make_trainer(callbacks=[LoaderkitCallback()])
    dm = BuilderDataModule(build, 0)
    trainer.predict(model, datamodule=dm)  # warm-up: first-use imports and caches
    gc.collect()
    proc = psutil.Process()
    fds, children = proc.num_fds(), len(worker_processes())
    for _ in range(10):
        trainer = make_trainer(callbacks=[LoaderkitCallback()])
        trainer.predict(model, datamodule=BuilderDataModule(build, 0))
    gc.collect()
    assert len(worker_processes()) == children == 0
    assert proc.num_fds() <= fds
    assert hdf5_fds(tmp_path) == []


@pytest.mark.parametrize("fail", [False, True], ids=["fit", "exception_in_training_step"])
def test_no_session_file_left_open_after_fit(tmp_path: Path, fail: bool) -> None:
    build = _hdf5_builder(tmp_path)
    dm = BuilderDataModule(build, 0)
    trainer = make_trainer(callbacks=[LoaderkitCallback()])
    model = RecordingModule(fail_at_step=3 if fail else None)
    if fail:
        with pytest.raises(RuntimeError, match="boom"):
            trainer.fit(model, datamodule=dm)
    else:
        trainer.fit(model, datamodule=dm)
        assert len(set(model.seen["fit:train:1"])) == 48  # every sample (first values differ)
    assert dm.returned["train"].persistent_workers  # workers that held files in them
    assert worker_processes() == []
    assert hdf5_fds(tmp_path) == []
    assert all(loader.dataset.handles.open_files == 0 for loader in dm.returned.values())


def test_without_the_callback_lightning_leaves_files_open(tmp_path: Path) -> None:
    """Why the callback exists: Lightning stops workers but never closes datasets."""
    paths = write_sessions(tmp_path, [8, 8])
    dm = BuilderDataModule(
        lambda stage, _: create_dataloader(HDF5SessionDataset(paths), batch_size=4), 0
    )
    make_trainer().fit(RecordingModule(), datamodule=dm)
    assert hdf5_fds(tmp_path) != []  # read in this process, still open after fit
    assert close_loaders(dm.returned) == 2  # train and val
    assert hdf5_fds(tmp_path) == []


def test_callback_closes_the_rebuilt_and_the_original_loaders() -> None:
    ds = IndexDataset(N)
    dm = BuilderDataModule(build_create_kw, N, dataset=ds)
    trainer = make_trainer(callbacks=[LoaderkitCallback()])
    trainer.predict(RecordingModule(), datamodule=dm)
    assert ds.closed >= 1
    assert dm.returned["predict"]._closed and trainer.predict_dataloaders._closed
    gc.collect()


@pytest.mark.parametrize(
    "options",
    [
        {"overfit_batches": 2},
        {"limit_train_batches": 3, "limit_val_batches": 2},
        {"reload_dataloaders_every_n_epochs": 1},
    ],
    ids=["overfit_batches", "limit_batches", "reload_every_epoch"],
)
def test_trainer_options_that_rebuild_or_cut_loaders(options: dict[str, Any]) -> None:
    """No crash, and no LoaderkitWarning (an error under this project's pytest settings)."""
    dm = BuilderDataModule(build_class_kw, N)
    model = RecordingModule()
    trainer = make_trainer(callbacks=[LoaderkitCallback()], **options)
    trainer.fit(model, datamodule=dm)
    seen = model.seen["fit:train:1"]
    if "overfit_batches" in options:  # Lightning rebuilt it with a SequentialSampler
        assert seen == list(range(8))
    elif "limit_train_batches" in options:
        assert len(seen) == 12
    else:
        assert sorted(seen) == list(range(N))
    assert worker_processes() == []
