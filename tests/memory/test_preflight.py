"""Picklability preflight under real spawn and forkserver contexts."""

from __future__ import annotations

import functools
import threading
import warnings

import h5py
import numpy as np
import pytest
import torch

from loaderkit import ConfigError, LoaderkitWarning, checks, create_dataloader
from loaderkit.memory.preflight import find_unpicklable, pickled_size
from tests.helpers import (
    LargeArrayDataset,
    ReverseSampler,
    SquareDataset,
    Transform,
    TransformDataset,
    child_pids,
    tiered,
    tuple_collate,
)

#: Both pickle what crosses to a worker; forkserver takes spawn's path and runs in the slow tier.
SPAWNING = tiered(["spawn", "forkserver"], {"spawn"})


def _local_function():
    def inner(x):
        return x

    return inner


class WithState(SquareDataset):
    """Drops its lock in __getstate__: must count as picklable."""

    def __init__(self) -> None:
        super().__init__(4)
        self.lock = threading.Lock()

    def __getstate__(self):
        state = dict(self.__dict__)
        state["lock"] = None
        return state


@pytest.mark.parametrize("context", SPAWNING)
@pytest.mark.parametrize(
    ("make_leaf", "kind"),
    [
        (lambda: lambda x: x, "lambda"),
        (_local_function, "local function"),
        (threading.Lock, "lock"),
        (lambda: (i for i in range(3)), "generator"),
    ],
    ids=["lambda", "local-function", "lock", "generator"],
)
def test_unpicklable_dataset_attribute_is_named(context, make_leaf, kind) -> None:
    before = child_pids()
    dataset = TransformDataset(Transform(make_leaf()))
    with pytest.raises(ConfigError) as info:
        create_dataloader(dataset, num_workers=2, multiprocessing_context=context)
    message = str(info.value)
    assert "dataset.transform.fn cannot be pickled" in message
    assert f"'{context}' start method" in message
    assert "Fix:" in message
    assert find_unpicklable(dataset, "dataset").kind == kind
    assert child_pids() == before  # nothing was started


@pytest.mark.parametrize("context", SPAWNING)
def test_open_file_and_h5py_handles_are_explained(context, tmp_path) -> None:
    path = tmp_path / "x.txt"
    path.write_text("x")
    with (
        open(path) as handle,
        pytest.raises(ConfigError, match=r"dataset\.transform\.fn .*open file"),
    ):
        create_dataloader(
            TransformDataset(Transform(handle)), num_workers=1, multiprocessing_context=context
        )
    h5 = tmp_path / "d.h5"
    with h5py.File(h5, "w") as f:
        f["x"] = np.arange(4)
    with h5py.File(h5, "r") as f:
        with pytest.raises(ConfigError, match="h5py objects cannot be pickled") as info:
            create_dataloader(
                TransformDataset(Transform(f["x"])), num_workers=1, multiprocessing_context=context
            )
        assert "HDF5SessionDataset" in str(info.value)


@pytest.mark.parametrize("context", SPAWNING)
def test_unpicklable_collate_fn_and_worker_init_fn(context) -> None:
    with pytest.raises(ConfigError, match=r"^collate_fn cannot be pickled.*lambda"):
        create_dataloader(
            SquareDataset(), num_workers=2, collate_fn=lambda b: b, multiprocessing_context=context
        )
    with pytest.raises(ConfigError, match=r"^collate_fn\.func cannot be pickled.*local"):
        create_dataloader(
            SquareDataset(),
            num_workers=2,
            collate_fn=functools.partial(_local_function(), 1),
            multiprocessing_context=context,
        )
    with pytest.raises(ConfigError, match=r"^worker_init_fn cannot be pickled"):
        create_dataloader(
            SquareDataset(),
            num_workers=2,
            worker_init_fn=_local_function(),
            multiprocessing_context=context,
        )


