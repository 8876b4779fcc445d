"""The public surface: __all__ is sorted, complete and documented."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import loaderkit


def _public_names() -> set[str]:
    return {
        name
        for name, obj in vars(loaderkit).items()
        if not name.startswith("_")
        and not inspect.ismodule(obj)
        and getattr(obj, "__module__", "loaderkit").startswith("loaderkit")
    }


def test_all_is_sorted() -> None:
    assert list(loaderkit.__all__) == sorted(loaderkit.__all__)


def test_all_lists_exactly_the_public_names() -> None:
    assert set(loaderkit.__all__) - {"__version__"} == _public_names()


def test_every_public_name_has_a_docstring() -> None:
    for name in loaderkit.__all__:
        if name == "__version__":
            continue
        doc = inspect.getdoc(getattr(loaderkit, name))
        assert doc and len(doc) > 20, f"loaderkit.{name} has no real docstring"


def test_version_matches_metadata() -> None:
    from importlib.metadata import version

    assert loaderkit.__version__ == version("loaderkit")


def test_create_dataloader_documents_every_argument() -> None:
    doc = inspect.getdoc(loaderkit.create_dataloader)
    for name in inspect.signature(loaderkit.create_dataloader).parameters:
        assert f"{name}:" in doc, f"create_dataloader's docstring does not document {name}"
    for policy in ("Windows policy", "pin-memory", "persistent", "picklability"):
        assert policy in doc


def test_signature_matches_torch() -> None:
    import torch.utils.data

    ours = list(inspect.signature(loaderkit.create_dataloader).parameters.values())
    theirs = list(inspect.signature(torch.utils.data.DataLoader.__init__).parameters.values())[1:]
    for mine, torch_param in zip(ours[: len(theirs)], theirs, strict=True):
        assert mine.name == torch_param.name
        assert mine.kind == torch_param.kind
    cls = list(inspect.signature(loaderkit.DataLoader.__init__).parameters)
    assert cls[1:] == [p.name for p in ours]


def test_errors_hierarchy() -> None:
    assert issubclass(loaderkit.ConfigError, loaderkit.LoaderkitError)
    assert issubclass(loaderkit.ConfigError, ValueError)
    assert issubclass(loaderkit.ArgumentTypeError, loaderkit.LoaderkitError)
    assert issubclass(loaderkit.ArgumentTypeError, TypeError)
    assert issubclass(loaderkit.HDF5FileError, OSError)
    assert issubclass(loaderkit.MissingKeyError, KeyError)
    assert issubclass(loaderkit.MissingKeyError, loaderkit.LoaderkitError)
    assert issubclass(loaderkit.StorageError, OSError)
    assert issubclass(loaderkit.StorageAccessError, PermissionError)
    assert issubclass(loaderkit.StorageAccessError, loaderkit.StorageError)
    assert issubclass(loaderkit.LoaderkitWarning, UserWarning)
    assert issubclass(loaderkit.PerformanceHint, loaderkit.LoaderkitWarning)
    classes = [
        obj
        for obj in vars(loaderkit).values()
        if isinstance(obj, type) and issubclass(obj, (BaseException, Warning))
    ]
    assert {cls.__module__ for cls in classes} == {"loaderkit.errors"}  # one module for all


def test_deliberate_argument_errors_are_loaderkit_errors() -> None:
    import pytest

    for seed, kind in ((-1, ValueError), (2**64, ValueError), (1.5, TypeError), (True, TypeError)):
        with pytest.raises(loaderkit.LoaderkitError) as info:
            loaderkit.create_dataloader([1, 2], seed=seed)
        assert isinstance(info.value, kind) and "seed" in str(info.value)


def test_performance_hints_can_be_silenced_alone() -> None:
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.simplefilter("ignore", loaderkit.PerformanceHint)
        loaderkit.errors.warn("slow", loaderkit.PerformanceHint)
        loaderkit.errors.warn("wrong")
    assert [str(w.message) for w in caught] == ["wrong"]


def test_one_mechanism_serves_moved_attributes_and_module_names(monkeypatch) -> None:
    import sys
    import types
    import warnings

    import pytest

    from loaderkit.errors import Moved, MovedAttribute, moved_module_getattr

    class Part:
        def figures(self) -> int:
            return 7

    class Owner:
        part = Part()
        figures = MovedAttribute("part.figures", "0.1.0")

    module = types.ModuleType("loaderkit.fake")
    module.NewName = int  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "loaderkit.fake", module)
    module.__getattr__ = moved_module_getattr(  # type: ignore[method-assign]
        "loaderkit.fake", {"OldName": Moved("NewName", "0.1.0")}
    )
    with pytest.warns(loaderkit.LoaderkitDeprecationWarning) as caught:
        assert Owner().figures() == 7
        assert module.OldName is int
    messages = [str(w.message) for w in caught]
    assert messages[0].startswith("Owner.figures (loaderkit 0.1.0) is now Owner.part.figures")
    assert messages[1].startswith("loaderkit.fake.OldName (loaderkit 0.1.0) is now ")
    assert (
        "loaderkit.fake.NewName" in messages[1]
        and "through loaderkit 0.2.0 and goes in 0.3.0" in messages[1]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Owner().part.figures() == 7 and module.NewName is int  # new names: silent
    with pytest.raises(AttributeError, match=r"'loaderkit\.fake' has no attribute 'Other'"):
        module.Other  # noqa: B018


def test_deprecation_warnings_come_from_the_one_mechanism() -> None:
    from pathlib import Path

    root = Path(loaderkit.__file__).parent
    users = sorted(
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if "LoaderkitDeprecationWarning" in path.read_text()
    )
    assert users == ["__init__.py", "errors.py"], users


def test_cache_names_the_node_cache_only() -> None:
    """The pool of open files and HDF5's chunk buffer have names of their own in the code."""
    import re
    from pathlib import Path

    other = re.compile(
        r"handle[ _]cache|HandleCache|cached_chunks|cache_info|LRU cache"
        r"|(?<!raw data )(?<!get_)chunk[ _-]cache",
        re.IGNORECASE,
    )
    root = Path(loaderkit.__file__).parent
    found = [
        f"{path.relative_to(root)}:{number}: {line.strip()}"
        for path in sorted(root.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if other.search(line) and "Moved" not in line  # the released names' aliases
    ]
    assert found == []
    assert other.search("the handle cache") and other.search("HDF5's chunk-cache settings")


def test_py_typed_shipped() -> None:
    from importlib.resources import files

    assert files("loaderkit").joinpath("py.typed").is_file()


# ------------------------------------------------------------------ module paths

#: Module paths the docs, README, examples and benchmarks use.
DOCUMENTED_MODULES = (
    "loaderkit.cli",
    "loaderkit.cli.demo",
    "loaderkit.device.prefetch",
    "loaderkit.device.transfer",
    "loaderkit.errors",
    "loaderkit.hdf5",
    "loaderkit.hdf5.convert.rechunk",
    "loaderkit.hdf5.read.widerows",
    "loaderkit.integrations",
    "loaderkit.integrations.lightning",
    "loaderkit.machine.distributed",
    "loaderkit.memory.containers",
    "loaderkit.memory.preflight",
    "loaderkit.memory.resources",
    "loaderkit.order.resume",
    "loaderkit.order.samplers",
    "loaderkit.order.seeding",
    "loaderkit.policy",
    "loaderkit.policy.budgets",
    "loaderkit.policy.memory",
    "loaderkit.singlecell",
    "loaderkit.storage",
    "loaderkit.workers.collate",
    "loaderkit.workers.queues",
)


def test_documented_module_paths_import() -> None:
    import importlib

    import pytest

    for name in DOCUMENTED_MODULES:
        if name == "loaderkit.integrations.lightning":
            pytest.importorskip("lightning")
        assert importlib.import_module(name).__name__ == name


def test_unknown_attribute_is_an_attribute_error() -> None:
    import pytest

    with pytest.raises(AttributeError, match="no attribute 'no_such_module'"):
        _ = loaderkit.no_such_module
    assert not hasattr(loaderkit, "no_such_module")


def test_import_loaderkit_adds_no_import_hook_and_modules_have_one_path() -> None:
    """Each module imports under its path in the tree only: no finder maps other names."""
    import importlib
    import sys

    import pytest

    hooks = [f for f in sys.meta_path if type(f).__module__.startswith("loaderkit")]
    assert not hooks, hooks
    for name in ("loaderkit.transfer", "loaderkit.samplers", "loaderkit.cli_cache"):
        with pytest.raises(ModuleNotFoundError, match=name):
            importlib.import_module(name)


def test_the_release_is_one_number_everywhere() -> None:
    """pyproject, ``loaderkit.__version__``, ``loaderkit --version`` and the CHANGELOG agree."""
    root = Path(__file__).resolve().parent.parent
    declared = re.search(r'^version = "([^"]+)"', (root / "pyproject.toml").read_text(), re.M)
    assert declared is not None and declared.group(1) == loaderkit.__version__
    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\]", (root / "CHANGELOG.md").read_text(), re.M)
    assert released[0] == loaderkit.__version__  # the newest release section is this one
    shown = subprocess.run(
        [sys.executable, "-m", "loaderkit", "--version"], capture_output=True, text=True, check=True
    )
    assert shown.stdout.strip() == f"loaderkit {loaderkit.__version__}"
