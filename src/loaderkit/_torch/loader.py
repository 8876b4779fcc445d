"""torch's DataLoader as loaderkit subclasses it: the base class, its private members, views.

Checked on torch 2.4.1, 2.6.0, 2.9.1, 2.12.0, 2.13.0, 2.14.1 and 2.15.0.

* ``TorchLoader``: torch's ``DataLoader`` with the two private members loaderkit replaces
  turned into loaderkit hooks. torch asks ``_get_iterator()`` for each new pass's iterator: it
  calls ``self._loaderkit_iterator()`` (default: torch's own). torch's iterators draw indices
  from ``_index_sampler``: it is ``self._loaderkit_index_sampler(<torch's>)`` (default: torch's).
  Generic in the sample type as torch's class is, however many type parameters torch declares.
  torch calls ``check_worker_number_rationality()`` at the end of ``__init__`` and before each
  pass with workers: it calls ``self._loaderkit_check_workers()`` (default: torch's own). Run
  on 2.13.0 and read in torch's main branch (2.4.1 not re-read for this member).
* ``torch_iterator`` / ``torch_index_sampler`` / ``torch_check_workers``: torch's own answers,
  for a fallback, for the wrapped index sampler, and torch's advice on ``num_workers`` (its
  "This DataLoader will create N worker processes" warning).
* ``kept_iterator`` / ``forget_kept_iterator``: the iterator torch keeps between passes when
  workers are persistent (``DataLoader._iterator``).
* ``LoaderView``: what torch's iterator reads of a loader, with some attributes replaced (the
  dataset, the index sampler, the multiprocessing context, the collate function).
* ``loader_parameters``: the arguments this torch's ``DataLoader.__init__`` accepts;
  ``ARGUMENTS_SINCE``: the torch release that added each argument loaderkit may pass.

Examples:
    >>> "batch_size" in loader_parameters()
    True
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import torch
import torch.utils.data

__all__ = [
    "ARGUMENTS_SINCE",
    "LoaderView",
    "TorchLoader",
    "forget_kept_iterator",
    "index_sampler",
    "kept_iterator",
    "loader_hooks_probe",
    "loader_parameters",
    "torch_check_workers",
    "torch_index_sampler",
    "torch_iterator",
]

_T_co = TypeVar("_T_co", covariant=True)

#: ``DataLoader`` arguments younger than the oldest supported torch, with the release (major,
#: minor) that added them and the value that means "torch's behaviour" (what leaving it unset
#: gives): an older torch is never handed one, and a value other than that is refused there.
ARGUMENTS_SINCE: dict[str, tuple[tuple[int, int], Any]] = {"in_order": ((2, 6), True)}


@functools.lru_cache(maxsize=1)
def loader_parameters() -> frozenset[str]:
    """The keyword arguments this torch's ``DataLoader.__init__`` accepts (but ``self``)."""
    signature = inspect.signature(torch.utils.data.DataLoader.__init__)
    return frozenset(name for name in signature.parameters if name != "self")


_TorchDataLoader: Any = torch.utils.data.DataLoader

if TYPE_CHECKING:

    class _Base(torch.utils.data.DataLoader[_T_co]):
        pass

else:

    class _Base(_TorchDataLoader, Generic[_T_co]):
        """torch's DataLoader, generic in the sample type whatever torch's own parameters."""


class TorchLoader(_Base[_T_co]):
    """torch's DataLoader whose iterator and index sampler loaderkit provides."""

    def _get_iterator(self) -> Any:
        return self._loaderkit_iterator()

    def _loaderkit_iterator(self) -> Any:
        """The iterator of a new pass (default: torch's own)."""
        return torch_iterator(self)

    @property
    def _index_sampler(self) -> Any:
        return self._loaderkit_index_sampler(torch_index_sampler(self))

    def _loaderkit_index_sampler(self, base: Any) -> Any:
        """What torch's iterators draw indices from, given torch's own (default: it)."""
        return base

    def check_worker_number_rationality(self) -> None:
        self._loaderkit_check_workers()

    def _loaderkit_check_workers(self) -> None:
        """Advice on ``num_workers`` (from torch's ``__init__`` too; default: torch's own)."""
        torch_check_workers(self)


