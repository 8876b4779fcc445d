"""The package layout, checked by reading the source tree (and the tests' tree).

* the package root holds at most ``ROOT_MAX`` modules (the front door and two leaves);
* every folder's ``__init__`` has a docstring that maps the folder (names each of its modules
  and sub-folders) and says which way its imports go;
* no module is longer than ``MAX_LINES`` lines;
* the import graph between *units* (a folder, or one module of the root) follows ``LAYERS``:
  a unit imports only units listed before it, so nothing imports back up;
* inside ``hdf5/`` the same holds one level down: its units (a stage folder, or one module of
  ``hdf5/`` itself) follow ``HDF5_LAYERS``, and ``hdf5/`` itself holds at most
  ``HDF5_MAX_MODULES`` modules;
* the import graph between *modules* has no circle, inside folders too. Every import counts,
  also those inside functions and under ``TYPE_CHECKING``;
* private names stay in their module: no module imports another's ``_name``
  (``private_imports``), and no module reads ``obj._name`` of an object another module owns
  (``private_reads``), but for the rules in ``private_reads``;
* no two modules share a name (``shared_module_names``), but by ``NAMED_BY_FOLDER``;
* tests, examples, benchmarks and tools import loaderkit only by module paths that exist;
* ``tests/`` mirrors the package: at most ``TESTS_ROOT_MAX`` test modules in ``tests/`` itself,
  every other one in ``tests/<folder>/`` for a folder of ``src/loaderkit/``, and
  ``tests/hdf5/<stage>/`` for a stage folder of ``src/loaderkit/hdf5/``.

``imports_of``, ``layer_violations``, ``find_cycle``, ``private_imports`` and
``private_reads`` are pure functions, tested here on
small synthetic inputs so that the checks on the real tree are known to be able to fail.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "loaderkit"
TESTS = Path(__file__).resolve().parent
ROOT_MAX = 10
#: Test modules in ``tests/`` itself: the front door (loader, public API, docs, examples,
#: layout...); every other test module lives in the folder of the package folder it tests.
TESTS_ROOT_MAX = 12
MAX_LINES = 600
#: Modules over ``MAX_LINES`` that read better whole, each with why (reviewed, not exempt).
REVIEWED_LONG: dict[str, str] = {
    "hdf5/dataset/dataset.py": (
        "one class, the page a subclass author reads: every hook and in-hook helper with its "
        "docstring and example, the read-only constructor arguments, and its LoaderSupport, "
        "which calls the class's own seeded read; a split would cut the class, not a seam"
    ),
    "hdf5/anndata/csrmatrix.py": (
        "CSRMatrix, one class whose batch path is one plan (the catalog taught the batch's "
        "sessions, runs, one table of pieces, the runs decoded where they cannot be read raw, "
        "the column-id check): its process-local parts (read-ahead, file maps) live apart"
    ),
    "hdf5/read/reader.py": (
        "the reader contract (a Protocol: declarations only) beside SessionReader, the one "
        "class that answers it for rows as stored; its read paths (_fill, _fill_at_once, "
        "stored_rows) share its files part, scratch rows and counters of threads reading"
    ),
    "hdf5/read/handles.py": (
        "the per-process cache of open files and its one lock discipline (the mutex, leases, "
        "retired handles, waiting for room, the fork hook): every method keeps the same "
        "invariant (never more than max_open files, not even for a moment); the Handle it "
        "holds is defined beside it"
    ),
    "hdf5/read/sessionfiles.py": (
        "the reader's files part and every check on its open files (open, record, verify, "
        "changed, read errors and their causes): one class whose methods share that state; "
        "the row reads over it are SessionReader's, which holds it"
    ),
}

#: Units from the bottom up: each may import only the units before it. A folder is one unit
#: (its modules import each other freely); a module of the root is a unit of its own;
#: ``__init__`` is the package ``loaderkit`` itself.
LAYERS: tuple[str, ...] = (
    "errors",  # every exception and warning; imports nothing
    "plan",  # Plan, PlanEntry, Decision; imports nothing
    "batches",  # the finished-batch contract (RowBatch, BatchMemory): imports torch only
    "support",  # LoaderSupport: what a loader asks of a dataset; imports errors and plan
    "_torch",  # torch's private API
    "machine",  # what this machine and torch are
    "workers",  # what runs in worker processes, the hand-off
    "memory",  # what processes hold
    "order",  # which samples, in what order
    "policy",  # decisions and checks before a start
    "device",  # to the GPU
    "singlecell",  # a batch of single-cell counts normalised: imports errors only
    "storage",  # where session files live
    "hdf5",  # reading session files
    "passes",  # one pass of a loader (the front door from here on)
    "checks",  # the checks before workers start (pickling, start method)
    "planning",
    "loader",
    "factory",
    "__init__",
    "integrations",
    "cli",  # the command line
    "__main__",
)

#: Inside ``hdf5/``, its units from the bottom up, in the same sense as ``LAYERS``: a stage
#: folder, or one module of ``hdf5/`` itself (``__init__`` is ``loaderkit.hdf5``).
HDF5_LAYERS: tuple[str, ...] = (
    "meta",  # what session files hold; imports nothing else of hdf5
    "read",  # rows read out of the files
    "anndata",  # AnnData's own: .h5ad matrices, genes, the per-cell columns beside them
    "convert",  # files rewritten row by row
    "remote",  # sessions read through the node cache
    "dataset",  # HDF5SessionDataset
    "sampler",  # stands apart: reads the dataset's public accessors only
    "__init__",
)
HDF5 = PACKAGE / "hdf5"
HDF5_MAX_MODULES = 4

#: Names with a leading underscore that their library documents as public: namedtuple's API
#: and ``sys._getframe``.
DOCUMENTED_UNDERSCORE = frozenset({"_asdict", "_field_defaults", "_fields", "_make", "_replace"})
DOCUMENTED_UNDERSCORE_OF = {"sys": frozenset({"_getframe"})}
#: Modules whose job is to hold another library's private API (a name no loaderkit module
#: defines): torch's in ``_torch/``, fsspec's filesystems in ``storage/filesystems``.
PRIVATE_API_HOMES = ("loaderkit._torch", "loaderkit.storage.filesystems")
#: Folders whose modules are named after something outside them (torch's piece, a command).
NAMED_BY_FOLDER = ("_torch", "cli")


# ------------------------------------------------------------------ pure functions


def imports_of(source: str, module: str, known: set[str] | None = None) -> set[str]:
    """Every ``loaderkit`` module path ``source`` imports (at any depth of the code).

    ``module`` is the importing module's dotted name (for relative imports). For
    ``from loaderkit.x import y``: ``loaderkit.x.y`` when it is a module of ``known``, else
    ``loaderkit.x`` (``y`` is a name in it); without ``known``, both.

    Examples:
        >>> sorted(imports_of("def f():\\n    from loaderkit import errors", "loaderkit.a"))
        ['loaderkit', 'loaderkit.errors']
    """
    package = module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if known is None:
                    found.update((base, full))
                else:
                    found.add(full if full in known else base)
    return {name for name in found if name == "loaderkit" or name.startswith("loaderkit.")}


def layer_violations(graph: Mapping[str, set[str]], layers: Sequence[str]) -> list[str]:
    """The edges of ``graph`` (unit -> units it imports) that do not point down ``layers``.

    Examples:
        >>> layer_violations({"a": set(), "b": {"a"}}, ["a", "b"])
        []
        >>> layer_violations({"a": {"b"}, "b": set()}, ["a", "b"])
        ['a imports b, which is above it']
    """
    rank = {unit: i for i, unit in enumerate(layers)}
    problems = []
    for unit, targets in sorted(graph.items()):
        if unit not in rank:
            problems.append(f"{unit} is in no layer")
            continue
        for target in sorted(targets - {unit}):
            if target not in rank:
                problems.append(f"{unit} imports {target}, which is in no layer")
            elif rank[target] > rank[unit]:
                problems.append(f"{unit} imports {target}, which is above it")
    return problems


def find_cycle(graph: Mapping[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` as ``[a, b, ..., a]``, or None.

    Examples:
        >>> find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
        True
        >>> find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}})
        ['a', 'b', 'c', 'a']
    """
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(unit: str) -> list[str] | None:
        state[unit] = 1
        path.append(unit)
        for target in sorted(graph.get(unit, set()) - {unit}):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        path.pop()
        state[unit] = 2
        return None

    for unit in sorted(graph):
        if unit not in state:
            found = visit(unit)
            if found:
                return found
    return None


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(source: str, module: str, known: set[str]) -> list[str]:
    """``from loaderkit.x import _name`` in ``source``: another module's private name.

    ``module`` is the importing module's dotted name (for relative imports); a private name
    that is itself a module of ``known`` (the private package ``loaderkit._torch``) is a unit
    of the layout, not a name, and is not reported.

    Examples:
        >>> private_imports("from loaderkit.a import _f, g", "loaderkit.b", set())
        ['loaderkit.b:1 imports _f from loaderkit.a']
        >>> private_imports("from loaderkit import _torch", "loaderkit.b", {"loaderkit._torch"})
        []
    """
    found = []
    package = module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom):
            continue
        base = node.module or ""
        if node.level:
            parts = package.split(".")
            anchor = ".".join(parts[: len(parts) - node.level + 1])
            base = f"{anchor}.{base}" if base else anchor
        if (base != "loaderkit" and not base.startswith("loaderkit.")) or base == module:
            continue
        for alias in node.names:
            if _private(alias.name) and f"{base}.{alias.name}" not in known:
                found.append(f"{module}:{node.lineno} imports {alias.name} from {base}")
    return found


