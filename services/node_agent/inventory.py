"""The node as the scheduler sees it: its resources, and its GPUs from the device backend.

Its labels: the agent's own (``KAIROS_NODE_LABELS``) and, over them, the platform's:
``kairos.io/rack``; from its GPUs ``kairos.io/gpu-model``, ``-family``, ``-memory``,
``-count``, ``kairos.io/mig``, ``kairos.io/compute-capability``; from its driver
``kairos.io/driver-version`` and ``kairos.io/cuda-version``; and
``kairos.io/nvlink-domain``, the NVLink domain joining it to other nodes (an NVL72 rack):
the operator's (``KAIROS_NVLINK_DOMAIN``) or else the GPU fabric's.
"""

from __future__ import annotations

from scheduling.mig import MEMORY_SLICES
from scheduling.node_table import NVLINK_DOMAIN
from services.node_agent.devices.base import DeviceBackend
from shared import gpu_models
from shared.events import GpuInfo, NodeInventory
from shared.events.nodes import MigInstanceInfo
from shared.logging import get_logger
from shared.node_constraints import LABEL_VALUE_RE, parse_labels, parse_taints

log = get_logger(__name__)


def node_inventory(node_id: str, devices: DeviceBackend, cpu_milli: int,
                   memory_mib: int, rack: str, runtime: str = "simulated",
                   address: str = "127.0.0.1", agent_url: str = "",
                   datasets: list[str] | None = None, labels: str = "",
                   taints: str = "", nvlink_domain: str = "") -> NodeInventory:
    """Raises ValueError for labels, taints or an NVLink domain written wrong (the agent
    refuses to start)."""
    if nvlink_domain and not LABEL_VALUE_RE.match(nvlink_domain):
        raise ValueError(f"NVLink domain {nvlink_domain!r} is not a valid label value")
    devs = devices.devices()
    facts = devices.node_facts()
    gpus = [GpuInfo(index=d.index, uuid=d.uuid, model=d.model, memory_mib=d.memory_mib,
                    nvlink_domain=d.nvlink_domain, nvlink_peers=list(d.nvlink_peers),
                    mig_mode=d.mig_mode,
                    mig_instances=[MigInstanceInfo(profile=m.profile, start=m.start,
                                                   size=m.size, uuid=m.uuid)
                                   for m in d.mig_instances])
            for d in devs]
    own = {"kairos.io/rack": rack} if rack else {}
    if devs:  # a node's GPUs are one model (a mixed node is labelled by its first)
        own |= gpu_models.node_labels(gpu_models.model_id(devs[0].model, devs[0].memory_mib))
        own["kairos.io/gpu-count"] = str(len(devs))
        own["kairos.io/mig"] = "enabled" if any(d.mig_mode for d in devs) else "disabled"
        if devs[0].compute_capability:
            own["kairos.io/compute-capability"] = devs[0].compute_capability
        own |= _valid({"kairos.io/driver-version": facts.driver_version,
                       "kairos.io/cuda-version": facts.cuda_version})
    own |= _valid({NVLINK_DOMAIN: nvlink_domain or facts.fabric_domain})
    return NodeInventory(
        node_id=node_id, hostname=node_id, address=address, cpu_milli=cpu_milli,
        memory_mib=memory_mib, rack=rack, runtime=runtime, agent_url=agent_url,
        datasets=datasets or [], gpus=gpus, labels={**parse_labels(labels), **own},
        taints=parse_taints(taints))


def _valid(labels: dict[str, str]) -> dict[str, str]:
    """Those with a valid label value: an odd string from the driver must not stop the node."""
    for key, value in labels.items():
        if value and not LABEL_VALUE_RE.match(value):
            log.warning("node label left out: not a valid label value", key=key, value=value)
    return {k: v for k, v in labels.items() if v and LABEL_VALUE_RE.match(v)}


def gpu_memory_mib(inventory: NodeInventory, index: int, mig_start: int = -1) -> int:
    """The memory of GPU ``index``, or of its MIG instance at memory slice ``mig_start``
    (its slices' part of the GPU's); 0 for a GPU or instance the node does not have."""
    gpu = next((g for g in inventory.gpus if g.index == index), None)
    if gpu is None or mig_start < 0:
        return gpu.memory_mib if gpu is not None else 0
    inst = next((m for m in gpu.mig_instances if m.start == mig_start), None)
    return gpu.memory_mib * inst.size // MEMORY_SLICES if inst is not None else 0
