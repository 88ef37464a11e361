"""The shape of the code, checked from its source (issue 19's rules):

- the scheduling core imports no broker, database, Kubernetes, NVML, web framework or
  clock, and nothing from ``services`` or ``shared``: the simulator runs it as is;
- no service imports another service (they talk over Kafka topics only);
- the CLI takes nothing from ``services``;
- no import cycle among Kairos' own modules (lazy imports inside functions count: a
  cycle hidden in a function is still a cycle);
- no module in ``services/``, ``scheduling/`` or ``shared/`` is over 400 lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("services", "scheduling", "shared", "kairos", "sim")
MAX_LINES = 400
CORE_FORBIDDEN = ("aiokafka", "sqlalchemy", "asyncpg", "kubernetes", "pynvml", "fastapi",
                  "httpx", "time", "services", "shared")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(module: str, path: Path) -> set[str]:
    """Every module ``module`` imports, at any depth, except under ``if TYPE_CHECKING``."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                up = up[:len(up) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)  # a submodule, if it is one
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


SOURCES = _sources()
IMPORTS = {m: _imports(m, p) for m, p in SOURCES.items()}


def _internal(names: set[str]) -> set[str]:
    """The imported names that are Kairos modules, each reduced to the module it names."""
    out = set()
    for n in names:
        while n and n not in SOURCES:
            n = n.rpartition(".")[0]
        if n:
            out.add(n)
    return out


def _top(name: str) -> str:
    return name.split(".")[0]


def test_the_scheduling_core_imports_no_infrastructure() -> None:
    bad = {m: sorted(n for n in names if _top(n) in CORE_FORBIDDEN)
           for m, names in IMPORTS.items() if _top(m) == "scheduling"}
    assert {m: v for m, v in bad.items() if v} == {}


def test_no_service_imports_another_service() -> None:
    bad = {}
    for m, names in IMPORTS.items():
        parts = m.split(".")
        if parts[0] != "services" or len(parts) < 2:
            continue
        others = sorted(n for n in names if n.startswith("services.")
                        and n.split(".")[1] != parts[1])
        if others:
            bad[m] = others
    assert bad == {}


def test_the_cli_takes_nothing_from_services() -> None:
    bad = {m: sorted(n for n in names if _top(n) == "services")
           for m, names in IMPORTS.items() if m.startswith("kairos.cli")}
    assert {m: v for m, v in bad.items() if v} == {}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_the_import_graph_has_no_cycle() -> None:
    # A package's __init__ that re-exports its submodules is not a cycle of its own
    # making: importing ``a.b`` runs ``a/__init__`` first, so edges into a parent
    # package are left out.
    graph = {m: {n for n in _internal(names) if n != m and not m.startswith(n + ".")}
             for m, names in IMPORTS.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("package", ["services", "scheduling", "shared"])
def test_no_module_is_over_400_lines(package: str) -> None:
    long = {str(p.relative_to(ROOT)): n for m, p in SOURCES.items() if _top(m) == package
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}
