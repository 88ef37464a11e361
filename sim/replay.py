"""``kairos sim replay``: the cluster's recorded arrivals, with their observed durations,
through the current policy and a candidate, on the same simulated cluster.

What is replayed: every recorded job that held GPUs (``HistoryJob.ran``; a running job
at export with its running time so far, unless ``drop_censored``), arriving at its
recorded submit time, asking for its recorded task groups (GPUs per replica x replicas,
CPU, memory, GPU shares), gang size, queue, tenant, user, priority, priority class,
preemptibility and ``runtimeEstimate`` (what the live core ranks by: no oracle). What is
not: queueing's quotas (the core alone decides), elastic resizing, node failures.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from scheduling import GpuSlot, JobRequest, Node, SchedulerConfig, TaskRequest
from scheduling.config import PRESETS
from sim.engine import JobRun, SimResult, SimSettings, Simulation
from sim.history_trace import HistoryJob

CURRENT, CANDIDATE = "current", "candidate"


@dataclass(frozen=True, slots=True)
class Policy:
    label: str  # where it came from: a file path or "preset <name>"
    config: SchedulerConfig


def load_policy(arg: str) -> Policy:
    """A policy file (as the scheduler reads ``KAIROS_POLICY_FILE``) or a preset name."""
    if Path(arg).is_file():
        return Policy(arg, SchedulerConfig.from_yaml(Path(arg).read_text()))
    if arg in PRESETS:
        return Policy(f"preset {arg}", SchedulerConfig.preset(arg))
    raise FileNotFoundError(f"{arg!r} is neither a policy file nor a preset ({', '.join(sorted(PRESETS))})")


def current_policy(env: Mapping[str, str] | None = None) -> Policy:
    """What the scheduler runs: ``KAIROS_POLICY_FILE``, else the preset ``KAIROS_POLICY``
    (its default, ``default``), as services/scheduler/main.py's ``load_placer``."""
    env = os.environ if env is None else env
    return load_policy(env.get("KAIROS_POLICY_FILE") or env.get("KAIROS_POLICY") or "default")


def recorded_cluster(shape: Mapping[str, Any]) -> tuple[Node, ...]:
    """The nodes of an export's header (``cluster.groups``), one rack per 32 nodes."""
    nodes: list[Node] = []
    for g in shape.get("groups") or []:
        for _ in range(int(g["count"])):
            i = len(nodes)
            gpus = [GpuSlot(k, f"n{i}-g{k}", g.get("gpu_model", ""), int(g.get("gpu_memory_mib") or 81920), k // 4)
                    for k in range(int(g["gpus"]))]
            nodes.append(Node(f"n{i:04d}", int(g.get("cpu_milli") or 96_000), int(g.get("memory_mib") or 1_048_576),
                              gpus, rack=f"r{i // 32:03d}"))
    return tuple(nodes)


def uniform(nodes: int, gpus: int) -> tuple[Node, ...]:
    """``--nodes N --gpus G``: N nodes of G 80 GiB GPUs, 96 cores, 1 TiB."""
    return recorded_cluster({"groups": [{"count": nodes, "gpus": gpus}]})


def request(j: HistoryJob) -> JobRequest:
    """The recorded job as the live core saw it (shared/job_request.py's fields)."""
    tasks = tuple(TaskRequest(t.name, t.name, t.replicas, gpu=t.gpu, gpu_memory_mib=t.gpu_memory_mib,
                              gpu_compute_pct=t.gpu_compute_pct, cpu_milli=t.cpu_milli, memory_mib=t.memory_mib)
                  for t in j.tasks)
    return JobRequest(j.job_id, tasks, queue=j.queue, tenant=j.tenant, priority=j.priority,
                      submit_time=j.submit_s, min_available=j.min_available, priority_class=j.priority_class,
                      user=j.user, runtime_estimate_s=j.runtime_estimate_s, preemptible=j.preemptible)


class ReplaySimulation(Simulation):
    """The simulator with each arrival asking for its recorded shape (the engine's own
    arrivals make every job one group of up to ``gpus_per_task`` GPUs)."""

    def _handle(self, t: float, kind: int, payload: object) -> bool:
        if isinstance(payload, HistoryJob):  # only arrivals carry a trace job
            jr = JobRun(payload, request(payload), payload.duration_s)
            self.all.append(jr)
            self._queue(jr)
            return True
        return super()._handle(t, kind, payload)


def select(jobs: Sequence[HistoryJob], since: timedelta | None = None, exported_at: str | None = None,
           drop_censored: bool = False) -> list[HistoryJob]:
    """The jobs a replay runs: those that held GPUs, submitted within ``since`` of the
    export, without the still-running ones if ``drop_censored``."""
    cut = None
    if since is not None and exported_at:
        cut = datetime.fromisoformat(exported_at) - since
    return [j for j in jobs if j.ran and not (drop_censored and j.censored)
            and (cut is None or datetime.fromisoformat(j.submitted_at) >= cut)]


def replay(jobs: Sequence[HistoryJob], nodes: tuple[Node, ...], policies: Mapping[str, Policy],
           settings: SimSettings) -> dict[str, SimResult]:
    """Each policy over the same arrivals and cluster."""
    return {name: ReplaySimulation(nodes, jobs, p.config, settings).run() for name, p in policies.items()}
