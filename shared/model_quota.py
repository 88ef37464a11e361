"""Quota per GPU model (Kueue's ResourceFlavors) over the queue tree.

A queue may give each GPU model a quota of its own (``QueueSpec.gpu_models``: guaranteed,
borrowing and lending limits in GPUs of that model, in the order its jobs try them). Each
model named anywhere in a tree makes a tree of its own, the same queues with that
model's numbers, checked by the same ``QuotaState`` as the totals: borrowing, lending
and reclaim work per model exactly as they do for all GPUs.

In a tree that names models, a GPU job is admitted against one of them and runs only on
it (``Choice``): the first, in its own ``gpuModel`` order (else its queue's order, then
its cohorts', then the tree's other models), whose quota has room now; a job that names
only models the tree does not name is not limited per model. The totals are checked
first and still bind. Queueing admits with it, the gateway's dry run and ceiling check
and the forecaster's replay ask it the same question.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from shared.events.reasons import WaitReason
from shared.gpu_models import expand
from shared.queuespec import Amount, QueueSpec
from shared.quota_state import Decision, QuotaState
from shared.quota_tree import BIG, EPS, ZERO, QueueTree, Vec, add

__all__ = ["NO_MODEL", "Choice", "ModelTrees", "Quotas", "Verdict"]


@dataclass(frozen=True, slots=True)
class Choice:
    """A model quota a job may be admitted against, and the GPU models it then runs on."""

    key: str  # the queue's model name (H100, A100-80GB); "" = no model quota limits it
    models: tuple[str, ...]  # the GPU model names it may run on; empty = any


NO_MODEL = Choice("", ())


def _gpus_only(a: float | None) -> Amount | None:
    return None if a is None else Amount(gpus=a)


def _model_spec(q: QueueSpec, key: str) -> QueueSpec:
    """Queue ``q`` as the tree of one model sees it: that model's numbers as its GPUs."""
    m = q.model_quota(key)
    return q.model_copy(update={
        "guaranteed": _gpus_only(m.guaranteed if m else None),
        "borrowing_limit": _gpus_only(m.borrowing_limit if m else None),
        "lending_limit": _gpus_only(m.lending_limit if m else None), "gpu_models": None})


