"""Subclasses of ``HDF5SessionDataset`` as users write them, and the checks every pattern runs.

Each class overrides one hook and calls the base through ``super()``: the base
method must then behave exactly as when it is not overridden, so a pass-through override
reads what the corpus oracle (``tests/hdf5/corpus.py``) says, per item, batched and in
loaders. Module level, so spawned workers can import them.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import pytest

from loaderkit import HDF5SessionDataset, create_dataloader
from loaderkit.hdf5 import SampleIndex
from tests.hdf5.corpus import SPECS, Case, assert_same, expected_batch, expected_samples
from tests.hdf5.helpers import load, shuffled_with_repeats

#: Cases read through loaders (every kind and layout the corpus has, a few of each);
#: per item and batched reads cover every readable case. Per-sample reads are collated by
#: torch's ``default_collate``, which refuses numpy ``uint64`` scalars (a compound field of
#: ``u8``): such tables are left out here, as they would fail under torch's DataLoader too.
LOADER_CASES = [
    "num_f4_le_contig",
    "num_i2_be_gzip",
    "num_f8_be_1d_contig",
    "num_bool_gzip",
    "num_f8_be_gzip_2sessions",
    "compound_subarray_gzip",
    "compound_mixed_contig",
    "compound_nested_contig",
    "tables_table_be",
    "pandas_table",
    "str_vlen_utf8",
    "keys_mapping",
    "keys_with_strings",
    "axis_last_chunked",
    "group_patches",
]
#: Cases read by spawned workers (the subclass is pickled into fresh interpreters).
SPAWN_CASES = ["num_i2_be_gzip", "keys_with_strings"]
BATCH = 4


class SuperRead(HDF5SessionDataset):
    """``read`` overridden, calling the base first (the commonest override)."""

    def read(self, session: Hashable, row: int) -> Any:
        return super().read(session, row)


class ScaledRead(HDF5SessionDataset):
    """The override the issue quotes: the base ``read``, then a conversion (NSD betas)."""

    def read(self, session: Hashable, row: int) -> Any:
        return super().read(session, row).astype("float32") / 300


class SuperReadRows(HDF5SessionDataset):
    """``read_rows`` overridden (batched-read opt-in), calling the base."""

    def read_rows(self, session: Hashable, start: int, stop: int) -> Sequence[Any]:
        return list(super().read_rows(session, start, stop))


class SuperReadAndReadRows(HDF5SessionDataset):
    """Both ``read`` and ``read_rows`` overridden, each calling the base."""

    def read(self, session: Hashable, row: int) -> Any:
        return super().read(session, row)

    def read_rows(self, session: Hashable, start: int, stop: int) -> Sequence[Any]:
        return super().read_rows(session, start, stop)


class SuperGetItem(HDF5SessionDataset):
    """``__getitem__`` overridden, calling the base."""

    def __getitem__(self, index: int) -> Any:
        return super().__getitem__(index)


class SuperGetItems(HDF5SessionDataset):
    """``__getitems__`` overridden, calling the base and passing its batch on."""

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        return super().__getitems__(indices)


class RebuiltGetItems(HDF5SessionDataset):
    """``__getitems__`` overridden, calling the base and returning a plain list of its samples."""

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        return [sample for sample in super().__getitems__(indices)]


class SuperTransform(HDF5SessionDataset):
    """``transform`` overridden, calling the base."""

    def transform(self, sample: Any, index: int) -> Any:
        return super().transform(sample, index)


class SuperBuildIndex(HDF5SessionDataset):
    """``build_index`` overridden, returning the base's index unchanged."""

    def build_index(self) -> Any:
        return super().build_index()


class EveryOtherRow(HDF5SessionDataset):
    """``build_index`` overridden, keeping every other sample of the base's index."""

    def build_index(self) -> Any:
        index = super().build_index()
        return SampleIndex(index.sessions[::2], index.rows[::2])


class RawBytesRead(HDF5SessionDataset):
    """Converts rows torch cannot hold itself (never calls the base ``read``)."""

    def read(self, session: Hashable, row: int) -> Any:
        value = self.h5dataset(session)[row]
        return np.frombuffer(np.ascontiguousarray(value).tobytes(), np.uint8).copy()