def torch_check_workers(loader: Any) -> None:
    """Run torch's own check of ``loader.num_workers``: it warns above the CPUs torch counts."""
    check = getattr(_TorchDataLoader, "check_worker_number_rationality", None)
    if check is not None:
        check(loader)


def torch_iterator(loader: Any) -> Any:
    """The iterator torch's own ``DataLoader`` would make for ``loader``'s next pass."""
    return _TorchDataLoader._get_iterator(loader)


def index_sampler(loader: Any) -> Any:
    """What torch's iterators of ``loader`` draw indices from (``TorchLoader``: loaderkit's)."""
    return loader._index_sampler


def torch_index_sampler(loader: Any) -> Any:
    """Torch's index sampler of ``loader``: its batch sampler, or its sampler without batching."""
    return _TorchDataLoader._index_sampler.fget(loader)


def kept_iterator(loader: Any) -> Any:
    """The iterator torch keeps between passes (persistent workers), or ``None``."""
    return loader.__dict__.get("_iterator")


def forget_kept_iterator(loader: Any) -> None:
    """Make torch create a new iterator for the next pass (after loaderkit shut the old down)."""
    loader._iterator = None


class LoaderView:
    """What torch's iterator sees of a loader: the loader, with some attributes replaced.

    torch's iterators read a loader's attributes once, when they are created (the dataset,
    ``collate_fn``, the multiprocessing context, the index sampler, ...). A view passes every
    read through to the loader but those it overrides.

    Args:
        loader: The loader.
        dataset: Replaces ``loader.dataset`` (``None``: kept).
        index_sampler: Replaces what torch's iterator draws indices from.
        multiprocessing_context: Replaces the context torch starts workers and makes queues with.
        collate_fn: Replaces ``loader.collate_fn``.

    Examples:
        >>> loader = torch.utils.data.DataLoader([1, 2, 3])
        >>> LoaderView(loader, dataset=[4, 5]).dataset, LoaderView(loader).batch_size
        ([4, 5], 1)
    """

    def __init__(
        self,
        loader: Any,
        *,
        dataset: Any = None,
        index_sampler: Any = None,
        multiprocessing_context: Any = None,
        collate_fn: Any = None,
    ) -> None:
        self._loader = loader
        if dataset is not None:
            self.dataset = dataset
        if index_sampler is not None:
            self._index_sampler = index_sampler
        if multiprocessing_context is not None:
            self.multiprocessing_context = multiprocessing_context
        if collate_fn is not None:
            self.collate_fn = collate_fn

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    @property
    def loader(self) -> Any:
        """The loader seen through this view."""
        return self._loader

    @property
    def index_sampler(self) -> Any:
        """What torch's iterator will draw indices from through this view."""
        return self._index_sampler


def loader_hooks_probe() -> str | None:
    """``None`` when torch's DataLoader still has the members ``TorchLoader`` replaces."""
    missing = [
        name
        for name in ("_get_iterator", "_index_sampler", "__iter__")
        if not hasattr(_TorchDataLoader, name)
    ]
    if missing:
        return f"torch's DataLoader has no {', '.join(missing)}"
    if not isinstance(inspect.getattr_static(_TorchDataLoader, "_index_sampler"), property):
        return "torch's DataLoader._index_sampler is no longer a property"
    try:
        source = inspect.getsource(_TorchDataLoader.__iter__)
    except (OSError, TypeError) as exc:
        return f"torch's DataLoader.__iter__ cannot be read ({exc})"
    for needed in ("self._get_iterator()", "self._iterator"):
        if needed not in source:
            return f"torch's DataLoader.__iter__ no longer uses {needed}"
    return None
