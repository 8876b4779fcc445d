"""The resolved loader plan: for each setting, what was asked, what is used, and why.

A ``Plan`` is what ``loader.plan`` returns. It is a read-only mapping from setting name to
``PlanEntry``; ``Plan.describe`` renders it as a table. ``Decision`` is one value with its
reason, the unit every policy (``loaderkit.policy``) and the node cache's limits
(``loaderkit.storage``) answer in. This module imports nothing of torch or of loaderkit, so
any layer may use it.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = [
    "TERMS",
    "UNSET",
    "Decision",
    "Plan",
    "PlanEntry",
    "counted",
    "short_repr",
    "wrap_column",
]

T = TypeVar("T")

#: loaderkit's own words in a plan, explained under ``Plan.describe``'s table when they appear
#: (a setting of that name, or the words in a value or reason). torch's own arguments are
#: torch's documentation's.
TERMS: Mapping[str, str] = {
    "worker_method": "workers as processes (torch's) or as threads of this process",
    "batched_reads": "the dataset reads a whole batch in one __getitems__ call",
    "read_path": "how the dataset turns rows into a batch",
    "batch-native": "rows read straight into one batch tensor, collated as is",
    "handoff": "how a batch crosses from a worker process to the training loop",
    "slot pool": "long-lived shared-memory buffers per worker: a batch crosses as a number",
    "main_threads": "torch's intra-op threads in this process while a pass runs",
    "max_open_files": "HDF5 files each process keeps open (least recently used closed)",
    "hdf5_reads": "how rows leave the files: h5py, or os.preadv on the bytes (no HDF5 lock)",
    "held_sessions": "whole sessions read once into memory and served from there",
    "copy_on_read": "Python objects forked workers copy page by page as they read them",
    "gc_freeze": "gc.freeze() in each worker: inherited objects stay shared, not copied",
    "mix": "a batch's file entropy over the corpus's: 1 full shuffle, 0 file order (order_mix)",
    "sample_seeding": "each sample's randomness seeded from (seed, epoch, index)",
}

#: Widest ``requested`` and ``used`` columns: a longer value puts its reason on the next line.
_VALUE_WIDTH = 26
#: Narrowest reason column: with wider setting/requested/used columns, reasons go below.
_REASON_MIN = 40


def counted(number: int, singular: str, plural: str | None = None) -> str:
    """``number`` with its noun, singular for exactly one: ``"1 worker"``, ``"2 workers"``.

    Examples:
        >>> counted(1, "worker"), counted(3, "process", "processes"), counted(0, "file")
        ('1 worker', '3 processes', '0 files')
    """
    return f"{number} {singular if number == 1 else plural or singular + 's'}"


def wrap_column(text: str, width: int, indent: int) -> list[str]:
    """``text`` wrapped to ``width - indent`` columns (a long word broken only if it must be).

    Examples:
        >>> wrap_column("a reason too long for its column", 40, 20)
        ['a reason too long', 'for its column']
    """
    space = max(width - indent, 20)
    return textwrap.wrap(text, space, break_on_hyphens=False) or [""]


class _Unset:
    """Marker for "the user left this setting to loaderkit"."""

    _instance: _Unset | None = None

    def __new__(cls) -> _Unset:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "unset"

    def __reduce__(self) -> str:
        return "UNSET"


#: The ``requested`` value of a setting the user did not give.
UNSET: Any = _Unset()


@dataclass(frozen=True)
class Decision(Generic[T]):
    """A policy's answer: the value to use and a one-line reason.

    Examples:
        >>> Decision(0, "Windows: workers disabled").value
        0
    """

    value: T
    reason: str


def short_repr(value: Any, limit: int = 60) -> str:
    """A one-line description of a setting's value (class name for objects).

    Examples:
        >>> short_repr(4)
        '4'
        >>> short_repr(object()).startswith("<object")
        True
    """
    if value is None or value is UNSET or isinstance(value, (bool, int, float, str)):
        text = repr(value)
    elif callable(value) and hasattr(value, "__qualname__"):
        text = f"{getattr(value, '__module__', '?')}.{value.__qualname__}"
    else:
        text = repr(value)
        if text.startswith("<") and " at 0x" in text:
            text = f"<{type(value).__qualname__}>"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class PlanEntry:
    """One resolved setting.

    Attributes:
        name: The setting, usually a DataLoader argument name.
        requested: What the caller passed (``UNSET`` when left to loaderkit).
        value: What the loader uses.
        reason: One line saying why.

    Examples:
        >>> PlanEntry("num_workers", "auto", 4, "4 usable CPUs").changed
        True
    """

    name: str
    requested: Any
    value: Any
    reason: str

    @property
    def changed(self) -> bool:
        """True when loaderkit used something other than what was requested."""
        if self.requested is UNSET:
            return True
        try:
            return bool(self.requested is not self.value and self.requested != self.value)
        except Exception:  # objects with exotic __eq__ (arrays, tensors)
            return self.requested is not self.value


class Plan(Mapping[str, PlanEntry]):
    """Read-only mapping of setting name to ``PlanEntry``, in resolution order.

    Examples:
        >>> plan = Plan([PlanEntry("shuffle", None, True, "training=True")])
        >>> plan["shuffle"].value
        True
        >>> print(plan.describe().splitlines()[0])
        setting  requested  used  reason
    """

    def __init__(self, entries: Iterable[PlanEntry], header: str = "") -> None:
        self._entries: dict[str, PlanEntry] = {}
        for entry in entries:
            self._entries[entry.name] = entry
        self.header = header

    def __getitem__(self, name: str) -> PlanEntry:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={short_repr(v.value)}" for k, v in self._entries.items())
        return f"Plan({inner})"

    def changes(self) -> list[PlanEntry]:
        """The entries where loaderkit filled in or changed a value."""
        return [entry for entry in self._entries.values() if entry.changed]

    def describe(self, width: int = 100) -> str:
        """The plan as a table (setting, requested, used, reason) ``width`` columns wide.

        Reasons are wrapped in their column (below the row when a value is long); the
        loaderkit terms that appear are explained under the table (``TERMS``).

        Args:
            width: The widest line (100 by default: a terminal split in two still fits it).

        Examples:
            >>> plan = Plan([PlanEntry("gc_freeze", UNSET, True, "forked workers")])
            >>> print(plan.describe())
            setting    requested  used  reason
            gc_freeze  unset      True  forked workers
            <BLANKLINE>
            terms:
              gc_freeze  gc.freeze() in each worker: inherited objects stay shared, not copied
        """
        rows = [("setting", "requested", "used", "reason")]
        for entry in self._entries.values():
            rows.append(
                (entry.name, short_repr(entry.requested), short_repr(entry.value), entry.reason)
            )
        widths = [max(len(row[0]) for row in rows)]
        widths += [min(_VALUE_WIDTH, max(len(row[i]) for row in rows)) for i in (1, 2)]
        start = sum(widths) + 2 * 3
        below = width - start < _REASON_MIN  # reasons on their own lines, indented
        indent = 4 if below else start
        lines = wrap_column(self.header, width, 0) if self.header else []
        for row in rows:
            head = "  ".join(row[i].ljust(widths[i]) for i in range(3)).rstrip()
            reason = wrap_column(row[3], width, indent)
            if below or len(head) > start - 2:  # a long value: its reason starts below
                lines.extend(
                    textwrap.wrap(head, width, subsequent_indent=" " * (widths[0] + 2))
                    if len(head) > width
                    else [head]
                )
                lines.extend(" " * indent + part for part in reason if part)
            else:
                lines.append(head.ljust(start) + reason[0])
                lines.extend(" " * indent + part for part in reason[1:])
        lines.extend(self._legend(width))
        return "\n".join(line.rstrip() for line in lines)

    def _legend(self, width: int) -> list[str]:
        """The ``terms:`` lines for the loaderkit words this plan uses."""
        words = " ".join(
            f"{e.name} {short_repr(e.value)} {e.reason}" for e in self._entries.values()
        )
        used = [
            term
            for term in TERMS
            if term in self._entries or ((" " in term or "-" in term) and term in words)
        ]
        if not used:
            return []
        name_width = max(len(term) for term in used)
        lines = ["", "terms:"]
        for term in used:
            parts = wrap_column(TERMS[term], width, name_width + 4)
            lines.append(f"  {term.ljust(name_width)}  {parts[0]}")
            lines.extend(" " * (name_width + 4) + part for part in parts[1:])
        return lines
