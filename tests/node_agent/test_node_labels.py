"""The labels a simulated node gives itself (services/node_agent/inventory.py, main.py):
its GPUs', its driver's (KAIROS_SIM_DRIVER_VERSION, _CUDA_VERSION) and its NVLink domain
(KAIROS_NVLINK_DOMAIN as is, or numbered by KAIROS_SIM_NVLINK_DOMAIN_NODES across the
group's agent processes from KAIROS_SIM_FIRST_NODE). NVML's are in test_nvml_backend.py."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.node_agent.inventory import node_inventory
from services.node_agent.main import AgentHost, sim_devices, sim_nvlink_domain
from services.node_agent.settings import AgentSettings

DOMAIN = "kairos.io/nvlink-domain"


def host_labels(**settings: object) -> dict[str, dict[str, str]]:
    """Each simulated node's labels, as the agent process registers them."""
    s = AgentSettings(sim_gpus_per_node=2, **settings)  # type: ignore[arg-type]
    return {name: agent.inventory.labels
            for name, agent in AgentHost(s, None).agents.items()}  # type: ignore[arg-type]


def test_a_simulated_node_carries_every_platform_label() -> None:
    (labels,) = host_labels(node_id="n1").values()
    assert labels == {
        "kairos.io/rack": "rack-0", "kairos.io/gpu-model": "H100-80GB",
        "kairos.io/gpu-family": "H100", "kairos.io/gpu-memory": "80GB",
        "kairos.io/gpu-count": "2", "kairos.io/mig": "disabled",
        "kairos.io/compute-capability": "9.0", "kairos.io/driver-version": "550.54.15",
        "kairos.io/cuda-version": "12.4"}  # no NVLink domain unless one is given


def test_the_simulated_driver_reports_the_versions_it_is_given() -> None:
    s = AgentSettings(sim_driver_version="570.133.20", sim_cuda_version="12.8")
    labels = node_inventory("n1", sim_devices(s, "n1"), 1, 1, "r0").labels
    assert (labels["kairos.io/driver-version"], labels["kairos.io/cuda-version"]) == (
        "570.133.20", "12.8")
    # a node without GPUs has no driver to speak of
    none = node_inventory("c1", sim_devices(s.model_copy(update={"sim_gpus_per_node": 0}),
                                            "c1"), 1, 1, "r0").labels
    assert not {"kairos.io/driver-version", "kairos.io/cuda-version"} & set(none)


@pytest.mark.parametrize("field", ["sim_driver_version", "sim_cuda_version", "nvlink_domain"])
def test_a_setting_that_is_no_label_value_stops_the_agent(field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        AgentSettings(**{field: "550 beta!"})  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="sim_nvlink_domain_nodes"):
        AgentSettings(sim_nvlink_domain_nodes=-1)


def test_the_operators_domain_is_every_node_of_the_process() -> None:
    nodes = host_labels(node_id="rack7", sim_nodes=3, nvlink_domain="nvl72-rack7")
    assert {labels[DOMAIN] for labels in nodes.values()} == {"nvl72-rack7"}


def test_domains_of_n_nodes_are_numbered_across_the_groups_processes() -> None:
    # nodes 4..9 of a group, domains of 4: this process's first two are in domain 1
    nodes = host_labels(node_id="gb1", sim_nodes=6, nvlink_domain="gb",
                        sim_nvlink_domain_nodes=4, sim_first_node=4)
    assert [nodes[f"gb1-{i}"][DOMAIN] for i in range(6)] == [
        "gb-nvl1", "gb-nvl1", "gb-nvl1", "gb-nvl1", "gb-nvl2", "gb-nvl2"]
    # without a stem, the process's node id
    s = AgentSettings(node_id="pool", sim_nvlink_domain_nodes=2)
    assert [sim_nvlink_domain(s, i) for i in range(3)] == ["pool-nvl0", "pool-nvl0", "pool-nvl1"]


def test_a_numbered_domain_too_long_for_a_label_stops_the_agent() -> None:
    with pytest.raises(SystemExit, match=r"NVLink domain 'x{63}-nvl0' is not a valid label"):
        host_labels(node_id="n", nvlink_domain="x" * 63, sim_nvlink_domain_nodes=18)
