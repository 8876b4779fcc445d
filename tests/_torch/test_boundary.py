"""torch's internals only behind ``loaderkit._torch``; a changed internal falls back.

* A scan of the source: outside ``src/loaderkit/_torch/`` no module names a private torch
  module, class, function or attribute, nor a private member of torch's DataLoader and its
  iterators (collected from the installed torch itself, so a new one is caught too).
* The probes pass on the torch this suite runs on (CI runs it on the oldest and the newest).
* A faked change of each internal makes its piece fall back: one ``LoaderkitWarning`` naming
  the torch version and what was turned off, a plan row, and a loader that still loads every
  sample (with workers too).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.utils.data
from torch.utils.data import TensorDataset

import loaderkit
from loaderkit import ConfigError, LoaderkitWarning, _torch, create_dataloader
from loaderkit import planning as planning_module
from loaderkit.planning import plan_loader
from loaderkit.policy import LoaderRequest
from tests.conftest import fake_platform

SRC = Path(loaderkit.__file__).resolve().parent
BOUNDARY = SRC / "_torch"

#: Private torch modules and objects, by name.
PRIVATE_PATTERNS = [
    r"torch\._C\b",
    r"torch\._utils\b",
    r"utils\.data\._utils\b",
    r"datapipes\b",
    r"_new_shared",
    r"_typed_storage",
    r"_is_in_bad_fork",
    r"_storage_Use_Count",
    r"\._cdata\b",
    r"SerializationWrapper",
    r"DataLoaderIter\b",
    r"torch\.accelerator\b",
    r"\._(?:indices|values)\(",
]


def _sources() -> Iterator[tuple[Path, str]]:
    for path in sorted(SRC.rglob("*.py")):
        if BOUNDARY not in path.parents:
            yield path, path.read_text()


def _torch_private_members() -> set[str]:
    """Private members of torch's DataLoader and its iterators, read from torch itself."""
    from torch.utils.data import dataloader

    names: set[str] = set()
    classes = [torch.utils.data.DataLoader]
    classes += [
        getattr(dataloader, name)
        for name in dir(dataloader)
        if name.endswith("DataLoaderIter") and isinstance(getattr(dataloader, name), type)
    ]
    for cls in classes:
        names.update(n for n in dir(cls) if n.startswith("_") and not n.startswith("__"))
    loader = torch.utils.data.DataLoader(TensorDataset(torch.arange(4.0)), num_workers=1)
    iterator = iter(loader)
    try:
        names.update(vars(iterator))
        names.update(vars(loader))
    finally:
        iterator._shutdown_workers()  # type: ignore[attr-defined]
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_no_private_torch_name_outside_the_boundary() -> None:
    found = []
    for path, text in _sources():
        for pattern in PRIVATE_PATTERNS:
            for match in re.finditer(pattern, text):
                line = text.count("\n", 0, match.start()) + 1
                found.append(f"{path.relative_to(SRC)}:{line}: {match.group(0)}")
    assert not found, "torch internals outside loaderkit/_torch:\n" + "\n".join(found)


def test_no_private_member_of_torchs_loader_or_iterators_outside_the_boundary() -> None:
    members = _torch_private_members()
    assert {"_index_sampler", "_get_iterator", "_iterator", "_workers", "_shutdown_workers"} <= (
        members
    )
    pattern = re.compile(r"\.(" + "|".join(sorted(map(re.escape, members))) + r")\b")
    found = []
    for path, text in _sources():
        for match in pattern.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"{path.relative_to(SRC)}:{line}: {match.group(0)}")
    assert not found, "private members of torch's DataLoader used outside the boundary:\n" + (
        "\n".join(found)
    )


def test_each_boundary_module_says_which_torch_releases_it_was_checked_on() -> None:
    for path in sorted(BOUNDARY.glob("*.py")):
        if path.name in ("__init__.py", "probes.py"):
            continue
        text = path.read_text()
        assert "Checked on torch" in text, path.name
        for release in _torch.CHECKED_ON:
            assert release in text, (path.name, release)


def test_every_probe_passes_on_this_torch() -> None:
    support = _torch.refresh()
    assert support.failed == (), support.describe()
    assert support.tested, support.version


def test_the_plan_names_the_torch_and_what_it_checked() -> None:
    loader = create_dataloader(list(range(4)))
    row = loader.plan["torch"]
    assert row.value == torch.__version__
    assert "tested" in row.reason and "checked" in row.reason


# ------------------------------------------------------------------- a changed internal


