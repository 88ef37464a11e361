"""`kairos up` lists every part of the platform with its URL (/metrics) and log, and
`kairos status` shows the same for a running platform from what it saved in its
workdir (issue 19). No process is started: the stack's `_spawn` is a stand-in."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from kairos import cli, cli_common, cli_stack
from kairos import stack as stack_mod
from kairos.stack import SERVICES

from .fake_stack import fake_stack

PARTS = ["broker", "database", *SERVICES, "node-agent#node0"]


@pytest.fixture
def healthy_port() -> Iterator[int]:
    """A port whose /healthz answers 200, standing for a running service."""

    class Healthz(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/healthz" else 404)
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Healthz)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_services_lists_every_part_with_its_url_metrics_and_log(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    st = fake_stack(monkeypatch, tmp_path)
    rows = {r["name"]: r for r in st.services()}
    assert list(rows) == PARTS
    assert rows["broker"]["url"] == "broker.example:9092"
    assert "s3cret" not in rows["database"]["url"]  # the password is not shown
    assert rows["database"]["url"].startswith("postgresql+asyncpg://kairos:***@db.example")
    for p in st.procs:
        assert rows[p.name]["url"] == f"http://127.0.0.1:{p.port}"
        assert rows[p.name]["metrics"] == f"http://127.0.0.1:{p.port}/metrics"
        assert rows[p.name]["log"] == str(st.workdir / "logs" / f"{p.name}.log")
    assert rows["admission"]["url"] == st.url  # the gateway
    # every service's port is its own
    assert len({p.port for p in st.procs}) == len(st.procs)


def test_the_table_up_prints_shows_each_url_and_log(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    st = fake_stack(monkeypatch, tmp_path)
    out = Console(record=True, width=250)
    out.print(cli_stack.services_table(st.services()))
    text = out.export_text()
    for r in st.services():
        line = next(ln for ln in text.splitlines() if f" {r['name']} " in ln)
        assert r["url"] in line and r["log"] in line
    assert "/metrics" in text


def test_status_shows_the_saved_table_and_who_answers(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, healthy_port: int) -> None:
    st = fake_stack(monkeypatch, tmp_path)
    st.proc("admission").port = st.admission_port = healthy_port  # only admission runs
    saved = st.write_services()
    assert json.loads(saved.read_text())["gateway"] == f"http://127.0.0.1:{healthy_port}"
    monkeypatch.setattr(stack_mod, "WORKDIR", st.workdir)
    monkeypatch.setattr(cli_common.console, "width", 250)
    result = CliRunner().invoke(cli.app, ["status"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert f"gateway: http://127.0.0.1:{healthy_port}" in lines[0]
    for r in st.services():
        line = next(ln for ln in lines if f" {r['name']} " in ln)
        assert r["url"] in line and r["log"] in line
        if r["name"] == "admission":
            assert line.rstrip(" │").endswith("up")
        elif r["url"].startswith("http"):
            assert line.rstrip(" │").endswith("down")


def test_status_without_a_running_platform_says_so(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    monkeypatch.setattr(stack_mod, "WORKDIR", tmp_path / "nothing")
    result = CliRunner().invoke(cli.app, ["status"])
    assert result.exit_code == 1
    assert "no platform running" in result.output
    assert "make run" in result.output


def test_stop_removes_the_saved_table(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    st = fake_stack(monkeypatch, tmp_path)
    path = st.write_services()
    monkeypatch.setattr(st, "procs", [])  # nothing to signal
    st.stop()
    assert not path.exists()
