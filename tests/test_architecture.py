"""The package's shape: worlds in their own folders, layers in order, one owner per shared fact.

These read the code (imports and string literals), except the first, which imports the light
worlds in a fresh interpreter and checks that MXNet stayed out. Imports are counted twice: those
that run when a module loads, and every import, inside functions too (a lazy import crosses a
boundary just the same when it runs).
"""
import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest

from support import REPO

PACKAGE = REPO / "esync"
WORLDS = ("common", "worker", "coordination", "emulation", "launch", "analysis", "benchmark")
# Which worlds a world may import, at load time and inside functions. The emulation sits just
# above common: the launcher and the benchmark drive it, the worker reads its speed schedules.
# The launcher and the benchmark start workers as processes and never import the worker; nor
# does the command line, which the launcher builds on (``entry`` runs main.py's roles).
ALLOWED = {
    "common": {"common"},
    "worker": {"common", "worker", "coordination", "emulation"},
    "coordination": {"common", "coordination"},
    "emulation": {"common", "emulation"},
    "launch": {"common", "launch", "coordination", "emulation", "cli"},
    "analysis": {"common", "analysis"},
    "benchmark": {"common", "benchmark", "analysis", "emulation", "launch"},
    "cli": {"common", "emulation"},
    "entry": {"common", "cli", "worker"},
}
# Imports allowed inside a function only, each for one reason.
LAZY_ONLY = {
    ("launch", "analysis"): "the launcher writes the run's summary when the run ends",
    ("analysis", "worker"): "the drawer builds a network to weigh it when a figure needs it",
}
NO_WORKER = ("launch", "benchmark", "cli")       # they start workers, as processes
LAYOUT_NAMES = ("iter-", "evaluations.jsonl", "checkpoints", "processes")


@functools.cache
def _modules() -> tuple:
    """(path, syntax tree) of every module of the package, parsed once for all the tests here
    (they only read the trees)."""
    return tuple((path, ast.parse(path.read_text(), filename=str(path)))
                 for path in sorted(PACKAGE.rglob("*.py")))


def _world(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _top_level_imports(tree):
    """Modules imported when the module loads (not inside functions)."""
    for node in tree.body:
        for sub in ast.walk(node) if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) \
                else _class_level(node):
            if isinstance(sub, ast.Import):
                yield from (alias.name for alias in sub.names)
            elif isinstance(sub, ast.ImportFrom) and sub.module and sub.level == 0:
                yield sub.module
                yield from (f"{sub.module}.{alias.name}" for alias in sub.names)


def _every_import(tree):
    """Every module a module may import, at load time or inside a function, with its line."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, node.lineno
            yield from ((f"{node.module}.{alias.name}", node.lineno) for alias in node.names)


def _world_of(name: str) -> str | None:
    """The world ``esync.<world>...`` names, None outside the package (or for ``esync``)."""
    parts = name.split(".")
    return parts[1] if parts[0] == "esync" and len(parts) > 1 else None


def _class_level(node):
    if isinstance(node, ast.ClassDef):
        for item in node.body:
            if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield from ast.walk(item)


def test_loading_the_analysis_and_the_launcher_does_not_load_mxnet():
    code = ("import esync.analysis.summary, esync.analysis.drawer, esync.launch, sys; "
            "print('mxnet' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize("world", WORLDS)
def test_each_world_is_a_package_of_its_own(world):
    assert (PACKAGE / world / "__init__.py").is_file()


def test_worlds_import_only_the_worlds_below_them_at_load_time():
    wrong = []
    for path, tree in _modules():
        world = _world(path)
        for name in _top_level_imports(tree):
            parts = name.split(".")
            if parts[0] != "esync" or len(parts) < 2:
                continue
            if parts[1] not in ALLOWED.get(world, set(ALLOWED)) | {world}:
                wrong.append(f"{path.relative_to(REPO)} imports {name}")
    assert wrong == []


def test_every_import_inside_functions_too_keeps_to_the_allowed_worlds():
    wrong = []
    for path, tree in _modules():
        world = _world(path)
        for name, line in _every_import(tree):
            target = _world_of(name)
            if target is None or target in ALLOWED.get(world, set(ALLOWED)) | {world}:
                continue
            if (world, target) not in LAZY_ONLY:
                wrong.append(f"{path.relative_to(REPO)}:{line} imports {name}")
    assert wrong == []


@pytest.mark.parametrize("world", NO_WORKER)
def test_the_launcher_the_benchmark_and_the_command_line_import_no_worker_module(world):
    found = [f"{path.relative_to(REPO)}:{line} imports {name}"
             for path, tree in _modules() if _world(path) == world
             for name, line in _every_import(tree) if _world_of(name) == "worker"]
    assert found == []
    assert (world, "worker") not in LAZY_ONLY and "worker" not in ALLOWED[world]


def test_the_lazy_only_imports_are_still_made():
    """An exception nobody needs any more goes from LAZY_ONLY."""
    made = {(_world(path), _world_of(name)) for path, tree in _modules()
            for name, _ in _every_import(tree)}
    assert set(LAZY_ONLY) <= made


def _import_graph(imports) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (``imports``: a tree's imported names)."""
    names = {_module_name(p): p for p, _ in _modules()}
    graph = {}
    for path, tree in _modules():
        targets = set()
        for name in imports(tree):
            while name and name not in names:
                name = name.rpartition(".")[0]
            if name and name != _module_name(path):
                targets.add(name)
        graph[_module_name(path)] = targets
    return graph


