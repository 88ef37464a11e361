"""Listings fit the terminal (cells wrap, never end in '…') and print as json, yaml or
wide, as ``kubectl get -o`` does (issue 19). The commands run against a stand-in
gateway that answers canned objects."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from kairos import cli_common
from kairos.cli import app
from kairos.cli_output import Col, Output, dump, field, table
from kairos.cli_queues import QUEUE_COLUMNS

QUEUES = [
    {"name": "research-team-vision", "kind": "queue", "parent": "research-cohort",
     "tenant": "vision-and-perception", "state": "open", "strategy": "best_effort",
     "weight": 2.0, "guaranteed": {"gpus": 2}, "borrowing_limit": {"gpus": 6},
     "lending_limit": None, "description": "", "used": {"gpus": 2}, "borrowed": {"gpus": 0},
     "pending": 12, "admitted": 3, "running": 2, "version": 4,
     "updated_at": "2025-01-06T10:00:00Z"},
    {"name": "research-cohort", "kind": "cohort", "parent": None, "tenant": "",
     "state": "open", "strategy": "best_effort", "weight": 1.0, "guaranteed": {"gpus": 16},
     "borrowing_limit": None, "lending_limit": None, "description": "",
     "used": {"gpus": 2}, "borrowed": {"gpus": 0}, "pending": 12, "admitted": 3,
     "running": 2, "version": 1, "updated_at": "2025-01-06T10:00:00Z"},
]
NODES = [
    {"node_id": "node-with-a-long-name-0", "state": "ready", "last_heartbeat": None,
     "inventory": {"gpus": [{"model": "NVIDIA H100 80GB HBM3"}]}, "gpus_total": 8,
     "gpus_allocated": 3, "gpus_shared": 1, "allocations": [], "scheduling": "cordoned",
     "scheduling_reason": "replacing a fan", "gpu_health": [{"health": "degraded"}]},
]
JOBS = {"items": [
    {"id": "j-0123456789abcdef", "name": "a-rather-long-job-name-for-bert", "queue": "default",
     "tenant": "vision", "user": "alice", "state": "admitted", "attempt": 0,
     "reason": "waiting for GPUs: no node has 8 free GPUs of model H100",
     "exit_code": None, "submitted_at": "2025-01-06T10:00:00Z",
     "updated_at": "2025-01-06T10:00:01Z", "spec": {}},
], "limit": 50, "offset": 0, "next_offset": None, "next_cursor": None}
ANSWERS: dict[str, Any] = {"/v1/queues": QUEUES, "/v1/nodes": NODES, "/v1/jobs": JOBS}


@pytest.fixture
def gateway() -> Iterator[str]:
    class Canned(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(ANSWERS[self.path.partition("?")[0]]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Canned)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def narrow(monkeypatch: pytest.MonkeyPatch) -> int:
    """An 80-column terminal (what a pipe or file gets)."""
    monkeypatch.setattr(cli_common.console, "width", 80)
    return 80


def kairos(gateway: str, *args: str) -> str:
    result = CliRunner().invoke(app, [*args, "--url", gateway, "--token", "t"])
    assert result.exit_code == 0, result.output
    return result.output


def rendered(t: Any, width: int) -> str:
    out = Console(width=width, record=True)
    out.print(t)
    return out.export_text()


def test_a_table_fits_the_width_and_wraps_instead_of_cutting() -> None:
    text = rendered(table(QUEUES, QUEUE_COLUMNS), 80)
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text
    # a column kept whole (the name) is on one line; the others wrap but lose nothing
    assert any("research-team-vision" in line for line in text.splitlines())
    body = [line.split("│") for line in text.splitlines() if line.startswith("│")]
    assert "".join(cells[2].strip() for cells in body) == "vision-and-perception(shared)"


def test_wide_adds_columns_the_default_leaves_out() -> None:
    cols = (Col("a", field("a")), Col("b", field("b"), wide=True))
    assert [c.header for c in table([{"a": 1, "b": 2}], cols).columns] == ["a"]
    assert [c.header for c in table([{"a": 1, "b": 2}], cols, wide=True).columns] == ["a", "b"]


def test_json_and_yaml_are_the_full_objects() -> None:
    assert json.loads(dump(QUEUES, Output.JSON)) == QUEUES
    assert yaml.safe_load(dump(QUEUES, Output.YAML)) == QUEUES
    assert dump(QUEUES, Output.YAML).startswith("- name: research-team-vision")  # field order


def test_queues_fits_80_columns_by_default(gateway: str, narrow: int) -> None:
    out = kairos(gateway, "queues")
    assert max(len(line) for line in out.splitlines()) <= narrow
    assert "…" not in out
    row = next(line for line in out.splitlines() if "research-team-vision" in line)
    assert "2/2" in row  # GPUs used / guaranteed
    assert "research-cohort (cohort)" in out
    assert "weight" not in out and "parent" not in out  # -o wide only


def test_queues_wide_json_and_yaml(gateway: str, narrow: int) -> None:
    # as kubectl's -o wide: as wide as its columns (the terminal wraps), nothing cut
    out = kairos(gateway, "queues", "-o", "wide")
    header = next(line for line in out.splitlines() if "queue" in line)
    for name in ("parent", "weight", "strategy", "borrow max", "GPUs used/quota"):
        assert name in header
    row = next(line for line in out.splitlines() if "research-team-vision" in line)
    assert "research-cohort" in row and "vision-and-perception" in row and "…" not in out
    assert json.loads(kairos(gateway, "queues", "-o", "json")) == QUEUES
    assert yaml.safe_load(kairos(gateway, "queues", "--output", "yaml")) == QUEUES


def test_nodes_and_jobs_in_every_format(gateway: str, narrow: int) -> None:
    out = kairos(gateway, "nodes")
    assert max(len(line) for line in out.splitlines()) <= narrow and "…" not in out
    row = next(line for line in out.splitlines() if "node-with-a-long-name-0" in line)
    assert row.split("│")[1].strip() == "node-with-a-long-name-0"  # first, whole
    assert "health" in out and "replacing" not in out
    wide = kairos(gateway, "nodes", "-o", "wide")
    assert "replacing a fan" in wide and "1 degraded" in wide
    assert json.loads(kairos(gateway, "nodes", "-o", "json")) == NODES
    out = kairos(gateway, "jobs")
    assert max(len(line) for line in out.splitlines()) <= narrow and "…" not in out
    assert "j-0123456789abcdef" in out  # ids stay whole
    assert yaml.safe_load(kairos(gateway, "jobs", "-o", "yaml")) == JOBS["items"]
    assert "tenant" in kairos(gateway, "jobs", "-o", "wide")


def test_an_unknown_format_is_refused(gateway: str) -> None:
    result = CliRunner().invoke(app, ["queues", "-o", "xml", "--url", gateway, "--token", "t"])
    assert result.exit_code == 2 and "xml" in result.output
