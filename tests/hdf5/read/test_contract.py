"""The reader's contract: declared on its base, one level deep, asked without probing.

* outside ``hdf5/read/`` nothing asks a reader or a record what kind it is: no ``isinstance``
  on a reader class or a record kind, no ``getattr``/``hasattr`` on a reader or a record
  (``kind_probes``, tested here on small synthetic sources so that the check can fail);
* every reader class is a direct subclass of the one base, ``SessionReader``, which holds its
  files (``SessionFiles``) as a part;
* what the dataset, budgets and inspection ask has a default on the base: a plain reader
  answers ``None`` (no genes, no matrix) and refuses ``sparse=``/``genes=``/``join=`` by name.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

from loaderkit import ConfigError, HDF5SessionDataset
from loaderkit.hdf5 import read as read_stage
from loaderkit.hdf5.read.reader import SessionReader
from loaderkit.hdf5.read.sessionfiles import SessionFiles
from tests.hdf5.h5adfiles import matrix, write_csr
from tests.hdf5.helpers import write_sessions

PACKAGE = Path(__file__).resolve().parents[3] / "src" / "loaderkit"
READ = PACKAGE / "hdf5" / "read"
#: Classes whose kind nobody outside ``hdf5/read/`` tests.
KINDS = frozenset({"SessionFiles", "SessionReader", "CSRReader", "DenseJoinReader", "CSRRecord"})
#: Words naming a reader or a record in the object ``getattr``/``hasattr`` would probe.
PROBED = ("reader", "record", "rec")


def _names(node: ast.AST) -> set[str]:
    """Every name and attribute name in an expression (``a.b | C`` -> a, b, C)."""
    found: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            found.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            found.add(sub.attr)
    return found


def kind_probes(source: str, where: str) -> list[str]:
    """The places in ``source`` that ask a reader or a record what kind it is.

    ``isinstance(x, K)`` with a class of ``KINDS`` in ``K``; ``getattr(x, ...)`` or
    ``hasattr(x, ...)`` where ``x`` names a reader or a record (``reader``, ``self._reader``,
    ``rec``...).

    Examples:
        >>> kind_probes("isinstance(r, (CSRReader, int))", "m")
        ['m:1 isinstance on CSRReader']
        >>> kind_probes("getattr(self.reader, 'genes', None)", "m")
        ['m:1 getattr on self.reader']
        >>> kind_probes("isinstance(v, list); getattr(torch, 'x')", "m")
        []
    """
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        if node.func.id == "isinstance" and len(node.args) == 2:
            kinds = sorted(_names(node.args[1]) & KINDS)
            found.extend(f"{where}:{node.lineno} isinstance on {kind}" for kind in kinds)
        elif node.func.id in ("getattr", "hasattr") and node.args:
            words = {w.strip("_").lower() for w in _names(node.args[0])}
            if words & set(PROBED):
                target = ast.unparse(node.args[0])
                found.append(f"{where}:{node.lineno} {node.func.id} on {target}")
    return found


def test_kind_probes_finds_each_form() -> None:
    source = (
        "isinstance(record, RemoteRecord | CSRRecord)\n"
        "isinstance(reader, (CSRReader, DenseJoinReader))\n"
        "isinstance(ds._reader, read.csrrows.CSRReader)\n"
        "hasattr(rec, 'group')\n"
        "getattr(obj, 'reader')\n"  # the attribute's name is not the object probed
    )
    assert kind_probes(source, "m") == [
        "m:1 isinstance on CSRRecord",
        "m:2 isinstance on CSRReader",
        "m:2 isinstance on DenseJoinReader",
        "m:3 isinstance on CSRReader",
        "m:4 hasattr on rec",
    ]


def test_nothing_outside_the_read_stage_asks_a_reader_or_record_its_kind() -> None:
    found: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if READ in path.parents:
            continue
        where = str(path.relative_to(PACKAGE))
        found.extend(kind_probes(path.read_text(encoding="utf-8"), where))
    assert not found, "declare it on the reader base (or the record) instead:\n" + "\n".join(found)


def _reader_classes() -> list[type]:
    """Every class of the read stage that is, or builds on, ``SessionReader``."""
    for info in pkgutil.iter_modules(read_stage.__path__):
        importlib.import_module(f"{read_stage.__name__}.{info.name}")
    found, todo = [], [SessionReader]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return [cls for cls in found if cls.__module__.startswith("loaderkit.")]


def test_every_reader_class_is_one_level_below_its_base() -> None:
    classes = _reader_classes()
    names = {cls.__name__ for cls in classes}
    assert {"SessionReader", "CSRReader", "DenseJoinReader"} <= names
    assert SessionReader.__mro__ == (SessionReader, object)
    for cls in classes:
        if cls is not SessionReader:
            assert cls.__mro__ == (cls, SessionReader, object), cls
    assert SessionFiles.__mro__ == (SessionFiles, object)  # a part the reader holds


def test_a_plain_reader_answers_the_contract_with_its_defaults(tmp_path: Path) -> None:
    paths = write_sessions(tmp_path, [10, 12])
    with HDF5SessionDataset(paths, key="betas") as ds:
        reader = ds.handles.reader
        assert type(reader) is SessionReader and isinstance(reader.files, SessionFiles)
        assert reader.genes is None and reader.n_out is None and reader.table is None
        assert reader.matrix_nbytes is None and not reader.sparse_samples
        assert ds.handles.var_names is None and ds.handles.columns is None
        reader.configure("csr")  # the defaults: nothing to serve otherwise
        with pytest.raises(ConfigError, match=r"genes= and join= apply to an anndata matrix"):
            reader.configure("csr", genes=["a"])
        with pytest.raises(ConfigError, match=r"sparse='dense'.*'betas' is none"):
            reader.configure("dense")


def test_a_csr_reader_declares_its_matrix(tmp_path: Path) -> None:
    path = write_csr(tmp_path / "a.h5ad", matrix(0, cells=20, genes=30), var=True)
    with HDF5SessionDataset([path], key="X") as ds:
        reader = ds.handles.reader
        assert reader.sparse_samples and reader.n_out == 30 == ds.handles.n_vars
        assert reader.matrix_nbytes is not None and reader.matrix_nbytes[0] > 0
        assert reader.genes is not None and reader.genes.var_names is not None
        assert (
            ds.handles.var_names == list(reader.genes.var_names) == [f"gene{i}" for i in range(30)]
        )
        reader.configure("dense")
        assert not reader.sparse_samples
