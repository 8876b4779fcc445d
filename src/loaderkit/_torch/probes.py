"""What this torch lets loaderkit rely on: one probe per piece, run once per process.

Each ``Probe`` checks what one piece of ``loaderkit._torch`` needs (attributes, signatures,
behaviour) and says what falls back to torch's public path when it fails. ``support()`` runs
them all once (a few milliseconds; cached) and is what the rest of loaderkit asks;
``refresh()`` runs them again (tests that fake a changed torch).

Examples:
    >>> support().ok("slot storage") in (True, False)
    True
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from loaderkit._torch.collate import tensor_rule
from loaderkit._torch.iterators import direct_queues_probe, iterator_probe
from loaderkit._torch.loader import loader_hooks_probe
from loaderkit._torch.seeds import base_seed_probe, worker_seed_probe
from loaderkit._torch.storage import storage_probe
from loaderkit._torch.threadloop import thread_info_probe
from loaderkit._torch.version import TESTED_FROM, TESTED_TO, TORCH_VERSION, version_text

__all__ = ["PIECES", "Probe", "TorchSupport", "refresh", "support"]


@dataclass(frozen=True)
class Probe:
    """The result of probing one piece.

    Attributes:
        piece: The piece's name (``"iterators"``, ``"slot storage"``, ...).
        problem: What failed (``None``: the piece fits this torch).
        fallback: What loaderkit does instead when it failed.
    """

    piece: str
    problem: str | None
    fallback: str

    @property
    def ok(self) -> bool:
        """Whether the piece fits this torch."""
        return self.problem is None


def _tensor_collate_probe() -> str | None:
    if tensor_rule() is None:
        return "torch's default_collate has no rule map for tensors (default_collate_fn_map)"
    return None


#: Every piece: its probe and what falls back when it fails.
PIECES: dict[str, tuple[Callable[[], str | None], str]] = {
    "loader hooks": (
        loader_hooks_probe,
        "torch's own iterators and index sampler: no mid-epoch resume, no slot hand-off",
    ),
    "iterators": (
        iterator_probe,
        "torch's own iterators: no slot hand-off, no direct queues, torch's worker-death and "
        "collate errors as they are (batches are still counted for resume)",
    ),
    "slot storage": (storage_probe, "torch's hand-off (a new shared-memory segment per batch)"),
    "direct queues": (direct_queues_probe, "multiprocessing queues (a feeder thread per message)"),
    "tensor collate": (
        _tensor_collate_probe,
        "batches stacked by torch, then copied into their slot",
    ),
    "base seed draw": (
        base_seed_probe,
        "no replay of the iterator's seed draw: a pass with persistent workers may be ordered "
        "differently from one without, and a resumed pass from the one it continues",
    ),
    "worker seeds": (worker_seed_probe, "each worker's streams derived from its own seed as is"),
    "worker threads": (
        thread_info_probe,
        "worker processes only: worker_method='thread' is refused, 'auto' and the Windows "
        "policy choose processes",
    ),
}


@dataclass(frozen=True)
class TorchSupport:
    """What this process's torch lets loaderkit rely on.

    Attributes:
        version: ``torch.__version__``.
        version_tuple: ``(major, minor, patch)``.
        probes: One ``Probe`` per piece.

    Examples:
        >>> s = support()
        >>> s.tested in (True, False), len(s.probes) == len(PIECES)
        (True, True)
    """

    version: str
    version_tuple: tuple[int, int, int]
    probes: tuple[Probe, ...]

    def ok(self, piece: str) -> bool:
        """Whether ``piece`` fits this torch."""
        return next(p.ok for p in self.probes if p.piece == piece)

    @property
    def failed(self) -> tuple[Probe, ...]:
        """The probes that failed."""
        return tuple(p for p in self.probes if not p.ok)

    @property
    def tested(self) -> bool:
        """Whether this torch is within the releases loaderkit is tested on."""
        return TESTED_FROM <= self.version_tuple[:2] <= TESTED_TO

    def describe(self) -> str:
        """One line: the version, whether it is tested, and each fallback in force."""
        span = f"{TESTED_FROM[0]}.{TESTED_FROM[1]} to {TESTED_TO[0]}.{TESTED_TO[1]}"
        if self.tested:
            tested = "tested"
        elif self.version_tuple[:2] > TESTED_TO:
            tested = f"not yet tested: loaderkit is tested on {span}"
        else:
            tested = f"untested: loaderkit is tested on {span}"
        head = f"torch {self.version} ({tested})"
        passed = ", ".join(p.piece for p in self.probes if p.ok) or "none"
        if not self.failed:
            return f"{head}: every internal loaderkit relies on checked ({passed}: ok)"
        failed = "; ".join(f"{p.piece}: {p.problem} -> {p.fallback}" for p in self.failed)
        return f"{head}; ok: {passed}; {failed}"


def _run(piece: str) -> Probe:
    check, fallback = PIECES[piece]
    try:
        problem = check()
    except Exception as exc:  # a probe never fails loaderkit: its piece is turned off
        problem = f"the probe itself failed ({type(exc).__name__}: {exc})"
    return Probe(piece, problem, fallback)


@functools.lru_cache(maxsize=1)
def support() -> TorchSupport:
    """Probe every piece once (cached for the process)."""
    return TorchSupport(
        version=version_text(),
        version_tuple=TORCH_VERSION,
        probes=tuple(_run(piece) for piece in PIECES),
    )


def refresh() -> TorchSupport:
    """Probe again (after a test changed something torch provides)."""
    support.cache_clear()
    from loaderkit._torch import seeds

    seeds.seeds_workers_base_plus_id.cache_clear()
    return support()
