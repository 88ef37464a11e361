"""The `kairos` CLI against the running gateway, and `kairos up` (what `make run` runs)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
import pytest
from typer.testing import CliRunner

from kairos.cli import app
from kairos.embedded import free_port
from kairos.stack import Stack

pytestmark = [pytest.mark.e2e]


def run_cli(stack: Stack, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, [*args, "--url", stack.url, "--token", stack.token or ""])
    return result.exit_code, result.output


def test_cli_errors_are_clear_with_exit_codes(stack: Stack, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntasks: [{name: w, resources: {gpu: -1}}]\n")
    code, out = run_cli(stack, "submit", str(bad))
    assert code == 1 and "tasks.0.resources.gpu" in out
    code, out = run_cli(stack, "describe", "j-nope")
    assert code == 1 and "404" in out
    result = CliRunner().invoke(app, ["describe", "j-x", "--url", stack.url, "--token", "wrong"])
    assert result.exit_code == 1 and "401" in result.output
    result = CliRunner().invoke(app, ["describe", "j-x", "--url", f"http://127.0.0.1:{free_port()}",
                                      "--token", "t"])
    assert result.exit_code == 3 and "cannot reach the gateway" in result.output
    code, out = run_cli(stack, "nodes")
    assert code == 0 and "node0-0" in out


def test_kairos_up_starts_everything_and_ctrl_c_stops_everything() -> None:
    """`make run` is `kairos up`: it prints the URL, the token and a live summary, serves
    jobs, and on Ctrl-C (SIGINT to its process group) leaves nothing running."""
    # outside pytest's 0700 tmp tree: the embedded PostgreSQL runs as its own user
    tmp_path = Path(tempfile.mkdtemp(prefix="kairos-up-"))
    port = free_port()
    env = {**os.environ, "KAIROS_PROFILE": str(tmp_path / "profile.json")}
    env.pop("KAIROS_KAFKA_BOOTSTRAP", None)
    env.pop("KAIROS_DATABASE_URL", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "kairos.cli", "up", "--nodes", "2", "--port", str(port)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 120
        assert proc.stdout is not None
        while not any("token:" in line for line in lines):
            assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
            lines.append(proc.stdout.readline())
        text = "".join(lines)
        assert f"http://127.0.0.1:{port}" in text
        token = re.search(r"token: (\S+)", text)[1]  # type: ignore[index]
        profile = json.loads((tmp_path / "profile.json").read_text())
        assert (profile["url"], profile["token"]) == (f"http://127.0.0.1:{port}", token)
        # and where `kairos check` / `kairos admin replay` find the broker and database
        assert profile["kafka_bootstrap"] and profile["database_url"].startswith("postgresql")
        r = httpx.post(f"http://127.0.0.1:{port}/v1/jobs",
                       headers={"Authorization": f"Bearer {token}"},
                       json={"name": "up", "duration": 0.1, "tasks": [{"name": "w"}]})
        assert r.status_code == 201
        children = psutil.Process(proc.pid).children(recursive=True)
        assert len(children) >= 6  # broker, four services, an agent (and PostgreSQL)
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "nothing left running" in out
    time.sleep(1)
    alive = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert alive == [], [c.cmdline() for c in alive]
    assert not (tmp_path / "profile.json").exists()
    shutil.rmtree(tmp_path, ignore_errors=True)