def _own_names(tree: ast.AST) -> set[str]:
    """The names a module defines: functions, methods, classes, class-level and stored
    attributes (``x._name = ...`` on any object), ``__slots__`` entries."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store | ast.Del):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)  # __slots__ entries, dataclass field names given as text
    return names


def _is_own_object(receiver: ast.expr) -> bool:
    """``self``, ``cls``, ``super()``, ``type(self)``: the reading class's own object."""
    if isinstance(receiver, ast.Name):
        return receiver.id in ("self", "cls")
    if isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Name):
        if receiver.func.id == "super":
            return True
        return receiver.func.id == "type" and any(map(_is_own_object, receiver.args))
    return False


def private_reads(source: str, module: str, defined_elsewhere: Mapping[str, set[str]]) -> list[str]:
    """``obj._name`` reads in ``source`` of a private name this module does not own.

    The rules, in order: the reading class's own object (``self``, ``cls``, ``super()``,
    ``type(self)``) may be read; a name this module defines itself (``_own_names``: its own
    objects, a dataclass of the same module) may be read; ``DOCUMENTED_UNDERSCORE`` names
    may be read. A name ``defined_elsewhere`` (loaderkit module -> the names it defines) names
    a loaderkit module and is reported; any other name is another library's and is reported
    outside ``PRIVATE_API_HOMES``. Inside a home, only its own modules' names are loaderkit's
    (``tensor._values`` in ``_torch/`` is torch's, whatever another folder calls ``_values``).

    Examples:
        >>> private_reads("x = loader._pass", "loaderkit.a", {"loaderkit.b": {"_pass"}})
        ['loaderkit.a:1 reads loader._pass, private to loaderkit.b']
        >>> private_reads("def f(self):\n    return self._pass", "loaderkit.a", {})
        []
    """
    tree = ast.parse(source)
    own = _own_names(tree)
    home = next((m for m in PRIVATE_API_HOMES if module == m or module.startswith(f"{m}.")), None)
    if home is not None:  # it holds the library's objects: a name of its own home is loaderkit's
        defined_elsewhere = {m: n for m, n in defined_elsewhere.items() if m.startswith(home)}
    found: list[tuple[int, int, int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not isinstance(node.ctx, ast.Load):
            continue
        name, receiver = node.attr, node.value
        if not _private(name) or _is_own_object(receiver) or name in own:
            continue
        if name in DOCUMENTED_UNDERSCORE:
            continue
        if isinstance(receiver, ast.Name) and name in DOCUMENTED_UNDERSCORE_OF.get(receiver.id, ()):
            continue
        owners = sorted(m for m, names in defined_elsewhere.items() if name in names)
        if owners:
            where = f"private to {', '.join(owners)}"
        elif home is not None:
            continue
        else:
            where = "another library's private name"
        text = f"{module}:{node.lineno} reads {ast.unparse(node)}, {where}"
        found.append((node.lineno, node.col_offset, -len(text), text))
    return [text for *_, text in sorted(found)]


# ------------------------------------------------------------------ the tree


def _modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the package."""
    names = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        names[name] = path
    return names


def _inside(name: str, package: str) -> bool:
    return name == package or name.startswith(f"{package}.")


def _unit(name: str, package: str = "loaderkit") -> str:
    """The unit of module ``name`` inside ``package``: its folder, its own name, or __init__.

    Examples:
        >>> name = "loaderkit.hdf5.read.reader"
        >>> _unit(name), _unit(name, "loaderkit.hdf5")
        ('hdf5', 'read')
        >>> [_unit(f"loaderkit.hdf5{tail}", "loaderkit.hdf5") for tail in ("", ".sampler")]
        ['__init__', 'sampler']
    """
    parts = name.split(".")[package.count(".") :]
    return "__init__" if len(parts) == 1 else parts[1]


def _unit_graph(
    package: str = "loaderkit",
) -> tuple[dict[str, set[str]], dict[tuple[str, str], str]]:
    """Unit -> units of ``package`` it imports, and one module-level example of each edge."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    examples: dict[tuple[str, str], str] = {}
    for name, path in modules.items():
        if not _inside(name, package):
            continue
        unit = _unit(name, package)
        graph.setdefault(unit, set())
        module = name if path.name != "__init__.py" else f"{name}.__init__"
        for target in imports_of(path.read_text(encoding="utf-8"), module, set(modules)):
            assert target in modules, f"{name} imports {target}, which is no module"
            if not _inside(target, package):
                continue
            target_unit = _unit(target, package)
            if target_unit != unit:
                graph[unit].add(target_unit)
                examples.setdefault((unit, target_unit), f"{name} -> {target}")
    return graph, examples


def test_the_checks_can_fail() -> None:
    circle = {"workers": {"order"}, "order": {"policy"}, "policy": {"workers"}}
    assert find_cycle(circle) == ["order", "policy", "workers", "order"]
    assert layer_violations(circle, ["workers", "order", "policy"]) == [
        "order imports policy, which is above it",
        "workers imports order, which is above it",
    ]
    assert layer_violations({"x": {"errors"}}, ["errors"]) == ["x is in no layer"]
    # inside hdf5/: the reader importing the remote stage is an arrow back up
    stages = {"read": {"meta", "remote"}, "remote": {"read"}, "meta": set()}
    assert layer_violations(stages, HDF5_LAYERS) == ["read imports remote, which is above it"]
    assert _unit("loaderkit.hdf5.read.sessionfiles", "loaderkit.hdf5") == "read"
    nested = "import os\nif True:\n    def f():\n        import loaderkit.order.seeding as s\n"
    assert imports_of(nested, "loaderkit.workers.worker") == {"loaderkit.order.seeding"}
    relative = "from ..order import seeding\nfrom . import wire\n"
    assert imports_of(relative, "loaderkit.workers.worker") == {
        "loaderkit.order",
        "loaderkit.order.seeding",
        "loaderkit.workers",
        "loaderkit.workers.wire",
    }


def test_the_private_name_checks_can_fail() -> None:
    relative = "from .types import Kind, _dicts\nfrom ..meta import _torch\n"
    known = {"loaderkit.hdf5.meta._torch"}
    assert private_imports(relative, "loaderkit.hdf5.read.reader", known) == [
        "loaderkit.hdf5.read.reader:1 imports _dicts from loaderkit.hdf5.read.types"
    ]
    assert private_imports("from __future__ import annotations", "loaderkit.a", set()) == []
    reads = (
        "def state(loader, seq, p):\n"
        "    loader._owns_generator, loader._batches_per_pass()\n"  # the loader's: reported
        "    seq._set, p._replace(x=1), type(self)._x, super()._reset()\n"  # own, documented
        "    return torch._C._autograd\n"  # torch's: only in _torch/
    )
    elsewhere = {"loaderkit.loader": {"_owns_generator", "_batches_per_pass"}}
    assert private_reads(f"{reads}class S:\n    _set = 1\n", "loaderkit.order.r", elsewhere) == [
        "loaderkit.order.r:2 reads loader._owns_generator, private to loaderkit.loader",
        "loaderkit.order.r:2 reads loader._batches_per_pass, private to loaderkit.loader",
        "loaderkit.order.r:4 reads torch._C._autograd, another library's private name",
        "loaderkit.order.r:4 reads torch._C, another library's private name",
    ]
    # in _torch/ torch's private names may be read, another _torch module's may not
    assert private_reads(reads, "loaderkit._torch.x", elsewhere) == []
    elsewhere["loaderkit._torch.seeds"] = {"_set"}
    assert private_reads(reads, "loaderkit._torch.x", elsewhere) == [
        "loaderkit._torch.x:3 reads seq._set, private to loaderkit._torch.seeds"
    ]


def test_no_module_reaches_into_another_modules_private_names() -> None:
    """Private state stays home: another module's ``_name`` is neither imported nor read.

    A name a module needs from another is a public name of that module (in its ``__all__``),
    or it is passed in. Reads of the module's own objects and of other libraries' private API
    in the module that holds it (``PRIVATE_API_HOMES``) follow ``private_reads``' rules.
    """
    modules = _modules()
    sources = {name: path.read_text(encoding="utf-8") for name, path in modules.items()}
    defines = {
        name: {n for n in _own_names(ast.parse(source)) if _private(n)}
        for name, source in sources.items()
    }
    found = []
    for name, source in sources.items():
        module = name if modules[name].name != "__init__.py" else f"{name}.__init__"
        found += private_imports(source, module, set(modules))
        elsewhere = {other: names for other, names in defines.items() if other != name}
        found += private_reads(source, name, elsewhere)
    assert {"_pass", "_built"} <= defines["loaderkit.loader"]  # the scan holds real names
    assert not found, "\n".join(found)


def shared_module_names(paths: Sequence[str]) -> dict[str, list[str]]:
    """Module names that more than one module of ``paths`` (relative to the package) has.

    Python's own names (``__init__``, ``__main__``) are left out, and so is a name shared by at
    most one module outside ``NAMED_BY_FOLDER``: a module of ``_torch/`` is named after the
    piece of torch it holds, one of ``cli/`` after its command, and the folder says which.

    Examples:
        >>> shared_module_names(["machine/threads.py", "workers/threads.py"])
        {'threads': ['machine/threads.py', 'workers/threads.py']}
        >>> shared_module_names(["_torch/loader.py", "loader.py", "cli/__main__.py"])
        {}
    """
    by_name: dict[str, list[str]] = {}
    for path in sorted(paths):
        by_name.setdefault(Path(path).stem, []).append(path)
    return {
        name: found
        for name, found in by_name.items()
        if name not in ("__init__", "__main__")
        and len([p for p in found if Path(p).parts[0] not in NAMED_BY_FOLDER]) > 1
    }


def test_no_two_modules_share_a_name() -> None:
    """One name per module subject (``threads`` was three modules: which threads?)."""
    paths = [str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")]
    assert "loader.py" in paths and "_torch/loader.py" in paths  # the rule is exercised
    assert shared_module_names(paths) == {}


def test_root_holds_at_most_ten_modules() -> None:
    root = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(root) <= ROOT_MAX, root


def test_every_unit_has_a_layer() -> None:
    units = {_unit(name) for name in _modules()}
    assert units == set(LAYERS), (units - set(LAYERS), set(LAYERS) - units)


def test_hdf5_holds_at_most_four_modules_and_every_unit_has_a_layer() -> None:
    own = sorted(path.name for path in HDF5.glob("*.py"))
    assert len(own) <= HDF5_MAX_MODULES, own
    units = {
        _unit(name, "loaderkit.hdf5") for name in _modules() if _inside(name, "loaderkit.hdf5")
    }
    assert units == set(HDF5_LAYERS), (units - set(HDF5_LAYERS), set(HDF5_LAYERS) - units)


def test_hdf5_imports_follow_its_stages() -> None:
    graph, examples = _unit_graph("loaderkit.hdf5")
    assert "meta" in graph["read"]  # the graph holds real imports
    problems = layer_violations(graph, HDF5_LAYERS)
    where = [
        examples.get((words[0], words[2].rstrip(",")), "")
        for words in (problem.split() for problem in problems)
    ]
    assert not problems, list(zip(problems, where, strict=True))


def test_every_folder_docstring_maps_the_folder_and_its_imports() -> None:
    for init in sorted(PACKAGE.rglob("__init__.py")):
        folder = init.parent
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert doc, f"{init} has no docstring"
        if folder == PACKAGE:
            continue  # the front door: its docstring names the folders instead
        missing = [
            path.stem
            for path in sorted(folder.glob("*.py"))
            if path.stem != "__init__" and f"``{path.stem}``" not in doc
        ]
        missing += [
            sub.parent.name
            for sub in sorted(folder.glob("*/__init__.py"))
            if f"``{sub.parent.name}``" not in doc
        ]
        assert not missing, f"{folder.name}/__init__.py does not name {missing}"
        assert re.search(r"\bimports?\b", doc, re.IGNORECASE), f"{folder.name}: which way?"
    root_doc = ast.get_docstring(ast.parse((PACKAGE / "__init__.py").read_text()))
    assert root_doc
    for folder in sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py")):
        assert f"``{folder}``" in root_doc, f"loaderkit's docstring does not name {folder}"


def test_a_module_over_600_lines_was_reviewed() -> None:
    """The cap is a prompt to look, not a rule that splits: a longer module says why.

    A module over ``MAX_LINES`` either splits where a seam is, or is listed in
    ``REVIEWED_LONG`` with the reason it reads better whole; an entry no longer over the cap
    is removed (the list never hides a module that shrank and grew again unseen).
    """
    long = {
        str(path.relative_to(PACKAGE)): count
        for path in PACKAGE.rglob("*.py")
        if (count := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    unreviewed = {name: count for name, count in long.items() if name not in REVIEWED_LONG}
    assert not unreviewed, f"over {MAX_LINES} lines with no reason in REVIEWED_LONG: {unreviewed}"
    stale = sorted(set(REVIEWED_LONG) - set(long))
    assert not stale, f"no longer over {MAX_LINES} lines: remove from REVIEWED_LONG: {stale}"
    assert all(len(reason) > 40 for reason in REVIEWED_LONG.values())


def test_imports_follow_the_layers_without_circles() -> None:
    graph, examples = _unit_graph()
    problems = layer_violations(graph, LAYERS)
    where = [
        examples.get((words[0], words[2].rstrip(",")), "")
        for words in (problem.split() for problem in problems)
    ]
    assert not problems, list(zip(problems, where, strict=True))
    assert find_cycle(graph) is None


def _module_graph() -> dict[str, set[str]]:
    """Module -> the loaderkit modules it imports (at any depth of its code)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        module = name if path.name != "__init__.py" else f"{name}.__init__"
        graph[name] = imports_of(path.read_text(encoding="utf-8"), module, set(modules)) - {name}
    return graph


def test_no_module_is_in_an_import_circle() -> None:
    """Between any two modules, folders' own modules included: a circle is a shared piece
    in the wrong module (move it to the lower one) or an import in a function that hides it."""
    graph = _module_graph()
    assert "loaderkit.loader" in graph["loaderkit.factory"]  # the graph holds real imports
    circle = find_cycle(graph)
    assert circle is None, " -> ".join(circle)


def test_every_loaderkit_import_outside_the_package_names_a_module() -> None:
    """Tests, examples, benchmarks and tools import loaderkit only by paths that exist."""
    modules = set(_modules())
    repo = PACKAGE.parents[1]
    wrong = []
    for folder in ("tests", "examples", "benchmarks", "tools"):
        for path in sorted((repo / folder).rglob("*.py")):
            name = ".".join(path.relative_to(repo).with_suffix("").parts)
            for target in imports_of(path.read_text(encoding="utf-8"), name, modules):
                if target not in modules:
                    wrong.append(f"{path.relative_to(repo)} imports {target}")
    assert not wrong, wrong


def test_tests_mirror_the_package() -> None:
    """``tests/<folder>/`` for a folder of ``src/loaderkit/``; few test modules in ``tests/``."""
    top = sorted(path.name for path in TESTS.glob("test_*.py"))
    assert len(top) <= TESTS_ROOT_MAX, f"{len(top)} test modules in tests/: {top}"
    package_folders = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    for folder in sorted(p for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"):
        if not any(folder.rglob("*.py")):
            continue  # what a run leaves behind (caches), no tests
        assert folder.name in package_folders, (
            f"tests/{folder.name}/ names no src/loaderkit/ folder"
        )
        assert (folder / "__init__.py").is_file(), f"tests/{folder.name}/ has no __init__.py"
    stages = {path.parent.name for path in HDF5.glob("*/__init__.py")}
    for folder in sorted(p for p in (TESTS / "hdf5").iterdir() if p.is_dir()):
        if not any(folder.rglob("*.py")):
            continue
        assert folder.name in stages, f"tests/hdf5/{folder.name}/ names no hdf5/ stage folder"
        assert (folder / "__init__.py").is_file(), f"tests/hdf5/{folder.name}/ has no __init__.py"


def test_readers_never_reach_into_the_worker_transport() -> None:
    """``hdf5`` writes batches where the loader's ``BatchMemory`` says (``loaderkit.batches``):
    no module of it imports ``loaderkit.workers`` or asks torch which process it is in."""
    modules = _modules()
    known = set(modules)
    reaching = {}
    for name, path in modules.items():
        if not _inside(name, "loaderkit.hdf5"):
            continue
        source = path.read_text()
        found = {m for m in imports_of(source, name, known) if _inside(m, "loaderkit.workers")}
        if "get_worker_info" in source:
            found.add("torch's get_worker_info")
        if found:
            reaching[name] = sorted(found)
    assert reaching == {}


def _imports_into(package: str, outside: str) -> dict[str, list[str]]:
    """Per module of ``outside`` (not of ``package``), the import lines that reach ``package``."""
    found: dict[str, list[str]] = {}
    for name, path in _modules().items():
        if not _inside(name, outside) or _inside(name, package):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            target = None
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                target = node.module
            elif isinstance(node, ast.Import):
                target = next((a.name for a in node.names if _inside(a.name, package)), None)
            if target is not None and _inside(target, package):
                found.setdefault(name, []).append(f"{node.lineno}: {target}")
    return found


def test_anndata_has_its_own_room_entered_by_a_few_doors() -> None:
    """The rest of ``hdf5/`` reaches the AnnData package through its front door, from a few
    modules; the row reader's stage never does (it knows nothing of AnnData)."""
    found = _imports_into("loaderkit.hdf5.anndata", "loaderkit.hdf5")
    assert not [name for name in found if _inside(name, "loaderkit.hdf5.read")], found
    lines = [line for lines in found.values() for line in lines]
    assert len(lines) <= 4 and len(found) <= 3, found
    assert all(line.endswith(": loaderkit.hdf5.anndata") for line in lines), found
    assert len(list((HDF5 / "read").glob("*.py"))) <= 19


def test_no_reader_reads_keys_by_offsets() -> None:
    """A matrix part and the row reader beside it are two parts with their own keys: no
    ``specs[2:]``, ``range(2, ...)`` or ``k + 2`` that reads the keys after a matrix's."""
    offsets = re.compile(r"\[\s*2\s*:\s*\]|range\(\s*2\s*,|\bk\s*\+\s*2\b")
    found = []
    for folder in ("read", "anndata"):
        for path in sorted((HDF5 / folder).glob("*.py")):
            for lineno, line in enumerate(path.read_text().splitlines(), 1):
                if offsets.search(line.split("#")[0]):
                    found.append(f"{folder}/{path.name}:{lineno}: {line.strip()}")
    assert found == []
