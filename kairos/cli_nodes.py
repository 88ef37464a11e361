"""``kairos node cordon|drain|uncordon NODE`` (admin), beside ``kairos nodes``."""

from __future__ import annotations

from typing import Annotated

import typer

from kairos.cli import TokenOpt, UrlOpt, _client, _request, app, console

node_app = typer.Typer(help="Node operations (admin): cordon, drain, uncordon.",
                       no_args_is_help=True)
app.add_typer(node_app, name="node")

ReasonOpt = Annotated[str, typer.Option(help="why (shown by `kairos nodes`)")]


def _command(action: str, node_id: str, body: dict[str, object], url: str | None,
             token: str | None) -> None:
    with _client(url, token) as c:
        out = _request(c, "POST", f"/v1/nodes/{node_id}/{action}", json=body)
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