class ModelTrees:
    """The queue tree's models: one ``QueueTree`` per model named, and the order each
    queue's jobs try them in."""

    def __init__(self, tree: QueueTree) -> None:
        self.tree = tree
        named: dict[str, list[str]] = {}  # top -> model keys, in the order met
        for top in tree.tops:
            keys = named.setdefault(top, [])
            for n in sorted(tree.subtree(top)):
                for m in tree.specs[n].gpu_models or ():
                    if m.model not in keys:
                        keys.append(m.model)
        self.named = named
        keys = sorted({k for ks in named.values() for k in ks})
        self.trees: dict[str, QueueTree] = {
            k: QueueTree(_model_spec(q, k) for q in tree.specs.values()) for k in keys}
        self._order: dict[str, tuple[str, ...]] = {}

    def order(self, queue: str) -> tuple[str, ...]:
        """The models a job of ``queue`` tries when it names none: its queue's, then each
        cohort's above it, then the tree's others."""
        got = self._order.get(queue)
        if got is None:
            out: dict[str, None] = {}
            for n in self.tree.path(queue):
                out.update(dict.fromkeys(m.model for m in self.tree.specs[n].gpu_models or ()))
            out.update(dict.fromkeys(self.named.get(self.tree.top_of[queue], ())))
            got = self._order[queue] = tuple(out)
        return got

    def choices(self, queue: str, gpus: float, requested: Sequence[str]) -> list[Choice]:
        """What a job of ``queue`` asking ``gpus`` GPUs may be admitted against, in the
        order to try; ``requested``: its ``gpuModel`` names in its order (empty: any)."""
        if gpus <= 0 or queue not in self.tree.specs:
            return [NO_MODEL]
        order = self.order(queue)
        if not order:
            return [NO_MODEL]
        if not requested:
            return [Choice(k, expand(k)) for k in order]
        covered = {m for k in order for m in expand(k)}
        out: list[Choice] = []
        for name in requested:
            asked = expand(name)
            for k in order:
                inside = set(expand(k))
                models = tuple(m for m in asked if m in inside)
                if models and all(c.key != k for c in out):
                    out.append(Choice(k, models))
            rest = tuple(m for m in asked if m not in covered)
            if rest and Choice("", rest) not in out:
                out.append(Choice("", rest))
        return out

    def key_of(self, queue: str, models: Sequence[str]) -> str:
        """The model quota a job admitted to run on ``models`` counts against ("": none)."""
        if not models or queue not in self.tree.specs:
            return ""
        return next((k for k in self.order(queue) if set(models) <= set(expand(k))), "")

    def ceiling(self, queue: str, key: str) -> float:
        """The most GPUs of model ``key`` a job of ``queue`` could ever be admitted for."""
        t = self.trees.get(key)
        if t is None or queue not in t.specs:
            return BIG
        return t.ceiling(queue).amount[0]


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether a job is admitted now, and against which model quota."""

    decision: Decision
    choice: Choice = NO_MODEL


@dataclass(slots=True)
class Quotas:
    """A tree's quota state: the totals and each model's (GPUs only: ``(gpus, 0, 0)``)."""

    trees: ModelTrees
    total: QuotaState
    models: dict[str, QuotaState] = field(default_factory=dict)

    @classmethod
    def of(cls, trees: ModelTrees, usage: Iterable[tuple[str, str, Vec, bool]]) -> Quotas:
        """From what the admitted jobs hold: (queue, model key, demand, being reclaimed)."""
        held = list(usage)

        def state(tree: QueueTree, key: str | None) -> QuotaState:
            """``key`` None: the totals; else that model's GPUs alone."""
            used: dict[str, Vec] = {}
            freeing: dict[str, Vec] = {}
            for queue, k, d, going in held:
                if key is not None and k != key:
                    continue
                v = d if key is None else (d[0], 0.0, 0.0)
                for acc in (used, freeing) if going else (used,):
                    acc[queue] = add(acc.get(queue, ZERO), v)
            return QuotaState(tree, used, freeing)
        return cls(trees, state(trees.tree, None),
                   {k: state(t, k) for k, t in trees.trees.items()})

    def check(self, queue: str, demand: Vec, choices: Sequence[Choice]) -> Verdict:
        """The totals, then the first model that has room now. None has: the first that
        waits for reclaim (its borrowers are stopped), else the wait names each model."""
        total = self.total.check(queue, demand)
        if not total.admitted:
            return Verdict(total)
        tried: list[tuple[Choice, Decision]] = []
        for c in choices:
            state = self.models.get(c.key)
            if state is None:
                return Verdict(total, c)
            d = state.check(queue, (demand[0], 0.0, 0.0))
            if d.admitted:
                return Verdict(Decision(True, borrowing=total.borrowing or d.borrowing), c)
            tried.append((c, d))
        if not tried:
            return Verdict(total)
        for c, d in tried:
            if d.reason is WaitReason.RECLAIM:
                return Verdict(replace(d, detail=f"{c.key}: {d.detail}"), c)
        c, d = tried[0]
        detail = "; ".join(f"{c.key}: {d.detail}" for c, d in tried)
        return Verdict(Decision(False, reason=WaitReason.QUOTA, detail=detail, at=d.at), c)

    def add(self, queue: str, demand: Vec, key: str) -> None:
        self.total.add(queue, demand)
        if key in self.models:
            self.models[key].add(queue, (demand[0], 0.0, 0.0))

    def mark_freeing(self, queue: str, demand: Vec, key: str) -> None:
        self.total.mark_freeing(queue, self.total.mask(queue, demand))
        if key in self.models:
            m = self.models[key]
            m.mark_freeing(queue, m.mask(queue, (demand[0], 0.0, 0.0)))

    def state(self, key: str) -> QuotaState:
        """The state a reclaim of model ``key`` is counted in ("" = the totals)."""
        return self.models.get(key, self.total)

    def used_by_model(self, queue: str) -> dict[str, float]:
        """GPUs of each named model the queue's subtree holds (models it holds none of
        are left out)."""
        return {k: s.used[queue][0] for k, s in self.models.items()
                if queue in s.used and s.used[queue][0] > EPS}

