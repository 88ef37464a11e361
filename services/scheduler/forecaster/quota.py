"""When would queueing admit a job it holds for quota? The rule a forecast replay asks at
every step (``scheduling.forecast.Admit``), from the queue tree queueing keeps in the
``queues`` table and its own quota check (``shared.quota_state``, the one queueing and
the gateway's dry run use).

Queueing's decision (``services/queueing/admit.py``) in the replay's terms: usage is
what the jobs admitted in the replay reserve (running or waiting for GPUs), held jobs
are tried in arrival order, a job that must wait holds back no later one unless its
queue is ``strict``, a closed queue admits nothing. Two simplifications: arrival order
stands for the queue's ordering plugins, and a job whose guarantee is lent out (it
waits for *reclaim*) counts as admitted at once, as the borrowers it waits for are
being stopped. Where the tree gives GPU models quotas of their own, a held job counts
against the first model with room (``shared/model_quota.py``), an admitted one against
the model it runs on.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from scheduling import JobRequest
from scheduling.forecast import Admit
from shared.events.reasons import WaitReason
from shared.model_quota import ModelTrees, Quotas
from shared.queuespec import QueueSpec, QueueState
from shared.quota_tree import QueueTree, request_demand


def tree_of(configs: Mapping[str, Any]) -> QueueTree:
    """The tree from the ``queues`` table's ``config`` column, by queue name."""
    return QueueTree(QueueSpec.model_validate(c) for c in configs.values())


def admit_rule(tree: QueueTree) -> Admit:
    models = ModelTrees(tree)

    def admit(admitted: Sequence[JobRequest], held: Sequence[JobRequest]) -> Collection[str]:
        state = Quotas.of(models, ((j.queue, models.key_of(j.queue, j.gpu_models),
                                    request_demand(j), False)
                                   for j in admitted if j.queue in tree.specs))
        out: list[str] = []
        stuck: set[str] = set()  # strict queues held back by a job ahead
        for j in held:
            spec = tree.specs.get(j.queue)
            if spec is None:  # the default queue before queueing announced it: no quota
                out.append(j.job_id)
                continue
            if spec.state == QueueState.CLOSED or j.queue in stuck:
                continue
            d = request_demand(j)
            verdict = state.check(j.queue, d, models.choices(j.queue, d[0], j.gpu_models))
            decision = verdict.decision
            if decision.admitted or decision.reason == WaitReason.RECLAIM:
                state.add(j.queue, d, verdict.choice.key)
                out.append(j.job_id)
            elif spec.strategy == "strict":
                stuck.add(j.queue)
        return out

    return admit
