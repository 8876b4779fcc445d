"""Old module paths of loaderkit (before the layout of issue 36) and the finder that keeps them.

Before that layout the package root held every module (``loaderkit.transfer``,
``loaderkit.samplers``, ...). They now live in a folder per stage (``loaderkit.device.transfer``,
``loaderkit.order.samplers``, ...; see ``docs/architecture.md``). ``MOVED`` maps each old path
to its new one, and ``MovedFinder`` (installed by ``loaderkit/__init__.py`` on
``sys.meta_path``) makes ``import loaderkit.transfer`` return the module object of the new
home: ``sys.modules["loaderkit.transfer"] is sys.modules["loaderkit.device.transfer"]``, so
monkeypatching, ``isinstance`` and pickles made under the old names keep working.
``python -m`` with an old path runs the new module (the loader has ``get_code``).
``loaderkit.<old name>`` as an attribute of the package works too (``loaderkit.__getattr__``).

Type checkers do not run this finder: they see the new paths only.

This module imports nothing of loaderkit, so it is safe to import first.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import CodeType, ModuleType

__all__ = ["MOVED", "MovedFinder", "install", "moved_attribute"]

#: Old module path -> new module path.
MOVED: dict[str, str] = {
    "loaderkit.bench": "loaderkit.cli.bench",
    "loaderkit.budgets": "loaderkit.policy.budgets",
    "loaderkit.cli_cache": "loaderkit.cli.cache",
    "loaderkit.collate": "loaderkit.workers.collate",
    "loaderkit.collate_context": "loaderkit.workers.collate_context",
    "loaderkit.containers": "loaderkit.memory.containers",
    "loaderkit.deaths": "loaderkit.workers.deaths",
    "loaderkit.demo": "loaderkit.cli.demo",
    "loaderkit.distributed": "loaderkit.machine.distributed",
    "loaderkit.doctor": "loaderkit.cli.doctor",
    "loaderkit.handoff": "loaderkit.workers.handoff",
    "loaderkit.hooks": "loaderkit.order.hooks",
    "loaderkit.lookahead": "loaderkit.order.lookahead",
    "loaderkit.platform": "loaderkit.machine.platform",
    "loaderkit.prefetch": "loaderkit.device.prefetch",
    "loaderkit.preflight": "loaderkit.memory.preflight",
    "loaderkit.queues": "loaderkit.workers.queues",
    "loaderkit.resources": "loaderkit.memory.resources",
    "loaderkit.resume": "loaderkit.order.resume",
    "loaderkit.sample_seeding": "loaderkit.order.sample_seeding",
    "loaderkit.samplers": "loaderkit.order.samplers",
    "loaderkit.seeding": "loaderkit.order.seeding",
    "loaderkit.sequence": "loaderkit.memory.sequence",
    "loaderkit.teardown": "loaderkit.workers.teardown",
    "loaderkit.threads": "loaderkit.machine.threads",
    "loaderkit.transfer": "loaderkit.device.transfer",
    "loaderkit.versions": "loaderkit.machine.versions",
    "loaderkit.wire": "loaderkit.workers.wire",
    "loaderkit.worker": "loaderkit.workers.worker",
}


class _AliasLoader(importlib.abc.Loader):
    """Loads an old path as the module object of its new home (imported if need be)."""

    def __init__(self, new: str) -> None:
        self.new = new
        self._own_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        # The import system keeps the module's __name__, __loader__ and __file__ (set
        # already) but sets __spec__ to the old path's spec: exec_module puts it back.
        module = importlib.import_module(self.new)
        self._own_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run (the new module ran when it was imported): give back its own spec."""
        module.__spec__ = self._own_spec

    def get_code(self, fullname: str) -> CodeType | None:
        """The new module's code, for ``python -m <old path>`` (runpy asks the loader)."""
        spec = importlib.util.find_spec(self.new)
        loader = spec.loader if spec is not None else None
        get_code = getattr(loader, "get_code", None)
        return get_code(self.new) if get_code is not None else None


class MovedFinder(importlib.abc.MetaPathFinder):
    """Finds the old paths in ``MOVED`` (and nothing else)."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        origin = None
        new_spec = importlib.util.find_spec(new)
        if new_spec is not None:
            origin = new_spec.origin
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(new), origin=origin)


def install() -> None:
    """Put one ``MovedFinder`` first on ``sys.meta_path`` (again: no second one)."""
    if not any(isinstance(finder, MovedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())


def moved_attribute(name: str) -> ModuleType:
    """``loaderkit.<old name>``: the moved module, imported under its old path.

    Raises:
        AttributeError: ``name`` is no old module path.
    """
    old = f"loaderkit.{name}"
    if old not in MOVED:
        raise AttributeError(f"module 'loaderkit' has no attribute {name!r}")
    return importlib.import_module(old)
