"""``kairos submit|describe|jobs|cancel|demo``: a user's jobs and job arrays."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
import yaml
from rich.table import Table

from kairos import cli_dryrun
from kairos.cli_common import TokenOpt, UrlOpt, client, console, err, request
from kairos.cli_forecast import START_COLUMNS, forecast_line
from kairos.cli_output import Col, OutputOpt, field, printed_as_data, show, timestamp
from shared.job_array import is_array_id


def submit(
    file: Annotated[Path, typer.Argument(help="job spec, YAML or JSON", exists=True,
                                         dir_okay=False)],
    url: UrlOpt = None, token: TokenOpt = None,
    idempotency_key: Annotated[str | None, typer.Option(help="makes a retry safe")] = None,
    array: Annotated[str | None, typer.Option(
        "--array", "-a", help="a job array, as sbatch --array: 0-999, 1,3,5-7, 0-15:4, and "
        "%N to run at most N at once (0-999%50); the file's own `array` is replaced")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="print only the job id "
                                        "(like sbatch --parsable)")] = False,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="submit nothing: check the spec and quota and say when it would "
        "start (like sbatch --test-only)")] = False,
    what_if: Annotated[str | None, typer.Option(
        "--what-if", help="with --dry-run: compare shapes side by side, one of gpu=8,16,32 "
        "(total GPUs), replicas=2,4 or gpu-per-replica=1,2 (of the task with GPUs)")] = None,
    output: OutputOpt = None,
) -> None:
    """Submit a job or a job array (like sbatch / vcctl job run); with --dry-run, only
    say what would happen."""
    if what_if is not None and not dry_run:
        err.print("[red]--what-if compares dry runs: add --dry-run[/]")
        raise typer.Exit(2)
    headers = {"Content-Type": "application/yaml"}
    body = file.read_bytes()
    if array is not None:
        try:
            spec = yaml.safe_load(body)
        except yaml.YAMLError as exc:
            err.print(f"[red]{file} is not valid YAML or JSON[/]: {exc}")
            raise typer.Exit(2) from exc
        if not isinstance(spec, dict):
            err.print(f"[red]{file} does not hold a job spec (a mapping)[/]")
            raise typer.Exit(2)
        body = json.dumps({**spec, "array": array}).encode()
        headers["Content-Type"] = "application/json"
    if dry_run:
        cli_dryrun.dry_run(body, headers, what_if, output, url, token)
        return
    if idempotency_key:
        headers["Idempotency-Key"] = idempotency_key
    with client(url, token) as c:
        job = request(c, "POST", "/v1/jobs", content=body, headers=headers)
    if printed_as_data(job, output):
        return
    if quiet:
        print(job["id"])
        return
    if "size" in job:  # an array
        cap = f", at most {job['max_running']} at once" if job.get("max_running") else ""
        console.print(f"submitted array [bold]{job['id']}[/] ({job['name']}): {job['size']} "
                      f"jobs {job['id']}-<index> for {job['indices']}{cap}, to queue "
                      f"{job['queue']}")
        return
    console.print(f"submitted [bold]{job['id']}[/] ({job['name']}) to queue {job['queue']}")


def _describe_array(c: httpx.Client, array_id: str) -> None:
    arr = request(c, "GET", f"/v1/arrays/{array_id}")
    cap = f"  at most {arr['max_running']} at once" if arr.get("max_running") else ""
    console.print(f"[bold]{arr['id']}[/] {arr['name']}  queue={arr['queue']} "
                  f"tenant={arr['tenant']}  array {arr['indices']} ({arr['size']} jobs){cap}")
    t = Table("state", "jobs", title="elements")
    for state, n in sorted(arr["states"].items()):
        t.add_row(state, str(n))
    console.print(t)


def describe(job_id: str, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """A job's state, placement and the history of its transitions with reasons (for a
    job array: its elements counted by state)."""
    with client(url, token) as c:
        if is_array_id(job_id):
            _describe_array(c, job_id)
            return
        job = request(c, "GET", f"/v1/jobs/{job_id}")
    console.print(f"[bold]{job['id']}[/] {job['name']}  queue={job['queue']} "
                  f"tenant={job['tenant']}  state=[bold]{job['state']}[/] ({job['reason']}) "
                  f"attempt={job['attempt']}")
    if job.get("waiting"):  # still in its queue: why, and when it may start
        w = job["waiting"]
        eta = f", estimated start {w['estimated_start'][:19]}" if w.get("estimated_start") else ""
        console.print(f"waiting in queue {w['queue']}: position {w['position']}, "
                      f"{_why(w)} ({w['detail']}){eta}")
    if job.get("placement_wait"):  # admitted: why the scheduler has not placed it yet
        w = job["placement_wait"]
        eta = f", estimated start {w['estimated_start'][:19]}" if w.get("estimated_start") else ""
        console.print(f"waiting for GPUs: {_why(w)} ({w['detail']}){eta}")
    if job.get("forecast"):  # the forecaster's: when, where, within which band
        console.print(forecast_line(job["forecast"]), highlight=False)
    if job.get("placement"):
        t = Table("task", "node", "gpus", title="placement")
        for p in job["placement"]:
            gpus = ", ".join(f"{g['index']}{_gpu_part(g)}" for g in p["gpus"])
            t.add_row(p["task_id"], p["node_id"], gpus or "-")
        console.print(t)
    t = Table("time", "state", "task", "node", "code", "reason", "exit", title="history")
    for h in job["history"]:
        t.add_row(h["occurred_at"][11:23], h["state"], h.get("task") or "job",
                  h.get("node_id") or "", h.get("reason_code") or "", h["reason"],
                  "" if h.get("exit_code") is None else str(h["exit_code"]))
    console.print(t)


def _gpu_part(g: dict[str, Any]) -> str:
    """What of a GPU a task holds, after its index: a MIG instance, a share, or all of it."""
    if g.get("mig_profile"):
        return f" (MIG {g['mig_profile']} at slice {g.get('mig_start', 0)})"
    return f" ({g['memory_mib']} MiB, {g['compute_pct']}%)" if g.get("memory_mib") else ""


def _why(wait: dict[str, Any]) -> str:
    """A wait's code, and the job it waits behind when it names one."""
    behind = wait.get("blocked_by")
    return f"{wait['reason']}, behind {behind}" if behind else str(wait["reason"])


