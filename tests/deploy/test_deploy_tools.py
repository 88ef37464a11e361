"""The tools the deploy tests need are installed (scripts/install-deploy-tools.sh)."""

from __future__ import annotations

import pytest

from .conftest import INSTALL_HINT, MISSING_PACKAGES, run, tool


def test_python_tools_installed() -> None:
    assert not MISSING_PACKAGES, f"missing {', '.join(MISSING_PACKAGES)}: {INSTALL_HINT}"


@pytest.mark.parametrize("name", ["promtool", "prometheus", "check-jsonschema", "hadolint"])
def test_command_line_tools_installed(name: str) -> None:
    proc = run([tool(name), "--version"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
