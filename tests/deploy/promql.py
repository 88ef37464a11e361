"""PromQL helpers: parse with promql-parser (the Rust PromQL parser, PyPI) to find every
selected metric, and have promtool (Prometheus' own Go parser) accept every expression."""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

import promql_parser
import yaml

from .conftest import run, tool

# Grafana's built-in and dashboard variables, replaced before parsing.
GRAFANA_RANGE_VARS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


def degrafana(expr: str) -> str:
    for var, value in GRAFANA_RANGE_VARS.items():
        expr = expr.replace(var, value)
    # Dashboard variables appear only inside label-matcher strings: any regex will do.
    return re.sub(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", ".*", expr)


def vector_selector_nodes(node: object) -> Iterator[promql_parser.VectorSelector]:
    """Every vector selector in a parsed expression (inside ranges, calls, operators)."""
    if isinstance(node, promql_parser.VectorSelector):
        yield node
        return
    if isinstance(node, promql_parser.MatrixSelector):
        yield from vector_selector_nodes(node.vector_selector)
        return
    if isinstance(node, promql_parser.Call):
        for arg in node.args:
            yield from vector_selector_nodes(arg)
        return
    for attr in ("expr", "lhs", "rhs", "param"):
        child = getattr(node, attr, None)
        if isinstance(child, promql_parser.Expr):
            yield from vector_selector_nodes(child)


def selectors(expr: str) -> Iterator[tuple[str, set[str]]]:
    """(metric name, label names matched) for every vector selector in expr."""
    for node in vector_selector_nodes(promql_parser.parse(expr)):
        matchers = node.matchers.matchers
        name = node.name or next((m.value for m in matchers if m.name == "__name__"), "")
        yield name, {m.name for m in matchers if m.name != "__name__"}


def promtool_check(exprs: list[str]) -> tuple[int, str]:
    """Have promtool parse every expression (as recording rules of a throwaway file)."""
    rules = [{"record": f"kairos:check:{i}", "expr": e} for i, e in enumerate(exprs)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "exprs.yml"
        path.write_text(yaml.safe_dump({"groups": [{"name": "check", "rules": rules}]}))
        proc = run([tool("promtool"), "check", "rules", str(path)])
    return proc.returncode, proc.stdout + proc.stderr
