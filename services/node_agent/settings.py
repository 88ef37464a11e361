import socket
from typing import Annotated

from pydantic import Field

from shared.config import CommonSettings
from shared.node_constraints import LabelValue


class AgentSettings(CommonSettings):
    service_name: str = "node-agent"
    http_port: int = 8003
    node_id: str = socket.gethostname()
    node_runtime: str = "simulated"  # simulated | process | kubernetes
    sim_nodes: int = 1  # simulated nodes hosted by this process (node ids <node_id>-<i>)
    sim_gpus_per_node: int = 8
    sim_gpu_model: str = "NVIDIA H100 80GB HBM3"
    sim_gpu_memory_mib: int = 81559
    # simulated MIG: profiles laid out on each MIG GPU ("3g.40gb,2g.20gb,1g.10gb,1g.10gb"),
    # on the node's first sim_mig_gpus GPUs (0: all of them); empty: no MIG
    sim_mig_profiles: str = ""
    sim_mig_gpus: int = 0
    # what simulated GPUs' driver reports (labels kairos.io/driver-version, -cuda-version)
    sim_driver_version: LabelValue = "550.54.15"
    sim_cuda_version: LabelValue = "12.4"
    # label kairos.io/nvlink-domain, the NVLink domain joining this node to others (an
    # NVL72 rack): as is, over what NVML reads; empty: NVML's (none when simulated). With
    # sim_nvlink_domain_nodes = n, simulated nodes are numbered into domains of n instead:
    # node k of the group (sim_first_node + its index in this process) is in
    # <nvlink_domain, or node_id>-nvl<k // n>
    nvlink_domain: LabelValue = ""
    sim_nvlink_domain_nodes: Annotated[int, Field(ge=0)] = 0
    sim_first_node: Annotated[int, Field(ge=0)] = 0
    node_cpu_milli: int = 128_000
    node_memory_mib: int = 1_048_576
    heartbeat_s: float = 5.0
    # The self-fencing lease: renewed by every heartbeat the broker acknowledges; not
    # renewed for this long, the agent stops its tasks and starts none until it is. It
    # MUST be shorter than the monitor's lost_after_s (default 20 s), with room for the
    # lease check (up to 1 s), a fenced task's stop (1 s grace, then a kill) and clock
    # skew, so no task still runs here once the scheduler places it elsewhere. Also the
    # grace of a restart: an agent down longer stops the tasks it finds, adopting none.
    # Keep it above two heartbeats, or one slow acknowledgement fences the node.
    fence_after_s: float = 12.0
    telemetry_s: float = 5.0
    # what survives a restart (the highest epoch seen, the lease, pending reports, the
    # simulated tasks); empty = memory only
    state_dir: str = ""
    rack: str = "rack-0"
    # the node's own labels (key=value,...) and taints (key=value:NoSchedule,...), as
    # kubectl label / taint write them; the agent adds its kairos.io/ ones (inventory.py)
    node_labels: str = ""
    node_taints: str = ""
    node_address: str = ""  # how other nodes reach this one (MASTER_ADDR); default loopback
    pod_namespace: str = "kairos"  # the Kubernetes runtime's namespace
    # how the gateway reaches this agent's HTTP port (task logs); default
    # http://<node_address or http_host>:<http_port>
    agent_url: str = ""
    agent_token: str = ""  # when set, /logs asks for "Authorization: Bearer <it>"
    datasets: str = ""  # comma-separated datasets the local cache holds (simulated nodes)
    datasets_dir: str = ""  # the local dataset cache: each entry is a dataset
    # GPU-share watchdog, on the telemetry interval
    share_grace_s: float = 10.0  # checkpoint grace of a task stopped over its share
    share_strikes: int = 2  # samples in a row over its share before it is stopped
    share_tolerance_mib: int = 0
    # shared GPUs run under CUDA MPS where nvidia-cuda-mps-control is on PATH and starts
    mps_enabled: bool = True
