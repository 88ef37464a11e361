"""``kairos logs JOB [--task T] [--attempt N] [--tail N] [--follow]``: a task's output."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import httpx
import typer

from kairos.cli_common import TokenOpt, UrlOpt, client, err, fail


def logs(
    job_id: str,
    task: Annotated[str | None, typer.Option("--task", "-t", help=(
        "the task, e.g. worker-1 (default: the job's first)"))] = None,
    attempt: Annotated[int | None, typer.Option(help="the attempt (default: the latest)")] = None,
    tail: Annotated[int | None, typer.Option(help="only the last N lines")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help=(
        "keep printing new output until the task ends"))] = False,
    url: UrlOpt = None, token: TokenOpt = None,
) -> None:
    """Print a task's output (stdout and stderr), fetched from its node's agent."""
    params: dict[str, Any] = {"follow": follow}
    for name, value in (("task", task), ("attempt", attempt), ("tail", tail)):
        if value is not None:
            params[name] = value
    with client(url, token) as c:
        try:
            with c.stream("GET", f"/v1/jobs/{job_id}/logs", params=params,
                          timeout=httpx.Timeout(30, read=None if follow else 30)) as r:
                if r.status_code >= 400:
                    r.read()
                    fail(r)
                shown = r.headers.get("x-kairos-task", "")
                if task is None and shown:
                    err.print(f"[dim]task {shown.split('/')[1]} (attempt {shown.split('/')[2]}) "
                              f"on node {r.headers.get('x-kairos-node', '?')}[/]")
                for chunk in r.iter_raw():
                    sys.stdout.buffer.write(chunk)
                    sys.stdout.flush()
        except httpx.HTTPError as exc:
            err.print(f"[red]cannot reach the gateway[/] at {c.base_url}: {exc}")
            raise typer.Exit(3) from exc
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
