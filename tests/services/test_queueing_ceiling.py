"""A queue's quota ceiling (``shared/quota_tree.py``, what admission refuses a job
above) agrees with queueing's own admission check on an empty cluster: a job at the
ceiling is admitted, one a little larger never is."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.queueing.quota import QuotaState
from shared.jobspec import parse_job_spec
from shared.queuespec import QueueSpec
from shared.quota_tree import BIG, QueueTree, spec_demand


def q(name: str, **fields: object) -> QueueSpec:
    return QueueSpec.model_validate({"name": name, **fields})


def test_a_team_reaches_its_borrowing_limit_or_what_its_cohorts_can_lend() -> None:
    tree = QueueTree([
        q("cluster", kind="cohort"),
        q("vision", kind="cohort", parent="cluster", guaranteed={"gpus": 8},
          borrowing_limit={"gpus": 4}),
        q("vision-dev", parent="vision", guaranteed={"gpus": 2}, borrowing_limit={"gpus": 3}),
        q("vision-prod", parent="vision", guaranteed={"gpus": 6}),
        q("nlp", parent="cluster", guaranteed={"gpus": 8}, lending_limit={"gpus": 2}),
        q("solo", guaranteed={"gpus": 1}),
        q("free"),
    ])
    dev = tree.ceiling("vision-dev")
    assert dev.amount[0] == 5 and dev.at[0] == "vision-dev"  # 2 + its borrowing limit 3
    # all of vision (8) and what vision may borrow: 4 by its limit, but nlp lends only 2
    prod = tree.ceiling("vision-prod")
    assert prod.amount[0] == 10 and prod.at[0] == "vision"
    assert tree.ceiling("nlp").amount[0] == 8 + 8  # nlp may borrow all vision lends
    assert tree.ceiling("solo").amount[0] == 1 and tree.ceiling("solo").at[0] == "solo"
    assert tree.ceiling("vision-dev").amount[1] == BIG  # CPU: limited nowhere
    assert tree.ceiling("free").amount == (BIG, BIG, BIG)  # a tree without quota


def test_the_demand_is_what_queueing_reserves() -> None:
    spec = parse_job_spec({"name": "j", "tasks": [
        {"name": "w", "replicas": 3, "resources": {"gpu": 2, "cpu": 1000, "memory": 10}},
        {"name": "s", "replicas": 2, "resources": {"gpuMemory": 1000, "gpuCompute": 25}}]})
    assert spec_demand(spec) == (6.5, 3000 + 2 * spec.tasks[1].resources.cpu,
                                 30 + 2 * spec.tasks[1].resources.memory)


amount = st.one_of(st.none(), st.integers(0, 12))


@st.composite
def trees(draw: st.DrawFn) -> list[QueueSpec]:
    """A random tree of up to three levels; GPUs and CPU limited here and there."""
    specs: list[QueueSpec] = []
    n = draw(st.integers(1, 6))
    for i in range(n):
        parent = draw(st.one_of(st.none(), st.sampled_from([s.name for s in specs])
                                if specs else st.none()))
        fields: dict[str, object] = {"kind": "queue"}
        g = {"gpus": draw(amount), "cpu_milli": draw(amount)}
        g = {k: v for k, v in g.items() if v is not None}
        if g:
            fields["guaranteed"] = g
        if parent is not None:
            fields["parent"] = parent
            b = {k: v for k, v in {"gpus": draw(amount), "cpu_milli": draw(amount)}.items()
                 if v is not None}
            if b:
                fields["borrowing_limit"] = b
        if g and draw(st.booleans()):
            fields["lending_limit"] = {k: draw(st.integers(0, int(v)))  # type: ignore[call-overload]
                                       for k, v in g.items()}
        specs.append(q(f"q{i}", **fields))
    return specs


@settings(max_examples=300, deadline=None)
@given(trees())
def test_the_ceiling_is_exactly_where_an_empty_cluster_stops_admitting(
        specs: list[QueueSpec]) -> None:
    tree = QueueTree(specs)
    for name in tree.specs:
        ceiling = tree.ceiling(name)
        for r in range(2):
            at = [0.0, 0.0, 0.0]
            if ceiling.amount[r] >= BIG / 2:
                at[r] = 1e6
                assert QuotaState(tree).check(name, (at[0], at[1], at[2])).admitted, (name, r)
                continue
            at[r] = ceiling.amount[r]
            assert QuotaState(tree).check(name, (at[0], at[1], at[2])).admitted, (name, r)
            at[r] += 0.5
            demand = (at[0], at[1], at[2])
            assert not QuotaState(tree).check(name, demand).admitted, (name, r, ceiling)
            assert ceiling.exceeded(demand) == [r]
