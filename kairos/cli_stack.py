"""``kairos up|status|reset``: the embedded platform on this machine (what `make run`
starts), the table of its services, and wiping its state."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Annotated

import httpx
import typer
from rich.table import Column, Table

from kairos.cli_common import PROFILE, console, err
from kairos.cli_jobs import demo
from kairos.cli_output import OutputOpt, printed_as_data


def _summary(metrics_url: str) -> str:
    """One status line from the monitor's /metrics: nodes, GPUs allocated, jobs by state."""
    try:
        text = httpx.get(metrics_url, timeout=2).text
    except httpx.HTTPError:
        return "monitor unreachable"
    vals: dict[str, float] = {}
    for m in re.finditer(r'^(kairos_jobs|kairos_cluster_gpus|kairos_nodes)\{state="(\w+)"\} '
                         r'([0-9.e+]+)$', text, re.M):
        vals[f"{m[1]}.{m[2]}"] = float(m[3])
    jobs = " ".join(f"{s}={int(vals.get(f'kairos_jobs.{s}', 0))}" for s in (
        "admitted", "bound", "running", "succeeded", "failed", "cancelled"))
    return (f"nodes={int(vals.get('kairos_nodes.ready', 0))} "
            f"gpus={int(vals.get('kairos_cluster_gpus.allocated', 0))}/"
            f"{int(vals.get('kairos_cluster_gpus.total', 0))} allocated | jobs {jobs}")


def _saved_token() -> str | None:
    """The token of a profile a run that did not stop cleanly left behind (Stack then
    falls back to the one it keeps in its workdir): a restart keeps the CLI working."""
    try:
        return str(json.loads(PROFILE.read_text())["token"]) or None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def up(
    nodes: Annotated[int, typer.Option(help="simulated nodes")] = 4,
    gpus: Annotated[int, typer.Option(help="GPUs per simulated node")] = 8,
    nodes_per_agent: Annotated[int, typer.Option(
        help="simulated nodes per node-agent process: one agent fault takes down one "
        "slice of the cluster, as one node's agent does in production", min=1)] = 4,
    cluster: Annotated[Path | None, typer.Option(
        help="a mixed cluster: node groups of their own GPU model, labels and taints "
        "(examples/config/mixed-cluster.yaml); --nodes and --gpus then do not apply",
        exists=True, dir_okay=False)] = None,
    port: Annotated[int, typer.Option(help="gateway port")] = 8000,
    with_demo: Annotated[bool, typer.Option("--demo", help="submit example jobs")] = False,
    reset_first: Annotated[bool, typer.Option(
        "--reset", help="wipe the state of earlier runs first (jobs, tokens, queues)")] = False,
) -> None:
    """Start the whole platform on embedded defaults, keeping the state of earlier runs;
    a service that exits is restarted; Ctrl-C stops everything."""
    from kairos.cluster_spec import load_cluster
    from kairos.stack import Stack

    try:
        spec = load_cluster(cluster) if cluster is not None else None
    except ValueError as exc:  # pydantic's names the field; YAML's the line
        console.print(f"[red]{cluster}: {exc}[/]")
        raise typer.Exit(2) from exc
    if reset_first:
        reset()
    # KAIROS_DEV_TOKEN, when set, wins over a saved one (as it does in Stack)
    stack = Stack(nodes=nodes, gpus_per_node=gpus, nodes_per_agent=nodes_per_agent, cluster=spec,
                  admission_port=port, fresh=False,
                  token=os.environ.get("KAIROS_DEV_TOKEN") or _saved_token(),
                  say=lambda msg: console.print(msg, markup=False, highlight=False))
    console.print("starting broker, database and services ...")
    stopping = False

    def _stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    # Ctrl-C reaches this process alone (each part runs in a process group of its own):
    # Stack.stop then stops the parts in an order that loses nothing in flight.
    # Supervision runs in this loop, never after the flag is up, so a part stopped on
    # the way out is not restarted.
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGHUP, _stop)  # the terminal closed
    try:
        stack.start()
        PROFILE.parent.mkdir(parents=True, exist_ok=True)
        PROFILE.write_text(json.dumps({"url": stack.url, "token": stack.token,
                                       "kafka_bootstrap": stack.kafka_bootstrap,
                                       "database_url": stack.database_url}))
        monitor = stack.proc("monitor")
        console.print(f"[bold green]Kairos is up[/]  gateway: {stack.url}  (docs: {stack.url}/docs)")
        console.print(f"token: [bold]{stack.token}[/]   (saved in {PROFILE} for the CLI)")
        console.print(services_table(stack.services()))
        console.print(f"logs: {stack.workdir / 'logs'}   state kept in {stack.workdir} "
                      "(`make reset` wipes it)   Ctrl-C stops everything")
        if with_demo:
            demo(12, stack.url, stack.token)
        with console.status("") as status:
            while not stopping:
                stack.supervise_once()
                status.update(_summary(f"http://127.0.0.1:{monitor.port}/metrics"))
                time.sleep(1)
    finally:
        console.print("stopping ...")
        stack.stop()
        PROFILE.unlink(missing_ok=True)  # the token stays in the workdir for the next run
        console.print("stopped; nothing left running")


def services_table(rows: list[dict[str, str]], health: dict[str, str] | None = None
                   ) -> Table:
    """Every part of a stack (Stack.services()): where it is reached and its log; with
    ``health``, whether each answered."""
    t = Table("service", Column("url", overflow="fold"), Column("log", overflow="fold"),
              caption="each service's URL serves /healthz, /readyz and /metrics; "
                      "admission's is the gateway")
    if health is not None:
        t.add_column("health")
    for r in rows:
        cells = [r["name"], r["url"], r["log"] or "-"]
        if health is not None:
            cells.append(health.get(r["name"], "-"))
        t.add_row(*cells)
    return t


def _health(rows: list[dict[str, str]]) -> dict[str, str]:
    """'up' or 'down' for each part with an HTTP port, by its /healthz."""
    out = {}
    for r in rows:
        if not r["url"].startswith("http"):
            continue
        try:
            ok = httpx.get(f"{r['url']}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            ok = False
        out[r["name"]] = "up" if ok else "[red]down[/]"
    return out


def status(output: OutputOpt = None) -> None:
    """The running platform's services: URL, /metrics, log file and whether each
    answers (what `kairos up` saved in .kairos/services.json)."""
    from kairos.stack import SERVICES_FILE, WORKDIR

    path = WORKDIR / SERVICES_FILE
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        err.print(f"no platform running here ({path} {'unreadable' if path.exists() else 'missing'}"
                  f"): start one with `make run`")
        raise typer.Exit(1) from exc
    if printed_as_data(saved, output):
        return
    rows = saved["services"]
    console.print(f"gateway: {saved['gateway']}  (docs: {saved['gateway']}/docs)")
    console.print(services_table(rows, _health(rows)))


def reset() -> None:
    """Wipe the embedded platform's state: jobs, tokens, queues, agents' state, logs."""
    from kairos.stack import WORKDIR, wipe_state

    try:
        wipe_state(WORKDIR)
    except RuntimeError as exc:
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(1) from exc
    PROFILE.unlink(missing_ok=True)
    console.print("embedded state wiped")
