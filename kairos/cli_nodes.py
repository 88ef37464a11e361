"""``kairos nodes`` (nodes with their GPUs and allocation) and ``kairos node
cordon|drain|uncordon|label|taint NODE`` (admin)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from kairos.cli_common import TokenOpt, UrlOpt, client, console, err, request
from kairos.cli_output import Col, OutputOpt, field, show, timestamp

node_app = typer.Typer(help="Node operations (admin): cordon, drain, uncordon, label, taint.",
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
    """The node's own labels, its agent's and an admin's (those the platform sets are in
    other columns)."""
    own = {k: v for k, v in {**n["inventory"].get("labels", {}),
                             **(n.get("admin_labels") or {})}.items()
           if not k.startswith("kairos.io/")}
    return ",".join(f"{k}={v}" for k, v in sorted(own.items())) or "-"


def _taints(n: dict[str, Any]) -> str:
    every = dict.fromkeys([*(n["inventory"].get("taints") or []), *(n.get("admin_taints") or [])])
    return ",".join(every) or "-"


def _mig(n: dict[str, Any]) -> str:
    """The MIG geometry of its MIG-mode GPUs, alike GPUs counted: '2x 3g.40gb+2g.20gb'."""
    geoms: dict[str, int] = {}
    for g in n["inventory"]["gpus"]:
        if g.get("mig_mode"):
            shape = "+".join(m["profile"] for m in g.get("mig_instances") or []) or "none"
            geoms[shape] = geoms.get(shape, 0) + 1
    return ", ".join(f"{k}x {shape}" for shape, k in geoms.items()) or "-"


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
    Col("mig", _mig, wide=True),
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


def _node(c: Any, node_id: str) -> dict[str, Any]:
    found = [n for n in request(c, "GET", "/v1/nodes") if n["node_id"] == node_id]
    if not found:
        err.print(f"[red]no node {node_id}[/]")
        raise typer.Exit(1)
    return found[0]


def _changes(items: list[str], what: str) -> tuple[dict[str, str], set[str]]:
    """``key=value`` to set and ``key-`` to remove, as kubectl writes them."""
    sets: dict[str, str] = {}
    removes: set[str] = set()
    for item in items:
        if item.endswith("-"):
            removes.add(item[:-1])
        elif what == "label" and "=" in item:
            key, _, value = item.partition("=")
            sets[key] = value
        elif what == "taint":
            sets[item] = ""
        else:
            err.print(f"[red]{item}[/]: give key=value to set, key- to remove")
            raise typer.Exit(2)
    return sets, removes


def _show_labels(out: dict[str, Any]) -> None:
    labels = ",".join(f"{k}={v}" for k, v in sorted(out["labels"].items())) or "-"
    console.print(f"node [bold]{out['node_id']}[/]: labels {labels}; taints "
                  f"{','.join(out['taints']) or '-'} (generation {out['generation']})")


@node_app.command("label")
def label(node_id: str, changes: Annotated[list[str], typer.Argument(
              help="key=value to set, key- to remove")],
          url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Set or remove an admin's labels on NODE (like kubectl label); jobs reach them
    with nodeSelector. The agent's own labels stay."""
    sets, removes = _changes(changes, "label")
    with client(url, token) as c:
        current = dict(_node(c, node_id).get("admin_labels") or {})
        labels = {k: v for k, v in {**current, **sets}.items() if k not in removes}
        _show_labels(request(c, "PUT", f"/v1/nodes/{node_id}/labels", json={"labels": labels}))


@node_app.command("taint")
def taint(node_id: str, changes: Annotated[list[str], typer.Argument(
              help="key=value:Effect to add; key- or key=value:Effect- to remove")],
          url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Add or remove an admin's taints on NODE (like kubectl taint): NoSchedule keeps
    out jobs that do not tolerate it; what runs there goes on."""
    sets, removes = _changes(changes, "taint")
    with client(url, token) as c:
        current = list(_node(c, node_id).get("admin_taints") or [])
        kept = [t for t in current if t not in removes
                and t.partition("=")[0].partition(":")[0] not in removes]
        taints = list(dict.fromkeys([*kept, *sets]))
        _show_labels(request(c, "PUT", f"/v1/nodes/{node_id}/taints", json={"taints": taints}))
