"""Every job file in examples/ (files of another kind, like a queues file, are skipped by
their `kind`) submitted with the CLI to the whole stack, followed with `kairos watch`
until it ends, then described, listed with filters, and counted in `kairos usage`."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from kairos.cli import app
from kairos.stack import Stack
from shared.jobspec import JOB_KINDS

pytestmark = [pytest.mark.e2e, pytest.mark.broker, pytest.mark.db]
EXAMPLES = Path(__file__).parents[2] / "examples"


def run_cli(stack: Stack, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, [*args, "--url", stack.url, "--token", stack.token or ""])
    return result.exit_code, result.output


def job_files() -> list[Path]:
    files = []
    for path in sorted(EXAMPLES.rglob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        if isinstance(doc, dict) and doc.get("kind", "Job") in JOB_KINDS and "tasks" in doc:
            files.append(path)
    return files


def test_every_example_is_a_job_the_tests_know() -> None:
    names = {p.name for p in job_files()}
    assert {"single-gpu.yaml", "data-parallel-gang.yaml", "ps-worker.yaml",
            "fractional-gpu.yaml", "elastic.yaml"} <= names
    assert not any("queues" in n for n in names)  # a queues file is not a job


def test_submit_every_example_and_watch_it_succeed(stack: Stack) -> None:
    started = time.time()
    ids: dict[str, str] = {}
    for example in job_files():
        code, out = run_cli(stack, "submit", str(example))
        assert code == 0, (example.name, out)
        ids[example.name] = re.search(r"submitted (j-[0-9a-f]+)", out)[1]  # type: ignore[index]
    for name, job_id in ids.items():
        code, out = run_cli(stack, "watch", job_id)  # returns when the job ends
        assert code == 0, (name, out)
        assert f"job {job_id} succeeded" in out and "running" in out, out
        code, out = run_cli(stack, "describe", job_id)
        flat = " ".join(out.split())  # the header wraps at the terminal's width
        assert code == 0 and "state=succeeded" in flat and "all tasks succeeded" in flat, out

    code, out = run_cli(stack, "jobs", "--state", "succeeded", "--limit", "2000")
    assert code == 0 and all(job_id in out for job_id in ids.values())
    code, out = run_cli(stack, "jobs", "--user", "dev", "--tenant", "default", "--limit", "2000")
    assert code == 0 and all(job_id in out for job_id in ids.values())
    code, out = run_cli(stack, "jobs", "--user", "nobody")
    assert code == 0 and not any(job_id in out for job_id in ids.values())
    code, out = run_cli(stack, "jobs", "--state", "flying")
    assert code == 1 and "query.state" in out  # the gateway's 422 names the parameter

    # what they ran is counted: GPU-hours of tenant default since the test started
    since = f"{int(time.time() - started) + 5}s"
    code, out = run_cli(stack, "usage", "--from", since)
    assert code == 0, out
    row = next(ln for ln in out.splitlines() if " default " in ln and "│" in ln)
    assert float(row.split("│")[3]) > 0, out


def test_watch_says_how_a_cancelled_or_unknown_job_ended(stack: Stack, tmp_path: Path) -> None:
    spec = tmp_path / "long.yaml"
    spec.write_text("name: long\nduration: 600\ntasks: [{name: w, resources: {gpu: 1}}]\n")
    code, out = run_cli(stack, "submit", "--quiet", str(spec))  # only the id, for scripts
    assert code == 0 and re.fullmatch(r"j-[0-9a-f]+\n", out), out
    job_id = out.strip()
    assert run_cli(stack, "cancel", job_id)[0] == 0
    code, out = run_cli(stack, "watch", job_id, "--no-tasks")
    assert code == 5 and f"job {job_id} cancelled" in out, out
    code, out = run_cli(stack, "watch", "j-0000000000000000")
    assert code == 1 and "404" in out
