"""The `kairos` command: run the embedded platform, submit and describe jobs.

This module only assembles the commands; each group lives in its own ``cli_*`` module,
and what they share (gateway client, token lookup, consoles, output formats) in
``cli_common`` and ``cli_output``. The gateway URL and token come from --url/--token,
then KAIROS_URL/KAIROS_TOKEN, then the profile the embedded stack writes
(.kairos/profile.json).
"""

from __future__ import annotations

import typer

from kairos import (
    cli_admin,
    cli_env,
    cli_jobs,
    cli_logs,
    cli_nodes,
    cli_queues,
    cli_stack,
    cli_tokens,
    cli_watch,
)
from sim.cli import app as sim_app

# markdown: a docstring wrapped over several lines reads as one paragraph in --help
app = typer.Typer(help="Kairos: a GPU scheduler for deep-learning training.", no_args_is_help=True,
                  rich_markup_mode="markdown")

# the platform on this machine
app.command()(cli_stack.up)
app.command()(cli_stack.status)
app.command()(cli_stack.reset)
# jobs
app.command()(cli_jobs.submit)
app.command()(cli_jobs.describe)
app.command()(cli_jobs.jobs)
app.command()(cli_jobs.cancel)
app.command()(cli_jobs.demo)
app.command()(cli_watch.watch)
app.command()(cli_logs.logs)
app.command()(cli_watch.usage)
app.add_typer(cli_env.env_app, name="env")
# the cluster and its administration
app.command()(cli_nodes.nodes)
app.add_typer(cli_nodes.node_app, name="node")
app.command()(cli_queues.queues)
app.add_typer(cli_queues.queue_app, name="queue")
app.add_typer(cli_tokens.token_app, name="token")
app.command("check")(cli_admin.check)
app.add_typer(cli_admin.admin_app, name="admin")
app.add_typer(sim_app, name="sim")

if __name__ == "__main__":
    app()
