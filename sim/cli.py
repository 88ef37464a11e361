"""``kairos sim``: replay public traces through the scheduling core.

Mounted by the main CLI as ``app.add_typer(sim.cli.app, name="sim")``.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Annotated

import typer

from sim.traces import MURI, OPENB, PHILLY, TimeUnit

app = typer.Typer(help="Trace-driven simulator: the same scheduling core, replayed over public traces.",
                  no_args_is_help=True, rich_markup_mode="markdown")

POLICY_HELP = "FIFO, SJF-oracle (or SJF), Tiresias, DRF, Kairos (repeat the option)"
TIME_UNIT_HELP = ("unit of the CSV's times (default: the format's, Philly s, Muri ms; a file whose times "
                  "look 1,000x off is refused)")
TimeUnitOpt = Annotated[TimeUnit | None, typer.Option("--time-unit", help=TIME_UNIT_HELP)]


@app.command()
def openb(
    lists: Annotated[list[str] | None, typer.Option(
        "--list", help="pod list: a name (default, gpushare100, multigpu50, cpu050 .. cpu250) or a CSV path; "
        "repeat the option (default: all seven names)")] = None,
    seeds: Annotated[int, typer.Option(help="seeds 42..42+n-1")] = 10,
    out: Annotated[Path, typer.Option()] = Path("bench/results/sim_openb.json"),
) -> None:
    """The FGD fill experiment (Random, BestFit, FGD, Kairos) on Alibaba openb."""
    from sim.openb_experiment import LISTS, main
    from sim.traces import TraceError

    try:
        main(lists or list(LISTS), list(range(42, 42 + seeds)), out)
    except TraceError as e:
        raise typer.BadParameter(str(e), param_hint="--list") from e


@app.command()
def run(
    trace: Annotated[str, typer.Argument(help="philly | muri-trace1 | muri-trace2 | synthetic | gavel-<msr trace> "
                                              "(e.g. gavel-0e4a51) | a CSV or Gavel .trace path")],
    policy: Annotated[str, typer.Option(help=POLICY_HELP + "; on a mixed cluster also Kairos-aware")] = "Kairos",
    nodes: Annotated[int, typer.Option()] = 64,
    gpus: Annotated[int | None, typer.Option(help="GPUs per node (default 8; 4 on a mixed cluster)")] = None,
    cluster: Annotated[str | None, typer.Option(help="a mixed cluster, GPUs per model: v100:36,p100:36,k80:36 "
                                                     "(nodes of one model each, in a seeded random order; "
                                                     "replaces --nodes)")] = None,
    limit: Annotated[int | None, typer.Option(help="first N jobs")] = None,
    cycle_s: Annotated[float, typer.Option(help="at most one cycle per this many simulated s")] = 60.0,
    tick_s: Annotated[float, typer.Option(help="re-ranking cycles while jobs wait (Tiresias)")] = 600.0,
    checkpoint_s: Annotated[float, typer.Option()] = 1800.0,
    restore_s: Annotated[float, typer.Option()] = 60.0,
    out: Annotated[Path | None, typer.Option(help="write the JSON result here")] = None,
    time_unit: TimeUnitOpt = None,
) -> None:
    """One policy over one trace on N x G GPUs, or a mixed cluster; prints (and writes)
    the JSON result (on a mixed cluster with GPU-hours per model)."""
    from sim.engine import SimSettings
    from sim.jct_experiment import run_mixed, run_policy
    from sim.metrics import summarize

    jobs = load_jobs(trace, limit, time_unit)
    per_node = gpus or (4 if cluster else 8)
    base = SimSettings(checkpoint_s=checkpoint_s, restore_s=restore_s, cycle_s=cycle_s, tick_s=tick_s,
                       gpus_per_task=min(per_node, 8))
    if cluster:
        from sim.gavel import parse_cluster

        try:
            res, wall, extra = run_mixed(jobs, parse_cluster(cluster), per_node, policy, base)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--cluster") from e
        shape = cluster
    else:
        res, wall = run_policy(jobs, nodes, per_node, policy, base)
        shape, extra = f"{nodes}x{per_node}", {}
    m = summarize(res) | extra | {"policy": policy, "trace": trace, "cluster": shape, "wall_s": round(wall, 1)}
    text = json.dumps(m, indent=2)
    if out:
        out.write_text(text + "\n")
    typer.echo(text)


@app.command()
def compare(
    trace: Annotated[str, typer.Argument(help="philly | muri-trace1 | muri-trace2 | synthetic | a CSV path")],
    nodes: Annotated[list[int], typer.Option("--nodes", help="cluster sizes (nodes), repeat")] = [64],  # noqa: B006
    gpus: Annotated[int, typer.Option()] = 8,
    limit: Annotated[int | None, typer.Option()] = None,
    policies: Annotated[list[str], typer.Option("--policy", help=POLICY_HELP)] = [],  # noqa: B006
    cycle_s: Annotated[float, typer.Option()] = 60.0,
    tick_s: Annotated[float, typer.Option()] = 600.0,
    out: Annotated[Path, typer.Option()] = Path("bench/results/sim_compare.json"),
    time_unit: TimeUnitOpt = None,
) -> None:
    """The policies side by side on one trace and several cluster sizes (table, JSON, plots)."""
    from sim.engine import SimSettings
    from sim.jct_experiment import run as run_exp
    from sim.policies import POLICIES

    jobs = load_jobs(trace, limit, time_unit)
    run_exp(trace, jobs, [(n, gpus) for n in nodes], out, SimSettings(cycle_s=cycle_s, tick_s=tick_s),
            policies or POLICIES, note=f"first {limit} jobs" if limit else "all jobs")


@app.command()
def suite(
    case: Annotated[list[str], typer.Option("--case", help="cases by glob (repeat): philly@64x8, 'muri-*', "
                                                             "'syn-*' (default: every case)")] = [],  # noqa: B006
    policies: Annotated[list[str], typer.Option("--policy", help=POLICY_HELP)] = [],  # noqa: B006
    jobs: Annotated[int, typer.Option("--jobs", min=1, help="runs at once, in separate processes")] = 1,
    limit: Annotated[int | None, typer.Option(help="first N jobs of each case (a quick look)")] = None,
    out: Annotated[Path, typer.Option(help="results merge into this file")] = Path("bench/results/sim_robust.json"),
    plots: Annotated[bool, typer.Option(help="plots under the result's folder, plots/")] = True,
    list_cases: Annotated[bool, typer.Option("--list", help="print the cases and stop")] = False,
) -> None:
    """The robustness suite: every policy on the whole Philly trace (64/80/96 x 8), the
    Muri traces and synthetic families; prints Kairos/Tiresias and the longest waits
    against FIFO, with the geometric mean where queues form."""
    from sim import suite as st

    try:
        chosen = st.select(case)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--case") from e
    if list_cases:
        typer.echo("\n".join(c.name for c in chosen))
        return
    st.run(case, policies, out, jobs, limit, plots)


def load_jobs(trace: str, limit: int | None, time_unit: TimeUnit | None = None):  # type: ignore[no-untyped-def]
    """The trace's jobs; a file that cannot be read right (missing columns, times that
    look like another unit) is a bad TRACE argument with the loader's message. A
    ``kairos sim export`` file gives its jobs that ran, as a plain trace (total GPUs,
    tenant; a GPU share counts as one GPU, as in the public traces): ``sim replay``
    keeps their exact shapes."""
    from dataclasses import replace

    from sim.history_trace import is_history, load_history
    from sim.traces import TraceError, load_muri, load_philly, synthetic

    if trace.startswith("gavel-") or trace.endswith(".trace"):
        from sim.gavel import MSR, load_msr

        try:
            return load_msr(MSR / f"{trace[6:]}.trace" if trace.startswith("gavel-") else Path(trace), None, limit).jobs
        except (TraceError, OSError) as e:
            raise typer.BadParameter(str(e), param_hint="TRACE") from e
    if trace == "synthetic":
        if time_unit is not None:
            raise typer.BadParameter("the synthetic trace is generated in seconds; --time-unit is for CSV files",
                                     param_hint="--time-unit")
        return synthetic(limit or 1000)
    try:
        if trace == "philly":
            return load_philly(PHILLY, limit, time_unit)
        if trace.startswith("muri-"):
            return load_muri(MURI / f"{trace[5:]}.csv", limit, time_unit)
        path = Path(trace)
        if is_history(path):
            jobs, _ = load_history(path, limit, time_unit, ran_only=True)
            return [replace(j, num_gpus=max(j.num_gpus, 1)) for j in jobs]
        with path.open() as f:
            head = f.readline()
        return load_philly(path, limit, time_unit) if "timestamp" in head else load_muri(path, limit, time_unit)
    except (TraceError, OSError) as e:
        raise typer.BadParameter(str(e), param_hint="TRACE") from e


_ = OPENB  # the openb loaders read it by default

DB_HELP = "PostgreSQL of the platform (default: $KAIROS_DATABASE_URL, else the services' default)"


def _database_url(url: str | None) -> str:
    import os

    from sim.export import DEFAULT_DATABASE_URL

    return url or os.environ.get("KAIROS_DATABASE_URL") or DEFAULT_DATABASE_URL


def _since(value: str) -> timedelta:
    from shared.durations import parse_duration

    try:
        return parse_duration(value)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--since") from e


@app.command()
def export(
    out: Annotated[Path, typer.Option(help="the trace file to write (CSV with a header line)")],
    since: Annotated[str, typer.Option(help="jobs submitted in this last span: 7d, 12h, 90m")] = "7d",
    database_url: Annotated[str | None, typer.Option(help=DB_HELP)] = None,
) -> None:
    """The platform's recorded history as a trace file that `sim run`, `sim compare` and
    `sim replay --from` read: per job its submit time, tenant, queue, user, GPUs per task
    x replicas, observed duration (summed running time over attempts), priority, priority
    class and final state; jobs not ended are marked `censored`. Times in seconds."""
    from sim.export import export as run_export

    jobs, meta = run_export(_database_url(database_url), _since(since), out)
    ran = sum(j.ran for j in jobs)
    censored = sum(j.censored for j in jobs)
    c = meta["cluster"]
    typer.echo(f"{out}: {len(jobs)} jobs ({ran} ran, {censored} not ended at export) since {meta['since']}; "
               f"cluster {c['nodes']} nodes, {c['gpus_per_node']} GPUs each")


@app.command()
def replay(
    policy: Annotated[str, typer.Option("--policy", help="the candidate: a policy file (YAML) or a preset")],
    since: Annotated[str | None, typer.Option(help="arrivals of this last span (default: 7d from the "
                                                   "database, the whole file with --from)")] = None,
    current: Annotated[str | None, typer.Option(help="the policy to compare against (default: "
                                                     "$KAIROS_POLICY_FILE, else the preset $KAIROS_POLICY, "
                                                     "else default)")] = None,
    from_file: Annotated[Path | None, typer.Option("--from", help="a `sim export` file instead of the database")] = None,
    database_url: Annotated[str | None, typer.Option(help=DB_HELP)] = None,
    nodes: Annotated[int | None, typer.Option(help="simulated nodes (default: the recorded cluster)")] = None,
    gpus: Annotated[int | None, typer.Option(help="GPUs per node, with --nodes")] = None,
    drop_censored: Annotated[bool, typer.Option(help="leave out jobs still running at export")] = False,
    checkpoint_s: Annotated[float, typer.Option()] = 1800.0,
    restore_s: Annotated[float, typer.Option()] = 60.0,
    cycle_s: Annotated[float, typer.Option(help="at most one cycle per this many s (0: at every event)")] = 0.0,
    tick_s: Annotated[float, typer.Option(help="a cycle this often while jobs wait (time-based re-ranking)")] = 60.0,
    out: Annotated[Path, typer.Option(help="JSON result; the plot is written beside it")] = Path("sim_replay.json"),
) -> None:
    """Replay the recorded arrivals, with their observed durations, through the current
    policy and a candidate on the same cluster; prints them side by side with what was
    recorded (JCT, queueing delay per tenant, GPU allocation, preemptions, fairness)."""
    from sim import replay as rp
    from sim.engine import SimSettings
    from sim.history_trace import load_history
    from sim.replay_report import figures, print_table, recorded, write
    from sim.traces import TraceError

    try:
        policies = {rp.CURRENT: rp.load_policy(current) if current else rp.current_policy(),
                    rp.CANDIDATE: rp.load_policy(policy)}
    except (OSError, ValueError) as e:
        raise typer.BadParameter(str(e), param_hint="--policy / --current") from e
    if (nodes is None) != (gpus is None):
        raise typer.BadParameter("give both --nodes and --gpus, or neither (the recorded cluster)")
    span = _since(since) if since else None
    if from_file is not None:
        try:
            all_jobs, head = load_history(from_file)
        except (TraceError, OSError) as e:
            raise typer.BadParameter(str(e), param_hint="--from") from e
        source = from_file.name
    else:
        from sqlalchemy.engine import make_url

        from sim.export import read_history_now

        url = _database_url(database_url)
        span = span or _since("7d")
        all_jobs, head = read_history_now(url, span)
        source = f"{make_url(url).database} (last {since or '7d'})"
    jobs = rp.select(all_jobs, span, head.get("exported_at"), drop_censored)
    if not jobs:
        raise typer.BadParameter("no recorded job that ran in that span", param_hint="--since")
    cluster = (rp.uniform(nodes, gpus) if nodes is not None and gpus is not None
               else rp.recorded_cluster(head["cluster"]))
    if not cluster:
        raise typer.BadParameter("the history records no node: give --nodes and --gpus")
    shape = f"{len(cluster)}x{max(len(n.gpus) for n in cluster)}"
    settings = SimSettings(checkpoint_s=checkpoint_s, restore_s=restore_s, cycle_s=cycle_s, tick_s=tick_s)
    runs = rp.replay(jobs, cluster, policies, settings)
    cols = {name: figures(res) for name, res in runs.items()} | {"recorded": recorded(jobs)}
    doc = {"source": source, "cluster": shape, "policies": {k: p.label for k, p in policies.items()},
           "figures": cols, "rules": settings.rules(),
           "fairness": "Jain's index and max/min ratio over tenants' mean slowdown (JCT / duration)"}
    png = write(out, doc, runs, source, shape)
    print_table({f"{k} ({p.label})": cols[k] for k, p in policies.items()} | {"recorded": cols["recorded"]},
                f"shadow replay of {source} on {shape} GPUs ({len(jobs)} jobs)")
    typer.echo(f"wrote {out}" + (f" and {png}" if png else ""))
