"""Tenants end to end: an admin creates tokens with the CLI, two tenants run jobs through
the whole stack and cannot see or touch each other's, an admin sees both, and a revoked
token is refused. The embedded stack's development token is an admin."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from kairos.cli import app
from kairos.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.broker, pytest.mark.db]


def cli(stack: Stack, token: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, [*args, "--url", stack.url, "--token", token])
    return result.exit_code, result.output


def get(stack: Stack, token: str, path: str, **params: str) -> httpx.Response:
    return httpx.get(f"{stack.url}{path}", params=params,
                     headers={"Authorization": f"Bearer {token}"}, timeout=10)


def test_two_tenants_cannot_see_each_other_and_an_admin_sees_both(
        stack: Stack, tmp_path: Path) -> None:
    dev = stack.token or ""
    me = get(stack, dev, "/v1/me").json()
    assert (me["tenant"], me["user"], me["role"]) == ("default", "dev", "admin")

    code, out = cli(stack, dev, "token", "create", "--tenant", "vision", "--name", "alice",
                    "--expires-in", "1d")
    assert code == 0, out
    assert "shown only now" in out and "expires 20" in out
    alice = re.search(r"^token: (\S+)$", out, re.M)[1]  # type: ignore[index]
    code, bob = cli(stack, dev, "token", "create", "--tenant", "nlp", "--name", "bob", "-q")
    bob = bob.strip()
    assert code == 0 and bob.startswith("kairos_")

    # a user token manages no tokens
    code, out = cli(stack, alice, "token", "create", "--tenant", "vision", "--role", "admin")
    assert code == 1 and "403" in out and "admin role required" in out
    code, out = cli(stack, bob, "token", "list")
    assert code == 1 and "403" in out

    spec = tmp_path / "job.yaml"
    spec.write_text("name: tenant-job\nduration: 0.5\ntasks: [{name: w, resources: {gpu: 1}}]\n")
    jobs = {}
    for who, token in (("alice", alice), ("bob", bob)):
        code, out = cli(stack, token, "submit", str(spec))
        assert code == 0, out
        jobs[who] = re.search(r"submitted (j-[0-9a-f]+)", out)[1]  # type: ignore[index]

    deadline = time.monotonic() + 60
    for who, token in (("alice", alice), ("bob", bob)):
        while True:
            code, out = cli(stack, token, "describe", jobs[who])
            assert code == 0, out
            if "state=succeeded" in out:
                break
            assert "state=failed" not in out and time.monotonic() < deadline, out
            time.sleep(0.3)
    assert "tenant=vision" in cli(stack, alice, "describe", jobs["alice"])[1]

    # neither sees nor cancels the other's job: 404, as for a job that does not exist
    for token, other in ((alice, jobs["bob"]), (bob, jobs["alice"])):
        for command in ("describe", "cancel"):
            code, out = cli(stack, token, command, other)
            assert code == 1 and "404" in out and f"no job {other}" in out, out
    code, out = cli(stack, alice, "jobs", "--limit", "500")
    assert code == 0 and jobs["alice"] in out and jobs["bob"] not in out
    page = get(stack, alice, "/v1/jobs", limit="500").json()
    assert {j["tenant"] for j in page["items"]} == {"vision"}
    assert get(stack, bob, "/v1/jobs", tenant="vision").status_code == 403

    # the admin sees both tenants
    for who, tenant in (("alice", "vision"), ("bob", "nlp")):
        page = get(stack, dev, "/v1/jobs", tenant=tenant).json()
        assert [j["id"] for j in page["items"]] == [jobs[who]]
        assert get(stack, dev, f"/v1/jobs/{jobs[who]}").json()["user"] == who

    # tokens are listed without secrets, and a revoked one is refused at once
    code, out = cli(stack, dev, "token", "list")
    assert code == 0 and "alice" in out and "bob" in out and "dev" in out
    assert alice not in out and bob not in out
    alice_id = next(t["id"] for t in get(stack, dev, "/v1/tokens", tenant="vision").json())
    code, out = cli(stack, dev, "token", "revoke", alice_id)
    assert code == 0 and f"revoked {alice_id}" in out
    code, out = cli(stack, alice, "jobs")
    assert code == 1 and "401" in out and "token revoked" in out
    assert get(stack, dev, "/v1/tokens", tenant="vision").json()[0]["state"] == "revoked"
    assert get(stack, bob, f"/v1/jobs/{jobs['bob']}").status_code == 200
