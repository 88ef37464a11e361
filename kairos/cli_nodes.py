"""``kairos nodes`` (nodes with their GPUs and allocation) and ``kairos node
cordon|drain|uncordon NODE`` (admin)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from kairos.cli_common import TokenOpt, UrlOpt, client, console, request
from kairos.cli_output import Col, OutputOpt, field, show, timestamp

node_app = typer.Typer(help="Node operations (admin): cordon, drain, uncordon.",
                       no_args_is_help=True, rich_markup_mode="markdown")

ReasonOpt = Annotated[str, typer.Option(help="why (shown by `kairos nodes`)")]


def gpu_health(gpus: list[dict[str, Any]]) -> str:
    """'ok', or how many GPUs are unhealthy by kind: '2 degraded'."""
    counts: dict[str, int] = {}
    for g in gpus:
        counts[g["health"]] = counts.get(g["health"], 0) + 1
    return ", ".join(f"{n} {h}" for h, n in sorted(counts.items())) or "ok"


def _state(n: dict[str, Any]) -> str:
    """Its state, and how it is cordoned or drained when it is."""
    if n.get("scheduling", "schedulable") == "schedulable":
        return str(n["state"])
    return f"{n['state']},{n['scheduling']}"


def _model(n: dict[str, Any]) -> str:
    """The name jobs ask for in gpuModel (its kairos.io/gpu-model label), else the
    product name an older agent reported."""
    inv = n["inventory"]
    named = inv.get("labels", {}).get("kairos.io/gpu-model")
    return str(named) if named else str(inv["gpus"][0]["model"]) if inv["gpus"] else "-"


def _labels(n: dict[str, Any]) -> str:
    """The node's own labels (those the platform sets are in other columns)."""
    own = {k: v for k, v in n["inventory"].get("labels", {}).items()
           if not k.startswith("kairos.io/")}
    return ",".join(f"{k}={v}" for k, v in sorted(own.items())) or "-"


def _taints(n: dict[str, Any]) -> str:
    return ",".join(n["inventory"].get("taints") or []) or "-"


NODE_COLUMNS = (
    Col("node", field("node_id"), whole=True),
    Col("state", _state),
    Col("gpus", field("gpus_total")),
    Col("allocated", field("gpus_allocated")),
    Col("shared", field("gpus_shared")),
    Col("health", lambda n: gpu_health(n.get("gpu_health") or [])),
    Col("model", _model),
    Col("labels", _labels, wide=True),
    Col("taints", _taints, wide=True),
    Col("why", field("scheduling_reason"), wide=True),
    Col("heartbeat", timestamp("last_heartbeat"), wide=True),
)


def nodes(output: OutputOpt = None, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Nodes with their GPUs and allocation."""
    with client(url, token) as c:
        rows = request(c, "GET", "/v1/nodes")
    show(console, rows, NODE_COLUMNS, output)


def _command(action: str, node_id: str, body: dict[str, object], url: str | None,
             token: str | None) -> None:
    with client(url, token) as c:
        out = request(c, "POST", f"/v1/nodes/{node_id}/{action}", json=body)
    console.print(f"node [bold]{out['node_id']}[/] {out['scheduling']} "
                  f"(generation {out['generation']})")


@node_app.command("cordon")
def cordon(node_id: str, reason: ReasonOpt = "", url: UrlOpt = None,
           token: TokenOpt = None) -> None:
    """Place nothing new on NODE; what runs there goes on (like kubectl cordon)."""
    _command("cordon", node_id, {"reason": reason}, url, token)


@node_app.command("drain")
def drain(
    node_id: str, reason: ReasonOpt = "",
    grace_period: Annotated[float, typer.Option(
        help="seconds each task gets to checkpoint before it is killed")] = 30.0,
    url: UrlOpt = None, token: TokenOpt = None,
) -> None:
    """Cordon NODE and stop its tasks gracefully; their jobs are requeued, not failed."""
    _command("drain", node_id, {"reason": reason, "grace_period_s": grace_period}, url, token)


@node_app.command("uncordon")
def uncordon(node_id: str, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Let NODE take new work again."""
    _command("uncordon", node_id, {}, url, token)
