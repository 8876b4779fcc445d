"""The reader's contract: a declared ``Protocol``, answered by composition, asked without probing.

* outside ``hdf5/read/`` and ``hdf5/anndata/`` nothing asks a reader or a record what kind it
  is: no ``isinstance`` on a reader class or a record kind, no ``getattr``/``hasattr`` on a
  reader or a record (``kind_probes``, tested here on small synthetic sources so that the
  check can fail);
* no class derives from ``SessionReader``: the AnnData reader *holds* one (its ``rows``) beside
  its matrix part; both answer every member of ``Reader``, which names nothing AnnData's;
* a plain dataset's reader is a ``SessionReader`` with no AnnData part, and the dataset refuses
  ``sparse=``/``genes=``/``join=`` by name.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from loaderkit import ConfigError, HDF5SessionDataset
from loaderkit.hdf5 import anndata as anndata_stage
from loaderkit.hdf5 import read as read_stage
from loaderkit.hdf5.anndata import AnnDataReader, CSRMatrix, DenseColumns
from loaderkit.hdf5.anndata.keyreader import MatrixPart
from loaderkit.hdf5.read.reader import Reader, SessionReader
from loaderkit.hdf5.read.sessionfiles import SessionFiles
from tests.hdf5.h5adfiles import matrix, write_csr
from tests.hdf5.helpers import write_sessions

PACKAGE = Path(__file__).resolve().parents[3] / "src" / "loaderkit"
READ = PACKAGE / "hdf5" / "read"
ANNDATA = PACKAGE / "hdf5" / "anndata"
#: Classes whose kind nobody outside ``hdf5/read/`` tests.
KINDS = frozenset(
    {"SessionFiles", "SessionReader", "AnnDataReader", "CSRMatrix", "DenseColumns", "CSRRecord"}
)
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
        >>> kind_probes("isinstance(r, (CSRMatrix, int))", "m")
        ['m:1 isinstance on CSRMatrix']
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
        "isinstance(reader, (CSRMatrix, DenseColumns))\n"
        "isinstance(ds._reader, anndata.keyreader.AnnDataReader)\n"
        "hasattr(rec, 'group')\n"
        "getattr(obj, 'reader')\n"  # the attribute's name is not the object probed
    )
    assert kind_probes(source, "m") == [
        "m:1 isinstance on CSRRecord",
        "m:2 isinstance on CSRMatrix",
        "m:2 isinstance on DenseColumns",
        "m:3 isinstance on AnnDataReader",
        "m:4 hasattr on rec",
    ]


def test_nothing_outside_the_read_stage_asks_a_reader_or_record_its_kind() -> None:
    found: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if READ in path.parents or ANNDATA in path.parents:
            continue
        where = str(path.relative_to(PACKAGE))
        found.extend(kind_probes(path.read_text(encoding="utf-8"), where))
    assert not found, "declare it on the reader base (or the record) instead:\n" + "\n".join(found)


def _members(protocol: type) -> set[str]:
    """The members a ``Protocol`` declares: its annotations, methods and properties."""
    own = {n for n in vars(protocol) if not n.startswith("_")}
    return own | set(getattr(protocol, "__annotations__", {}))


#: Words that are AnnData's: a matrix's genes, forms and labels.
ANNDATA_WORDS = {"genes", "n_out", "served", "configure", "form", "forms", "table", "labels"}


def test_no_reader_class_derives_from_the_row_reader() -> None:
    for info in pkgutil.iter_modules(read_stage.__path__):
        importlib.import_module(f"{read_stage.__name__}.{info.name}")
    for info in pkgutil.iter_modules(anndata_stage.__path__):
        importlib.import_module(f"{anndata_stage.__name__}.{info.name}")
    assert SessionReader.__subclasses__() == []
    assert SessionReader.__mro__ == (SessionReader, object)
    assert AnnDataReader.__mro__ == (AnnDataReader, object)
    assert SessionFiles.__mro__ == (SessionFiles, object)  # a part the reader holds


def test_the_contract_names_nothing_of_anndata_and_every_reader_answers_it() -> None:
    members = _members(Reader)
    assert {"read_batch", "read_one", "files", "index", "use_memory", "close"} <= members
    assert not members & ANNDATA_WORDS
    for cls in (SessionReader, AnnDataReader):
        missing = {m for m in members if not hasattr(cls, m)}
        missing -= set(cls.__init__.__code__.co_names)  # set in __init__
        assert not missing, (cls.__name__, missing)
    for part in (CSRMatrix, DenseColumns):
        missing = {m for m in _members(MatrixPart) if not hasattr(part, m)}
        missing -= set(part.__init__.__code__.co_names)
        assert not missing, (part.__name__, missing)


def test_an_anndata_reader_holds_a_row_reader_for_the_keys_beside_its_matrix(
    tmp_path: Path,
) -> None:
    m = matrix(2)
    path = write_csr(tmp_path / "a.h5ad", m)
    with h5py.File(path, "a") as f:
        f["obs/n_counts"] = np.arange(m.shape[0], dtype="f4")
    with HDF5SessionDataset([path], key=("X", "obs/n_counts")) as ds:
        reader = ds.handles.reader
        assert isinstance(reader, AnnDataReader) and isinstance(reader.matrix, CSRMatrix)
        assert type(reader.rows) is SessionReader and reader.rows.files is reader.files
        assert reader.matrix.keys == (0, 1) and reader.rows.keys == (2,)  # two parts
        batch = ds.__getitems__([3, 0])
        assert [float(b["obs/n_counts"]) for b in batch] == [3.0, 0.0]
        assert np.array_equal(batch[0]["X"].to_dense().numpy(), m[3].toarray()[0])


def test_a_plain_reader_answers_the_contract_with_its_defaults(tmp_path: Path) -> None:
    paths = write_sessions(tmp_path, [10, 12])
    with HDF5SessionDataset(paths, key="betas") as ds:
        reader = ds.handles.reader
        assert type(reader) is SessionReader and isinstance(reader.files, SessionFiles)
        assert not hasattr(reader, "genes") and not hasattr(reader, "served")
        assert reader.matrix_nbytes is None and not reader.sparse_samples
        assert ds.handles.var_names is None and ds.handles.columns is None
    with pytest.raises(ConfigError, match=r"genes= and join= apply to an anndata matrix"):
        HDF5SessionDataset(paths, key="betas", genes=["a"])
    with pytest.raises(ConfigError, match=r"sparse='dense'.*'betas' is none"):
        HDF5SessionDataset(paths, key="betas", sparse="dense")


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
