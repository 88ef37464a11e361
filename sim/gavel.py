"""Gavel's data (OSDI'20): measured speeds per GPU model, its MSR-derived traces, its
job generator, and mixed clusters to run them on.

A job's work is its steps; its duration on a model is steps / that model's measured
throughput (``simulation_throughputs.json``, the consolidated figures, the job alone on
its GPUs). A ``TraceJob`` keeps the duration on the job's fastest model and its speed
on each model relative to it (``TraceJob.speeds``); a model with no figure, or 0, cannot
run the job.

Job sizes the table has no figure for (12, 16, 24, 32 GPUs, and multi-GPU runs of A3C,
CycleGAN and Recommendation in the MSR traces) take GPUs x the 1-GPU figure: the linear
model the traces were generated with. ``Loaded.linear`` counts the jobs it touched.
"""

from __future__ import annotations

import ast
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from scheduling import GpuSlot, Node
from sim.traces import DATA, TraceError, TraceJob

GAVEL = DATA / "gavel"
THROUGHPUTS = GAVEL / "simulation_throughputs.json"
MSR = GAVEL / "msr-seed1"
MODELS = {"v100": "V100", "p100": "P100", "k80": "K80"}  # the table's keys -> GPU model names
GAVEL_CLUSTER = {"V100": 36, "P100": 36, "K80": 36}  # Gavel's simulated cluster (GPUs)
GPUS_PER_NODE = 4  # Gavel's servers


Table = Mapping[str, Mapping[tuple[str, int], float]]  # model -> (job type, GPUs) -> steps/s


@cache
def throughputs(path: Path = THROUGHPUTS) -> dict[str, dict[tuple[str, int], float]]:
    """Steps/s of each (job type, GPUs) alone on each model (consolidated placement)."""
    raw = json.loads(Path(path).read_text())
    out: dict[str, dict[tuple[str, int], float]] = {}
    for key, name in MODELS.items():
        if key not in raw:
            raise TraceError(f"{path}: no {key!r} throughputs")
        out[name] = {_key(k): float(v["null"]) for k, v in raw[key].items()}
    return out


def _key(text: str) -> tuple[str, int]:
    kind, gpus = ast.literal_eval(text)  # "('ResNet-18 (batch size 16)', 1)": a tuple literal
    return str(kind), int(gpus)


def job_types(table: Table) -> list[str]:
    """Job types with a 1-GPU figure on every model, in a fixed order."""
    return sorted({k for k, g in next(iter(table.values())) if g == 1})


def steps_per_s(table: Table, kind: str, gpus: int) -> tuple[dict[str, float], bool]:
    """Per model, the job's steps/s on ``gpus`` GPUs; True when the linear model filled
    a missing figure."""
    out, linear = {}, False
    for model, rows in table.items():
        v = rows.get((kind, gpus))
        if v is None:
            one = rows.get((kind, 1))
            if one is None:
                raise TraceError(f"no throughput for job type {kind!r} on {model}")
            v, linear = gpus * one, True
        out[model] = v
    return out, linear


def make_job(job_id: str, submit_s: float, kind: str, gpus: int, steps: float, table: Table,
             tenant: str = "default") -> tuple[TraceJob, bool]:
    rates, linear = steps_per_s(table, kind, gpus)
    best = max(rates.values())
    if best <= 0:
        raise TraceError(f"{job_id}: job type {kind!r} on {gpus} GPUs runs on no model")
    speeds = tuple(sorted((m, round(v / best, 6)) for m, v in rates.items() if v > 0))
    return TraceJob(job_id, submit_s, max(steps / best, 1.0), gpus, tenant, speeds, kind), linear


@dataclass(slots=True)
class Loaded:
    jobs: list[TraceJob] = field(default_factory=list)
    linear: int = 0  # jobs whose throughput came from the linear model


