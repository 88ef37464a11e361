"""`make run PORT=...` moves the gateway (issue 19): the Makefile passes it to
`kairos up --port`, and `make help` says so."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def make(*args: str) -> str:
    """What make would run (-n: nothing is run; the stamp's install steps may be listed)."""
    return subprocess.run(["make", "-n", *args], cwd=ROOT, capture_output=True, text=True,
                          check=True, timeout=60).stdout


def up_line(*args: str) -> str:
    return next(ln for ln in make("run", *args).splitlines() if "kairos up" in ln)


def test_make_run_passes_port_to_kairos_up() -> None:
    assert "--port 8123" in up_line("PORT=8123")
    assert "--port 8123" in up_line("PORT=8123", "DEMO=1") and "--demo" in up_line("DEMO=1")


def test_make_run_without_port_keeps_kairos_ups_default() -> None:
    assert "--port" not in up_line()


def test_make_help_documents_port() -> None:
    out = subprocess.run(["make", "help"], cwd=ROOT, capture_output=True, text=True,
                         check=True, timeout=60).stdout
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)  # without the bold
    run = next(ln for ln in plain.splitlines() if ln.split()[:1] == ["run"])
    assert "PORT=" in run


def test_the_readme_documents_port() -> None:
    assert "make run PORT=" in (ROOT / "README.md").read_text()
