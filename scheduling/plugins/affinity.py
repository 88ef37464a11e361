"""Affinity and anti-affinity, as Kubernetes' pod (anti-)affinity: a role's replicas
want to be near (or apart from) the replicas of another role of the job, or other jobs'
tasks whose labels a rule selects (of its own tenant only), within a topology domain (node, rack, NVLink domain,
or any node label).

Required rules filter nodes; preferred ones add +1 (affinity) or -1 (anti) to the score.
Roles placed earlier in the gang (parameter servers first) anchor later ones; other jobs
anchor where they run, and where this cycle placed them (so two jobs placed in one cycle
keep a required anti-affinity between them, as the scheduler's assumed pods do).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np

from scheduling.arrays import BoolArray, FloatArray, IntArray
from scheduling.framework import Cycle, Placing, Plugin, register
from scheduling.model import AffinityRule, JobRequest

_Key = tuple[str, tuple[tuple[str, str], ...]]  # (tenant, label pairs)


def _selects(key: _Key, job: JobRequest) -> bool:
    """A selector sees only its own tenant's jobs (as a pod affinity its namespace's):
    another tenant's jobs can be neither followed nor probed."""
    return job.tenant == key[0] and all(job.labels.get(k) == v for k, v in key[1])


@dataclass(slots=True)
class OtherJobs:
    """Per tenant and selector, the nodes where the jobs it selects run, this cycle's
    placements added as they come (``seen``: how many of ``Cycle.placed`` are counted)."""

    nodes: dict[_Key, BoolArray] = field(default_factory=dict)
    seen: dict[_Key, int] = field(default_factory=dict)

    def of(self, cycle: Cycle, rule: AffinityRule, tenant: str) -> BoolArray:
        sel = (tenant, rule.to_jobs)
        at = self.nodes.get(sel)
        if at is None:
            at = self.nodes[sel] = np.zeros(cycle.table.n, dtype=bool)
            self.seen[sel] = 0
            chosen = {r.job.job_id for r in cycle.snapshot.running if _selects(sel, r.job)}
            index = cycle.table.index
            for a in cycle.snapshot.allocations:
                if a.job_id in chosen and (i := index.get(a.node_id)) is not None:
                    at[i] = True
        for job, binds in cycle.placed[self.seen[sel]:]:
            if _selects(sel, job):
                at[[cycle.table.index[b.node_id] for b in binds]] = True
        self.seen[sel] = len(cycle.placed)
        return at


@register
class Affinity(Plugin):
    name = "affinity"

    def _hits(self, cycle: Cycle, p: Placing, cand: IntArray, required: bool
              ) -> list[tuple[bool, BoolArray]]:
        """(anti, candidate is near an anchor) for each rule of this role that has anchors."""
        out = []
        job = p.info.job
        for rule in job.affinity:
            if rule.role != p.task.role or rule.required != required:
                continue
            if rule.to_jobs:
                anchors = np.flatnonzero(cycle.setdefault(OtherJobs).of(cycle, rule, job.tenant))
            else:
                anchors = np.asarray([n for n, role in zip(p.nodes, p.roles, strict=True)
                                      if role == rule.to_role], dtype=np.int64)
            if not anchors.size:
                if rule.to_jobs:  # no such job runs: near it is nowhere, apart from it anywhere
                    out.append((rule.anti, np.zeros(cand.size, dtype=bool)))
                continue
            dom = cycle.table.domains_of(rule.scope)
            near = np.unique(dom[anchors])
            near = near[near >= 0]
            here = dom[cand]
            out.append((rule.anti, np.isin(here, near) & (here >= 0)))
        return out

    def task_mask_applies(self, cycle: Cycle, p: Placing) -> bool:
        rules = p.info.job.affinity
        return bool(rules) and (bool(p.nodes) or any(r.to_jobs for r in rules))

    def task_mask(self, cycle: Cycle, p: Placing, cand: IntArray) -> BoolArray | None:
        if not p.info.job.affinity:
            return None
        hits = self._hits(cycle, p, cand, required=True)
        if not hits:
            return None
        ok = np.ones(cand.size, dtype=bool)
        for anti, hit in hits:
            ok &= ~hit if anti else hit
        return ok

    def score(self, cycle: Cycle, p: Placing, cand: IntArray) -> FloatArray | None:
        if not p.info.job.affinity:
            return None
        hits = self._hits(cycle, p, cand, required=False)
        if not hits:
            return None
        out = np.zeros(cand.size)
        for anti, hit in hits:
            out += np.where(hit, -1.0 if anti else 1.0, 0.0)
        return out

    def score_key(self, cycle: Cycle, p: Placing) -> Hashable | None:
        return None if p.info.job.affinity else ()

    def score_epoch(self, cycle: Cycle) -> Hashable | None:
        return ()
