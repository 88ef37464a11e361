"""The `kairos` command: run the embedded platform, submit and describe jobs.

The gateway URL and token come from --url/--token, then KAIROS_URL/KAIROS_TOKEN, then
the profile the embedded stack writes (.kairos/profile.json).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
import yaml
from rich.console import Console
from rich.table import Column, Table

from shared.job_array import is_array_id
from sim.cli import app as sim_app

app = typer.Typer(help="Kairos: a GPU scheduler for deep-learning training.", no_args_is_help=True)
app.add_typer(sim_app, name="sim")
console = Console()
err = Console(stderr=True)
PROFILE = Path(os.environ.get("KAIROS_PROFILE", ".kairos/profile.json"))

UrlOpt = Annotated[str | None, typer.Option("--url", help="gateway URL", envvar="KAIROS_URL")]
TokenOpt = Annotated[str | None, typer.Option("--token", help="API token", envvar="KAIROS_TOKEN")]


def _client(url: str | None, token: str | None) -> httpx.Client:
    profile: dict[str, str] = {}
    if PROFILE.exists():
        profile = json.loads(PROFILE.read_text())
    url = url or profile.get("url")
    token = token or profile.get("token")
    if not url or not token:
        err.print("[red]no gateway configured[/]: pass --url/--token, set KAIROS_URL and "
                  "KAIROS_TOKEN, or start the platform with `make run`")
        raise typer.Exit(2)
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def _fail(r: httpx.Response) -> None:
    try:
        detail: Any = r.json().get("detail", r.text)
    except ValueError:
        detail = r.text
    if isinstance(detail, list):
        detail = "; ".join(f"{d.get('field')}: {d.get('message')}" for d in detail)
    err.print(f"[red]error {r.status_code}[/]: {detail}")
    raise typer.Exit(1 if r.status_code < 500 else 3)


def _request(client: httpx.Client, method: str, path: str, **kw: Any) -> Any:
    try:
        r = client.request(method, path, **kw)
    except httpx.HTTPError as exc:
        err.print(f"[red]cannot reach the gateway[/] at {client.base_url}: {exc}")
        raise typer.Exit(3) from exc
    if r.status_code >= 400:
        _fail(r)
    return r.json()


@app.command()
def submit(
    file: Annotated[Path, typer.Argument(help="job spec, YAML or JSON", exists=True,
                                         dir_okay=False)],
    url: UrlOpt = None, token: TokenOpt = None,
    idempotency_key: Annotated[str | None, typer.Option(help="makes a retry safe")] = None,
    array: Annotated[str | None, typer.Option(
        "--array", "-a", help="a job array, as sbatch --array: 0-999, 1,3,5-7, 0-15:4, and "
        "%N to run at most N at once (0-999%50); the file's own `array` is replaced")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="print only the job id "
                                        "(like sbatch --parsable)")] = False,
) -> None:
    """Submit a job or a job array (like sbatch / vcctl job run)."""
    headers = {"Content-Type": "application/yaml"}
    body = file.read_bytes()
    if array is not None:
        try:
            spec = yaml.safe_load(body)
        except yaml.YAMLError as exc:
            err.print(f"[red]{file} is not valid YAML or JSON[/]: {exc}")
            raise typer.Exit(2) from exc
        if not isinstance(spec, dict):
            err.print(f"[red]{file} does not hold a job spec (a mapping)[/]")
            raise typer.Exit(2)
        body = json.dumps({**spec, "array": array}).encode()
        headers["Content-Type"] = "application/json"
    if idempotency_key:
        headers["Idempotency-Key"] = idempotency_key
    with _client(url, token) as c:
        job = _request(c, "POST", "/v1/jobs", content=body, headers=headers)
    if quiet:
        print(job["id"])
        return
    if "size" in job:  # an array
        cap = f", at most {job['max_running']} at once" if job.get("max_running") else ""
        console.print(f"submitted array [bold]{job['id']}[/] ({job['name']}): {job['size']} "
                      f"jobs {job['id']}-<index> for {job['indices']}{cap}, to queue "
                      f"{job['queue']}")
        return
    console.print(f"submitted [bold]{job['id']}[/] ({job['name']}) to queue {job['queue']}")


def _describe_array(c: httpx.Client, array_id: str) -> None:
    arr = _request(c, "GET", f"/v1/arrays/{array_id}")
    cap = f"  at most {arr['max_running']} at once" if arr.get("max_running") else ""
    console.print(f"[bold]{arr['id']}[/] {arr['name']}  queue={arr['queue']} "
                  f"tenant={arr['tenant']}  array {arr['indices']} ({arr['size']} jobs){cap}")
    t = Table("state", "jobs", title="elements")
    for state, n in sorted(arr["states"].items()):
        t.add_row(state, str(n))
    console.print(t)


@app.command()
def describe(job_id: str, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """A job's state, placement and the history of its transitions with reasons (for a
    job array: its elements counted by state)."""
    with _client(url, token) as c:
        if is_array_id(job_id):
            _describe_array(c, job_id)
            return
        job = _request(c, "GET", f"/v1/jobs/{job_id}")
    console.print(f"[bold]{job['id']}[/] {job['name']}  queue={job['queue']} "
                  f"tenant={job['tenant']}  state=[bold]{job['state']}[/] ({job['reason']}) "
                  f"attempt={job['attempt']}")
    if job.get("waiting"):  # still in its queue: why, and when it may start
        w = job["waiting"]
        eta = f", estimated start {w['estimated_start'][:19]}" if w.get("estimated_start") else ""
        console.print(f"waiting in queue {w['queue']}: position {w['position']}, "
                      f"{w['reason']} ({w['detail']}){eta}")
    if job.get("placement_wait"):  # admitted: why the scheduler has not placed it yet
        w = job["placement_wait"]
        eta = f", estimated start {w['estimated_start'][:19]}" if w.get("estimated_start") else ""
        console.print(f"waiting for GPUs: {w['reason']} ({w['detail']}){eta}")
    if job.get("placement"):
        t = Table("task", "node", "gpus", title="placement")
        for p in job["placement"]:
            gpus = ", ".join(
                f"{g['index']}" + (f" ({g['memory_mib']} MiB, {g['compute_pct']}%)"
                                   if g.get("memory_mib") else "") for g in p["gpus"])
            t.add_row(p["task_id"], p["node_id"], gpus or "-")
        console.print(t)
    t = Table("time", "state", "task", "node", "reason", "exit", title="history")
    for h in job["history"]:
        t.add_row(h["occurred_at"][11:23], h["state"], h.get("task") or "job",
                  h.get("node_id") or "", h["reason"],
                  "" if h.get("exit_code") is None else str(h["exit_code"]))
    console.print(t)


@app.command()
def jobs(
    state: Annotated[str | None, typer.Option(help="only jobs in this state")] = None,
    queue: Annotated[str | None, typer.Option(help="only jobs of this queue")] = None,
    user: Annotated[str | None, typer.Option(help="only jobs this user submitted")] = None,
    tenant: Annotated[str | None, typer.Option(help="only this tenant's jobs (admin)")] = None,
    array: Annotated[str | None, typer.Option(help="only this job array's elements")] = None,
    limit: Annotated[int, typer.Option(help="at most this many", min=1)] = 50,
    url: UrlOpt = None, token: TokenOpt = None,
) -> None:
    """Jobs with their state (like squeue / vcctl job list)."""
    params: dict[str, Any] = {k: v for k, v in (
        ("state", state), ("queue", queue), ("user", user), ("tenant", tenant),
        ("array", array)) if v}
    items: list[dict[str, Any]] = []
    with _client(url, token) as c:
        while len(items) < limit:  # page by cursor: stable while jobs come and go
            page = _request(c, "GET", "/v1/jobs",
                            params={**params, "limit": min(500, limit - len(items))})
            items += page["items"]
            if not page.get("next_cursor"):
                break
            params["cursor"] = page["next_cursor"]
    t = Table("name", "queue", "user", "state", "attempt", "reason", "submitted")
    t.columns.insert(0, Column("job", no_wrap=True, min_width=18))  # ids stay whole
    for j in items:
        t.add_row(j["id"], j["name"], j["queue"], j["user"], j["state"], str(j["attempt"]),
                  j["reason"], j["submitted_at"][:19].replace("T", " "))
    console.print(t)


@app.command()
def cancel(job_id: str, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Cancel a job, or every element of a job array not ended yet (like scancel)."""
    with _client(url, token) as c:
        if is_array_id(job_id):
            arr = _request(c, "DELETE", f"/v1/arrays/{job_id}")
            console.print(f"cancel requested for {arr['cancelled']} jobs of array {job_id}")
            return
        _request(c, "DELETE", f"/v1/jobs/{job_id}")
    console.print(f"cancel requested for {job_id}")


