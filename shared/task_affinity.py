"""Affinity, as a Kubernetes user writes pod (anti-)affinity: a task's replicas want to
run near (``affinity``) or apart from (``antiAffinity``) the replicas of a task named in
the same job, or other jobs' tasks whose labels match ``jobSelector`` (Kubernetes'
``labelSelector.matchLabels``, against the jobs' ``labels``), within a topology domain.

    tasks:
      - name: ps
      - name: worker
        replicas: 4
        affinity: [{task: ps, topologyKey: rack}]            # near the parameter servers
        antiAffinity: [{task: worker, topologyKey: node, required: true}]  # one per node
      - name: eval
        affinity: [{jobSelector: {app: feature-cache}, topologyKey: nvlink, required: true}]

``topologyKey`` is ``node`` (``kubernetes.io/hostname``), ``rack`` (``kairos.io/rack``),
``nvlink`` (``kairos.io/nvlink-domain``: the nodes one NVLink fabric joins, as on an
NVL72 rack; a node without the label is its own domain), or any node label key
(``topology.kubernetes.io/zone``): nodes lacking that label are in no domain.
A rule is a preference unless ``required`` (Kubernetes' requiredDuringScheduling): a
required rule no placement can keep leaves the job waiting with ``affinity`` as its
reason; required affinity to jobs none of which runs waits for one. Tasks placed first
anchor the later ones (parameter servers before workers); other jobs anchor where they
run or were placed earlier in the same cycle.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from scheduling import AffinityRule
from scheduling.node_table import NVLINK_DOMAIN
from shared.node_constraints import LabelKey, LabelValue

MAX_RULES = 8  # per task and kind
TOPOLOGY_KEYS = {"node": "node", "kubernetes.io/hostname": "node", "rack": "rack",
                 "kairos.io/rack": "rack", "nvlink": NVLINK_DOMAIN, NVLINK_DOMAIN: NVLINK_DOMAIN}


class TaskAffinity(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)
    task: Annotated[str | None, Field(min_length=1, max_length=63, description=(
        "a task of the same job (or give jobSelector)"))] = None
    job_selector: Annotated[dict[LabelKey, LabelValue] | None, Field(max_length=8, description=(
        "other jobs whose labels include all of these (or give task)"))] = None
    topology_key: LabelKey = Field(default="node", description=(
        "the domain: node (kubernetes.io/hostname), rack (kairos.io/rack), nvlink "
        "(kairos.io/nvlink-domain), or any node label key"))
    required: bool = Field(default=False, description=(
        "true: never placed otherwise (the job waits); false: a preference"))

    @model_validator(mode="after")
    def _one_target(self) -> TaskAffinity:
        if (self.task is None) == (self.job_selector is None):
            raise ValueError("a rule names a task of the job (task) or selects other jobs "
                             "by their labels (jobSelector), one of the two")
        if self.job_selector == {}:
            raise ValueError("jobSelector needs at least one label (an empty one selects every job)")
        return self

    @property
    def scope(self) -> str:
        return TOPOLOGY_KEYS.get(self.topology_key, self.topology_key)


Rules = Annotated[list[TaskAffinity], Field(max_length=MAX_RULES)]


def unknown_tasks(named: dict[str, tuple[list[TaskAffinity], list[TaskAffinity]]]) -> list[str]:
    """Errors for rules naming a task the job does not have (task -> its two lists)."""
    return [f"task {owner!r}: {kind} names task {r.task!r}, which the job does not have"
            for owner, (near, apart) in named.items()
            for kind, rules in (("affinity", near), ("antiAffinity", apart))
            for r in rules if r.task is not None and r.task not in named]


def core_rules(tasks: list[tuple[str, list[TaskAffinity], list[TaskAffinity]]],
               role_of: dict[str, str]) -> tuple[AffinityRule, ...]:
    """The core's rules (between roles, or towards other jobs) from each task's (role,
    affinity, antiAffinity)."""
    return tuple(AffinityRule(role, role_of[r.task] if r.task else "", r.scope, anti=anti, required=r.required,
                              to_jobs=tuple(sorted((r.job_selector or {}).items())))
                 for role, near, apart in tasks
                 for anti, rules in ((False, near), (True, apart)) for r in rules)
