"""Affinity between a job's tasks, as a Kubernetes user writes pod (anti-)affinity: a
task's replicas want to run near (``affinity``) or apart from (``antiAffinity``) the
replicas of a task named in the same job, within a topology domain.

    tasks:
      - name: ps
      - name: worker
        replicas: 4
        affinity: [{task: ps, topologyKey: rack}]            # near the parameter servers
        antiAffinity: [{task: worker, topologyKey: node, required: true}]  # one per node

``topologyKey`` is ``node`` (``kubernetes.io/hostname``) or ``rack`` (``kairos.io/rack``).
A rule is a preference unless ``required`` (Kubernetes' requiredDuringScheduling): a
required rule no placement can keep leaves the job waiting with ``affinity`` as its
reason. Tasks placed first anchor the later ones (parameter servers before workers).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from scheduling import AffinityRule

MAX_RULES = 8  # per task and kind
Scope = Literal["node", "rack"]
TOPOLOGY_KEYS: dict[str, Scope] = {"node": "node", "kubernetes.io/hostname": "node", "rack": "rack",
                                   "kairos.io/rack": "rack"}


class TaskAffinity(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)
    task: Annotated[str, Field(min_length=1, max_length=63, description="a task of the same job")]
    topology_key: str = Field(default="node", description=(
        "the domain: node (kubernetes.io/hostname) or rack (kairos.io/rack)"))
    required: bool = Field(default=False, description=(
        "true: never placed otherwise (the job waits); false: a preference"))

    @field_validator("topology_key")
    @classmethod
    def _known_key(cls, v: str) -> str:
        if v not in TOPOLOGY_KEYS:
            raise ValueError(f"topologyKey must be one of {', '.join(TOPOLOGY_KEYS)}")
        return v

    @property
    def scope(self) -> Scope:
        return TOPOLOGY_KEYS[self.topology_key]


Rules = Annotated[list[TaskAffinity], Field(max_length=MAX_RULES)]


def unknown_tasks(named: dict[str, tuple[list[TaskAffinity], list[TaskAffinity]]]) -> list[str]:
    """Errors for rules naming a task the job does not have (task -> its two lists)."""
    return [f"task {owner!r}: {kind} names task {r.task!r}, which the job does not have"
            for owner, (near, apart) in named.items()
            for kind, rules in (("affinity", near), ("antiAffinity", apart))
            for r in rules if r.task not in named]


def core_rules(tasks: list[tuple[str, list[TaskAffinity], list[TaskAffinity]]],
               role_of: dict[str, str]) -> tuple[AffinityRule, ...]:
    """The core's rules (between roles) from each task's (role, affinity, antiAffinity)."""
    return tuple(AffinityRule(role, role_of[r.task], r.scope, anti=anti, required=r.required)
                 for role, near, apart in tasks
                 for anti, rules in ((False, near), (True, apart)) for r in rules)
