"""Billing weights per GPU model (Slurm's ``TRESBillingWeights``, set per partition): an
H100-hour may count as more than a V100-hour. A queue's ``billing_weights`` map a GPU
model (a family, ``H100``, or a family with its memory, ``A100-80GB``) to what one
GPU-hour of it counts as; a queue inherits its parent's and overrides model by model; a
model no queue of the path names counts 1.

The weights are read when usage is reported (``kairos usage``: billed GPU-hours, at the
queue's weights now) and travel with each admitted job to the scheduling core, whose
fair share counts a tenant's GPUs at their weights (``JobRequest.gpu_prices``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from shared.gpu_models import expand
from shared.queuespec import QueueSpec


def effective_weights(specs: Mapping[str, QueueSpec], queue: str) -> dict[str, float]:
    """The weights a queue's jobs are billed at: its own over its ancestors', nearest
    first (``weight_of`` takes the first that covers a model, so ``A100-80GB: 3`` in a
    queue beats its cohort's ``A100: 2`` for that size only)."""
    def node(name: str) -> tuple[str | None, Mapping[str, float]] | None:
        q = specs.get(name)
        return None if q is None else (q.parent, q.billing_weights or {})
    return inherited(node, queue)


def inherited(node: Callable[[str], tuple[str | None, Mapping[str, float]] | None],
              queue: str) -> dict[str, float]:
    """``effective_weights`` over ``node(name) -> (parent, own weights)`` (None: no such
    queue), walking up from ``queue``."""
    out: dict[str, float] = {}
    seen: set[str] = set()
    name: str | None = queue
    while name is not None and name not in seen and (found := node(name)) is not None:
        seen.add(name)
        parent, own = found
        for key, w in own.items():
            out.setdefault(key, w)
        name = parent
    return out


def weight_of(weights: Mapping[str, float], model: str) -> float:
    """What one GPU-hour of ``model`` (a node's model name, ``H100-80GB``) counts as."""
    for key, w in weights.items():
        if model in expand(key):
            return w
    return 1.0


def prices(weights: Mapping[str, float]) -> tuple[tuple[str, float], ...]:
    """The weights as the core takes them: each model name each key covers, sorted."""
    out: dict[str, float] = {}
    for key, w in weights.items():
        for m in expand(key):
            out.setdefault(m, w)
    return tuple(sorted(out.items()))
