"""``kairos watch JOB`` (a job's status changes, live, from the gateway's event stream)
and ``kairos usage`` (GPU-hours per tenant and queue).

Exit codes of ``watch``: 0 the job succeeded, 4 it failed, 5 it was cancelled; as for
every command, 1 the gateway refused the request, 2 no gateway configured, 3 the
gateway could not be reached (after retries, for a stream that broke).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Annotated, Any

import httpx
import typer
from rich.markup import escape

from kairos.cli_common import (
    TokenOpt,
    UrlOpt,
    client,
    console,
    err,
    fail,
    request,
)
from kairos.cli_output import Col, Output, OutputOpt, field, printed_as_data, table
from shared.durations import parse_duration

EXIT = {"succeeded": 0, "failed": 4, "cancelled": 5}
RETRIES = 5  # consecutive broken connections before giving up


def sse_events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """{event, id, data} of each event of a text/event-stream (comments skipped)."""
    event: dict[str, Any] = {}
    for line in lines:
        if not line:
            if "data" in event:
                event["data"] = json.loads(event["data"])
                yield event
            event = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            event[name] = value.removeprefix(" ")


def _show(e: dict[str, Any], tasks: bool) -> None:
    d = e["data"]
    if d.get("task") and not tasks:
        return
    when = d["occurred_at"][11:23]
    what = d.get("task") or "job"
    extra = f" on {d['node_id']}" if d.get("node_id") else ""
    if d.get("exit_code") is not None:
        extra += f" (exit {d['exit_code']})"
    colour = {"succeeded": "green", "failed": "red", "cancelled": "yellow"}.get(d["state"], "")
    state = f"[{colour}]{d['state']}[/]" if colour else d["state"]
    console.print(f"{when}  {what:<14} {state:<10} {escape(d['reason'])}{extra}")


def watch(
    job_id: str,
    tasks: Annotated[bool, typer.Option("--tasks/--no-tasks",
                                        help="show each task's changes too")] = True,
    url: UrlOpt = None, token: TokenOpt = None,
) -> None:
    """Follow a job live until it ends; exit 0 if it succeeded (4 failed, 5 cancelled)."""
    last: str | None = None
    broken = 0
    with client(url, token) as c:
        while True:
            headers = {"Accept": "text/event-stream"}
            if last:
                headers["Last-Event-ID"] = last  # resume where the broken stream stopped
            try:
                with c.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers,
                              timeout=httpx.Timeout(30, read=90)) as r:
                    if r.status_code >= 400:
                        r.read()
                        fail(r)
                    broken = 0
                    for e in sse_events(r.iter_lines()):
                        if e.get("event") == "end":
                            final = e["data"]
                            console.print(f"job {job_id} [bold]{final['state']}[/] "
                                          f"({escape(final['reason'])})")
                            raise typer.Exit(EXIT.get(final["state"], 1))
                        last = e.get("id") or last
                        _show(e, tasks)
            except httpx.HTTPError as exc:
                broken += 1
                if broken > RETRIES:
                    err.print(f"[red]cannot reach the gateway[/] at {c.base_url}: {exc}")
                    raise typer.Exit(3) from exc
                err.print(f"[dim]stream broken ({exc.__class__.__name__}); reconnecting[/]")
                time.sleep(min(8.0, 0.5 * 2 ** broken))
            except KeyboardInterrupt:
                raise typer.Exit(130) from None
            # a stream that closed without `end` (a replica going away): reconnect


def _when(value: str | None, option: str) -> str | None:
    """An ISO time, or a duration back from now (7d, 12h)."""
    if value is None:
        return None
    try:
        return datetime.fromisoformat(value).isoformat()
    except ValueError:
        pass
    try:
        return (datetime.now(UTC) - parse_duration(value)).isoformat()
    except ValueError as exc:
        err.print(f"[red]{option}[/]: {value!r} is neither an ISO time nor a duration "
                  "(7d, 12h, 90m)")
        raise typer.Exit(2) from exc


USAGE_COLUMNS = (
    Col("tenant", field("tenant")),
    Col("queue", field("queue")),
    Col("GPU-hours", lambda q: f"{q['gpu_hours']:.2f}"),
    Col("of which shared", lambda q: f"{q['shared_gpu_hours']:.2f}"),
    Col("billed", lambda q: f"{q.get('billed_gpu_hours', q['gpu_hours']):.2f}"),
    Col("by model", lambda q: ", ".join(
        f"{m or '?'} {h:.2f}" for m, h in sorted((q.get("gpu_hours_by_model") or {}).items())
        ) or "-", wide=True),
    Col("runs", field("runs")),
)


def usage(
    from_: Annotated[str | None, typer.Option(
        "--from", help="ISO time or a duration back from now (7d); default: a day ago")] = None,
    to: Annotated[str | None, typer.Option(help="ISO time or a duration ago; default: now")
                  ] = None,
    tenant: Annotated[str | None, typer.Option(help="only this tenant (admin)")] = None,
    output: OutputOpt = None, url: UrlOpt = None, token: TokenOpt = None,
) -> None:
    """GPU-hours used per tenant and queue (like sreport); GPU shares count their fraction;
    billed: each model's hours at its queue's billing weight (-o wide: hours per model)."""
    params = {k: v for k, v in (("from", _when(from_, "--from")), ("to", _when(to, "--to")),
                                ("tenant", tenant)) if v}
    with client(url, token) as c:
        report = request(c, "GET", "/v1/usage", params=params)
    if printed_as_data(report, output):  # the whole report, totals included
        return
    rows = [q | {"tenant": ten["tenant"]} for ten in report["tenants"] for q in ten["queues"]]
    t = table(rows, USAGE_COLUMNS, wide=output is Output.WIDE,
              title=f"usage {report['from'][:16]} .. {report['to'][:16]} (UTC)")
    blanks = [""] * (len(t.columns) - 5)
    t.add_row("[bold]all[/]", "", f"[bold]{report['gpu_hours']:.2f}[/]", "",
              f"[bold]{report.get('billed_gpu_hours', report['gpu_hours']):.2f}[/]", *blanks)
    console.print(t)
