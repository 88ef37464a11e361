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
    assert ampere["KAIROS_SIM_MIG_PROFILES"] == "3g.40gb,2g.20gb,1g.10gb,1g.10gb"
    assert ampere["KAIROS_SIM_MIG_GPUS"] == "2"
    hopper = spec.node_groups[0].agent_env()  # no MIG: says so, whatever was exported
    assert (hopper["KAIROS_SIM_MIG_PROFILES"], hopper["KAIROS_SIM_MIG_GPUS"]) == ("", "0")
    # nor NVLink domains joining nodes
    assert (hopper["KAIROS_NVLINK_DOMAIN"], hopper["KAIROS_SIM_NVLINK_DOMAIN_NODES"]) == ("", "0")


def test_a_mig_group_is_what_its_agents_lay_out() -> None:
    """The settings a group passes build the simulated GPUs the spec describes."""
    from services.node_agent.devices.simulated import SimulatedDevices

    g = NodeGroup.model_validate({"name": "a", "count": 1, "gpuModel": "A100-80GB",
                                  "gpus": 4, "mig": {"profiles": ["7g.80gb"]}})
    env = g.agent_env()
    assert env["KAIROS_SIM_MIG_GPUS"] == "0"  # all of them
    devs = SimulatedDevices("a0-0", int(env["KAIROS_SIM_GPUS_PER_NODE"]),
                            env["KAIROS_SIM_GPU_MODEL"], int(env["KAIROS_SIM_GPU_MEMORY_MIB"]),
                            mig_profiles=env["KAIROS_SIM_MIG_PROFILES"].split(","),
                            mig_gpus=int(env["KAIROS_SIM_MIG_GPUS"])).devices()
    assert all(d.mig_mode for d in devs)
    assert [(m.profile, m.start, m.size) for m in devs[3].mig_instances] == [("7g.80gb", 0, 8)]


def test_nvlink_domains_join_consecutive_nodes_of_the_group() -> None:
    """Node k of the group is in <group>-nvl<k // n>, whichever agent process hosts it:
    run as kairos/stack.py runs a group (a few nodes a process, each process told the
    number of its first node in the group, KAIROS_SIM_FIRST_NODE)."""
    import os
    from unittest import mock

    from services.node_agent.main import AgentHost
    from services.node_agent.settings import AgentSettings

    g = NodeGroup.model_validate({"name": "gb", "count": 10, "gpuModel": "GB200", "gpus": 4,
                                  "nvlinkDomainNodes": 4})
    domains = []
    for first in range(0, g.count, 3):  # 3 nodes a process: domains span processes
        count = min(3, g.count - first)
        prefix = f"gb{first // 3}"  # its nodes <prefix>-<i>, as the stack names them
        env = g.agent_env() | {"KAIROS_NODE_ID": prefix if count > 1 else f"{prefix}-0",
                               "KAIROS_SIM_NODES": str(count),
                               "KAIROS_SIM_FIRST_NODE": str(first)}
        with mock.patch.dict(os.environ, env, clear=True):
            host = AgentHost(AgentSettings(), None)  # type: ignore[arg-type]
        domains += [host.agents[f"{prefix}-{i}"].inventory.labels["kairos.io/nvlink-domain"]
                    for i in range(count)]
    assert domains == [f"gb-nvl{k // 4}" for k in range(10)]


@pytest.mark.parametrize(("group", "says"), [
    ({"name": "x", "count": 1, "gpuModel": "H1000"}, "unknown GPU model"),
    ({"name": "x", "count": 1, "taints": ["a=b"]}, "expected key=value:Effect"),
    ({"name": "X y", "count": 1}, "name"),
    ({"name": "x", "count": 0}, "count"),
    ({"name": "x", "count": 1, "mig": {"profiles": ["1g.5gb"]}},
     "H100-80GB has no MIG profile '1g.5gb'"),
    ({"name": "x", "count": 1, "mig": {"profiles": ["4g.40gb", "3g.40gb", "1g.10gb"]}},
     "do not fit together on one H100-80GB"),
    ({"name": "x", "count": 1, "gpuModel": "Tesla V100-SXM2-32GB",
      "mig": {"profiles": ["1g.10gb"]}}, "V100-32GB is not MIG-capable"),
    ({"name": "x", "count": 1, "gpus": 2, "mig": {"gpus": 3, "profiles": ["1g.10gb"]}},
     "mig.gpus 3 is more than the group's 2 GPUs"),
    ({"name": "x", "count": 1, "mig": {"profiles": []}}, "profiles"),
    ({"name": "x", "count": 1, "mig": {"profiles": ["1g.10gb"], "slices": 7}}, "slices"),
    ({"name": "x", "count": 1, "nvlinkDomainNodes": 0},
     r"nvlinkDomainNodes must be at least 1 \(how many consecutive nodes one NVLink "
     r"domain joins, 18 for an NVL72 rack\), not 0"),
    ({"name": "x", "count": 1, "nvlinkDomainNodes": "rack"}, "nvlinkDomainNodes"),
    ({"name": "x", "count": 1, "nvlinkDomains": 18}, "nvlinkDomains"),
])
def test_a_group_written_wrong_says_what(group: dict[str, object], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        NodeGroup.model_validate(group)


def test_a_file_with_two_groups_of_one_name_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("nodeGroups: [{name: a, count: 1}, {name: a, count: 2}]\n")
    with pytest.raises(ValueError, match="unique"):
        load_cluster(f)