class WithStimIds(HDF5SessionDataset):
    """Reads its label from a second dataset of the file (NSD: betas plus trial ids)."""

    def read(self, session: Hashable, row: int) -> Any:
        return {
            "betas": super().read(session, row),
            "stim": self.h5dataset(session, "stim_ids")[row],
        }


def open_as(cls: type[HDF5SessionDataset], case: Case, **kwargs: Any) -> HDF5SessionDataset:
    """``cls`` over ``case``'s files, with the case's key and options."""
    return cls(case.files, key=case.key, **case.options, **kwargs)


def check_reads(ds: HDF5SessionDataset, want: Sequence[Any]) -> None:
    """``ds`` gives ``want`` per item and through ``__getitems__`` (shuffled, with repeats)."""
    assert len(ds) == len(want)
    for i, expected in enumerate(want):
        assert_same(ds[i], expected, f"ds[{i}]")
    order = shuffled_with_repeats(len(want))
    got = ds.__getitems__(order)
    assert len(got) == len(order)
    for i, sample in zip(order, got, strict=True):
        assert_same(sample, want[i], f"__getitems__(...) sample {i}")


def check_loader(ds: HDF5SessionDataset, want: Sequence[Any], **loader_args: Any) -> None:
    """A loader over ``ds`` gives ``default_collate`` of ``want``, batch by batch."""
    batches = load(create_dataloader(ds, batch_size=BATCH, **loader_args))
    assert len(batches) == -(-len(want) // BATCH)
    for b, batch in enumerate(batches):
        assert_same(batch, expected_batch(want[b * BATCH : (b + 1) * BATCH]), f"batch {b}")


#: The loader cells of the fast tier, one per distinct read path in workers (the other cases'
#: ``w2`` cells read the same way and run in the slow tier; every case's ``w0`` cell stays fast,
#: and per item and batched reads of every case are fast in each pattern module).
FAST_WORKER_CASES = {
    "num_i2_be_gzip": "numbers read straight into one batch tensor (chunked, byte-swapped)",
    "compound_nested_contig": "compound rows as nested dicts, collated per sample",
    "str_vlen_utf8": "variable-length strings, collated as lists",
    "keys_mapping": "several keys per sample, rows aligned",
}


def loader_params(*, spawn_fast: bool = False) -> list[Any]:
    """``(case, workers, context)`` for the loader tests of a pattern module.

    Cells whose path a fast cell already takes are marked ``slow`` (see ``FAST_WORKER_CASES``).
    ``spawn_fast``: one spawn cell is fast (the subclass pickled by reference into a fresh
    interpreter: the same for every hook, so only ``test_subclass_read.py`` asks for it).
    """
    params = [
        pytest.param(
            name,
            workers,
            None,
            id=f"{name}-w{workers}",
            marks=() if workers == 0 or name in FAST_WORKER_CASES else (pytest.mark.slow,),
        )
        for name in LOADER_CASES
        for workers in (0, 2)
    ]
    params += [
        pytest.param(
            name,
            2,
            "spawn",
            id=f"{name}-spawn",
            marks=() if spawn_fast and name == SPAWN_CASES[-1] else (pytest.mark.slow,),
        )
        for name in SPAWN_CASES
    ]
    return params


def readable(*exclude: str) -> list[str]:
    """Every readable corpus case, but those of the kinds in ``exclude``."""
    from tests.hdf5.corpus import READABLE

    return [n for n, s in SPECS.items() if s.kind in READABLE and s.kind not in exclude]


__all__ = [
    "BATCH",
    "LOADER_CASES",
    "SPAWN_CASES",
    "EveryOtherRow",
    "RawBytesRead",
    "RebuiltGetItems",
    "ScaledRead",
    "SuperBuildIndex",
    "SuperGetItem",
    "SuperGetItems",
    "SuperRead",
    "SuperReadAndReadRows",
    "SuperReadRows",
    "SuperTransform",
    "check_loader",
    "check_reads",
    "expected_samples",
    "loader_params",
    "open_as",
    "readable",
]
