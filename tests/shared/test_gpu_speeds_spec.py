"""``throughput`` and ``gpuModel`` lists in the job spec, as the core receives them."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from shared.job_request import job_request
from shared.jobspec import parse_job_spec


def spec(**extra: object) -> dict[str, object]:
    return {"name": "a", "tasks": [{"name": "w", "resources": {"gpu": 1}}], **extra}


def request(**extra: object):  # type: ignore[no-untyped-def]
    return job_request(parse_job_spec(spec(**extra)), job_id="j", queue="q", tenant="t", user="u",
                       submitted_at=datetime(2026, 1, 1, tzinfo=UTC), attempt=1)


def test_throughput_becomes_speeds_relative_to_the_fastest_named() -> None:
    req = request(throughput={"H100": 3.0, "V100-32GB": 1.0})
    speeds = dict(req.gpu_speeds)
    assert speeds["H100-80GB"] == speeds["H100"] == 1.0  # a family names all its sizes
    assert speeds["V100-32GB"] == pytest.approx(1 / 3) and "V100-16GB" not in speeds
    assert request().gpu_speeds == ()


def test_a_list_of_models_carries_its_order() -> None:
    req = request(gpuModel=["A100-80GB", "H100"])
    assert req.gpu_models[0] == "A100-80GB"
    assert dict(zip(req.gpu_models, req.gpu_model_ranks, strict=True)) == {
        "A100-80GB": 0, "H100-80GB": 1, "H100-94GB": 1, "H100-96GB": 1, "H100": 1}
    assert request(gpuModel="H100").gpu_model_ranks == ()  # one choice: no order to keep


def test_a_cpu_only_job_carries_neither() -> None:
    s = spec(throughput={"H100": 2.0}, gpuModel=["H100", "V100"])
    s["tasks"] = [{"name": "w", "resources": {"cpu": 1000}}]
    req = job_request(parse_job_spec(s), job_id="j", queue="q", tenant="t", user="u",
                      submitted_at=datetime(2026, 1, 1, tzinfo=UTC), attempt=1)
    assert req.gpu_speeds == () and req.gpu_model_ranks == ()


@pytest.mark.parametrize(("throughput", "error"), [
    ({"H1000": 1.0}, "unknown GPU model 'H1000'"),
    ({"A100-64GB": 1.0}, "no A100 has 64 GB"),
    ({"H100": 0}, "greater than 0"),
    ({"H100": -1}, "greater than 0"),
    ({"H100": float("inf")}, "finite number"),
    ({}, "at least one GPU model"),
    ({f"m{k}": 1.0 for k in range(17)}, "at most 16"),
    ({"H100": "fast"}, "valid number"),
])
def test_a_bad_throughput_is_refused_with_what_is_wrong(throughput: object, error: str) -> None:
    with pytest.raises(ValidationError, match=error):
        parse_job_spec(spec(throughput=throughput))


def test_task_affinity_becomes_the_cores_rules_between_roles() -> None:
    s = {"name": "a", "tasks": [
        {"name": "ps", "role": "server"},
        {"name": "worker", "replicas": 2, "resources": {"gpu": 1},
         "affinity": [{"task": "ps", "topologyKey": "kairos.io/rack"}],
         "antiAffinity": [{"task": "worker", "required": True}]}]}
    req = job_request(parse_job_spec(s), job_id="j", queue="q", tenant="t", user="u",
                      submitted_at=datetime(2026, 1, 1, tzinfo=UTC), attempt=1)
    assert [(r.role, r.to_role, r.scope, r.anti, r.required) for r in req.affinity] == [
        ("worker", "server", "rack", False, False), ("worker", "worker", "node", True, True)]


@pytest.mark.parametrize(("rule", "error"), [
    ({"task": "nope"}, "names task 'nope', which the job does not have"),
    ({"task": "w", "topologyKey": "Zone Key!"}, "topologyKey"),  # not a node label key
    ({"task": "w", "jobSelector": {"app": "x"}}, "one of the two"),
    ({"jobSelector": {}}, "at least one label"),
    ({}, "one of the two"),
    ({"task": "w", "weight": 3}, "Extra inputs are not permitted"),
])
def test_a_bad_affinity_rule_is_refused(rule: dict[str, object], error: str) -> None:
    with pytest.raises(ValidationError, match=error):
        parse_job_spec({"name": "a", "tasks": [{"name": "w", "antiAffinity": [rule]}]})


def test_a_rule_may_select_other_jobs_at_any_node_label_scope() -> None:
    s = {"name": "a", "labels": {"app": "train"}, "tasks": [{"name": "w", "affinity": [
        {"jobSelector": {"app": "cache"}, "topologyKey": "nvlink", "required": True},
        {"jobSelector": {"app": "cache", "tier": "hot"}, "topologyKey": "topology.kubernetes.io/zone"}]}]}
    req = job_request(parse_job_spec(s), job_id="j", queue="q", tenant="t", user="u",
                      submitted_at=datetime(2026, 1, 1, tzinfo=UTC), attempt=1)
    assert req.labels == {"app": "train"}
    assert [(r.to_role, r.scope, r.to_jobs, r.required) for r in req.affinity] == [
        ("", "kairos.io/nvlink-domain", (("app", "cache"),), True),
        ("", "topology.kubernetes.io/zone", (("app", "cache"), ("tier", "hot")), False)]


def narrowed(admitted: tuple[str, ...], weights: dict[str, float] | None = None, **extra: object
             ):  # type: ignore[no-untyped-def]
    return job_request(parse_job_spec(spec(**extra)), job_id="j", queue="q", tenant="t",
                       user="u", submitted_at=datetime(2026, 1, 1, tzinfo=UTC), attempt=1,
                       admitted_models=admitted, billing_weights=weights)


def test_the_models_its_quota_admitted_it_for_narrow_where_it_may_run() -> None:
    """``JobReady.gpu_models``: admitted against the A100 quota, a job asking [H100, A100]
    may run on A100s only, keeping its preference ranks."""
    req = narrowed(("A100-40GB", "A100-80GB", "A100"), gpuModel=["H100", "A100"])
    assert req.gpu_models == ("A100-40GB", "A100-80GB", "A100")
    assert req.gpu_model_ranks == (1, 1, 1)
    assert narrowed(("V100-32GB",)).gpu_models == ("V100-32GB",)  # it named none
    assert narrowed(()).gpu_models == ()


def test_billing_weights_become_prices_per_model_name() -> None:
    req = narrowed((), {"A100-80GB": 3.0, "H100": 4.0, "A100": 2.0})
    prices = dict(req.gpu_prices)
    assert prices["A100-80GB"] == 3.0 and prices["A100-40GB"] == 2.0  # the nearer, first
    assert prices["H100-94GB"] == 4.0 and "V100-32GB" not in prices
    assert narrowed(()).gpu_prices == ()
