"""``kairos env request|list|return``: interactive GPU environments."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from kairos.cli_common import TokenOpt, UrlOpt, client, console, err, request
from kairos.cli_output import Col, OutputOpt, field, show, timestamp

env_app = typer.Typer(help="Interactive GPU environments: request, list, return.",
                      no_args_is_help=True, rich_markup_mode="markdown")


def _where(e: dict[str, Any]) -> str:
    c = e.get("connection")
    if not c:
        return "-"
    where = c.get("service") or f"{c['host']}:{c['port']}"
    return where + (" (simulated)" if c.get("simulated") else "")


@env_app.command("request")
def env_request(
    gpu: Annotated[int | None, typer.Option(help="whole GPUs (default 1)")] = None,
    gpu_memory: Annotated[int, typer.Option(help="MiB of one shared GPU")] = 0,
    gpu_compute: Annotated[int, typer.Option(help="percent of one shared GPU")] = 0,
    time_limit: Annotated[int, typer.Option(help="seconds it is held at most")] = 3600,
    name: Annotated[str, typer.Option(help="a name for it")] = "env",
    queue: Annotated[str, typer.Option(help="the queue it waits in")] = "default",
    image: Annotated[str | None, typer.Option(help="container image")] = None,
    command: Annotated[str | None, typer.Option(
        help="what runs (split on spaces); it listens on $KAIROS_PORT")] = None,
    wait: Annotated[float, typer.Option(
        help="seconds to wait for it to run and print where to connect; 0 = do not")] = 0,
    url: UrlOpt = None, token: TokenOpt = None,
) -> None:
    """Request an environment; it waits in its queue like any job."""
    body: dict[str, Any] = {"name": name, "queue": queue, "timeLimit": time_limit,
                            "gpuMemory": gpu_memory, "gpuCompute": gpu_compute}
    if gpu is not None:
        body["gpu"] = gpu
    if image:
        body["image"] = image
    if command:
        body["command"] = command.split()
    with client(url, token) as c:
        env = request(c, "POST", "/v1/environments", json=body)
        console.print(f"requested [bold]{env['id']}[/] ({env['name']}) in queue {env['queue']}")
        deadline = time.monotonic() + wait
        while wait and env["state"] not in ("running", "succeeded", "failed", "cancelled"):
            if time.monotonic() > deadline:
                err.print(f"still {env['state']} ({env['reason']}) after {wait:g}s")
                raise typer.Exit(4)
            time.sleep(0.5)
            env = request(c, "GET", f"/v1/environments/{env['id']}")
    if wait:
        console.print(f"{env['state']}: connect to {_where(env)}")


def _gpus(e: dict[str, Any]) -> str:
    r = e["resources"]
    return str(r.get("gpu") or f"{r.get('gpuMemory', 0)}MiB/{r.get('gpuCompute', 0)}%")


ENV_COLUMNS = (
    Col("id", field("id"), whole=True),  # ids and ports stay whole: they are copied
    Col("name", field("name")),
    Col("queue", field("queue"), wide=True),
    Col("user", field("user"), wide=True),
    Col("state", field("state")),
    Col("gpus", _gpus),
    Col("limit", lambda e: f"{e['time_limit_s']}s"),
    Col("expires", timestamp("expires_at"), wide=True),
    Col("connect to", _where, whole=True),
)


@env_app.command("list")
def list_(output: OutputOpt = None, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Your tenant's environments (an admin's: every tenant's)."""
    with client(url, token) as c:
        page = request(c, "GET", "/v1/environments")
    show(console, page["items"], ENV_COLUMNS, output)


@env_app.command("return")
def return_(env_id: str, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Hand the environment back: its session stops and its GPUs are freed."""
    with client(url, token) as c:
        request(c, "DELETE", f"/v1/environments/{env_id}")
    console.print(f"returned [bold]{env_id}[/]")
