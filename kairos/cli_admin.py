"""``kairos check`` (the platform's invariants, after a run) and ``kairos admin replay``
(refill a broker from the outboxes by hand; the services do it by themselves when they
find the broker empty). Both talk to the broker and PostgreSQL directly, not the API."""

from __future__ import annotations

import asyncio
import json
import os
from datetime import timedelta
from typing import Annotated, Any

import typer

from kairos.cli_common import console, err, profile_value

admin_app = typer.Typer(help="Operator tools that work on the broker and the database.",
                        no_args_is_help=True, rich_markup_mode="markdown")

BootstrapOpt = Annotated[str | None, typer.Option(
    "--bootstrap", help="Kafka bootstrap (default $KAIROS_KAFKA_BOOTSTRAP or the running "
    "platform's)")]
DatabaseOpt = Annotated[str | None, typer.Option(
    "--database-url", help="PostgreSQL URL (default $KAIROS_DATABASE_URL or the running "
    "platform's)")]


def _endpoint(value: str | None, env: str, key: str) -> str:
    found = value or os.environ.get(env) or profile_value(key)
    if not found:
        err.print(f"[red]no {key}: pass it, set {env}, or start the platform (`make run`)[/]")
        raise typer.Exit(2)
    return str(found)


def check(bootstrap: BootstrapOpt = None, database_url: DatabaseOpt = None,
          as_json: Annotated[bool, typer.Option("--json", help="the report as JSON")] = False
          ) -> None:
    """Check the invariants over what the topics and the database hold: every accepted
    job ended, none ran in two places, no GPU over capacity, no stale-epoch binding
    carried out, no quota over its borrowing limit. Exit code 1 if any is broken."""
    from kairos.check import run_check

    report = asyncio.run(run_check(
        _endpoint(bootstrap, "KAIROS_KAFKA_BOOTSTRAP", "kafka_bootstrap"),
        _endpoint(database_url, "KAIROS_DATABASE_URL", "database_url")))
    summary: dict[str, Any] = report.as_dict()
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        console.print(f"{summary['jobs']} jobs, {summary['terminal']} ended, "
                      f"{summary['reruns']} reruns with a reason")
        for v in report.violations[:50]:
            console.print(f"[red]{v.kind}[/] {v.subject}: {v.detail}")
        console.print("[green]no invariant broken[/]" if not report.violations else
                      f"[red]{len(report.violations)} violations[/]")
    if report.violations:
        raise typer.Exit(1)


@admin_app.command("replay")
def replay(since: Annotated[int, typer.Option(help="seconds back to replay")] = 3600,
           database_url: DatabaseOpt = None) -> None:
    """Publish again every outbox row of the last SINCE seconds (bindings excepted: the
    scheduler resends what its agents need). Consumers drop what they already handled."""
    from shared.db import make_engine
    from shared.events import utcnow
    from shared.outbox import replay as mark

    async def go() -> int:
        engine = make_engine(_endpoint(database_url, "KAIROS_DATABASE_URL", "database_url"),
                             pool_size=1)
        try:
            return await mark(engine, utcnow() - timedelta(seconds=since))
        finally:
            await engine.dispose()

    console.print(f"{asyncio.run(go())} outbox rows marked to publish again")
