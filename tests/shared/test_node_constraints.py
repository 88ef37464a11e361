"""Labels, taints and tolerations as a Kubernetes user writes them, as the core matches
them (shared/node_constraints.py), and through the core's own predicate."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from scheduling import Node
from scheduling.plugins.predicates import _matches
from shared.jobspec import parse_job_spec
from shared.node_constraints import (
    Toleration,
    core_tolerations,
    hard_taints,
    parse_labels,
    parse_taints,
)


def test_taints_are_written_back_whole_and_only_hard_ones_keep_jobs_out() -> None:
    taints = parse_taints("dedicated=ml:NoSchedule, spot:NoExecute,gpu=old:PreferNoSchedule")
    assert taints == ["dedicated=ml:NoSchedule", "spot=:NoExecute", "gpu=old:PreferNoSchedule"]
    assert hard_taints(taints) == ("dedicated=ml:NoSchedule", "spot=:NoExecute")
    for bad, says in [("dedicated=ml", "expected key=value:Effect"),
                      ("a=b:Sometimes", "effect must be one of"),
                      ("bad key=x:NoSchedule", "not a valid label")]:
        with pytest.raises(ValueError, match=says):
            parse_taints(bad)
    assert parse_labels("zone=a, kairos.io/pool=train") == {"zone": "a", "kairos.io/pool": "train"}
    with pytest.raises(ValueError, match="expected key=value"):
        parse_labels("zone")


def node(taints: tuple[str, ...], labels: dict[str, str] | None = None) -> Node:
    return Node("n", 1000, 1000, labels=labels or {}, taints=taints)


@pytest.mark.parametrize(("toleration", "taint", "tolerated"), [
    ({"key": "dedicated", "value": "ml"}, "dedicated=ml:NoSchedule", True),
    ({"key": "dedicated", "value": "ml"}, "dedicated=ml:NoExecute", True),  # every effect
    ({"key": "dedicated", "value": "ml", "effect": "NoExecute"}, "dedicated=ml:NoSchedule", False),
    ({"key": "dedicated", "value": "web"}, "dedicated=ml:NoSchedule", False),
    ({"key": "dedicated", "operator": "Exists"}, "dedicated=ml:NoSchedule", True),
    ({"key": "spot", "operator": "Exists"}, "dedicated=ml:NoSchedule", False),
    ({"key": "spot"}, "spot=:NoSchedule", True),  # a taint without value, Equal ""
])
def test_a_toleration_admits_what_kubernetes_would(toleration: dict[str, str], taint: str,
                                                  tolerated: bool) -> None:
    tolerations = core_tolerations([Toleration.model_validate(toleration)])
    assert _matches(node((taint,)), (), tolerations) is tolerated


def test_the_spec_carries_selector_and_tolerations_to_the_core() -> None:
    spec = parse_job_spec({"name": "a", "nodeSelector": {"zone": "b"},
                           "tolerations": [{"key": "spot", "operator": "Exists"}],
                           "tasks": [{"name": "w"}]})
    selector = tuple(sorted(spec.node_selector.items()))
    assert _matches(node(("spot=:NoSchedule",), {"zone": "b"}), selector,
                    spec.core_tolerations)
    assert not _matches(node((), {"zone": "a"}), selector, spec.core_tolerations)
    with pytest.raises(ValidationError, match="operator Exists takes no value"):
        parse_job_spec({"name": "a", "tasks": [{"name": "w"}], "tolerations": [
            {"key": "spot", "operator": "Exists", "value": "x"}]})
