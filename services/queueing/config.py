"""The queues file: the queue tree queueing starts with, and how it orders jobs.

This is policy, read from the file ``KAIROS_QUEUES_FILE`` names; the service's process
settings (that path, ports, the cycle period) are ``settings.py``.

A queues file (``KAIROS_QUEUES_FILE``, see ``examples/queues.yaml``)::

    ordering: {policy: priority, aging_per_hour: 0, starvation_bound_s: 14400,
               half_life_s: 0, fairshare_weight: 0}  # past use decayed: off
    cohorts:                       # nodes of the tree that hold no jobs
      - {name: cluster}
      - {name: vision, parent: cluster, tenant: vision, guaranteed: {gpus: 16}}
    queues:                        # where jobs are submitted
      - name: vision-train
        parent: vision             # (or ``cohort:``)
        guaranteed: {gpus: 8}      # (or ``nominal:``) GPUs, cpu_milli, memory_mib
        borrowing_limit: {gpus: 8} # above guaranteed, from the cohort's unused quota
        lending_limit: {gpus: 4}   # of its guarantee, what others may borrow
        weight: 2                  # its share in fair-share ordering
        state: open                # open | closed | draining
        strategy: best_effort      # or strict (a blocked head blocks the queue)

Every error is reported with its field path (``queues.2.guaranteed.gpus: ...``), all at
once, like the scheduling core's config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from scheduling import ConfigError, SchedulerConfig
from services.queueing.errors import QueueingError
from shared.queuespec import QueueSpec, tree_errors, validation_errors


class QueueConfigError(QueueingError, ValueError):
    """Invalid queue configuration; ``errors`` lists (field path, message)."""

    def __init__(self, errors: list[tuple[str, str]], what: str = "queues file") -> None:
        self.errors = errors
        super().__init__(f"invalid {what}:\n" + "\n".join(f"  {p}: {m}" for p, m in errors))


class OrderingSpec(BaseModel):
    """How pending jobs are ordered: a policy of the scheduling core's ordering plugins,
    or ``plugins`` (a core config's plugin list) for full control."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    policy: Literal["priority", "fairshare", "fifo"] = Field(
        "priority", description="priority: class, user priority and aging, then fair share "
        "between queues, then FIFO; fairshare: DRF between queues, then FIFO; fifo")
    aging_per_hour: float = Field(0.0, ge=0, description="priority points per hour waited")
    starvation_bound_s: float = Field(4 * 3600.0, gt=0, description="past it a job goes first")
    half_life_s: float = Field(0.0, ge=0, description="each queue's past use decays by half in "
                               "this time and counts beside its current share in fair share "
                               "between queues (Slurm's PriorityDecayHalfLife); 0: off")
    fairshare_weight: float = Field(0.0, ge=0, description="priority: points a queue's jobs lose "
                                    "per unit of its decayed past share (PriorityWeightFairshare)")
    plugins: list[dict[str, Any]] | None = None

    def scheduler_config(self) -> SchedulerConfig:
        prio: dict[str, Any] = {"name": "priority", "args": {
            "aging_per_hour": self.aging_per_hour, "starvation_bound_s": self.starvation_bound_s,
            "fairshare_weight": self.fairshare_weight}}
        fair: dict[str, Any] = {"name": "fairshare", "args": {
            "quota": False, "reclaim": False, "half_life_s": self.half_life_s}}
        plugins: list[dict[str, Any]] = self.plugins if self.plugins is not None else {
            "priority": [prio, fair, {"name": "fifo"}],
            "fairshare": [fair, {"name": "fifo"}],
            "fifo": [{"name": "fifo"}],
        }[self.policy]
        return SchedulerConfig.load({"plugins": plugins})


class QueuesFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    ordering: OrderingSpec = Field(default_factory=OrderingSpec)
    cohorts: list[QueueSpec] = Field(default_factory=list)
    queues: list[QueueSpec] = Field(default_factory=list)

    def specs(self) -> list[QueueSpec]:
        return [c.model_copy(update={"kind": "cohort"}) for c in self.cohorts] + list(self.queues)


def parse_queues(data: Any) -> tuple[OrderingSpec, list[QueueSpec]]:
    """Validate a decoded queues file; raises QueueConfigError listing every bad field."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise QueueConfigError([("<root>", "must be a mapping with ordering, cohorts, queues")])
    try:
        parsed = QueuesFile.model_validate(data)
    except ValidationError as exc:
        raise QueueConfigError(validation_errors(exc)) from exc
    errors: list[tuple[str, str]] = []
    try:
        parsed.ordering.scheduler_config()
    except ConfigError as exc:
        errors += [(f"ordering.{p}", m) for p, m in exc.errors]
    specs: dict[str, QueueSpec] = {}
    where: dict[str, str] = {}
    for section, items in (("cohorts", parsed.cohorts), ("queues", parsed.queues)):
        for i, q in enumerate(items):
            if q.name in specs:
                errors.append((f"{section}.{i}.name", f"{q.name!r} is defined twice "
                               f"(first at {where[q.name]})"))
                continue
            specs[q.name] = q.model_copy(update={"kind": "cohort"}) if section == "cohorts" else q
            where[q.name] = f"{section}.{i}"
    errors += tree_errors(specs, where)
    if errors:
        raise QueueConfigError(errors)
    return parsed.ordering, list(specs.values())


def load_queues_file(path: str | Path) -> tuple[OrderingSpec, list[QueueSpec]]:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise QueueConfigError([("<file>", f"cannot read {p}: {exc.strerror}")]) from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise QueueConfigError([("<yaml>", str(exc))]) from exc
    return parse_queues(data)