@app.command()
def nodes(url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Nodes with their GPUs and allocation."""
    with _client(url, token) as c:
        rows = _request(c, "GET", "/v1/nodes")
    t = Table("node", "state", "gpus", "allocated", "shared", "health", "model")
    for n in rows:
        model = n["inventory"]["gpus"][0]["model"] if n["inventory"]["gpus"] else "-"
        state = n["state"] if n.get("scheduling", "schedulable") == "schedulable" \
            else f"{n['state']},{n['scheduling']}"
        t.add_row(n["node_id"], state, str(n["gpus_total"]), str(n["gpus_allocated"]),
                  str(n["gpus_shared"]), _gpu_health(n.get("gpu_health") or []), model)
    console.print(t)


def _gpu_health(gpus: list[dict[str, Any]]) -> str:
    """'ok', or how many GPUs are unhealthy by kind: '2 degraded'."""
    counts: dict[str, int] = {}
    for g in gpus:
        counts[g["health"]] = counts.get(g["health"], 0) + 1
    return ", ".join(f"{n} {h}" for h, n in sorted(counts.items())) or "ok"


token_app = typer.Typer(help="API tokens per tenant (admin): create, list, revoke.",
                        no_args_is_help=True)
app.add_typer(token_app, name="token")


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
    from services.admission.tokens import parse_duration

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
    with _client(url, token) as c:
        created = _request(c, "POST", "/v1/tokens", json=body)
    if quiet:
        print(created["token"])
        return
    expires = (created["expires_at"] or "never")[:16].replace("T", " ")
    console.print(f"created token [bold]{created['id']}[/] for tenant {created['tenant']}")
    console.print(f"role {created['role']}, name {created['name']}, expires {expires}")
    console.print("it is shown only now; keep it secret:")
    print(f"token: {created['token']}")


@token_app.command("list")
def token_list(
    tenant: Annotated[str | None, typer.Option(help="only this tenant's tokens")] = None,
    url: UrlOpt = None, token: TokenOpt = None,
) -> None:
    """Tokens with their tenant, role and state; never their secrets (admin)."""
    with _client(url, token) as c:
        rows = _request(c, "GET", "/v1/tokens", params={"tenant": tenant} if tenant else {})
    t = Table("tenant", "name", "role", "state", "created", "expires", "last used")
    t.columns.insert(0, Column("id", no_wrap=True, min_width=14))
    for r in rows:
        t.add_row(r["id"], r["tenant"], r["name"], r["role"], r["state"],
                  r["created_at"][:19].replace("T", " "),
                  (r["expires_at"] or "never")[:19].replace("T", " "),
                  (r["last_used_at"] or "-")[:19].replace("T", " "))
    console.print(t)


@token_app.command("revoke")
def token_revoke(token_id: str, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Revoke a token by id (admin); it is refused from its next request on."""
    with _client(url, token) as c:
        _request(c, "DELETE", f"/v1/tokens/{token_id}")
    console.print(f"revoked {token_id}")


def _summary(metrics_url: str) -> str:
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


DEMO_DIR = Path(__file__).resolve().parent.parent / "examples"


def _demo_jobs(n: int, seed: int = 7) -> list[bytes]:
    files = sorted(DEMO_DIR.glob("*.yaml"))
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        spec = yaml.safe_load(rnd.choice(files).read_text())
        spec["duration"] = rnd.choice([3, 5, 8, 13])
        out.append(json.dumps(spec).encode())
    return out


@app.command()
def demo(count: Annotated[int, typer.Option(help="jobs to submit")] = 20,
         url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Submit a mix of the example jobs so you can watch them flow."""
    with _client(url, token) as c:
        for body in _demo_jobs(count):
            job = _request(c, "POST", "/v1/jobs", content=body,
                           headers={"Content-Type": "application/json"})
            console.print(f"submitted {job['id']} {job['name']}")


def _saved_token() -> str | None:
    """The token of a profile a run that did not stop cleanly left behind (Stack then
    falls back to the one it keeps in its workdir): a restart keeps the CLI working."""
    try:
        return str(json.loads(PROFILE.read_text())["token"]) or None
    except (OSError, ValueError, KeyError, TypeError):
        return None


@app.command()
def up(
    nodes: Annotated[int, typer.Option(help="simulated nodes")] = 4,
    gpus: Annotated[int, typer.Option(help="GPUs per simulated node")] = 8,
    port: Annotated[int, typer.Option(help="gateway port")] = 8000,
    with_demo: Annotated[bool, typer.Option("--demo", help="submit example jobs")] = False,
    reset_first: Annotated[bool, typer.Option(
        "--reset", help="wipe the state of earlier runs first (jobs, tokens, queues)")] = False,
) -> None:
    """Start the whole platform on embedded defaults, keeping the state of earlier runs;
    a service that exits is restarted; Ctrl-C stops everything."""
    from kairos.stack import Stack

    if reset_first:
        reset()
    # KAIROS_DEV_TOKEN, when set, wins over a saved one (as it does in Stack)
    stack = Stack(nodes=nodes, gpus_per_node=gpus, admission_port=port, fresh=False,
                  token=os.environ.get("KAIROS_DEV_TOKEN") or _saved_token(),
                  say=lambda msg: console.print(msg, markup=False, highlight=False))
    console.print("starting broker, database and services ...")
    stopping = False

    def _stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    # Ctrl-C reaches the services too (one process group): they stop on their own while
    # we notice the flag. Supervision runs in this loop, never after the flag is up, so
    # a service gone after Ctrl-C is not restarted.
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
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


@app.command()
def status() -> None:
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
    rows = saved["services"]
    console.print(f"gateway: {saved['gateway']}  (docs: {saved['gateway']}/docs)")
    console.print(services_table(rows, _health(rows)))


@app.command()
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


from kairos import cli_admin, cli_env, cli_logs, cli_nodes, cli_queues, cli_watch  # noqa: E402,F401  (they register on app)

if __name__ == "__main__":
    app()
