"""The `kairos` CLI configured by KAIROS_URL / KAIROS_TOKEN, as a user's shell would run
it (a separate process, its own environment) against the running gateway: the variables
alone are enough, they win over the profile file, flags win over them, and a wrong or
missing one gives a clear error and exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kairos.embedded import free_port
from kairos.stack import Stack

pytestmark = [pytest.mark.e2e]


def kairos(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``kairos ARGS`` with only these KAIROS_* variables (the profile unless given is a
    file that does not exist)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KAIROS_")}
    clean["KAIROS_PROFILE"] = str(tmp_path / "no-profile.json")
    clean["COLUMNS"] = "200"  # rich wraps tables at the terminal width
    return subprocess.run([sys.executable, "-m", "kairos.cli", *args], cwd=tmp_path,
                          env={**clean, **env}, capture_output=True, text=True, timeout=120)


def test_kairos_url_and_token_configure_the_cli(stack: Stack, tmp_path: Path) -> None:
    assert stack.token
    admin = {"KAIROS_URL": stack.url, "KAIROS_TOKEN": stack.token}
    made = kairos(tmp_path, "token", "create", "--tenant", "envtest", "--quiet", **admin)
    assert made.returncode == 0, made.stderr
    user = {"KAIROS_URL": stack.url, "KAIROS_TOKEN": made.stdout.strip()}

    job = tmp_path / "job.yaml"
    job.write_text("name: from-env\nduration: 0.1\ntasks: [{name: w, resources: {gpu: 1}}]\n")
    r = kairos(tmp_path, "submit", str(job), **user)
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.split()[1]
    r = kairos(tmp_path, "describe", job_id, **user)
    assert r.returncode == 0 and "tenant=envtest" in r.stdout, r.stdout + r.stderr
    r = kairos(tmp_path, "jobs", **user)  # the user token sees its tenant's jobs only
    assert r.returncode == 0 and job_id in r.stdout
    r = kairos(tmp_path, "jobs", "--limit", "500", **admin)
    assert r.returncode == 0 and job_id in r.stdout

    # the variables win over the profile file, which names a dead gateway and a bad token
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"url": f"http://127.0.0.1:{free_port()}", "token": "x"}))
    r = kairos(tmp_path, "describe", job_id, KAIROS_PROFILE=str(profile), **user)
    assert r.returncode == 0 and job_id in r.stdout, r.stderr
    # ... and --url / --token win over the variables
    r = kairos(tmp_path, "describe", job_id, "--token", user["KAIROS_TOKEN"],
               KAIROS_URL=stack.url, KAIROS_TOKEN="kairos_wrong")
    assert r.returncode == 0 and job_id in r.stdout, r.stderr


def test_a_wrong_or_missing_variable_is_a_clear_error(stack: Stack, tmp_path: Path) -> None:
    r = kairos(tmp_path, "jobs", KAIROS_URL=stack.url, KAIROS_TOKEN="kairos_wrong")
    assert r.returncode == 1 and "error 401" in r.stderr and "invalid token" in r.stderr
    r = kairos(tmp_path, "jobs", KAIROS_URL=f"http://127.0.0.1:{free_port()}",
               KAIROS_TOKEN=stack.token or "")
    assert r.returncode == 3 and "cannot reach the gateway" in r.stderr
    r = kairos(tmp_path, "jobs", KAIROS_URL=stack.url)  # no token anywhere
    assert r.returncode == 2 and "no gateway configured" in r.stderr
    assert "KAIROS_TOKEN" in r.stderr