def load_msr(path: Path | str, table: Table | None = None, limit: int | None = None) -> Loaded:
    """One MSR trace: tab-separated job type, command, step flag, data-dir flag, steps,
    arrival (s), GPUs."""
    table = table or throughputs()
    out = Loaded()
    path = Path(path)
    for n, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) != 7:
            raise TraceError(f"{path}:{n + 1}: {len(cols)} columns, expected 7")
        try:
            steps, arrival, gpus = float(cols[4]), float(cols[5]), int(cols[6])
        except ValueError as e:
            raise TraceError(f"{path}:{n + 1}: {e}") from e
        job, linear = make_job(f"{path.stem}-{n}", arrival, cols[0], gpus, steps, table)
        out.jobs.append(job)
        out.linear += linear
    out.jobs.sort(key=lambda j: j.submit_s)
    if limit is not None:
        out.jobs = out.jobs[:limit]
    return out


def poisson(n: int, rate_per_h: float, seed: int, table: Table | None = None) -> Loaded:
    """Gavel's generator: a job type uniformly, GPUs 1 (70%), 2 (10%), 4 (15%), 8 (5%)
    (1 for types measured on one GPU only), a duration on the V100 of 10^U(1.5, 3)
    minutes (80%) or 10^U(3, 4) (20%), Poisson arrivals at ``rate_per_h``."""
    table = table or throughputs()
    rng = random.Random(seed)
    kinds = job_types(table)
    v100 = table["V100"]
    out = Loaded()
    t = 0.0
    for k in range(n):
        t += rng.expovariate(rate_per_h / 3600.0)
        kind = rng.choice(kinds)
        r = rng.random()
        gpus = 2 if 0.7 <= r < 0.8 else 4 if 0.8 <= r < 0.95 else 8 if r >= 0.95 else 1
        if (kind, gpus) not in v100:
            gpus = 1
        minutes = 10 ** (rng.uniform(3, 4) if rng.random() >= 0.8 else rng.uniform(1.5, 3))
        steps = 60.0 * minutes * v100[(kind, gpus)]
        job, linear = make_job(f"p{seed}-{k}", round(t, 3), kind, gpus, steps, table)
        out.jobs.append(job)
        out.linear += linear
    return out


def parse_cluster(text: str) -> dict[str, int]:
    """``v100:36,p100:36,k80:36`` -> {"V100": 36, ...} (GPUs per model)."""
    out: dict[str, int] = {}
    for part in text.split(","):
        name, _, count = part.strip().partition(":")
        if not name or not count.isdigit() or int(count) <= 0:
            raise ValueError(f"bad cluster part {part!r}: expected MODEL:GPUS, e.g. v100:36")
        model = MODELS.get(name.lower(), name.upper())
        out[model] = out.get(model, 0) + int(count)
    return out


def mixed_cluster(gpus: Mapping[str, int], seed: int = 0, per_node: int = GPUS_PER_NODE,
                  cpu_milli: int = 96_000, memory_mib: int = 1_048_576) -> tuple[Node, ...]:
    """Nodes of ``per_node`` GPUs of one model each, in a seeded random order: a policy
    blind to models that takes nodes in order takes models at random, as it would on a
    real cluster, not the fastest by accident of listing."""
    specs: list[str] = []
    for model, count in gpus.items():
        if count % per_node:
            raise ValueError(f"{count} {model} GPUs are not whole nodes of {per_node}")
        specs += [model] * (count // per_node)
    random.Random(seed).shuffle(specs)
    return tuple(Node(f"n{i:04d}", cpu_milli, memory_mib,
                      [GpuSlot(g, f"n{i}-g{g}", model, 16_384, 0) for g in range(per_node)],
                      rack=f"r{i // 16:03d}")
                 for i, model in enumerate(specs))


def gpu_counts(nodes: Sequence[Node]) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in nodes:
        for g in n.gpus:
            out[g.model] = out.get(g.model, 0) + 1
    return out
