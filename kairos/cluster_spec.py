"""A simulated cluster of several kinds of node, for `kairos up --cluster FILE`, the tests
and the benchmarks: node groups, each with its GPU model, GPU count, labels and taints.

    nodeGroups:
      - name: h100            # node ids h100<i>-<j>
        count: 4
        gpuModel: H100-80GB   # or a product name, "NVIDIA A100-SXM4-40GB"
        gpus: 8
        labels: {zone: a}
        taints: ["dedicated=ml:NoSchedule"]
        mig:                  # optional: MIG mode on each node's first 2 GPUs (all
          gpus: 2             # of them without gpus), each split into these instances
          profiles: [3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb]
        nvlinkDomainNodes: 18 # optional: NVLink domains of 18 consecutive nodes (NVL72)

Each group runs as agent processes of a few nodes each, like the homogeneous stack; an
agent reports its group's model, labels and taints as a real node's agent would
(``KAIROS_SIM_GPU_MODEL``, ``KAIROS_NODE_LABELS``, ``KAIROS_NODE_TAINTS``,
``KAIROS_SIM_MIG_PROFILES`` and ``KAIROS_SIM_MIG_GPUS``). With ``nvlinkDomainNodes: n``,
node k of the group (its k-th, counted across the group's agent processes) has the label
``kairos.io/nvlink-domain: <name>-nvl<k // n>`` (``KAIROS_NVLINK_DOMAIN`` is the group's
name, ``KAIROS_SIM_NVLINK_DOMAIN_NODES`` n; each process's ``KAIROS_SIM_FIRST_NODE``, the
number of its first node in the group, is the stack's to set). A MIG layout is checked
here as the agent lays it out (``scheduling.mig.layout``), so a file written wrong fails
at load, not in an agent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from scheduling.mig import layout
from shared import gpu_models
from shared.node_constraints import LabelKey, LabelValue, parse_taints


class MigSpec(BaseModel):
    """MIG on a group's nodes: the profiles laid out on each MIG GPU, on the first
    ``gpus`` of them (all when not given)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True,
                              extra="forbid", frozen=True)
    gpus: Annotated[int | None, Field(ge=1, le=64)] = None
    profiles: Annotated[list[str], Field(min_length=1, max_length=8)]


class NodeGroup(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True,
                              extra="forbid", frozen=True)
    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9]{0,19}$")]
    count: Annotated[int, Field(ge=1, le=10_000)]
    gpu_model: str = "NVIDIA H100 80GB HBM3"
    gpu_memory_mib: Annotated[int | None, Field(alias="gpuMemoryMiB", ge=1)] = None
    gpus: Annotated[int, Field(ge=0, le=64)] = 8
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    taints: list[str] = Field(default_factory=list)
    mig: MigSpec | None = None
    nvlink_domain_nodes: int | None = None  # how many consecutive nodes one domain joins

    @field_validator("gpu_model")
    @classmethod
    def _known(cls, v: str) -> str:
        gpu_models.expand(v)  # a ValueError names the known families
        return v

    @field_validator("nvlink_domain_nodes")
    @classmethod
    def _domain_size(cls, v: int | None) -> int | None:
        if v is not None and v < 1:
            raise ValueError(f"nvlinkDomainNodes must be at least 1 (how many consecutive "
                             f"nodes one NVLink domain joins, 18 for an NVL72 rack), not {v}")
        return v

    @field_validator("taints")
    @classmethod
    def _taints(cls, v: list[str]) -> list[str]:
        return parse_taints(",".join(v))

    @model_validator(mode="after")
    def _mig_fits(self) -> NodeGroup:
        if self.mig is not None:
            if self.mig.gpus is not None and self.mig.gpus > self.gpus:
                raise ValueError(f"mig.gpus {self.mig.gpus} is more than the group's "
                                 f"{self.gpus} GPUs")
            # a ValueError names the profile the model lacks, or says they do not fit
            layout(gpu_models.model_id(self.gpu_model, self.memory_mib), self.mig.profiles)
        return self

    @property
    def memory_mib(self) -> int:
        """As given, else the model's memory as NVML reports it (a little under the box)."""
        return self.gpu_memory_mib or gpu_models.reported_memory_mib(self.gpu_model)

    def agent_env(self) -> dict[str, str]:
        return {"KAIROS_SIM_GPU_MODEL": self.gpu_model,
                "KAIROS_SIM_GPU_MEMORY_MIB": str(self.memory_mib),
                "KAIROS_SIM_GPUS_PER_NODE": str(self.gpus),
                "KAIROS_NODE_LABELS": ",".join(f"{k}={v}" for k, v in self.labels.items()),
                "KAIROS_NODE_TAINTS": ",".join(self.taints),
                # always set: a group without MIG has none, whatever the user exported
                "KAIROS_SIM_MIG_PROFILES": ",".join(self.mig.profiles) if self.mig else "",
                "KAIROS_SIM_MIG_GPUS": str(self.mig.gpus or 0) if self.mig else "0",
                # likewise: a group without domains has none
                "KAIROS_NVLINK_DOMAIN": self.name if self.nvlink_domain_nodes else "",
                "KAIROS_SIM_NVLINK_DOMAIN_NODES": str(self.nvlink_domain_nodes or 0)}


class ClusterSpec(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")
    node_groups: Annotated[list[NodeGroup], Field(min_length=1, max_length=64)]

    @field_validator("node_groups")
    @classmethod
    def _unique(cls, groups: list[NodeGroup]) -> list[NodeGroup]:
        names = [g.name for g in groups]
        if len(set(names)) != len(names):
            raise ValueError("node group names must be unique")
        return groups

    @property
    def nodes(self) -> int:
        return sum(g.count for g in self.node_groups)


def load_cluster(path: Path) -> ClusterSpec:
    """Raises ValueError (pydantic's, naming the field) for a file written wrong."""
    return ClusterSpec.model_validate(yaml.safe_load(path.read_text()) or {})
