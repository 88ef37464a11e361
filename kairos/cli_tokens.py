"""``kairos token create|list|revoke``: API tokens per tenant (admin)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from kairos.cli_common import TokenOpt, UrlOpt, client, console, err, request
from kairos.cli_output import Col, OutputOpt, field, show, timestamp
from shared.durations import parse_duration

token_app = typer.Typer(help="API tokens per tenant (admin): create, list, revoke.",
                        no_args_is_help=True, rich_markup_mode="markdown")


@token_app.command("create")
def token_create(
    tenant: Annotated[str, typer.Option(help="the tenant whose jobs it submits and sees")],
    role: Annotated[str, typer.Option(help="user or admin")] = "user",
    name: Annotated[str | None, typer.Option(help="who uses it (default: the tenant)")] = None,
    expires_in: Annotated[str | None, typer.Option(
        help="e.g. 30d, 12h, 90m; default: never")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="print only the token")] = False,
    url: UrlOpt = None, token: TokenOpt = None,
) -> None:
    """Create a token (admin). The token is printed once; only its hash is kept."""
    if role not in ("user", "admin"):
        err.print(f"[red]--role must be user or admin[/], not {role!r}")
        raise typer.Exit(2)
    body: dict[str, Any] = {"tenant": tenant, "role": role}
    if name:
        body["name"] = name
    if expires_in:
        try:
            body["expires_in_s"] = int(parse_duration(expires_in).total_seconds())
        except ValueError as exc:
            err.print(f"[red]--expires-in[/]: {exc}")
            raise typer.Exit(2) from exc
    with client(url, token) as c:
        created = request(c, "POST", "/v1/tokens", json=body)
    if quiet:
        print(created["token"])
        return
    expires = (created["expires_at"] or "never")[:16].replace("T", " ")
    console.print(f"created token [bold]{created['id']}[/] for tenant {created['tenant']}")
    console.print(f"role {created['role']}, name {created['name']}, expires {expires}")
    console.print("it is shown only now; keep it secret:")
    print(f"token: {created['token']}")


TOKEN_COLUMNS = (
    Col("id", field("id"), whole=True),
    Col("tenant", field("tenant")),
    Col("name", field("name")),
    Col("role", field("role")),
    Col("state", field("state")),
    Col("created", timestamp("created_at")),
    Col("created by", field("created_by"), wide=True),
    Col("expires", timestamp("expires_at", "never")),
    Col("last used", timestamp("last_used_at")),
)


@token_app.command("list")
def token_list(
    tenant: Annotated[str | None, typer.Option(help="only this tenant's tokens")] = None,
    output: OutputOpt = None, url: UrlOpt = None, token: TokenOpt = None,
) -> None:
    """Tokens with their tenant, role and state; never their secrets (admin)."""
    with client(url, token) as c:
        rows = request(c, "GET", "/v1/tokens", params={"tenant": tenant} if tenant else {})
    show(console, rows, TOKEN_COLUMNS, output)


@token_app.command("revoke")
def token_revoke(token_id: str, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Revoke a token by id (admin); it is refused from its next request on."""
    with client(url, token) as c:
        request(c, "DELETE", f"/v1/tokens/{token_id}")
    console.print(f"revoked {token_id}")
