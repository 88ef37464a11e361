"""``kairos sim``: replay public traces through the scheduling core.

Mounted by the main CLI as ``app.add_typer(sim.cli.app, name="sim")``.
"""

from __future__ import annotations

import json
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
    lists: Annotated[list[str], typer.Option("--list", help="pod lists")] = ["default", "gpushare100", "multigpu50"],  # noqa: B006
    seeds: Annotated[int, typer.Option(help="seeds 42..42+n-1")] = 10,
    out: Annotated[Path, typer.Option()] = Path("bench/results/sim_openb.json"),
) -> None:
    """The FGD fill experiment (Random, BestFit, FGD, Kairos) on Alibaba openb."""
    from sim.openb_experiment import main

    main(lists, list(range(42, 42 + seeds)), out)


@app.command()
def run(
    trace: Annotated[str, typer.Argument(help="philly | muri-trace1 | muri-trace2 | synthetic | a CSV path")],
    policy: Annotated[str, typer.Option(help=POLICY_HELP)] = "Kairos",
    nodes: Annotated[int, typer.Option()] = 64,
    gpus: Annotated[int, typer.Option(help="GPUs per node")] = 8,
    limit: Annotated[int | None, typer.Option(help="first N jobs")] = None,
    cycle_s: Annotated[float, typer.Option(help="at most one cycle per this many simulated s")] = 60.0,
    tick_s: Annotated[float, typer.Option(help="re-ranking cycles while jobs wait (Tiresias)")] = 600.0,
    checkpoint_s: Annotated[float, typer.Option()] = 1800.0,
    restore_s: Annotated[float, typer.Option()] = 60.0,
    out: Annotated[Path | None, typer.Option(help="write the JSON result here")] = None,
    time_unit: TimeUnitOpt = None,
) -> None:
    """One policy over one trace on N x G GPUs; prints (and writes) the JSON result."""
    from sim.engine import SimSettings
    from sim.jct_experiment import run_policy
    from sim.metrics import summarize

    jobs = load_jobs(trace, limit, time_unit)
    base = SimSettings(checkpoint_s=checkpoint_s, restore_s=restore_s, cycle_s=cycle_s, tick_s=tick_s)
    res, wall = run_policy(jobs, nodes, gpus, policy, base)
    m = summarize(res) | {"policy": policy, "trace": trace, "cluster": f"{nodes}x{gpus}", "wall_s": round(wall, 1)}
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


def load_jobs(trace: str, limit: int | None, time_unit: TimeUnit | None = None):  # type: ignore[no-untyped-def]
    """The trace's jobs; a file that cannot be read right (missing columns, times that
    look like another unit) is a bad TRACE argument with the loader's message."""
    from sim.traces import TraceError, load_muri, load_philly, synthetic

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
        with path.open() as f:
            head = f.readline()
        return load_philly(path, limit, time_unit) if "timestamp" in head else load_muri(path, limit, time_unit)
    except (TraceError, OSError) as e:
        raise typer.BadParameter(str(e), param_hint="TRACE") from e


_ = OPENB  # the openb loaders read it by default
