"""`kairos queues` (a table, like squeue -s / vcctl queue list) and `kairos queue
create|update|close|drain|open` (admin)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from kairos.cli_common import TokenOpt, UrlOpt, client, console, err, request
from kairos.cli_output import Col, OutputOpt, field, show

queue_app = typer.Typer(help="Queues and their quota (admin): create, update, close, drain, "
                        "open.", no_args_is_help=True, rich_markup_mode="markdown")


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:g}"


def _gpus(amount: dict[str, Any] | None) -> str:
    return _num((amount or {}).get("gpus"))


def _by_model(q: dict[str, Any]) -> str:
    """GPUs used/guaranteed of each model its quota names: ``H100 3/4, A100 0/8``."""
    used = q.get("used_by_model") or {}
    named = [(m["model"], m.get("guaranteed")) for m in q.get("gpu_models") or ()]
    named += [(k, None) for k in used if k not in {n for n, _ in named}]
    return ", ".join(f"{k} {used.get(k, 0):g}/{_num(g)}" for k, g in named) or "-"


def _name(q: dict[str, Any]) -> str:
    return str(q["name"]) + (" (cohort)" if q["kind"] == "cohort" else "")


QUEUE_COLUMNS = (
    Col("queue", _name, whole=True),  # names stay whole
    Col("parent", field("parent"), wide=True),
    Col("tenant", field("tenant", "(shared)")),
    Col("state", field("state")),
    Col("GPUs used/quota", lambda q: f"{q['used']['gpus']:g}/{_gpus(q['guaranteed'])}"),
    Col("borrowed", lambda q: f"{q['borrowed']['gpus']:g}"),
    Col("by model", _by_model),
    Col("borrow max", lambda q: _gpus(q["borrowing_limit"]), wide=True),
    Col("lend max", lambda q: _gpus(q["lending_limit"]), wide=True),
    Col("weight", lambda q: f"{q['weight']:g}", wide=True),
    Col("strategy", field("strategy"), wide=True),
    Col("pending", field("pending")),
    Col("admitted", field("admitted")),
    Col("running", field("running")),
)


def queues(output: OutputOpt = None, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Queues with their GPU quota, usage, borrowing and job counts (-o wide: parent,
    limits, weight)."""
    with client(url, token) as c:
        rows = request(c, "GET", "/v1/queues")
    show(console, rows, QUEUE_COLUMNS, output)


def _amount(gpus: float | None, cpu: int | None, memory: int | None) -> dict[str, Any] | None:
    out = {k: v for k, v in (("gpus", gpus), ("cpu_milli", cpu), ("memory_mib", memory))
           if v is not None}
    return out or None


def _models(given: list[str] | None, current: list[dict[str, Any]] | None = None
            ) -> list[dict[str, Any]] | None:
    """``--model H100=8`` as ``gpu_models`` entries: a model already named keeps its place
    and its limits, with the new guarantee; a new one goes last."""
    if not given:
        return None
    out = [dict(m) for m in current or ()]
    for item in given:
        model, sep, gpus = item.partition("=")
        try:
            value = float(gpus)
        except ValueError:
            value = -1.0
        if not sep or not model.strip() or value < 0:
            err.print(f"[red]--model {item}[/]: give MODEL=GPUS, e.g. --model H100=8")
            raise typer.Exit(2)
        entry = next((m for m in out if m["model"].upper() == model.strip().upper()), None)
        if entry is None:
            out.append({"model": model.strip(), "guaranteed": value})
        else:
            entry["guaranteed"] = value
    return out


