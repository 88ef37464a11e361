"""``kairos submit --dry-run [--what-if KEY=N,M,...] FILE``: what a submit would do,
without submitting (``POST /v1/jobs?dryRun=All``, like ``sbatch --test-only``).

``--what-if`` compares shapes side by side, one dry run per variant built here from the
spec file:

- ``gpu=8,16,32``: the job's total GPUs. Its GPU task keeps its GPUs per replica (capped
  at N) and gets N / that many replicas; N must be a multiple of it.
- ``replicas=2,4``: the GPU task's replicas.
- ``gpu-per-replica=1,2``: the GPU task's whole GPUs per replica.

The GPU task is the one task that asks for whole GPUs (a parameter server without GPUs
is left as it is). An elastic task's minReplicas/maxReplicas widen to take the new size;
a gang of every replica (``minAvailable`` = all) stays a gang of every replica.
"""

from __future__ import annotations

import copy
import json
from datetime import datetime
from typing import Any

import httpx
import typer
import yaml
from rich.table import Table
from rich.text import Text

from kairos.cli_common import client, console, err, fail
from kairos.cli_output import Output, fitted_table, printed_as_data
from shared.durations import in_words

DRY_RUN = "/v1/jobs?dryRun=All"
WHAT_IF_KEYS = ("gpu", "replicas", "gpu-per-replica")
ROW_REFUSALS = (409, 413, 422)  # a variant the gateway refuses is a row, not an exit


class WhatIfError(ValueError):
    """A --what-if the CLI cannot build variants from; the text says why."""


def parse_what_if(text: str) -> tuple[str, list[int]]:
    """``gpu=8,16,32`` -> ("gpu", [8, 16, 32])."""
    key, sep, values = text.partition("=")
    key = key.strip()
    if not sep or key not in WHAT_IF_KEYS:
        raise WhatIfError(f"--what-if {text!r}: expected KEY=N[,N...] with KEY one of "
                          f"{', '.join(WHAT_IF_KEYS)} (e.g. gpu=8,16,32)")
    out = []
    for v in values.split(","):
        v = v.strip()
        if not v.isdigit() or int(v) < 1:
            raise WhatIfError(f"--what-if {text!r}: {v!r} is not a positive whole number")
        out.append(int(v))
    if len(set(out)) != len(out):
        raise WhatIfError(f"--what-if {text!r}: a value is listed twice")
    return key, out


def _gpu_task(spec: dict[str, Any]) -> dict[str, Any]:
    tasks = spec.get("tasks")
    if not isinstance(tasks, list) or not all(isinstance(t, dict) for t in tasks):
        raise WhatIfError("the spec has no list of tasks to vary")
    with_gpus: list[dict[str, Any]] = [t for t in tasks if _gpus(t) > 0]
    if len(with_gpus) != 1:
        named = ", ".join(str(t.get("name")) for t in with_gpus)
        raise WhatIfError("--what-if varies the job's one task with whole GPUs; this job has "
                          + (f"{len(with_gpus)} ({named})" if with_gpus else "none"))
    return with_gpus[0]


def _gpus(task: dict[str, Any]) -> int:
    res = task.get("resources") or {}
    gpu = res.get("gpu", 0) if isinstance(res, dict) else 0
    return gpu if isinstance(gpu, int) else 0


def _resize(spec: dict[str, Any], task: dict[str, Any], replicas: int) -> None:
    before = sum(int(t.get("replicas", 1)) for t in spec["tasks"])
    old = int(task.get("replicas", 1))
    task["replicas"] = replicas
    if "minReplicas" in task:
        task["minReplicas"] = min(int(task["minReplicas"]), replicas)
    if "maxReplicas" in task:
        task["maxReplicas"] = max(int(task["maxReplicas"]), replicas)
    if spec.get("minAvailable") == before:  # a gang of every replica stays one
        spec["minAvailable"] = before - old + replicas


