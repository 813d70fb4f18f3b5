"""No import circle among the project's modules: every import of gateway/, engine/, bench/,
training/ and tests/ (at any depth: lazy ones in functions and TYPE_CHECKING ones count,
since a circle that only works because one side imports late is still a circle a newcomer
trips over) is an edge, and the graph has no strongly connected component of more than one
module."""

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("gateway", "engine", "bench", "training", "tests")  # benches import tests/

Graph = dict[str, set[str]]


def module_names(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the packages (a package is its
    __init__.py; a folder without one is a namespace package, still a prefix)."""
    modules: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _targets(node: ast.Import | ast.ImportFrom, name: str, is_package: bool) -> list[str]:
    """The dotted names an import statement reaches (a `from P import X` reaches P and P.X)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        here = name.split(".") if is_package else name.split(".")[:-1]
        here = here[: len(here) - (node.level - 1)]
        base = ".".join([*here, base] if base else here)
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def _resolve(target: str, modules: dict[str, Path]) -> str | None:
    """The deepest project module a dotted name names (`a.b.func` -> `a.b`)."""
    parts = target.split(".")
    while parts:
        if ".".join(parts) in modules:
            return ".".join(parts)
        parts.pop()
    return None


def import_graph(root: Path, packages: Iterable[str]) -> Graph:
    modules = module_names(root, packages)
    graph: Graph = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for target in _targets(node, name, is_package):
                found = _resolve(target, modules)
                if found is not None and found != name:
                    graph[name].add(found)
    return graph


def components(graph: Graph) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively (no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            child = next(edges, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == node:
                        break
                found.append(sorted(members))
    return found


def one_cycle(graph: Graph, members: list[str]) -> list[str]:
    """A shortest circle through the component's first module, as a path back to it."""
    inside, start = set(members), members[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & inside):
                if child == start:
                    return [*paths[node], start]
                if child not in paths:
                    paths[child] = [*paths[node], child]
                    following.append(child)
        frontier = following
    return members  # unreachable for a real component; shows its members all the same


def circles(root: Path, packages: Iterable[str]) -> list[str]:
    graph = import_graph(root, packages)
    return [
        " -> ".join(one_cycle(graph, members)) for members in components(graph) if len(members) > 1
    ]


def test_the_project_has_no_import_circle() -> None:
    graph = import_graph(ROOT, PACKAGES)
    assert "gateway.policy" in graph and "gateway.policy.loading" in graph["gateway.policy"]
    found = circles(ROOT, PACKAGES)
    assert found == [], "import circles (make one side a leaf):\n" + "\n".join(found)


def test_the_engine_core_never_imports_its_entrypoints() -> None:
    """The OpenAI layer and the HTTP servers (engine/entrypoints) sit on top of the core;
    nothing below them reaches up, so the core runs (and is read) without them."""
    graph = import_graph(ROOT, ["engine"])
    assert "engine.entrypoints.openai.protocol" in graph  # the layer is there to be avoided
    core = {name for name in graph if not name.startswith("engine.entrypoints")}
    upward = sorted(
        f"{name} -> {target}"
        for name in core
        for target in graph[name]
        if target.startswith("engine.entrypoints")
    )
    assert upward == [], "engine core modules importing engine/entrypoints:\n" + "\n".join(upward)


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_lazy_and_type_checking_imports_close_a_circle(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "app/__init__.py": "",
            "app/a.py": "import typing\nif typing.TYPE_CHECKING:\n    from app.b import B\n",
            "app/b.py": "def f():\n    from app import c\n",
            "app/c.py": "from .a import A\n",
            "app/leaf.py": "import app.a\n",
        },
    )
    assert circles(tmp_path, ["app"]) == ["app.a -> app.b -> app.c -> app.a"]


def test_a_package_import_reaches_the_package_and_its_submodule(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "app/__init__.py": "from app.inner import thing\n",
            "app/inner/__init__.py": "",
            "app/inner/thing.py": "from app import other\n",
            "app/other.py": "X = 1\n",
        },
    )
    graph = import_graph(tmp_path, ["app"])
    assert graph["app"] == {"app.inner", "app.inner.thing"}
    assert graph["app.inner.thing"] == {"app", "app.other"}
    assert circles(tmp_path, ["app"]) == ["app -> app.inner.thing -> app"]