def _body(file: Path | None, fields: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if file is not None:
        data = yaml.safe_load(file.read_text())
        if not isinstance(data, dict):
            err.print(f"[red]{file}[/]: must be a mapping of queue fields")
            raise typer.Exit(2)
        body.update(data)
    body.update({k: v for k, v in fields.items() if v is not None})
    return body


def _show(result: dict[str, Any], verb: str) -> None:
    if "request_id" in result:  # 202: queueing has not answered yet
        console.print(f"{verb} requested ({result['request_id']}): {result['detail']}")
    else:
        console.print(f"queue [bold]{result['name']}[/] {verb}: state {result['state']}, "
                      f"guaranteed {_gpus(result['guaranteed'])} GPUs, "
                      f"version {result['version']}")


GpusOpt = Annotated[float | None, typer.Option("--gpus", help="guaranteed GPUs")]
CpuOpt = Annotated[int | None, typer.Option("--cpu", help="guaranteed CPU millicores")]
MemOpt = Annotated[int | None, typer.Option("--memory", help="guaranteed memory MiB")]
BorrowOpt = Annotated[float | None, typer.Option("--borrow-gpus",
                                                 help="borrowing limit, GPUs above guaranteed")]
LendOpt = Annotated[float | None, typer.Option("--lend-gpus", help="lending limit, GPUs")]
ParentOpt = Annotated[str | None, typer.Option("--parent", help="its cohort or parent queue")]
WeightOpt = Annotated[float | None, typer.Option("--weight", help="fair-share weight")]
ModelOpt = Annotated[list[str] | None, typer.Option(
    "--model", help="guaranteed GPUs of one model, MODEL=GPUS (--model H100=8 --model "
    "A100=16: its jobs try them in this order); limits per model with --file")]
FileOpt = Annotated[Path | None, typer.Option("--file", "-f", exists=True, dir_okay=False,
                                              help="a YAML mapping of queue fields")]


@queue_app.command("create")
def queue_create(
    name: str,
    tenant: Annotated[str | None, typer.Option(help="its tenant; default: its parent's, or "
                                               "shared")] = None,
    kind: Annotated[str, typer.Option(help="queue or cohort")] = "queue",
    parent: ParentOpt = None, gpus: GpusOpt = None, cpu: CpuOpt = None, memory: MemOpt = None,
    borrow_gpus: BorrowOpt = None, lend_gpus: LendOpt = None, weight: WeightOpt = None,
    strict: Annotated[bool, typer.Option(help="a waiting job holds back those after it")] = False,
    model: ModelOpt = None, file: FileOpt = None, url: UrlOpt = None, token: TokenOpt = None,
) -> None:
    """Create a queue or cohort (admin)."""
    body = _body(file, {"name": name, "tenant": tenant, "kind": kind, "parent": parent,
                        "guaranteed": _amount(gpus, cpu, memory), "gpu_models": _models(model),
                        "borrowing_limit": _amount(borrow_gpus, None, None),
                        "lending_limit": _amount(lend_gpus, None, None), "weight": weight,
                        "strategy": "strict" if strict else None})
    with client(url, token) as c:
        _show(request(c, "POST", "/v1/queues", json=body), "created")


@queue_app.command("update")
def queue_update(
    name: str, parent: ParentOpt = None, gpus: GpusOpt = None, cpu: CpuOpt = None,
    memory: MemOpt = None, borrow_gpus: BorrowOpt = None, lend_gpus: LendOpt = None,
    weight: WeightOpt = None, model: ModelOpt = None, file: FileOpt = None,
    url: UrlOpt = None, token: TokenOpt = None,
) -> None:
    """Change a queue's quota, limits, weight or parent (admin); other fields stay."""
    with client(url, token) as c:
        current = request(c, "GET", f"/v1/queues/{name}")
        guaranteed = None
        if any(v is not None for v in (gpus, cpu, memory)):
            guaranteed = {**(current["guaranteed"] or {}), **(_amount(gpus, cpu, memory) or {})}
        body = _body(file, {"parent": parent, "guaranteed": guaranteed,
                            "borrowing_limit": _amount(borrow_gpus, None, None),
                            "lending_limit": _amount(lend_gpus, None, None), "weight": weight,
                            "gpu_models": _models(model, current.get("gpu_models"))})
        if not body:
            err.print("[red]nothing to change[/]: pass --gpus, --borrow-gpus, ... or --file")
            raise typer.Exit(2)
        _show(request(c, "PATCH", f"/v1/queues/{name}", json=body), "updated")


def _state_command(action: str, help_text: str) -> None:
    def command(name: str, url: UrlOpt = None, token: TokenOpt = None) -> None:
        with client(url, token) as c:
            _show(request(c, "POST", f"/v1/queues/{name}/{action}"), f"{action} done")

    command.__doc__ = help_text
    queue_app.command(action)(command)


_state_command("close", "Close a queue (admin): no new jobs, and none of those it holds "
               "starts; running jobs go on.")
_state_command("drain", "Drain a queue (admin): no new jobs; those it holds still run.")
_state_command("open", "Open a closed or draining queue again (admin).")
