"""Simulated GPUs whose telemetry follows the simulated load placed on them.

Simulated tasks also appear as processes with their GPU memory (``run_process``), as
NVML's per-process memory does, so the share watchdog works the same on a simulated node.

MIG: the first ``mig_gpus`` GPUs (all, with 0) are in MIG mode with ``mig_profiles`` laid
out on each as ``nvidia-smi mig -cgi`` would (``scheduling.mig.layout``); an instance's
UUID is derived from its node, GPU and start, so it is the same at every start.

The driver and CUDA versions are given (plausible fixed values by default); a simulated
node's NVLink domain is the agent's to set (``KAIROS_NVLINK_DOMAIN``), not the GPUs'.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from scheduling.mig import layout
from services.node_agent.devices.base import GpuDevice, GpuSample, MigDevice, NodeFacts
from shared.gpu_models import compute_capability, model_id


class SimulatedDevices:
    def __init__(self, node_id: str, count: int = 8, model: str = "NVIDIA H100 80GB HBM3",
                 memory_mib: int = 81559, mig_profiles: Sequence[str] = (),
                 mig_gpus: int = 0, driver_version: str = "550.54.15",
                 cuda_version: str = "12.4") -> None:
        """ValueError if the MIG profiles are not the model's or do not fit one GPU."""
        self.node_id = node_id
        self._facts = NodeFacts(driver_version=driver_version, cuda_version=cuda_version)
        mig = layout(model_id(model, memory_mib), list(mig_profiles)) if mig_profiles else ()
        in_mig = (mig_gpus or count) if mig else 0
        self._devices = [
            GpuDevice(
                index=i,
                uuid="GPU-" + hashlib.sha1(f"{node_id}/{i}".encode()).hexdigest()[:32],
                model=model,
                memory_mib=memory_mib,
                compute_capability=compute_capability(model),
                nvlink_peers=tuple(j for j in range(count) if j != i and j // 4 == i // 4),
                nvlink_domain=i // 4,
                mig_mode=i < in_mig,
                mig_instances=tuple(MigDevice(m.profile, m.start, m.size, _mig_uuid(
                    node_id, i, m.start)) for m in mig) if i < in_mig else (),
            )
            for i in range(count)
        ]
        # index -> (compute % busy, MiB used) from the tasks placed on it
        self._load: dict[int, tuple[float, int]] = {}
        self._procs: dict[int, dict[int, int]] = {}  # index -> pid -> MiB

    def run_process(self, index: int, pid: int, memory_mib: int) -> None:
        """A (simulated) process uses ``memory_mib`` on GPU ``index``; 0 ends it there."""
        procs = self._procs.setdefault(index, {})
        if memory_mib > 0:
            procs[pid] = memory_mib
        else:
            procs.pop(pid, None)

    def end_process(self, pid: int) -> None:
        for procs in self._procs.values():
            procs.pop(pid, None)

    def devices(self) -> list[GpuDevice]:
        return list(self._devices)

    def node_facts(self) -> NodeFacts:
        return self._facts

    def set_load(self, index: int, compute_pct: float, memory_mib: int) -> None:
        self._load[index] = (min(compute_pct, 100.0), memory_mib)

    def sample(self) -> list[GpuSample]:
        out = []
        for d in self._devices:
            busy, mem = self._load.get(d.index, (0.0, 0))
            procs = dict(self._procs.get(d.index, {}))
            mem = min(d.memory_mib, max(mem, sum(procs.values())))
            out.append(GpuSample(
                index=d.index,
                utilization_pct=busy,
                memory_used_mib=mem,
                temperature_c=32.0 + 0.4 * busy,
                power_w=70.0 + 6.3 * busy,
                sm_clock_mhz=1980 if busy else 345,
                process_memory_mib=procs,
            ))
        return out

    def close(self) -> None:
        return None


def _mig_uuid(node_id: str, index: int, start: int) -> str:
    return "MIG-" + hashlib.sha1(f"{node_id}/{index}/{start}".encode()).hexdigest()[:32]
