"""The public surface: __all__ is sorted, complete and documented."""

from __future__ import annotations

import inspect

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


def test_py_typed_shipped() -> None:
    from importlib.resources import files

    assert files("loaderkit").joinpath("py.typed").is_file()


# ------------------------------------------------------------------ module paths (issue 36)

#: Module paths the docs, README, examples and benchmarks use (the new layout).
DOCUMENTED_MODULES = (
    "loaderkit.cli",
    "loaderkit.cli.demo",
    "loaderkit.device.prefetch",
    "loaderkit.device.transfer",
    "loaderkit.errors",
    "loaderkit.hdf5",
    "loaderkit.hdf5.rechunk",
    "loaderkit.hdf5.wide",
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


def test_old_module_paths_are_the_new_modules() -> None:
    """``import loaderkit.transfer`` (before the layout) gives ``loaderkit.device.transfer``."""
    import importlib
    import sys

    from loaderkit._moved import MOVED

    for old, new in MOVED.items():
        module = importlib.import_module(old)
        assert module is importlib.import_module(new), old
        assert sys.modules[old] is sys.modules[new], old
        assert module.__name__ == new and module.__spec__.name == new, old
        assert getattr(loaderkit, old.rpartition(".")[2]) is module, old


def test_old_paths_keep_names_and_identity() -> None:
    from loaderkit.collate import pad_collate
    from loaderkit.samplers import ShardSampler
    from loaderkit.transfer import resolve_non_blocking

    import loaderkit.order.samplers
    from loaderkit.device.transfer import resolve_non_blocking as new_resolve

    assert resolve_non_blocking is new_resolve
    assert ShardSampler is loaderkit.order.samplers.ShardSampler
    assert pad_collate is loaderkit.pad_collate
    sampler = loaderkit.order.samplers.ShardSampler(range(4), num_replicas=1, rank=0)
    assert isinstance(sampler, ShardSampler)
    # a pickle made before the layout names the class by its old module path
    import pickle

    old_pickle = pickle.dumps(sampler, protocol=2).replace(
        b"loaderkit.order.samplers", b"loaderkit.samplers"
    )
    assert b"loaderkit.samplers" in old_pickle
    assert list(pickle.loads(old_pickle)) == list(sampler)


def test_old_path_monkeypatch_reaches_the_new_module(monkeypatch) -> None:
    import loaderkit.device.transfer

    monkeypatch.setattr("loaderkit.transfer.resolve_non_blocking", lambda *a, **k: "patched")
    assert loaderkit.device.transfer.resolve_non_blocking() == "patched"


def test_unknown_attribute_is_an_attribute_error() -> None:
    import pytest

    with pytest.raises(AttributeError, match="no attribute 'no_such_module'"):
        _ = loaderkit.no_such_module
    assert not hasattr(loaderkit, "no_such_module")


def test_python_dash_m_runs_an_old_path() -> None:
    """``python -m`` through an old path runs the new module (runpy asks ``get_code``)."""
    import os
    import subprocess
    import sys

    code = (
        "import runpy, sys; sys.argv = ['x']; "
        "g = runpy.run_module('loaderkit.cli_cache', run_name='__main__', alter_sys=True); "
        "print(g['__name__'], 'add_commands' in g)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["__main__", "True"]
