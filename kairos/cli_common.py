"""What every ``kairos`` command shares: where the gateway is and the token (flags, then
KAIROS_URL/KAIROS_TOKEN, then the profile the embedded stack writes), the HTTP client,
the consoles, and how a refused or failed request ends the command.

Exit codes, for every command: 1 the gateway refused the request, 2 no gateway configured
(or a bad option), 3 the gateway could not be reached or failed (5xx).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console

PROFILE = Path(os.environ.get("KAIROS_PROFILE", ".kairos/profile.json"))


def terminal_width() -> int:
    """$COLUMNS, else the terminal's width, else 80 (output to a pipe or a file)."""
    return shutil.get_terminal_size((80, 24)).columns


# one width for every table, decided once per command (a CLI process is short-lived)
console = Console(width=terminal_width())
err = Console(stderr=True, width=terminal_width())

UrlOpt = Annotated[str | None, typer.Option("--url", help="gateway URL", envvar="KAIROS_URL")]
TokenOpt = Annotated[str | None, typer.Option("--token", help="API token", envvar="KAIROS_TOKEN")]


def profile_value(key: str) -> str | None:
    """A value the running embedded platform saved for the CLI (url, token, ...)."""
    if not PROFILE.exists():
        return None
    value = json.loads(PROFILE.read_text()).get(key)
    return None if value is None else str(value)


def client(url: str | None, token: str | None) -> httpx.Client:
    """A client for the gateway, or exit 2 naming the three ways to configure one."""
    url = url or profile_value("url")
    token = token or profile_value("token")
    if not url or not token:
        err.print("[red]no gateway configured[/]: pass --url/--token, set KAIROS_URL and "
                  "KAIROS_TOKEN, or start the platform with `make run`")
        raise typer.Exit(2)
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def fail(r: httpx.Response) -> None:
    """Print the gateway's refusal (a 422 as field: message pairs) and exit 1, or 3 on 5xx."""
    try:
        detail: Any = r.json().get("detail", r.text)
    except ValueError:
        detail = r.text
    if isinstance(detail, list):
        detail = "; ".join(f"{d.get('field')}: {d.get('message')}" for d in detail)
    err.print(f"[red]error {r.status_code}[/]: {detail}")
    raise typer.Exit(1 if r.status_code < 500 else 3)


def request(c: httpx.Client, method: str, path: str, **kw: Any) -> Any:
    """The decoded JSON answer, or the command's exit (see ``fail``)."""
    try:
        r = c.request(method, path, **kw)
    except httpx.HTTPError as exc:
        err.print(f"[red]cannot reach the gateway[/] at {c.base_url}: {exc}")
        raise typer.Exit(3) from exc
    if r.status_code >= 400:
        fail(r)
    return r.json()