def _cycles(graph) -> list[list[str]]:
    """The cycles a depth-first walk meets. A package's face importing its own modules is how
    packages work; a cycle through any other edge is not."""
    seen, stack, cycles = set(), [], []

    def visit(node):
        if node in stack:
            cycles.append(stack[stack.index(node):] + [node])
            return
        if node in seen:
            return
        seen.add(node)
        stack.append(node)
        for target in graph.get(node, ()):
            if not node.startswith(target + "."):      # a module importing its package face
                visit(target)
        stack.pop()
    for node in graph:
        visit(node)
    return cycles


def test_the_import_graph_has_no_cycle():
    assert _cycles(_import_graph(_top_level_imports)) == []


def _tangles(graph) -> list[set[str]]:
    """The groups of modules that each reach one another (strongly connected, two or more),
    leaving out a module's edge to its own package face."""
    order, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node):
        order[node] = low[node] = len(order)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if node.startswith(target + "."):
                continue
            if target not in order:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], order[target])
        if low[node] == order[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)
    for node in sorted(graph):
        if node not in order:
            visit(node)
    return groups


# Modules that reach one another only through imports inside functions, all in the launcher,
# left for whoever next reshapes its backends: the flags read each backend's flags through
# remote.py, the backends' launches read the flags, the local launch picks the netns backend
# (a LocalBackend).
KNOWN_LAZY_TANGLES = (
    {"esync.launch.flags", "esync.launch.remote", "esync.launch.launches",
     "esync.launch.backends.local", "esync.launch.backends.netns", "esync.launch.backends.ssh",
     "esync.launch.backends.slurm", "esync.launch.backends.kubernetes"},
)


def _lazy_tangles() -> list[set[str]]:
    return _tangles(_import_graph(lambda tree: (name for name, _ in _every_import(tree))))


def test_the_import_graph_counting_imports_inside_functions_has_no_new_cycle():
    assert [t for t in _lazy_tangles() if t not in KNOWN_LAZY_TANGLES] == []


def test_the_known_lazy_tangles_are_still_there():
    """A tangle undone since goes from KNOWN_LAZY_TANGLES."""
    assert [t for t in KNOWN_LAZY_TANGLES if t not in _lazy_tangles()] == []



def test_the_benchmarks_plan_reads_its_options_and_never_the_other_way():
    graph = _import_graph(lambda tree: (name for name, _ in _every_import(tree)))
    assert "esync.benchmark.options" in graph["esync.benchmark.plan"]
    assert "esync.benchmark.plan" not in graph["esync.benchmark.options"]


def test_no_module_imports_from_its_own_package_face():
    """A submodule takes names from their own modules, never from its package's ``__init__``
    (which would tie the face and the rooms into a cycle)."""
    wrong = []
    for path, tree in _modules():
        module = _module_name(path)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.level == 0):
                continue
            if not module.startswith(node.module + ".") or path.name == "__init__.py":
                continue
            folder = REPO.joinpath(*node.module.split("."))
            for alias in node.names:
                if not ((folder / f"{alias.name}.py").exists() or (folder / alias.name).is_dir()):
                    wrong.append(f"{path.relative_to(REPO)}: from {node.module} import "
                                 f"{alias.name}")
    assert wrong == []


def test_the_launchers_face_is_thin():
    lines = (PACKAGE / "launch" / "__init__.py").read_text().splitlines()
    assert len(lines) < 100


def _string_literals(tree):
    """Every string constant except docstrings."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and id(node) not in docstrings):
            yield node.value


@functools.cache
def _literals_by_module() -> tuple:
    """(path, its string literals) of every module, gathered once for the tests below."""
    return tuple((path, tuple(_string_literals(tree))) for path, tree in _modules())


@pytest.mark.parametrize("name", LAYOUT_NAMES)
def test_the_run_layout_is_spelled_in_one_module(name):
    owners = sorted({str(path.relative_to(REPO)) for path, literals in _literals_by_module()
                     if any(name in text for text in literals
                            if name != "processes" and name != "checkpoints"
                            or text == name or f"/{name}" in text or f"{name}/" in text)})
    assert owners == ["esync/common/runlayout.py"]


def test_class_names_do_not_collide_across_the_package():
    where = {}
    for path, tree in _modules():
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where.setdefault(node.name, []).append(str(path.relative_to(REPO)))
    # Exceptions named for their module's domain may repeat only if they are one class.
    dupes = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert dupes == {}


def test_module_file_names_do_not_collide_across_the_package():
    where = {}
    for path, _ in _modules():
        if path.name not in ("__init__.py", "__main__.py"):
            where.setdefault(path.name, []).append(str(path.relative_to(REPO)))
    allowed = {"base.py"}          # each package's interface: algorithms, backends
    dupes = {n: p for n, p in where.items() if len(p) > 1 and n not in allowed}
    assert dupes == {}
