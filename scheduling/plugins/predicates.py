"""Predicates: node selectors and taints, GPU model constraints, role (anti-)affinity."""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from scheduling.arrays import BoolArray, FloatArray, IntArray
from scheduling.framework import Cycle, JobInfo, PlacementHints, Placing, Plugin, register
from scheduling.model import Node, TaskRequest


def _tolerates(taint: str, tolerations: tuple[str, ...]) -> bool:
    key = taint.split("=", 1)[0].split(":", 1)[0]
    return taint in tolerations or key in tolerations


def _matches(node: Node, selector: tuple[tuple[str, str], ...], tolerations: tuple[str, ...]) -> bool:
    return (all(node.labels.get(k) == v for k, v in selector)
            and all(_tolerates(t, tolerations) for t in node.taints))


@register
class NodeAffinity(Plugin):
    """Node selector (labels) and taints/tolerations; also drops unschedulable nodes."""

    name = "nodeaffinity"

    def node_mask(self, cycle: Cycle, info: JobInfo, task: TaskRequest) -> BoolArray | None:
        job = info.job
        selector = tuple(sorted(job.node_selector.items()))
        table = cycle.table
        key = ("nodeaffinity", selector, job.tolerations)
        cached = table.mask_cache.get(key)
        if cached is None:
            built: BoolArray = np.fromiter(
                (_matches(n, selector, job.tolerations) for n in table.nodes), bool, table.n)
            table.mask_cache[key] = cached = built
        return cached


@register
class GpuModel(Plugin):
    """GPU model constraints: only nodes with a GPU of an allowed model (GPU picks too)."""

    name = "gpumodel"

    def open(self, cycle: Cycle) -> None:
        cycle.setdefault(PlacementHints).enforce_models = True

    def node_mask(self, cycle: Cycle, info: JobInfo, task: TaskRequest) -> BoolArray | None:
        models = info.job.gpu_models
        if not models or not (task.gpu or task.shared or task.mig):
            return None
        key = ("gpumodel-node", models)
        cached = cycle.table.mask_cache.get(key)
        if cached is None:
            built: BoolArray = np.asarray(cycle.table.models_mask(models).any(axis=1), dtype=bool)
            cycle.table.mask_cache[key] = cached = built
        return cached


@register
class RoleAffinity(Plugin):
    """Affinity / anti-affinity between roles of one job, at node or rack scope.

    Required rules filter nodes; preferred ones add +1 (affinity) or -1 (anti) to the
    score. Roles placed earlier in the gang (parameter servers first) anchor later ones.
    """

    name = "affinity"

    def _hits(self, cycle: Cycle, p: Placing, cand: IntArray, required: bool
              ) -> list[tuple[bool, BoolArray]]:
        """(anti, candidate is near an anchor) for each rule of this role that has anchors."""
        out = []
        rack = cycle.table.rack
        for rule in p.info.job.affinity:
            if rule.role != p.task.role or rule.required != required:
                continue
            anchors = [n for n, role in zip(p.nodes, p.roles, strict=True) if role == rule.to_role]
            if not anchors:
                continue
            if rule.scope == "node":
                near = np.zeros(cycle.table.n, dtype=bool)
                near[anchors] = True
                hit = near[cand]
            else:
                near = np.zeros(len(cycle.table.racks), dtype=bool)
                near[rack[anchors]] = True
                hit = near[rack[cand]]
            out.append((rule.anti, hit))
        return out

    def task_mask_applies(self, cycle: Cycle, p: Placing) -> bool:
        return bool(p.info.job.affinity) and bool(p.nodes)

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
