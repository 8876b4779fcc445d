"""Copy-on-read: the survey of Python containers, the hint, the plan rows, gc.freeze in workers."""

from __future__ import annotations

import collections
import gc
import sys
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Subset, TensorDataset

from loaderkit import (
    HDF5SessionDataset,
    PerformanceHint,
    SharedSequence,
    create_dataloader,
    planning,
)
from loaderkit.memory import containers as containers_module
from loaderkit.memory.containers import ContainerFinding, ContainerSurvey, survey_containers
from loaderkit.policy.memory import COPY_ON_READ_BYTES, advise_copy_on_read, resolve_gc_freeze
from tests.helpers import tiered
from tests.memory.helpers import FreezeCount, ItemsDataset, trial_items

MIB = 2**20


def _objects_bytes(items: list[tuple[Any, ...]]) -> int:
    return sum(sys.getsizeof(t) + sum(sys.getsizeof(x) for x in t) for t in items)


@pytest.fixture(scope="module")
def issue_items() -> list[tuple[str, int, float]]:
    """The issue's case: 2,000,000 (str, int, float) tuples, ~350 MiB of objects."""
    return trial_items(2_000_000)


def _hints(dataset: Any, **kwargs: Any) -> tuple[list[str], Any]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = create_dataloader(dataset, **kwargs)
    hints = [str(w.message) for w in caught if issubclass(w.category, PerformanceHint)]
    return hints, loader


FORK = {"num_workers": 2, "multiprocessing_context": "fork", "batch_size": 4096}


# --------------------------------------------------------------------------- the survey


def test_the_issue_case_is_found_named_and_sized(issue_items) -> None:
    survey = survey_containers(ItemsDataset(issue_items))
    (finding,) = survey.findings
    assert finding.path == "dataset.items"
    assert (finding.kind, finding.length, finding.contents) == ("list", 2_000_000, "tuples")
    exact = _objects_bytes(issue_items[::1000]) * 1000
    assert 0.8 * exact < finding.nbytes < 1.2 * exact
    assert survey.visited <= 3 and not survey.truncated


def test_the_survey_samples_instead_of_traversing(monkeypatch) -> None:
    sized: list[int] = []
    real = containers_module._object_bytes

    def counting(obj: Any) -> int:
        sized.append(1)
        return real(obj)

    monkeypatch.setattr(containers_module, "_object_bytes", counting)
    counts = []
    for n in (20_000, 400_000):
        sized.clear()
        survey_containers(ItemsDataset(trial_items(n)))
        counts.append(len(sized))
    assert counts[0] == counts[1] <= 4 * containers_module.SAMPLES[0] + 8  # not O(length)


