"""Billing weights per GPU model (Slurm's TRESBillingWeights per partition): set on a
queue or cohort, inherited model by model, refused when malformed, and carried with each
admitted job to the scheduler (``job.ready``), whose fair share counts GPUs at them."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from services.queueing.messages import admitted
from services.queueing.ordering import Held, demand, job_request
from shared.billing import effective_weights, weight_of
from shared.events import JobReady, JobStatus, JobSubmitted
from shared.jobspec import parse_job_spec
from shared.model_quota import Choice
from shared.queuespec import QueueSpec

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def specs(*qs: QueueSpec) -> dict[str, QueueSpec]:
    return {q.name: q for q in qs}


def test_weights_are_inherited_model_by_model_nearest_first() -> None:
    tree = specs(QueueSpec(name="lab", kind="cohort", billing_weights={"H100": 4, "A100": 2}),
                 QueueSpec(name="team", parent="lab", billing_weights={"A100-80GB": 3}),
                 QueueSpec(name="plain"))
    w = effective_weights(tree, "team")
    assert weight_of(w, "A100-80GB") == 3 and weight_of(w, "A100-40GB") == 2
    assert weight_of(w, "H100-80GB") == 4 and weight_of(w, "V100-32GB") == 1
    assert effective_weights(tree, "plain") == {} and effective_weights(tree, "nowhere") == {}


@pytest.mark.parametrize(("weights", "message"), [
    ({"H900": 2}, "unknown GPU model"),
    ({"H100": 0}, "above 0"),
    ({"H100": -1}, "above 0"),
    ({"H100": 1, "h100 80gb": 2}, "overlaps"),
])
def test_malformed_weights_are_refused_naming_the_model(weights: dict[str, float],
                                                         message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        QueueSpec(name="q", billing_weights=weights)


def test_an_admitted_job_carries_its_model_and_its_queues_weights_to_the_scheduler() -> None:
    spec = parse_job_spec({"name": "j", "queue": "team", "gpuModel": ["H100", "A100"],
                           "tasks": [{"name": "w", "resources": {"gpu": 2}}]})
    sub = JobSubmitted(job_id="j-1", queue="team", tenant="t", user="u", spec=spec,
                       submitted_at=NOW)
    weights = {"A100-80GB": 3.0, "H100": 4.0}
    req = job_request(sub, 1, weights)
    assert dict(req.gpu_prices)["H100-80GB"] == 4.0  # the queue's order sees them too
    choice = Choice("A100", ("A100-40GB", "A100-80GB", "A100"))
    (ready_env, _), (status_env, _) = admitted(Held(1, sub, 1, req, demand(req)), False, NOW,
                                               choice, weights)
    ready = ready_env.payload()
    assert isinstance(ready, JobReady)
    assert ready.gpu_models == list(choice.models) and ready.billing_weights == weights
    status = status_env.payload()
    assert isinstance(status, JobStatus)
    assert status.reason == "admitted by queue team against its A100 quota"