def variant(spec: dict[str, Any], key: str, n: int) -> dict[str, Any]:
    """The spec with ``key=n`` applied (a copy)."""
    out = copy.deepcopy(spec)
    task = _gpu_task(out)
    per = _gpus(task)
    if key == "gpu":
        per = min(per, n)
        if n % per:
            raise WhatIfError(f"gpu={n}: not a multiple of the {per} GPUs per replica of "
                              f"task {task.get('name')}")
        task["resources"]["gpu"] = per
        _resize(out, task, n // per)
    elif key == "replicas":
        _resize(out, task, n)
    else:
        task["resources"]["gpu"] = n
    return out


def total_gpus(spec: dict[str, Any]) -> int:
    return sum(int(t.get("replicas", 1)) * _gpus(t) for t in spec.get("tasks", []))


def _ask(c: httpx.Client, body: bytes, headers: dict[str, str]) -> httpx.Response:
    try:
        return c.post(DRY_RUN, content=body, headers=headers)
    except httpx.HTTPError as exc:
        err.print(f"[red]cannot reach the gateway[/] at {c.base_url}: {exc}")
        raise typer.Exit(3) from exc


def dry_run(body: bytes, headers: dict[str, str], what_if: str | None, output: Output | None,
            url: str | None, token: str | None) -> None:
    """The command: one dry run of the file, or one per --what-if variant."""
    if what_if is None:
        with client(url, token) as c:
            r = _ask(c, body, headers)
        if r.status_code != 200:
            fail(r)
        show(r.json(), output)
        return
    try:
        key, values = parse_what_if(what_if)
        spec = yaml.safe_load(body)
        if not isinstance(spec, dict):
            raise WhatIfError("the file does not hold a job spec (a mapping)")
        specs = [(f"{key}={n}", variant(spec, key, n)) for n in values]
    except (WhatIfError, yaml.YAMLError) as exc:
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from exc
    rows = []
    with client(url, token) as c:
        for label, s in specs:
            r = _ask(c, json.dumps(s).encode(), {**headers, "Content-Type": "application/json"})
            if r.status_code in ROW_REFUSALS:
                rows.append({"variant": label, "spec": s, "refused": _refusal(r)})
            elif r.status_code != 200:
                fail(r)
            else:
                rows.append({"variant": label, "spec": s, "answer": r.json()})
    if not printed_as_data(rows, output):
        console.print(what_if_table(rows))


def _refusal(r: httpx.Response) -> str:
    try:
        detail = r.json().get("detail", r.text)
    except ValueError:
        detail = r.text
    if isinstance(detail, list):
        detail = "; ".join(f"{d.get('field')}: {d.get('message')}" for d in detail)
    return f"{r.status_code}: {detail}"


def show(answer: dict[str, Any], output: Output | None) -> None:
    if printed_as_data(answer, output):
        return
    console.print(f"dry run of [bold]{answer['name']}[/] to queue {answer['queue']}: "
                  "valid, nothing submitted", highlight=False)
    console.print(answer["summary"], highlight=False, markup=False)
    quota = answer["quota"]
    if not quota["admitted"]:
        console.print(f"quota: {quota['detail']}", highlight=False, markup=False)


def _relative(f: dict[str, Any], key: str) -> float | None:
    """Seconds from the gateway's now to a forecast time: measured from ``in_seconds``,
    so this machine's clock does not enter."""
    if f.get(key) is None or f.get("start") is None or f.get("in_seconds") is None:
        return None
    delta = datetime.fromisoformat(f[key]) - datetime.fromisoformat(f["start"])
    return float(f["in_seconds"]) + delta.total_seconds()


def _when(s: float | None) -> str:
    return "-" if s is None else "now" if s < 5 else f"in {in_words(s)}"


def _quota(a: dict[str, Any]) -> str:
    q = a["quota"]
    if q["admitted"]:
        return "admits (borrowing)" if q.get("borrowing") else "admits"
    return f"blocked: {q['blocked_by']}"


def row_cells(row: dict[str, Any]) -> list[str]:
    """One variant's cells: variant, GPUs, replicas, quota, start, band, finish, nodes."""
    task = _gpu_task(row["spec"])
    shape = f"{task.get('replicas', 1)} x {_gpus(task)} GPUs"
    head = [row["variant"], str(total_gpus(row["spec"])), shape]
    if "refused" in row:
        return [*head, f"refused {row['refused']}", "-", "-", "-", "-"]
    a = row["answer"]
    f = a.get("forecast")
    if f is None:
        return [*head, _quota(a), "-", "-", "-", "-"]
    if f.get("start") is None:
        return [*head, _quota(a), "none in horizon", "-", "-", "-"]
    low, high = _relative(f, "start_low"), _relative(f, "start_high")
    band = "-" if low is None or high is None else \
        f"{'now' if low < 5 else in_words(low)} to {in_words(high)}"
    return [*head, _quota(a), _when(f["in_seconds"]), band, _when(_relative(f, "finish")),
            ", ".join(f.get("nodes") or []) or "-"]


def what_if_table(rows: list[dict[str, Any]]) -> Table:
    t = fitted_table("variant", "GPUs", "replicas", "quota", "start", "band", "finish",
                     "nodes", title="what if (dry runs: nothing submitted)")
    why = []
    for row in rows:
        t.add_row(*(Text(c) for c in row_cells(row)))  # plain text: no rich markup
        unavailable = row.get("answer", {}).get("forecast_unavailable")
        if unavailable:
            why.append(unavailable)
    if why:
        t.caption = "no forecast: " + "; ".join(dict.fromkeys(why))
    return t
