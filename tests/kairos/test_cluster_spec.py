"""A simulated mixed cluster's description (kairos/cluster_spec.py): the example loads,
each group becomes what its agents report, and a file written wrong names its error."""

from __future__ import annotations

from pathlib import Path

import pytest

from kairos.cluster_spec import NodeGroup, load_cluster

EXAMPLE = Path(__file__).parents[2] / "examples" / "config" / "mixed-cluster.yaml"


def test_the_example_cluster_loads_as_its_agents_will_report_it() -> None:
    spec = load_cluster(EXAMPLE)
    assert [g.name for g in spec.node_groups] == ["hopper", "ampere", "volta"]
    assert spec.nodes == 8
    ampere = spec.node_groups[1].agent_env()
    assert ampere["KAIROS_SIM_GPU_MODEL"] == "NVIDIA A100-SXM4-80GB"
    assert ampere["KAIROS_NODE_TAINTS"] == "dedicated=ml:NoSchedule"
    assert ampere["KAIROS_NODE_LABELS"] == "zone=b"
    assert int(ampere["KAIROS_SIM_GPU_MEMORY_MIB"]) == 81560  # as NVML would, under 80 GiB


@pytest.mark.parametrize(("group", "says"), [
    ({"name": "x", "count": 1, "gpuModel": "H1000"}, "unknown GPU model"),
    ({"name": "x", "count": 1, "taints": ["a=b"]}, "expected key=value:Effect"),
    ({"name": "X y", "count": 1}, "name"),
    ({"name": "x", "count": 0}, "count"),
])
def test_a_group_written_wrong_says_what(group: dict[str, object], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        NodeGroup.model_validate(group)


def test_a_file_with_two_groups_of_one_name_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("nodeGroups: [{name: a, count: 1}, {name: a, count: 2}]\n")
    with pytest.raises(ValueError, match="unique"):
        load_cluster(f)
