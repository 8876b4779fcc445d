"""The resolved loader plan: for each setting, what was asked, what is used, and why.

A ``Plan`` is what ``loader.plan`` returns. It is a read-only mapping from setting name to
``PlanEntry``; ``Plan.describe`` renders it as a table. ``Decision`` is one value with its
reason, the unit every policy (``loaderkit.policy``) and the node cache's limits
(``loaderkit.storage``) answer in. This module imports nothing of torch or of loaderkit, so
any layer may use it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = ["UNSET", "Decision", "Plan", "PlanEntry", "short_repr"]

T = TypeVar("T")


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

    def describe(self) -> str:
        """Render the plan as an aligned text table (one row per setting)."""
        rows = [("setting", "requested", "used", "reason")]
        for entry in self._entries.values():
            rows.append(
                (entry.name, short_repr(entry.requested), short_repr(entry.value), entry.reason)
            )
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        lines = [self.header] if self.header else []
        for row in rows:
            cells = [row[i].ljust(widths[i]) for i in range(3)]
            lines.append("  ".join([*cells, row[3]]).rstrip())
        return "\n".join(lines)
