"""torch's seed conventions: the draw a new iterator makes, and how worker seeds are derived.

Checked on torch 2.4.1, 2.6.0, 2.9.1, 2.12.0, 2.13.0, 2.14.1 and 2.15.0.

* A new DataLoader iterator draws the workers' *base seed* from the loader's ``generator`` (or
  torch's global one) before its sampler draws anything: one ``int64`` ``random_``
  (``_BaseDataLoaderIter.__init__``); a persistent iterator reused for the next pass draws
  nothing. loaderkit replays that draw (``consume_base_seed_draw``) to know where a pass's order
  starts, so a pass has the same order with and without persistent workers, and a resumed pass
  the same order as the one it continues.
* Worker ``i`` is seeded with ``base_seed + i`` (``_utils.worker._worker_loop``), so
  ``get_worker_info().seed - id`` is the pass's base seed (``worker_base_seed``).
* ``RandomSampler`` without a generator draws its seed from torch's global generator as one
  ``int64`` ``random_``; ``draw_seed`` draws the same way.

``base_seed_probe`` and ``worker_seed_probe`` check the first two; where one fails, loaderkit
stops relying on it (``loaderkit._torch.probes``).

Examples:
    >>> g = torch.Generator(); _ = g.manual_seed(0)
    >>> consume_base_seed_draw(g); g.get_state().equal(torch.Generator().manual_seed(0).get_state())
    False
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, cast

import torch
import torch.utils.data

__all__ = [
    "base_seed_probe",
    "consume_base_seed_draw",
    "draw_seed",
    "seeds_workers_base_plus_id",
    "worker_base_seed",
    "worker_seed_probe",
]


def consume_base_seed_draw(generator: torch.Generator | None) -> None:
    """Advance ``generator`` (torch's global one for ``None``) as a new iterator does."""
    torch.empty((), dtype=torch.int64).random_(generator=generator)


def draw_seed(generator: torch.Generator | None = None) -> int:
    """A 64-bit seed drawn as ``RandomSampler`` draws its own (torch's global RNG for ``None``).

    Examples:
        >>> _ = torch.manual_seed(0); a = draw_seed(); _ = torch.manual_seed(0)
        >>> draw_seed() == a
        True
    """
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def worker_base_seed(info: Any) -> int:
    """The base seed of the pass a worker belongs to, from its ``get_worker_info()``.

    Where torch no longer seeds worker ``i`` with ``base_seed + i`` (``worker_seed_probe``), the
    worker's own seed is returned: still distinct per worker and repeatable per seed.
    """
    if seeds_workers_base_plus_id():
        return int(info.seed) - int(info.id)
    return int(info.seed)  # pragma: no cover - a torch that seeds workers otherwise


@functools.lru_cache(maxsize=1)
def seeds_workers_base_plus_id() -> bool:
    """Whether this torch seeds worker ``i`` with ``base_seed + i`` (probed once per process).

    ``loaderkit._torch.probes.refresh`` clears it to probe again.
    """
    return worker_seed_probe() is None


def base_seed_probe() -> str | None:
    """``None`` when a new iterator advances its loader's generator by one base-seed draw."""
    generator = torch.Generator()
    generator.manual_seed(12345)
    expected = torch.Generator()
    expected.manual_seed(12345)
    consume_base_seed_draw(expected)
    try:
        iter(torch.utils.data.DataLoader(cast(Any, [0]), generator=generator))
    except Exception as exc:
        return f"creating an iterator failed ({type(exc).__name__}: {exc})"
    if not torch.equal(generator.get_state(), expected.get_state()):
        return "a new iterator no longer draws exactly one base seed from the generator"
    return None


def worker_seed_probe() -> str | None:
    """``None`` when torch's worker loop still seeds worker ``i`` with ``base_seed + i``."""
    try:
        from torch.utils.data._utils import worker

        source = inspect.getsource(worker._worker_loop)
    except Exception as exc:
        return f"torch's worker loop cannot be read ({type(exc).__name__}: {exc})"
    if "base_seed + worker_id" not in source:
        return "torch's worker loop no longer seeds worker i with base_seed + i"
    return None
