"""The package's shape: worlds in their own folders, layers in order, one owner per shared fact.

These read the code (imports and string literals), except the first, which imports the light
worlds in a fresh interpreter and checks that MXNet stayed out.
"""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

from support import REPO

PACKAGE = REPO / "esync"
WORLDS = ("common", "worker", "coordination", "emulation", "launch", "analysis", "benchmark")
# Which worlds a world may import at load time (lazy imports inside functions are not counted).
ALLOWED = {
    "common": {"common"},
    "worker": {"common", "worker", "coordination", "emulation"},
    "coordination": {"common", "coordination"},
    "emulation": {"common", "emulation"},
    "launch": {"common", "launch", "coordination", "emulation", "cli"},
    "analysis": {"common", "analysis"},
    "benchmark": {"common", "benchmark", "analysis", "emulation", "launch"},
    "cli": {"common", "emulation"},
}
LAYOUT_NAMES = ("iter-", "evaluations.jsonl", "checkpoints", "processes")


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text(), filename=str(path))


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


def test_the_import_graph_has_no_cycle():
    names = {_module_name(p): p for p, _ in _modules()}
    graph = {}
    for path, tree in _modules():
        targets = set()
        for name in _top_level_imports(tree):
            while name and name not in names:
                name = name.rpartition(".")[0]
            if name and name != _module_name(path):
                targets.add(name)
        graph[_module_name(path)] = targets
    # A package's face importing its own modules is how packages work; a cycle through any
    # other edge is not.
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
    assert cycles == []


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


@pytest.mark.parametrize("name", LAYOUT_NAMES)
def test_the_run_layout_is_spelled_in_one_module(name):
    owners = sorted({str(path.relative_to(REPO)) for path, tree in _modules()
                     if any(name in text for text in _string_literals(tree)
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
