"""Importable datasets for the copy-on-read tests (spawned workers import them by name)."""

from __future__ import annotations

import gc
import os
from collections.abc import Sequence
from typing import Any

import psutil
from torch.utils.data import Dataset


def trial_items(n: int) -> list[tuple[str, int, float]]:
    """The issue's items: ``(str, int, float)`` tuples, every object distinct."""
    return [(f"trial_{i:07d}.npy", i + 1000, i * 0.5) for i in range(n)]


class ItemsDataset(Dataset):
    """A dataset keeping its items in ``self.items`` (a list, or a ``SharedSequence``)."""

    def __init__(self, items: Sequence[Any]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> Any:
        return self.items[index]


def uss() -> int:
    """Unique set size of this process in bytes (pages no other process shares)."""
    return int(psutil.Process().memory_full_info().uss)


class ReadEverything(Dataset):
    """One sample: how much this process's USS grew while it read every item of ``items``.

    The worker freezes the garbage collector first, so that only reading is measured (a
    collection would copy pages of every inherited container, whatever the items).
    """

    def __init__(self, items: Sequence[Any]) -> None:
        self.items = items

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> dict[str, int]:
        gc.freeze()
        before = uss()
        count = 0
        for item in self.items:  # every object of every item, as a collate function reads them
            for _part in item if isinstance(item, tuple) else (item,):
                count += 1
        return {"growth": uss() - before, "count": count, "pid": os.getpid()}


class FreezeCount(Dataset):
    """Each sample: how many objects the garbage collector of the producing process froze."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> int:
        return gc.get_freeze_count()
