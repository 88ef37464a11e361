"""`kairos nodes|queues|jobs -o json|yaml|wide` against the running gateway: the full
objects as the API returns them, or a table that fits 80 columns (issue 19)."""

from __future__ import annotations

import json

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from kairos import cli_common
from kairos.cli import app
from kairos.stack import Stack

pytestmark = [pytest.mark.e2e]


def run_cli(stack: Stack, *args: str) -> str:
    result = CliRunner().invoke(app, [*args, "--url", stack.url, "--token", stack.token or ""])
    assert result.exit_code == 0, result.output
    return result.output


def test_listings_print_json_yaml_wide_and_fit_80_columns(
        stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_common.console, "width", 80)  # a pipe, or an 80-column terminal
    api = httpx.get(f"{stack.url}/v1/nodes", timeout=10,
                    headers={"Authorization": f"Bearer {stack.token}"}).json()
    as_json = json.loads(run_cli(stack, "nodes", "-o", "json"))
    assert [n["node_id"] for n in as_json] == [n["node_id"] for n in api]
    assert {"inventory", "gpus_total", "allocations"} <= set(as_json[0])  # the full objects
    as_yaml = yaml.safe_load(run_cli(stack, "nodes", "--output", "yaml"))
    assert [n["node_id"] for n in as_yaml] == [n["node_id"] for n in api]
    assert "heartbeat" in run_cli(stack, "nodes", "-o", "wide")

    for listing in ("nodes", "queues", "jobs"):
        out = run_cli(stack, listing)
        assert max(len(line) for line in out.splitlines()) <= 80, out
        assert "…" not in out, out
    assert "default" in run_cli(stack, "queues")
    queues = json.loads(run_cli(stack, "queues", "-o", "json"))
    assert "default" in {q["name"] for q in queues} and "guaranteed" in queues[0]