JOB_COLUMNS = (
    Col("job", field("id"), whole=True),  # ids stay whole: they are copied
    Col("name", field("name")),
    Col("queue", field("queue")),
    Col("user", field("user")),
    Col("tenant", field("tenant"), wide=True),
    Col("state", field("state")),
    Col("attempt", field("attempt")),
    Col("reason", field("reason")),
    Col("exit", field("exit_code"), wide=True),
    Col("submitted", timestamp("submitted_at")),
    Col("updated", timestamp("updated_at"), wide=True),
)


def jobs(
    state: Annotated[str | None, typer.Option(help="only jobs in this state")] = None,
    queue: Annotated[str | None, typer.Option(help="only jobs of this queue")] = None,
    user: Annotated[str | None, typer.Option(help="only jobs this user submitted")] = None,
    tenant: Annotated[str | None, typer.Option(help="only this tenant's jobs (admin)")] = None,
    array: Annotated[str | None, typer.Option(help="only this job array's elements")] = None,
    limit: Annotated[int, typer.Option(help="at most this many", min=1)] = 50,
    start: Annotated[bool, typer.Option("--start", help="waiting jobs with their expected "
                                        "start, band and nodes (like squeue --start)")] = False,
    output: OutputOpt = None, url: UrlOpt = None, token: TokenOpt = None,
) -> None:
    """Jobs with their state (like squeue / vcctl job list)."""
    if start:
        with client(url, token) as c:
            page = request(c, "GET", "/v1/forecasts", params={k: v for k, v in (
                ("queue", queue), ("tenant", tenant), ("limit", min(limit, 5000))) if v})
        show(console, page["items"], START_COLUMNS, output)
        return
    params: dict[str, Any] = {k: v for k, v in (
        ("state", state), ("queue", queue), ("user", user), ("tenant", tenant),
        ("array", array)) if v}
    items: list[dict[str, Any]] = []
    with client(url, token) as c:
        while len(items) < limit:  # page by cursor: stable while jobs come and go
            page = request(c, "GET", "/v1/jobs",
                           params={**params, "limit": min(500, limit - len(items))})
            items += page["items"]
            if not page.get("next_cursor"):
                break
            params["cursor"] = page["next_cursor"]
    show(console, items, JOB_COLUMNS, output)


def cancel(job_id: str, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Cancel a job, or every element of a job array not ended yet (like scancel)."""
    with client(url, token) as c:
        if is_array_id(job_id):
            arr = request(c, "DELETE", f"/v1/arrays/{job_id}")
            console.print(f"cancel requested for {arr['cancelled']} jobs of array {job_id}")
            return
        request(c, "DELETE", f"/v1/jobs/{job_id}")
    console.print(f"cancel requested for {job_id}")


DEMO_DIR = Path(__file__).resolve().parent.parent / "examples"


def _demo_jobs(n: int, seed: int = 7) -> list[bytes]:
    files = sorted(DEMO_DIR.glob("*.yaml"))
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        spec = yaml.safe_load(rnd.choice(files).read_text())
        spec["duration"] = rnd.choice([3, 5, 8, 13])
        out.append(json.dumps(spec).encode())
    return out


def demo(count: Annotated[int, typer.Option(help="jobs to submit")] = 20,
         url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Submit a mix of the example jobs so you can watch them flow."""
    with client(url, token) as c:
        for body in _demo_jobs(count):
            job = request(c, "POST", "/v1/jobs", content=body,
                          headers={"Content-Type": "application/json"})
            console.print(f"submitted {job['id']} {job['name']}")
