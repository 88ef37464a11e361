"""Quota per GPU model (Kueue's ResourceFlavors) in queueing's pure admission decision
(``services/queueing/admit.py`` with ``shared/model_quota.py``): a job is admitted
against the first model with room, falls back when its first choice's quota is spent,
borrows and is reclaimed within one model, and the totals still bind."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.queueing.admit import Admission
from services.queueing.quota import QueueTree, WaitReason
from shared.model_quota import Choice, ModelTrees, Quotas
from tests.services.test_queueing_admit import Jobs, admitted, reasons, run, tree_of

FLAVORS = {
    "cohorts": [{"name": "cluster", "gpu_models": [{"model": "H100", "guaranteed": 8},
                                                    {"model": "A100", "guaranteed": 16}]}],
    "queues": [
        {"name": "vision", "cohort": "cluster", "gpu_models": [
            {"model": "H100", "guaranteed": 4, "borrowing_limit": 2},
            {"model": "A100", "guaranteed": 8}]},
        {"name": "nlp", "cohort": "cluster", "gpu_models": [
            {"model": "A100", "guaranteed": 8}, {"model": "H100", "guaranteed": 4}]},
    ],
}


def models_of(d: Admission) -> dict[str, str]:
    return {job_id: c.key for job_id, c in d.choices.items()}


def test_a_job_takes_its_queues_first_model_then_falls_back_when_that_quota_is_spent() -> None:
    jobs = Jobs()
    ids = [jobs.queued("vision", gpus=2) for _ in range(5)]
    d = run(tree_of(FLAVORS), jobs)
    # 4 H100 of its own; 2 more borrowed would need a cohort lender, and nlp lends its 4
    # H100 only when asked: H100 first (own, then borrowed), then A100
    assert [m for _, m in sorted(models_of(d).items())] == ["H100", "H100", "H100", "A100",
                                                            "A100"]
    assert d.quotas.models["H100"].used["vision"][0] == 6
    assert d.quotas.models["A100"].used["vision"][0] == 4
    assert all(c.models[0].startswith(c.key) for c in d.choices.values())
    assert admitted(d)[0] == (ids[0], False)


def test_a_job_naming_its_models_tries_them_in_its_order() -> None:
    jobs = Jobs()
    a = jobs.queued("vision", gpus=2, gpu_model=["A100", "H100"])
    h = jobs.queued("vision", gpus=2, gpu_model="H100-80GB")
    d = run(tree_of(FLAVORS), jobs)
    assert models_of(d) == {a: "A100", h: "H100"}
    assert d.choices[h].models == ("H100-80GB",)


def test_a_model_the_tree_does_not_name_is_not_limited_per_model() -> None:
    jobs = Jobs()
    v = [jobs.queued("vision", gpus=8, gpu_model="V100") for _ in range(3)]
    d = run(tree_of(FLAVORS), jobs)
    assert [j for j, _ in admitted(d)] == v
    assert all(d.choices[j] == Choice("", ("V100-16GB", "V100-32GB", "V100")) for j in v)


def test_when_every_model_is_spent_the_wait_names_each() -> None:
    tree = tree_of({"queues": [{"name": "solo", "gpu_models": [
        {"model": "H100", "guaranteed": 2}, {"model": "A100-80GB", "guaranteed": 2}]}]})
    jobs = Jobs()
    ids = [jobs.queued("solo", gpus=2) for _ in range(3)]
    d = run(tree, jobs)
    assert models_of(d) == {ids[0]: "H100", ids[1]: "A100-80GB"}
    assert reasons(d) == {ids[2]: WaitReason.QUOTA}
    detail = d.waits[ids[2]].detail
    assert detail.startswith("H100: ") and "; A100-80GB: " in detail


def test_the_totals_still_bind_across_models() -> None:
    tree = tree_of({"queues": [{"name": "solo", "guaranteed": {"gpus": 3}, "gpu_models": [
        {"model": "H100", "guaranteed": 2}, {"model": "A100", "guaranteed": 2}]}]})
    jobs = Jobs()
    ids = [jobs.queued("solo", gpus=1) for _ in range(4)]
    d = run(tree, jobs)
    assert len(admitted(d)) == 3 and reasons(d) == {ids[3]: WaitReason.QUOTA}
    assert "3" in d.waits[ids[3]].detail and "H100" not in d.waits[ids[3]].detail


def test_reclaim_picks_only_borrowers_of_the_short_model() -> None:
    tree = tree_of({
        "cohorts": [{"name": "c"}],
        "queues": [
            {"name": "owner", "cohort": "c", "gpu_models": [{"model": "H100", "guaranteed": 4},
                                                            {"model": "A100", "guaranteed": 4}]},
            {"name": "borrower", "cohort": "c", "gpu_models": [
                {"model": "H100", "guaranteed": 0}, {"model": "A100", "guaranteed": 0}]}]})
    jobs = Jobs()
    on_a100 = jobs.admitted("borrower", gpus=4, holds_model="A100")
    on_h100 = jobs.admitted("borrower", gpus=4, holds_model="H100")
    mine = jobs.queued("owner", gpus=4, gpu_model="H100")
    d = run(tree, jobs)
    assert reasons(d) == {mine: WaitReason.RECLAIM}
    assert [(j.job_id, rc.model) for j, rc in d.reclaims] == [(on_h100, "H100")]
    assert on_a100 not in {j.job_id for j, _ in d.reclaims}


def test_a_job_waiting_for_one_models_reclaim_takes_another_model_with_room() -> None:
    tree = tree_of({
        "cohorts": [{"name": "c"}],
        "queues": [
            {"name": "owner", "cohort": "c", "gpu_models": [{"model": "H100", "guaranteed": 4},
                                                            {"model": "A100", "guaranteed": 4}]},
            {"name": "borrower", "cohort": "c", "gpu_models": [{"model": "H100", "guaranteed": 0}]}]})
    jobs = Jobs()
    jobs.admitted("borrower", gpus=4, holds_model="H100")
    mine = jobs.queued("owner", gpus=4)
    d = run(tree, jobs)
    assert models_of(d) == {mine: "A100"} and d.reclaims == []


def test_queue_status_counts_gpus_per_model() -> None:
    jobs = Jobs()
    jobs.admitted("vision", gpus=3, holds_model="H100")
    jobs.admitted("nlp", gpus=2, holds_model="A100")
    d = run(tree_of(FLAVORS), jobs)
    assert d.quotas.used_by_model("vision") == {"H100": 3}
    assert d.quotas.used_by_model("cluster") == {"H100": 3, "A100": 2}


def test_queues_refuse_overlapping_or_unknown_models() -> None:
    from services.queueing.config import QueueConfigError
    with pytest.raises(QueueConfigError, match="overlaps"):
        tree_of({"cohorts": [{"name": "c", "gpu_models": [{"model": "H100"}]}],
                 "queues": [{"name": "q", "cohort": "c",
                             "gpu_models": [{"model": "H100-80GB", "guaranteed": 1}]}]})
    with pytest.raises(QueueConfigError, match="unknown GPU model"):
        tree_of({"queues": [{"name": "q", "gpu_models": [{"model": "X900"}]}]})


# --- property: no model's quota is exceeded beyond what it may borrow -----------------

QUEUES = ("a", "b", "c")
MODELS = ("H100", "A100", "V100")


@st.composite
def trees(draw: Any) -> QueueTree:
    queues = []
    for q in QUEUES:
        entries = []
        for m in MODELS:
            if draw(st.booleans()):
                e: dict[str, Any] = {"model": m, "guaranteed": draw(st.integers(0, 6))}
                if draw(st.booleans()):
                    e["borrowing_limit"] = draw(st.integers(0, 4))
                entries.append(e)
        queues.append({"name": q, "cohort": "top", "gpu_models": entries})
    return tree_of({"cohorts": [{"name": "top"}], "queues": queues})


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_no_model_is_used_beyond_its_guarantee_and_borrowing(data: st.DataObject) -> None:
    tree = data.draw(trees())
    jobs = Jobs()
    for _ in range(data.draw(st.integers(1, 14))):
        q = data.draw(st.sampled_from(QUEUES))
        ask = data.draw(st.sampled_from([None, "H100", "A100", ["A100", "H100"], "V100"]))
        jobs.queued(q, gpus=data.draw(st.integers(1, 4)), gpu_model=ask)
    d = run(tree, jobs)
    models = ModelTrees(tree)
    after = Quotas.of(models, ((j.queue, d.choices[j.job_id].key if j.job_id in d.choices
                                else "", j.held.demand, False)
                               for j, _ in d.admitted))
    for key, state in after.models.items():
        t = models.trees[key]
        pool = sum(t.nominal[q][0] for q in QUEUES)
        assert state.used["top"][0] <= max(pool, 0) + 1e-9 or not t.limited["top"][0]
        for q in QUEUES:
            spec = tree.specs[q].model_quota(key)
            if spec is None or spec.borrowing_limit is None:
                continue
            assert state.used[q][0] <= t.nominal[q][0] + spec.borrowing_limit + 1e-9
    for j, _ in d.admitted:
        c = d.choices.get(j.job_id)
        asked = j.held.event.spec.gpu_models
        if c is not None and asked:
            assert set(c.models) <= set(asked)  # it runs only where it asked to


def test_the_example_queues_by_model_file_admits_as_its_comments_say() -> None:
    from pathlib import Path

    import yaml
    data = yaml.safe_load((Path(__file__).parents[2] / "examples" / "config"
                           / "queues-by-model.yaml").read_text())
    jobs = Jobs()
    ids = [jobs.queued("research", gpus=4) for _ in range(5)]
    d = run(tree_of(data), jobs)
    # 8 H100 of its own (no borrowing), then its 4 A100 (2 more borrowed would not hold
    # a 4-GPU job), then 4 V100 borrowed from default; the fifth waits
    assert [models_of(d).get(i) for i in ids] == ["H100", "H100", "A100", "V100", None]
    assert reasons(d) == {ids[4]: WaitReason.QUOTA}