@pytest.fixture
def changed_torch(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """Lets a test change torch, then re-probes; everything is restored afterwards."""
    monkeypatch.setattr(planning_module, "_WARNED_FALLBACKS", set())
    yield monkeypatch
    monkeypatch.undo()
    _torch.refresh()


def _load_with_fallback(workers: int, **kwargs: Any) -> tuple[Any, list[Any], list[Any]]:
    _torch.refresh()
    data = TensorDataset(torch.arange(40.0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = create_dataloader(data, batch_size=4, num_workers=workers, **kwargs)
        again = create_dataloader(data, batch_size=4, num_workers=workers, **kwargs)
    batches = [b for (b,) in loader]
    loader.close()
    again.close()
    return loader, batches, [w for w in caught if issubclass(w.category, LoaderkitWarning)]


def _check_fallback(loader: Any, batches: list[Any], caught: list[Any], piece: str) -> None:
    assert torch.equal(torch.cat(batches), torch.arange(40.0))
    assert len(caught) == 1, [str(w.message) for w in caught]  # once per process
    message = str(caught[0].message)
    assert torch.__version__ in message and piece in message, message
    assert piece in loader.plan["torch"].reason


@pytest.mark.parametrize("workers", [0, 2])
def test_a_changed_iterator_falls_back_to_torchs_own(
    changed_torch: pytest.MonkeyPatch, workers: int
) -> None:
    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

    original = _MultiProcessingDataLoaderIter._process_data

    def _process_data(self: Any, data: Any, *worker_idx: Any, new_flag: bool = False) -> Any:
        return original(self, data, *worker_idx)  # a torch whose method grew an argument

    changed_torch.setattr(_MultiProcessingDataLoaderIter, "_process_data", _process_data)
    loader, batches, caught = _load_with_fallback(workers)
    _check_fallback(loader, batches, caught, "iterators")
    if workers:
        assert loader.plan["handoff"].value == "torch"
    state = loader.state_dict()  # batches are still counted for the caller
    assert (state["epoch"], state["batches_yielded"]) == (1, 0)


def test_a_changed_iterator_refuses_nothing_but_a_mid_epoch_resume_it_cannot_skip(
    changed_torch: pytest.MonkeyPatch,
) -> None:
    changed_torch.setattr(
        _torch.probes, "PIECES", {**_torch.PIECES, "loader hooks": (lambda: "faked", "torch's")}
    )
    _torch.refresh()
    with pytest.warns(LoaderkitWarning, match="loader hooks"):
        loader = create_dataloader(list(range(8)), batch_size=2)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    assert state["batches_yielded"] == 1
    fresh = create_dataloader(list(range(8)), batch_size=2)
    with pytest.raises(ConfigError, match="cannot resume at batch 1"):
        fresh.load_state_dict(state)


def test_storages_that_do_not_count_turn_the_slot_pool_off(
    changed_torch: pytest.MonkeyPatch,
) -> None:
    # a torch whose storages no longer count their tensors (torch's own path does not ask)
    changed_torch.setattr(torch._C, "_storage_Use_Count", lambda cdata: 1)
    loader, batches, caught = _load_with_fallback(2)
    _check_fallback(loader, batches, caught, "slot storage")
    assert loader.plan["handoff"].value == "torch"
    assert "slot storage" in loader.plan["handoff"].reason


def test_a_changed_queue_creation_turns_the_direct_queues_off(
    changed_torch: pytest.MonkeyPatch,
) -> None:
    from loaderkit._torch import iterators

    changed_torch.setattr(iterators, "direct_queues_probe", lambda: "faked")
    changed_torch.setattr(
        _torch.probes, "PIECES", {**_torch.PIECES, "direct queues": (lambda: "faked", "mp")}
    )
    loader, batches, caught = _load_with_fallback(2)
    _check_fallback(loader, batches, caught, "direct queues")
    assert loader.plan["handoff"].value.startswith("slot pool")  # the pool itself stays


# ----------------------------------------------------------------- arguments per torch


def test_an_argument_an_older_torch_lacks_is_never_passed_when_unset() -> None:
    old = fake_platform(
        torch_version="2.4.1", torch_loader_args=_torch.loader_parameters() - {"in_order"}
    )
    for asked in ({}, {"in_order": True}):
        request = LoaderRequest(batch_size=2, **asked)  # type: ignore[arg-type]
        assert "in_order" not in plan_loader(list(range(8)), request, old).torch_kwargs
        loader = create_dataloader(list(range(8)), batch_size=2, platform=old, **asked)
        assert loader.in_order is True  # the attribute frameworks rebuild from is still there
        assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    current = plan_loader(list(range(8)), LoaderRequest(batch_size=2), fake_platform())
    assert ("in_order" in current.torch_kwargs) == ("in_order" in _torch.loader_parameters())


def test_an_argument_an_older_torch_cannot_honour_is_a_config_error() -> None:
    old = fake_platform(
        torch_version="2.5.1", torch_loader_args=_torch.loader_parameters() - {"in_order"}
    )
    with pytest.raises(ConfigError) as info:
        create_dataloader(list(range(8)), batch_size=2, in_order=False, platform=old)
    message = str(info.value)
    assert "in_order=False" in message and "torch 2.6" in message and "2.5.1" in message


_CHANGED_TORCH = """
import warnings
import torch, torch.utils.data
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

# a torch newer than the tested range, changed in two places loaderkit relies on (and torch
# itself does not use in its DataLoader)
del torch._C._storage_Use_Count
original = _MultiProcessingDataLoaderIter._process_data
def _process_data(self, data, *worker_idx, new_flag=False):
    return original(self, data, *worker_idx)
_MultiProcessingDataLoaderIter._process_data = _process_data

import loaderkit  # importing never fails on a changed torch
from torch.utils.data import TensorDataset

if __name__ == "__main__":
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = loaderkit.create_dataloader(
            TensorDataset(torch.arange(64.0)), batch_size=8, num_workers=2, seed=0, training=True
        )
    batches = sorted(float(x) for (b,) in loader for x in b)
    loader.close()
    assert batches == [float(i) for i in range(64)], batches
    ours = loaderkit.LoaderkitWarning
    messages = [str(w.message) for w in caught if issubclass(w.category, ours)]
    assert len(messages) == 1, messages
    print(messages[0])
    print("PLAN", loader.plan["torch"].reason)
    print("HANDOFF", loader.plan["handoff"].value)
"""


def test_a_torch_changed_in_several_places_imports_warns_once_and_loads(tmp_path: Path) -> None:
    import subprocess
    import sys

    script = tmp_path / "changed_torch.py"
    script.write_text(_CHANGED_TORCH)
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    out = result.stdout
    assert torch.__version__ in out
    for piece in ("iterators", "slot storage"):
        assert piece in out, out
    assert "HANDOFF torch" in out


@pytest.mark.parametrize(
    ("fields", "status", "words"),
    [
        ({}, "pass", "every torch internal it relies on checked"),
        ({"torch_version": "2.16.0"}, "warn", "not yet tested"),
        (
            {"torch_version": "2.15.0", "python_version": (3, 10, 14)},
            "warn",
            "only up to torch 2.14",
        ),
        ({"python_version": (3, 15, 0)}, "warn", "Python 3.15 is not yet tested"),
        ({"torch_fallbacks": ("slot storage",)}, "warn", "slot storage"),
    ],
)
def test_doctor_says_which_torch_and_what_falls_back(
    fields: dict[str, Any], status: str, words: str
) -> None:
    from loaderkit.cli.doctor import run_checks

    check = next(c for c in run_checks(fake_platform(**fields)) if c.name == "torch")
    assert check.status == status and words in check.advice, check


# ---------------------------------------------------------------- numpy bools in default_collate


def test_numpy_bools_collate_as_newer_torch_collates_them(monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    samples = [{"ok": np.True_, "x": np.float32(1.5)}, {"ok": np.False_, "x": np.float32(2.5)}]
    on_this_torch = _torch.default_collate(samples)
    # where torch refuses them (2.6 under numpy 2.4+), the repaired map gives the same batch
    monkeypatch.setattr(_torch.collate, "NUMPY_BOOLS_COLLATE", False)
    repaired = _torch.default_collate(samples)
    for batch in (on_this_torch, repaired):
        assert batch["ok"].dtype == torch.bool and batch["ok"].tolist() == [True, False]
        assert batch["x"].dtype == torch.float32 and batch["x"].tolist() == [1.5, 2.5]
    assert _torch.default_collate([np.True_]).tolist() == [True]


def test_an_hdf5_dataset_on_a_torch_refusing_numpy_bools_collates_with_loaderkit(
    tmp_path: Path,
) -> None:
    import h5py
    import numpy as np

    from loaderkit import HDF5SessionDataset
    from loaderkit.workers.collate import collate

    path = tmp_path / "flags.h5"
    with h5py.File(path, "w") as f:
        f["flags"] = np.array([True, False, True, False])

    class Flags(HDF5SessionDataset):  # read per sample: each flag a numpy bool
        def __getitem__(self, index: int) -> Any:
            return super().__getitem__(index)

    dataset = Flags([path], key="flags")
    assert dataset.handles.read_path[0] == "per-sample"
    refusing = fake_platform(numpy_bools_collate=False)

    setup = plan_loader(dataset, LoaderRequest(batch_size=2), platform=refusing)
    row = setup.plan["collate_fn"]
    assert row.value == "loaderkit.workers.collate.collate"
    assert "refuses numpy bool scalars" in row.reason
    assert "refuses numpy bool scalars" in setup.plan["torch"].reason
    accepting = fake_platform(numpy_bools_collate=True)
    assert "numpy bool" not in plan_loader(dataset, LoaderRequest(), accepting).plan["torch"].reason
    assert setup.torch_kwargs["collate_fn"] is collate
    # this torch as it is, an explicit collate_fn, or no batching: left alone
    for platform, request in [
        (fake_platform(numpy_bools_collate=True), LoaderRequest(batch_size=2)),
        (refusing, LoaderRequest(batch_size=2, collate_fn=list)),
        (refusing, LoaderRequest(batch_size=None)),
    ]:
        kwargs = plan_loader(dataset, request, platform=platform).torch_kwargs
        assert kwargs["collate_fn"] is not collate
    with create_dataloader(dataset, batch_size=2) as loader:
        assert [b.tolist() for b in loader] == [[True, False], [True, False]]


def test_no_accelerator_is_none_where_torch_raises_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None:
        pytest.skip("torch.accelerator came with torch 2.6")

    def none_available() -> Any:  # torch 2.6 without a device (later releases give None)
        raise RuntimeError("Cannot access accelerator device when none is available.")

    monkeypatch.setattr(accelerator, "current_accelerator", none_available)
    assert _torch.accelerator_type() is None
