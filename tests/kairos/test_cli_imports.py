"""The CLI's modules (kairos/cli*.py) import each other without a circle, and take
nothing from ``services/``: what they need is in ``shared/`` or their own (issue 19)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

KAIROS = Path(__file__).resolve().parents[2] / "kairos"
CLI_MODULES = sorted(f"kairos.{p.stem}" for p in KAIROS.glob("cli*.py"))


def imported(module: str) -> set[str]:
    """Every module ``module`` names in an import, at any depth (lazy ones included)."""
    tree = ast.parse((KAIROS / f"{module.rpartition('.')[2]}.py").read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = "kairos." + node.module if node.level else node.module
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)  # `from kairos import cli_x`
    return found


def cli_graph() -> dict[str, set[str]]:
    return {m: imported(m) & set(CLI_MODULES) - {m} for m in CLI_MODULES}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle, as the path that closes it, or None (depth-first search)."""
    done: set[str] = set()

    def visit(m: str, path: list[str]) -> list[str] | None:
        if m in path:
            return [*path[path.index(m):], m]
        if m in done:
            return None
        for n in sorted(graph.get(m, ())):
            if found := visit(n, [*path, m]):
                return found
        done.add(m)
        return None

    for m in sorted(graph):
        if found := visit(m, []):
            return found
    return None


@pytest.mark.parametrize("module", CLI_MODULES)
def test_every_cli_module_imports(module: str) -> None:
    importlib.import_module(module)


@pytest.mark.parametrize("module", CLI_MODULES)
def test_the_cli_takes_nothing_from_services(module: str) -> None:
    assert sorted(n for n in imported(module) if n.split(".")[0] == "services") == []


def test_the_cli_modules_import_each_other_without_a_circle() -> None:
    assert len(CLI_MODULES) > 5  # the glob found them
    assert cycle(cli_graph()) is None
    # cli.py assembles the commands: every other CLI module is below it, none imports it
    assert not [m for m, deps in cli_graph().items() if "kairos.cli" in deps]


def test_the_circle_finder_finds_one() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
