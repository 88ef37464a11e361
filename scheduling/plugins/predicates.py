"""Predicates: node selectors and taints, GPU model constraints."""

from __future__ import annotations

import numpy as np

from scheduling.arrays import BoolArray
from scheduling.framework import Cycle, JobInfo, PlacementHints, Plugin, register
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
        key = ("gpumodel-node", models, task.mig)
        cached = cycle.table.mask_cache.get(key)
        if cached is None:  # GPUs of the model in the mode the task uses: MIG or not
            t = cycle.table
            mode = t.mig_mode if task.mig else ~t.mig_mode
            built: BoolArray = np.asarray((t.models_mask(models) & mode).any(axis=1), dtype=bool)
            cycle.table.mask_cache[key] = cached = built
        return cached