def test_preflight_catches_what_torch_would_fail_on() -> None:
    """Without the preflight, torch fails when the workers start (the failure is real)."""
    dataset = TransformDataset(Transform(lambda x: x))
    plain = torch.utils.data.DataLoader(dataset, num_workers=1, multiprocessing_context="spawn")
    # "Can't pickle local object" (Python <= 3.12), "Can't get local object" (3.13)
    with pytest.raises(Exception, match=r"pickle|local object"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # what torch warns on the way differs by release
        next(iter(plain))


@pytest.mark.parametrize("context", SPAWNING)
def test_picklable_objects_load_under_real_workers(context) -> None:
    loader = create_dataloader(
        WithState(),
        batch_size=2,
        num_workers=2,
        multiprocessing_context=context,
        collate_fn=tuple_collate,
    )
    batches = list(loader)
    loader.close()
    assert [int(x[0]) for batch in batches for x in batch] == [0, 1, 2, 3]
    assert "pickled_dataset" in loader.plan


def test_fork_runs_no_preflight() -> None:
    dataset = TransformDataset(Transform(lambda x: x), n=4)
    with create_dataloader(
        dataset, num_workers=2, multiprocessing_context="fork", batch_size=4
    ) as loader:
        ((first, _),) = list(loader)
    assert first.tolist() == [0, 1, 2, 3]


def test_large_dataset_warns_with_its_size(monkeypatch) -> None:
    monkeypatch.setattr(checks, "LARGE_PICKLE_BYTES", 1 << 20)
    with pytest.warns(LoaderkitWarning, match=r"pickles to 2 MiB .* each of the 2 workers"):
        create_dataloader(
            LargeArrayDataset(2 << 20), num_workers=2, multiprocessing_context="spawn"
        )


def test_tensors_are_not_counted_they_are_shared() -> None:
    small = pickled_size(torch.utils.data.TensorDataset(torch.zeros(1000, 1000)))
    assert small < 10_000


def test_unpicklable_sampler_only_warns_and_still_loads() -> None:
    sampler = ReverseSampler(4)
    sampler.lock = threading.Lock()
    with pytest.warns(LoaderkitWarning, match=r"sampler\.lock cannot be pickled.*main process"):
        loader = create_dataloader(
            SquareDataset(4),
            sampler=sampler,
            batch_size=4,
            num_workers=1,
            multiprocessing_context="spawn",
        )
    ((values, _),) = list(loader)
    loader.close()
    assert values.tolist() == [3, 2, 1, 0]


def test_paths_name_containers_partials_and_methods() -> None:
    lock = threading.Lock()
    assert find_unpicklable({"a": [1, {"b": lock}]}, "x").path == "x['a'][1]['b']"
    assert find_unpicklable((1, lock), "x").path == "x[1]"
    assert find_unpicklable(functools.partial(print, sep=lock), "fn").path == "fn.keywords['sep']"
    holder = Transform(lock)
    assert find_unpicklable(holder.__init__, "fn").path == "fn.__self__.fn"
    assert find_unpicklable(WithState(), "dataset") is None
    problem = find_unpicklable(Transform(_local_function()), "dataset")
    assert problem.kind == "local function" and "module level" in problem.fix


class _Slotted:
    __slots__ = ("empty", "labels")

    def __init__(self) -> None:
        self.labels = [1, 2]


class _DropsOnPickle:
    def __init__(self) -> None:
        self.cache = {"rows": [1, 2, 3]}
        self.path = "/data/x.h5"

    def __getstate__(self) -> dict:
        return {"path": self.path}


def test_attribute_walk_follows_live_attributes_or_pickle() -> None:
    from loaderkit.memory.preflight import AttributeWalk

    obj = _DropsOnPickle()
    live = [path for path, _ in AttributeWalk(obj, "dataset")]
    assert "dataset.cache['rows']" in live and "dataset.cache['rows'][2]" in live
    pickled = [path for path, _ in AttributeWalk(obj, "dataset", live=False)]
    assert "dataset.path" in pickled and not any("cache" in p for p in pickled)
    slotted = dict(AttributeWalk(_Slotted(), "x"))
    assert slotted["x.labels"] == [1, 2] and "x.empty" not in slotted
    walk = AttributeWalk(obj, "dataset", descend=lambda o: not isinstance(o, dict))
    assert [p for p, _ in walk] == ["dataset", "dataset.cache", "dataset.path"]
    bounded = AttributeWalk(list(range(100)), "d", max_nodes=10)
    assert len(list(bounded)) == 10 and bounded.truncated and bounded.visited == 10
