"""Files written by h5py, PyTables and pandas, read as h5py reads them, or refused.

Every readable case of ``tests/hdf5/corpus.py`` is read per item, with ``__getitems__`` (shuffled,
with repeats), through a memory map, and through ``create_dataloader`` with 0 and 2 workers, and
compared with the oracle computed from h5py (``corpus.expected_samples``): native byte order,
dicts for compound rows and several keys, ``str`` for strings, 1-D tensors for ragged rows.
Types with no torch equivalent are refused at construction (``ConfigError``), filters that are
not available are named at construction (``HDF5FileError``), and a damaged Fletcher-32 chunk is
an ``HDF5FileError`` that says so.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import loaderkit
from loaderkit import (
    ConfigError,
    HDF5FileError,
    HDF5SessionDataset,
    LoaderkitError,
    create_dataloader,
)
from tests.conftest import fake_platform
from tests.hdf5 import corpus
from tests.hdf5.corpus import (
    SPECS,
    Case,
    assert_same,
    case_names,
    expected_batch,
    expected_samples,
)
from tests.hdf5.helpers import load, shuffled_with_repeats
from tests.helpers import tiered

# A layout loaderkit would advise against is still a file it must read correctly.
pytestmark = pytest.mark.filterwarnings("ignore::loaderkit.errors.PerformanceHint")

READABLE = case_names(*corpus.READABLE)
BATCHABLE = [n for n in READABLE if SPECS[n].kind != "ragged"]
RAGGED = case_names("ragged")
REFUSED = case_names("refuse")
NO_PLUGIN = case_names("missing_plugin")
BATCH = 4
#: Start-method "spawn" (the dataset is pickled into fresh interpreters).
SPAWN_CASES = ["num_f8_be_gzip_2sessions", "tables_table_be", "keys_with_strings"]
#: Words that guess at a cause ("was the file modified, truncated or deleted?"): allowed only
#: when the file really changed after it was opened, which never happens here.
GUESSES = ("truncated", "modified", "deleted")


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Case]:
    return corpus.write_corpus(tmp_path_factory.mktemp("corpus"))


def open_dataset(case: Case, **kwargs: Any) -> HDF5SessionDataset:
    return HDF5SessionDataset(case.files, key=case.key, **case.options, **kwargs)


def scrub(message: str, case: Case) -> str:
    """``message`` without the case's file paths and names (they spell the case's name, which
    holds the very words the tests look for: "ragged", "lzo", "checksum", ...)."""
    for path in case.files.values():
        message = message.replace(path, "<path>").replace(Path(path).name, "<file>")
    return message


def test_the_corpus_lists_every_kind_of_case() -> None:
    kinds = {s.kind for s in SPECS.values()}
    assert kinds == corpus.KINDS
    assert len(READABLE) >= 100 and len(RAGGED) >= 5 and len(REFUSED) >= 5


def test_the_oracle_gives_back_the_values_written(cases: dict[str, Case]) -> None:
    """The oracle, from h5py, equals the values each writer put in (where it recorded them)."""
    checked = 0
    for case in cases.values():
        if case.truth is None or not case.readable:
            continue
        assert_same(expected_samples(case), case.truth, case.name)
        checked += 1
    assert checked >= 100


# ------------------------------------------------------------------------ per item, batch


@pytest.mark.parametrize("memory_map", [False, True], ids=["pread", "mmap"])
@pytest.mark.parametrize("name", READABLE)
def test_rows_equal_h5py(cases: dict[str, Case], name: str, memory_map: bool) -> None:
    case = cases[name]
    want = expected_samples(case)
    ds = open_dataset(case, memory_map=memory_map)
    try:
        assert len(ds) == len(want)
        for i, expected in enumerate(want):
            assert_same(ds[i], expected, f"ds[{i}]")
        order = shuffled_with_repeats(len(want))
        got = ds.__getitems__(order)
        assert len(got) == len(order)
        for i, sample in zip(order, got, strict=True):
            assert_same(sample, want[i], f"__getitems__(...) sample {i}")
    finally:
        ds.close()


def assert_loader_reads_the_oracle(case: Case, **loader_args: Any) -> Any:
    """A loader over ``case`` gives ``default_collate`` of h5py's rows, batch by batch."""
    want = expected_samples(case)
    ds = open_dataset(case)
    try:
        loader = create_dataloader(ds, batch_size=BATCH, **loader_args)
        batches = load(loader)
    finally:
        ds.close()
    assert len(batches) == -(-len(want) // BATCH)
    for b, batch in enumerate(batches):
        assert_same(batch, expected_batch(want[b * BATCH : (b + 1) * BATCH]), f"batch {b}")
    return loader


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("name", BATCHABLE)
def test_loader_batches_equal_default_collate_of_h5py_rows(
    cases: dict[str, Case], name: str, workers: int
) -> None:
    assert_loader_reads_the_oracle(cases[name], num_workers=workers)


@pytest.mark.parametrize("name", case_names("compound"))
def test_records_cross_torchs_shared_memory_path_too(cases: dict[str, Case], name: str) -> None:
    """Without the slot pool (not Linux), compound batches are torch shared-storage views."""
    darwin = fake_platform(os_name="Darwin")  # no memfd: batches take torch's path
    loader = assert_loader_reads_the_oracle(cases[name], num_workers=2, platform=darwin)
    assert loader.plan["handoff"].value == "torch"


# slow tier: the dataset pickled by path into spawned workers is fast in
# tests/hdf5/dataset/test_workers.py; these cases read there as forked workers do
@pytest.mark.parametrize("name", tiered(SPAWN_CASES, set()))
def test_spawned_workers_read_the_same(cases: dict[str, Case], name: str) -> None:
    assert_loader_reads_the_oracle(cases[name], num_workers=2, multiprocessing_context="spawn")


# ---------------------------------------------------------------------------------- ragged


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("name", RAGGED)
def test_ragged_rows_with_the_default_collate_say_so(
    cases: dict[str, Case], name: str, workers: int
) -> None:
    case = cases[name]
    ds = open_dataset(case)
    try:
        with pytest.raises(LoaderkitError) as info:
            load(create_dataloader(ds, batch_size=BATCH, num_workers=workers))
    finally:
        ds.close()
    message = scrub(str(info.value), case)
    assert "ragged" in message.lower(), message
    assert case.key in message, message


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("name", RAGGED)
def test_pad_collate_pads_ragged_rows_and_gives_their_lengths(
    cases: dict[str, Case], name: str, workers: int
) -> None:
    case = cases[name]
    want = expected_samples(case)
    pad_collate = loaderkit.pad_collate  # the collate loaderkit ships for ragged rows
    padded_type = loaderkit.Padded
    ds = open_dataset(case)
    try:
        batches = load(
            create_dataloader(ds, batch_size=BATCH, num_workers=workers, collate_fn=pad_collate)
        )
    finally:
        ds.close()
    assert len(batches) == -(-len(want) // BATCH)
    for b, batch in enumerate(batches):
        rows = want[b * BATCH : (b + 1) * BATCH]
        lengths = torch.tensor([len(r) for r in rows], dtype=torch.int64)
        values = torch.zeros((len(rows), int(lengths.max())), dtype=rows[0].dtype)
        for k, row in enumerate(rows):
            values[k, : len(row)] = row
        assert isinstance(batch, padded_type), type(batch)
        assert_same(batch.values, values, f"batch {b} values")
        assert_same(batch.lengths, lengths, f"batch {b} lengths")


# -------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("name", REFUSED)
def test_types_without_a_torch_dtype_are_refused_at_construction(
    cases: dict[str, Case], name: str
) -> None:
    case = cases[name]
    with pytest.raises(ConfigError) as info:
        open_dataset(case)
    message = scrub(str(info.value), case)
    assert case.key in message, message
    assert any(word in message.lower() for word in case.match), (case.match, message)


def test_keys_whose_row_counts_differ_are_refused_at_construction(
    cases: dict[str, Case],
) -> None:
    case = cases["keys_bad_rows"]
    with pytest.raises(ConfigError) as info:
        open_dataset(case)
    message = scrub(str(info.value), case)
    for word in case.match:  # the session and both counts
        assert word in message, (word, message)


# --------------------------------------------------------------------------------- filters


def check_filter_message(case: Case, message: str) -> None:
    (session,) = case.files
    assert session in message, message
    assert case.path.name in message, message
    name, filter_id = case.match
    message = scrub(message, case)
    assert name in message.lower(), message
    assert str(filter_id) in message, message
    assert not any(word in message.lower() for word in GUESSES), message


def test_a_filter_nobody_ships_is_named_at_construction(cases: dict[str, Case]) -> None:
    """LZO (305): no plugin in this process (hdf5plugin does not ship one)."""
    case = cases["missing_lzo"]
    with pytest.raises(HDF5FileError) as info:
        open_dataset(case)
    message = str(info.value)
    check_filter_message(case, message)
    assert "pip install hdf5plugin" not in message, message


@pytest.fixture(scope="module")
def without_plugins(cases: dict[str, Case]) -> dict[str, Any]:
    """Construct the filter cases (and a gzip control) in a process without hdf5plugin."""
    control = cases["num_f4_le_gzip"]
    return corpus.construct_without_plugins([control] + [cases[n] for n in NO_PLUGIN])


def test_without_plugins_builtin_filters_still_read(without_plugins: dict[str, Any]) -> None:
    assert without_plugins["hdf5plugin"] is False
    assert not any(without_plugins["avail"].values()), without_plugins["avail"]
    control = without_plugins["num_f4_le_gzip"]
    assert control["raised"] is None and "read_raised" not in control, control


@pytest.mark.parametrize("name", NO_PLUGIN)
def test_a_missing_plugin_filter_is_named_at_construction(
    cases: dict[str, Case], without_plugins: dict[str, Any], name: str
) -> None:
    case = cases[name]
    result = without_plugins[name]
    assert result["raised"] is not None, f"constructed without the filter: {result}"
    assert "HDF5FileError" in result["mro"], result
    message = result["message"]
    check_filter_message(case, message)
    assert "pip install hdf5plugin" in message, message


@pytest.mark.parametrize("name", NO_PLUGIN)
def test_plugin_filters_read_where_hdf5plugin_is_installed(
    cases: dict[str, Case], name: str
) -> None:
    case = cases[name]
    ds = open_dataset(case)
    try:
        got = ds.__getitems__(list(range(len(ds))))
        assert_same([ds[i] for i in range(len(ds))], case.truth, "per item")
        assert_same(list(got), case.truth, "batch")
    finally:
        ds.close()


# -------------------------------------------------------------------------------- checksum


def rows_named(message: str) -> set[int]:
    """Row numbers a (scrubbed) message names after "row"/"rows": "row 5", "rows 4..7",
    "rows 4-7", "rows 4 to 7"."""
    rows: set[int] = set()
    for match in re.finditer(r"rows?\b\D{0,4}(\d+)(?:\s*(?:-|\.\.|to|:)\s*(\d+))?", message):
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) else first
        rows.update(range(first, last + 1))
    return rows


READS: dict[str, Callable[[HDF5SessionDataset], Any]] = {
    "item": lambda ds: ds[5],
    "getitems": lambda ds: ds.__getitems__([0, 5, 9]),
    "loader": lambda ds: load(create_dataloader(ds, batch_size=BATCH, num_workers=0)),
}


@pytest.mark.parametrize("read", list(READS))
def test_a_fletcher32_failure_names_the_checksum_session_and_rows(
    cases: dict[str, Case], read: str
) -> None:
    case = cases["checksum_damaged"]
    ds = open_dataset(case)  # nothing is read at construction: the damage shows at the read
    try:
        assert_same(ds[0], case.truth[0], "an undamaged chunk")
        with pytest.raises(HDF5FileError) as info:
            READS[read](ds)
    finally:
        ds.close()
    message = scrub(str(info.value), case)
    assert "checksum" in message.lower(), message
    assert "sess_kappa" in message, message
    assert rows_named(message) & set(case.extra["damaged_rows"]), message
    assert not any(word in message.lower() for word in GUESSES), message


def test_the_damaged_chunk_is_really_damaged(cases: dict[str, Case]) -> None:
    import h5py

    case = cases["checksum_damaged"]
    with h5py.File(case.path, "r") as f:
        np.testing.assert_array_equal(f["betas"][8:12], np.stack(case.truth[8:12]))
        with pytest.raises(OSError):
            f["betas"][4]
