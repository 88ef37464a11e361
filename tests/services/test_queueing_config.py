"""The queues file and the quota model of the queue tree (pure: no broker, no database)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.queueing.config import QueueConfigError, load_queues_file, parse_queues
from services.queueing.quota import QueueTree, QuotaState, WaitReason

EXAMPLE = Path(__file__).parents[2] / "examples" / "config" / "queues.yaml"


def errors(data: object) -> list[tuple[str, str]]:
    with pytest.raises(QueueConfigError) as exc:
        parse_queues(data)
    return exc.value.errors


def test_the_example_file_loads_and_the_tree_adds_up() -> None:
    ordering, specs = load_queues_file(EXAMPLE)
    assert ordering.policy == "priority"
    tree = QueueTree(specs)
    assert tree.path("vision-dev") == ["vision-dev", "vision", "cluster"]
    assert tree.tenant("vision-dev") == "vision" and tree.tenant("default") == ""
    assert tree.nominal["cluster"][0] == 4 + 16 + 12  # a cohort without quota: its children's
    assert tree.lend["nlp"][0] == 6


def test_every_bad_field_is_named_at_once() -> None:
    found = errors({"queues": [
        {"name": "Bad_Name"},
        {"name": "a", "guaranteed": {"gpus": -1}, "colour": "red"},
        {"name": "b", "parent": "clustr"},
        {"name": "c", "borrowing_limit": {"gpus": 1}},
        {"name": "d", "guaranteed": {"gpus": 2}, "lending_limit": {"gpus": 3}},
        {"name": "e", "state": "paused"},
    ]})
    paths = [p for p, _ in found]
    assert paths == ["queues.0.name", "queues.1.guaranteed.gpus", "queues.1.colour",
                     "queues.5.state"]
    found = errors({"cohorts": [{"name": "cluster"}], "queues": [
        {"name": "b", "parent": "clustr"},
        {"name": "c", "borrowing_limit": {"gpus": 1}},
        {"name": "d", "guaranteed": {"gpus": 2}, "lending_limit": {"gpus": 3}},
        {"name": "b"},
        {"name": "x", "parent": "y"}, {"name": "y", "parent": "x"},
        {"name": "t", "parent": "v", "tenant": "nlp"},
        {"name": "v", "parent": "cluster", "tenant": "vision"},
    ], "ordering": {"plugins": [{"name": "fifoo"}]}})
    msgs = dict(found)
    assert msgs["ordering.plugins.0.name"] == "unknown plugin 'fifoo' (did you mean 'fifo'?)"
    assert msgs["queues.0.parent"] == "unknown queue or cohort 'clustr' (did you mean 'cluster'?)"
    assert msgs["queues.1.borrowing_limit"] == "needs a parent to borrow from"
    assert msgs["queues.2.lending_limit.gpus"] == "3 exceeds the guaranteed 2"
    assert msgs["queues.3.name"] == "'b' is defined twice (first at queues.0)"
    assert "form a cycle" in msgs["queues.4.parent"]
    assert msgs["queues.6.tenant"] == "'nlp' differs from its parent 'v''s tenant 'vision'"


def test_unreadable_and_malformed_files_say_so(tmp_path: Path) -> None:
    with pytest.raises(QueueConfigError, match="cannot read"):
        load_queues_file(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("queues: [name: x\n")
    with pytest.raises(QueueConfigError, match="<yaml>"):
        load_queues_file(bad)
    assert errors(["a list"]) == [("<root>", "must be a mapping with ordering, cohorts, queues")]


def tree() -> QueueTree:
    _, specs = parse_queues({"cohorts": [
        {"name": "cluster"},
        {"name": "vision", "parent": "cluster", "guaranteed": {"gpus": 12}},
        {"name": "nlp", "parent": "cluster", "guaranteed": {"gpus": 4}},
    ], "queues": [
        {"name": "va", "parent": "vision", "guaranteed": {"gpus": 6}},
        {"name": "vb", "parent": "vision", "guaranteed": {"gpus": 4},
         "borrowing_limit": {"gpus": 1}},
        {"name": "n1", "parent": "nlp"},
        {"name": "free"},
    ]})
    return QueueTree(specs)


@pytest.mark.parametrize(("usage", "queue", "gpus", "admitted", "reason"), [
    ({}, "vb", 5, True, None),  # 4 own + 1 borrowed
    ({}, "vb", 6, False, WaitReason.QUOTA),  # over its borrowing limit
    ({}, "va", 16, True, None),  # the whole cluster: vision borrows nlp's 4
    ({}, "va", 17, False, WaitReason.QUOTA),  # more than the cluster's quota
    ({}, "n1", 16, True, None),  # no quota of its own: borrows all of it
    ({"va": (16.0, 0.0, 0.0)}, "n1", 1, False, WaitReason.RECLAIM),  # nlp's 4 were lent
    ({"vb": (10.0, 0.0, 0.0)}, "va", 8, False, WaitReason.QUOTA),  # vision is full
    ({"va": (30.0, 0.0, 0.0)}, "free", 1000, True, None),  # a tree without quota
])
def test_quota_at_every_level_of_the_tree(usage: dict[str, tuple[float, float, float]],
                                          queue: str, gpus: float, admitted: bool,
                                          reason: WaitReason | None) -> None:
    d = QuotaState(tree(), usage).check(queue, (gpus, 0.0, 0.0))
    assert (d.admitted, d.reason) == (admitted, reason), d.detail


def test_reclaim_names_the_cohort_and_what_must_come_back() -> None:
    state = QuotaState(tree(), {"va": (15.0, 0.0, 0.0)})
    d = state.check("n1", (3.0, 0.0, 0.0))
    assert d.reclaim is not None
    assert (d.reclaim.cohort, d.reclaim.member, d.reclaim.need[0]) == ("cluster", "nlp", 2.0)
    assert state.borrowers("cluster", "nlp") == ["vision"]
    state.mark_freeing("va", (2.0, 0.0, 0.0))  # being preempted: nothing more to ask
    assert state.check("n1", (3.0, 0.0, 0.0)).reclaim.need[0] == 0  # type: ignore[union-attr]