class Nested:
    def __init__(self, n: int) -> None:
        self.meta = {"paths": [f"/data/{i}.png" for i in range(n)], "name": "nested"}
        self.by_subject = {f"s{i}": (i, f"subject {i}") for i in range(n)}
        self.tags = {f"tag{i}" for i in range(n)}
        self.queue = collections.deque(trial_items(n))
        self.names = np.array([f"n{i}" for i in range(n)], dtype=object)
        self.shards = [trial_items(n // 10) for _ in range(10)]


def test_every_kind_of_container_is_found_by_its_path() -> None:
    survey = survey_containers(Nested(200_000))
    found = {f.path: f for f in survey.findings}
    assert {
        "dataset.meta['paths']",
        "dataset.by_subject",
        "dataset.tags",
        "dataset.queue",
        "dataset.names",
        *(f"dataset.shards[{i}]" for i in range(10)),
    } == set(found)
    assert found["dataset.meta['paths']"].contents == "strings"
    assert found["dataset.by_subject"].contents == "entries (str -> tuple)"
    assert found["dataset.names"].kind == "numpy object array"
    assert found["dataset.queue"].kind == "deque"
    sizes = [f.nbytes for f in survey.findings]
    assert sizes == sorted(sizes, reverse=True)


def test_a_list_passed_as_the_dataset_is_found() -> None:
    (finding,) = survey_containers(trial_items(200_000)).findings
    assert finding.path == "dataset"


def test_pandas_object_columns_are_found_and_numeric_ones_are_not() -> None:
    pd = pytest.importorskip("pandas")
    n = 200_000
    frame = pd.DataFrame(
        {"path": [f"/data/{i}.png" for i in range(n)], "label": np.arange(n), "x": np.ones(n)}
    )

    class Table:
        def __init__(self) -> None:
            self.table = frame
            self.numbers = frame[["label", "x"]]
            self.labels = frame["label"]

    (finding,) = survey_containers(Table()).findings
    assert finding.path == "dataset.table" and finding.kind == "pandas DataFrame"
    assert finding.length == n and "'path'" in finding.contents and "label" not in finding.contents
    assert finding.nbytes > n * 50


class Clean:
    """Numbers in numpy and torch, small containers, a SharedSequence."""

    def __init__(self) -> None:
        self.array = np.zeros((4_000_000, 8))
        self.strings = np.array([f"{i:08d}" for i in range(200_000)])  # fixed width: numpy
        self.tensor = torch.zeros(4_000_000, 8)
        self.tensors = (self.tensor, self.tensor)
        self.small = trial_items(10_000)
        self.config = {"root": "/data", "sizes": list(range(50))}
        self.shared = SharedSequence(trial_items(200_000))
        self.text = "x" * 50 * MIB


def test_numbers_tensors_small_containers_and_shared_sequences_are_not_findings() -> None:
    survey = survey_containers(Clean(), min_bytes=COPY_ON_READ_BYTES)
    assert survey.findings == ()
    assert survey.largest is not None and survey.largest.path == "dataset.small"


def test_the_hdf5_dataset_index_is_not_a_finding(tmp_path) -> None:
    import h5py

    paths = []
    for s in range(4):
        path = tmp_path / f"s{s}.h5"
        with h5py.File(path, "w") as f:
            f.create_dataset("x", data=np.zeros(500_000, dtype=np.uint8))
        paths.append(path)
    with HDF5SessionDataset(paths, key="x") as dataset:
        assert len(dataset) == 2_000_000
        assert survey_containers(dataset, min_bytes=MIB).findings == ()
        hints, loader = _hints(dataset, **FORK)
        assert hints == [] and loader.plan["copy_on_read"].value == "none found"


class Awkward:
    """Properties that raise, __getattr__, __getstate__ that fails, a cycle, deep nesting."""

    def __init__(self) -> None:
        self.me = self
        deep: list[Any] = []
        self.deep = deep
        for _ in range(100):
            deep.append([])
            deep = deep[0]

    @property
    def broken(self) -> None:
        raise RuntimeError("never called by the walk")

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError("never called by the walk")

    def __getstate__(self) -> Any:
        raise RuntimeError("never called by the walk")

    def __len__(self) -> int:
        return 1


def test_the_walk_runs_no_object_code_and_stops_at_its_limits() -> None:
    survey = survey_containers(Awkward())
    assert survey.findings == () and survey.truncated
    wide = [[[i] for i in range(60)] for _ in range(60)]  # 3,600 small lists to walk into
    assert survey_containers(wide, max_nodes=500).truncated


# --------------------------------------------------------------------------- the advice


def _finding(path: str, size: int) -> ContainerFinding:
    return ContainerFinding(path, "list", size // 200, "tuples", size)


def test_advice_under_fork_names_the_largest_and_the_fix() -> None:
    survey = ContainerSurvey(
        tuple(_finding(f"dataset.part{i}", (50 - i) * MIB) for i in range(5)), visited=9
    )
    advice = advise_copy_on_read(survey, "fork", 3)
    assert advice.hint is not None
    assert advice.hint.startswith("dataset.part0: list of 262,144 tuples, ~50 MiB; dataset.part1")
    assert "and 2 more, copied into each of 3 workers as they read them" in advice.hint
    assert "~240 MiB in all per worker" in advice.hint
    assert "loaderkit.SharedSequence" in advice.hint and "not a leak" in advice.hint
    assert advice.value == "~240 MiB per worker"


def test_no_hint_below_the_threshold_or_without_findings() -> None:
    small = ContainerSurvey((), visited=4, largest=_finding("dataset.items", 3 * MIB))
    advice = advise_copy_on_read(small, "fork", 2)
    assert advice.hint is None and advice.value == "none over 16 MiB"
    assert "largest: dataset.items" in advice.reason
    nothing = advise_copy_on_read(ContainerSurvey((), visited=1, truncated=True), "fork", 2)
    assert nothing.value == "none found" and "stopped at the walk's limit" in nothing.reason
    several = ContainerSurvey(tuple(_finding(f"d.{i}", 6 * MIB) for i in range(3)), visited=4)
    assert advise_copy_on_read(several, "fork", 2).hint is not None  # 18 MiB together


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_no_copy_on_read_hint_when_workers_unpickle_their_own_copy(method: str) -> None:
    survey = ContainerSurvey((_finding("dataset.items", 300 * MIB),), visited=2)
    advice = advise_copy_on_read(survey, method, 2)
    assert advice.hint is None and advice.value == "not applicable"
    assert "unpickle their own copy" in advice.reason and "SharedSequence" in advice.reason


def test_gc_freeze_policy() -> None:
    assert resolve_gc_freeze("fork", 2).value is True
    assert resolve_gc_freeze("forkserver", 1).value is True
    assert "forkserver process" in resolve_gc_freeze("forkserver", 1).reason
    assert resolve_gc_freeze("spawn", 4).value is False
    assert resolve_gc_freeze("fork", 0).value is False


# --------------------------------------------------------------------------- in the loader


def test_the_hint_fires_for_the_issue_case_under_fork(issue_items) -> None:
    hints, loader = _hints(ItemsDataset(issue_items), **FORK)
    (hint,) = hints
    assert hint.startswith("dataset.items: list of 2,000,000 tuples, ~")
    assert "copied into each of 2 workers as they read it" in hint
    row = loader.plan["copy_on_read"]
    assert row.value.endswith("MiB per worker") and "dataset.items" in row.reason


def test_the_hint_changes_no_setting(issue_items) -> None:
    _, flagged = _hints(ItemsDataset(issue_items), **FORK)
    _, clean = _hints(ItemsDataset(issue_items[:10]), **FORK)
    for name in ("num_workers", "batch_size", "persistent_workers", "prefetch_factor"):
        assert getattr(flagged, name) == getattr(clean, name)
    same = {k: v.value for k, v in flagged.plan.items() if k != "copy_on_read"}
    assert same == {k: v.value for k, v in clean.plan.items() if k != "copy_on_read"}


def test_nothing_found_is_said_and_no_workers_means_no_row() -> None:
    hints, loader = _hints(TensorDataset(torch.zeros(1_000_000, 4)), **FORK)
    assert hints == [] and loader.plan["copy_on_read"].value == "none found"
    hints, loader = _hints(ItemsDataset(trial_items(200_000)), batch_size=8, num_workers=0)
    assert hints == [] and "copy_on_read" not in loader.plan and "gc_freeze" not in loader.plan


def test_small_containers_and_the_remedy_do_not_fire() -> None:
    hints, _ = _hints(ItemsDataset(trial_items(50_000)), **FORK)  # ~9 MiB
    assert hints == []
    hints, loader = _hints(ItemsDataset(SharedSequence(trial_items(300_000))), **FORK)
    assert hints == [] and loader.plan["copy_on_read"].value == "none found"


def test_subset_indices_in_a_list_are_found() -> None:
    subset = Subset(TensorDataset(torch.zeros(1_000_000)), list(range(1_000_000)))
    (hint,) = _hints(subset, **FORK)[0]
    assert hint.startswith("dataset.indices: list of 1,000,000 ints")


@pytest.mark.parametrize("method", tiered(["spawn", "forkserver"], {"spawn"}))
def test_spawned_loaders_get_a_row_but_no_copy_on_read_hint(method: str) -> None:
    hints, loader = _hints(
        ItemsDataset(trial_items(200_000)), num_workers=2, multiprocessing_context=method
    )
    assert hints == []
    row = loader.plan["copy_on_read"]
    assert row.value == "not applicable" and "dataset.items" in row.reason


def test_a_failing_survey_is_only_a_row(monkeypatch) -> None:
    def broken(dataset: Any) -> None:
        raise RuntimeError("odd object")

    monkeypatch.setattr(planning, "survey_containers", broken)
    hints, loader = _hints(ItemsDataset([1, 2, 3]), **FORK)
    assert hints == []
    assert loader.plan["copy_on_read"].value == "unknown"
    assert "RuntimeError: odd object" in loader.plan["copy_on_read"].reason


# fast: fork (frozen) and spawn (nothing inherited); forkserver freezes as fork does (slow tier)
@pytest.mark.parametrize(
    ("method", "frozen"),
    tiered(
        [("fork", True), ("forkserver", True), ("spawn", False)], {("fork", True), ("spawn", False)}
    ),
)
def test_workers_freeze_what_they_inherit(method: str, frozen: bool) -> None:
    with create_dataloader(
        FreezeCount(), batch_size=None, num_workers=2, multiprocessing_context=method
    ) as loader:
        counts = list(loader)
    assert loader.plan["gc_freeze"].value is frozen
    assert all(count > 1000 for count in counts) if frozen else counts == [0, 0]
    assert gc.get_freeze_count() == 0  # this process is left alone


def test_torch_loaders_are_left_alone() -> None:
    loader = DataLoader(
        FreezeCount(), batch_size=None, num_workers=1, multiprocessing_context="fork"
    )
    assert list(loader) == [0, 0]


def test_doctor_explains_copy_on_read_for_fork(make_platform) -> None:
    from loaderkit.cli.doctor import run_checks

    checks = {c.name: c for c in run_checks(make_platform(start_method="fork"))}
    assert "copy-on-read" in checks["start method"].advice
    assert "SharedSequence" in checks["start method"].advice
