"""NVML backend: GPU inventory, topology and telemetry through ``pynvml`` (nvidia-ml-py).

Runs unchanged on a GPU host with nothing but nvidia-ml-py and the standard library
(Python 3.8+): it imports no Kairos module except ``devices/base.py``. Probe a host with

    python -m services.node_agent.devices.nvml      # prints inventory + one sample as JSON

Every field is read on its own: a field the GPU or driver does not support
(``NVMLError_NotSupported``, no permission, a function missing from an old driver) gets
its default and the rest of the sample is still reported. NVML calls block for a few
milliseconds; the agent calls ``devices()`` and ``sample()`` through ``asyncio.to_thread``.

NVLink topology: each active link's remote end is either another GPU of this node (a
direct peer, by PCI bus id) or an NVSwitch (HGX boards: every switch-connected GPU
reaches every other). Domains are the connected components of that peer graph.

XID errors: NVML exposes them only as events, so one event set per GPU is registered for
critical XIDs and drained (without blocking) at every sample; application-caused XIDs
(``APPLICATION_XIDS``) are not counted. A GPU that NVML reports lost counts as XID 79
("fallen off the bus").

MIG: a GPU in MIG mode lists its instances (``MigDevice``): each MIG device handle
gives its UUID, its profile (in its name, "NVIDIA A100-SXM4-40GB MIG 1g.5gb") and its GPU
instance, whose placement (start and size in memory slices) NVML reports. A GPU instance
split into several compute instances has one MIG device for each; Kairos grants a GPU
instance whole, so it is listed once, by its first MIG device (a compute instance's name,
"MIG 1c.3g.40gb", still carries its GPU instance's profile). Reading placements needs the
MIG monitor capability (root, or /dev/nvidia-caps); without it, or on a driver without
these calls, the GPU is reported with no instances.

Node facts (``NodeFacts``): driver and CUDA versions, and the NVLink domain joining this
node to others (GB200 NVL72) where every GPU's fabric info names one cluster and clique.
"""

from __future__ import annotations

import ctypes
import json
import logging
import re
import sys
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

try:
    import pynvml
except ImportError:  # pragma: no cover - nvidia-ml-py is a dependency; a probe host may lack it
    pynvml = None  # type: ignore[assignment]

if __package__:
    from services.node_agent.devices.base import (
        APPLICATION_XIDS,
        GpuDevice,
        GpuSample,
        MigDevice,
        NodeFacts,
    )
else:  # pragma: no cover - run as a loose file on a GPU host next to base.py
    from base import (  # type: ignore[no-redef]
        APPLICATION_XIDS,
        GpuDevice,
        GpuSample,
        MigDevice,
        NodeFacts,
    )

log = logging.getLogger(__name__)

MIB = 1024 * 1024
XID_GPU_LOST = 79
_MAX_EVENTS_PER_SAMPLE = 64
_MIG_PROFILE = re.compile(r"(\d+g\.\d+gb)")  # "... MIG 1g.10gb", "... MIG 1c.3g.40gb"


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used here (no nvidia-ml-py, no driver, no GPU)."""


def _bus_key(bus_id: Any) -> str:
    """Normalise a PCI bus id: b'00000000:18:00.0' and '0000:18:00.0' -> '0000:18:00.0'."""
    if isinstance(bus_id, bytes):
        bus_id = bus_id.decode()
    text = str(bus_id).strip().lower()
    domain, _, rest = text.partition(":")
    if not rest:
        return text
    return f"{int(domain, 16) & 0xFFFF:04x}:{rest}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlDevices:
    """A DeviceBackend reading real GPUs through NVML."""

    def __init__(self, nvml: Any = None, watch_xid: bool = True) -> None:
        self._nvml = nvml if nvml is not None else pynvml
        if self._nvml is None:
            raise NvmlUnavailable("nvidia-ml-py (pynvml) is not installed")
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML init failed: {exc}") from exc
        self._lost: set[int] = set()
        n = self._nvml.nvmlDeviceGetCount()
        # a GPU lost since boot has no handle: it is listed, and reported degraded
        self._handles = [self._get(i, self._nvml.nvmlDeviceGetHandleByIndex, i)
                         for i in range(n)]
        self._inventory = self._read_inventory()
        self._facts = self._read_facts()
        self._xid_count = [0] * n
        self._last_xid = [0] * n
        self._event_sets: list[Any] = [self._register_xid(h) if watch_xid else None
                                       for h in self._handles]

    # --- field access -----------------------------------------------------------------

    def _get(self, index: int, fn: Callable[..., Any], *args: Any, default: Any = None) -> Any:
        """Call one NVML getter; an unsupported or failing field yields ``default``."""
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            if isinstance(exc, getattr(self._nvml, "NVMLError_GpuIsLost", ())):
                self._lost.add(index)
            elif not isinstance(exc, getattr(self._nvml, "NVMLError_NotSupported", ())):
                log.debug("GPU %d: %s failed: %s", index, getattr(fn, "__name__", fn), exc)
            return default

    # --- inventory --------------------------------------------------------------------

    def _read_inventory(self) -> list[GpuDevice]:
        nv = self._nvml
        raw: list[dict[str, Any]] = []
        for i, h in enumerate(self._handles):
            mem = self._get(i, nv.nvmlDeviceGetMemoryInfo, h)
            cc = self._get(i, nv.nvmlDeviceGetCudaComputeCapability, h)
            mig = self._get(i, nv.nvmlDeviceGetMigMode, h)
            pci = self._get(i, nv.nvmlDeviceGetPciInfo, h)
            raw.append({
                "index": i,
                "uuid": _text(self._get(i, nv.nvmlDeviceGetUUID, h, default="")),
                "model": _text(self._get(i, nv.nvmlDeviceGetName, h, default="")),
                "memory_mib": int(mem.total // MIB) if mem is not None else 0,
                "compute_capability": f"{cc[0]}.{cc[1]}" if cc else "",
                "mig_mode": bool(mig) and mig[0] == nv.NVML_DEVICE_MIG_ENABLE,
                "pci_bus_id": _bus_key(pci.busId) if pci is not None else "",
            })
            if raw[-1]["mig_mode"]:
                raw[-1]["mig_instances"] = self._mig_instances(i, h)
        by_bus = {d["pci_bus_id"]: d["index"] for d in raw if d["pci_bus_id"]}
        peers: dict[int, set[int]] = {d["index"]: set() for d in raw}
        switched: set[int] = set()
        for i, h in enumerate(self._handles):
            for remote in self._nvlink_remotes(i, h):
                if remote in by_bus and by_bus[remote] != i:
                    peers[i].add(by_bus[remote])
                    peers[by_bus[remote]].add(i)
                elif remote == "switch":
                    switched.add(i)
        for i in switched:
            peers[i] |= switched - {i}
        domains = _components(peers)
        return [
            GpuDevice(
                nvlink_peers=tuple(sorted(peers[d["index"]])),
                nvlink_domain=domains[d["index"]],
                numa_node=_numa_node(d["pci_bus_id"]),
                **d,
            )
            for d in raw
        ]

    def _mig_instances(self, index: int, handle: Any) -> tuple[MigDevice, ...]:
        """The GPU's MIG instances, one per GPU instance, by start; an instance whose
        reads fail is left out (it cannot be granted without its UUID and placement)."""
        nv = self._nvml
        if not hasattr(nv, "nvmlDeviceGetMigDeviceHandleByIndex"):  # an old nvidia-ml-py
            return ()
        found: dict[int, MigDevice] = {}  # GPU instance id -> its first MIG device
        for k in range(self._get(index, nv.nvmlDeviceGetMaxMigDeviceCount, handle, default=0)):
            mig = self._get(index, nv.nvmlDeviceGetMigDeviceHandleByIndex, handle, k)
            if mig is None:  # NVMLError_NotFound: no MIG device at this index
                continue
            gi_id = self._get(index, nv.nvmlDeviceGetGpuInstanceId, mig)
            if gi_id is None or gi_id in found:  # another compute instance of one we have
                continue
            name = _MIG_PROFILE.search(_text(self._get(index, nv.nvmlDeviceGetName, mig,
                                                       default="")))
            uuid = _text(self._get(index, nv.nvmlDeviceGetUUID, mig, default=""))
            gi = self._get(index, nv.nvmlDeviceGetGpuInstanceById, handle, gi_id)
            info = None if gi is None else self._get(index, nv.nvmlGpuInstanceGetInfo, gi)
            if name is None or not uuid or info is None:
                log.info("GPU %d: MIG device %d left out (profile, UUID or placement unread)",
                         index, k)
                continue
            found[gi_id] = MigDevice(profile=name.group(1), start=int(info.placement.start),
                                     size=int(info.placement.size), uuid=uuid)
        return tuple(sorted(found.values(), key=lambda m: m.start))

    def _nvlink_remotes(self, index: int, handle: Any) -> list[str]:
        """PCI bus ids of the GPUs at the far end of each active link ("switch" for NVSwitch)."""
        nv = self._nvml
        out = []
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            try:
                if nv.nvmlDeviceGetNvLinkState(handle, link) != nv.NVML_FEATURE_ENABLED:
                    continue
            except nv.NVMLError:
                break  # no NVLink on this GPU, or past its last link
            kind = self._get(index, nv.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link)
            if kind == nv.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                out.append("switch")
                continue
            pci = self._get(index, nv.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
            if pci is not None:
                out.append(_bus_key(pci.busId))
        return out

    def devices(self) -> list[GpuDevice]:
        return list(self._inventory)

    def node_facts(self) -> NodeFacts:
        return self._facts

    def _read_facts(self) -> NodeFacts:
        nv = self._nvml
        cuda = self._get(-1, nv.nvmlSystemGetCudaDriverVersion_v2, default=0)  # 12040: 12.4
        return NodeFacts(
            driver_version=_text(self._get(-1, nv.nvmlSystemGetDriverVersion, default="")),
            cuda_version=f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else "",
            fabric_domain=self._fabric_domain())

    def _fabric_domain(self) -> str:
        """"<cluster UUID hex>-<clique id>" if every GPU reports the same; else ""."""
        nv = self._nvml
        if not hasattr(nv, "nvmlDeviceGetGpuFabricInfoV"):  # an older nvidia-ml-py
            return ""
        seen: set[str] = set()
        for i, h in enumerate(self._handles):
            info = nv.c_nvmlGpuFabricInfoV_t()  # with its version set
            # fills the struct it points to: NVML_SUCCESS, or None where unsupported
            ok = self._get(i, nv.nvmlDeviceGetGpuFabricInfoV, h, ctypes.byref(info))
            if (ok is None or info.state != nv.NVML_GPU_FABRIC_STATE_COMPLETED
                    or info.status != nv.NVML_SUCCESS or not any(info.clusterUuid)):
                return ""  # not on a multi-node NVLink fabric, or not registered with it
            seen.add(f"{bytes(info.clusterUuid).hex()}-{info.cliqueId}")
        if len(seen) > 1:
            log.warning("GPUs disagree on their NVLink fabric: %s", sorted(seen))
        return seen.pop() if len(seen) == 1 else ""

    # --- telemetry --------------------------------------------------------------------

    def _register_xid(self, handle: Any) -> Any:
        nv = self._nvml
        try:
            event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError:
            return None
        try:
            nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, event_set)
        except nv.NVMLError as exc:
            log.info("XID events unavailable: %s", exc)
            nv.nvmlEventSetFree(event_set)
            return None
        return event_set

    def _drain_xids(self, index: int) -> None:
        nv = self._nvml
        event_set = self._event_sets[index]
        if event_set is None:
            return
        for _ in range(_MAX_EVENTS_PER_SAMPLE):
            try:
                data = nv.nvmlEventSetWait(event_set, 0)
            except nv.NVMLError:  # NVMLError_Timeout: nothing pending
                return
            if data.eventType & nv.nvmlEventTypeXidCriticalError:
                xid = int(data.eventData)
                if xid not in APPLICATION_XIDS:
                    self._xid_count[index] += 1
                    self._last_xid[index] = xid
                    log.warning("GPU %d: XID %d", index, xid)

    def _process_memory(self, index: int, handle: Any) -> dict[int, int]:
        nv = self._nvml
        out: dict[int, int] = {}
        getters = [nv.nvmlDeviceGetComputeRunningProcesses]
        if hasattr(nv, "nvmlDeviceGetMPSComputeRunningProcesses"):
            getters.append(nv.nvmlDeviceGetMPSComputeRunningProcesses)  # MPS clients
        for getter in getters:
            for proc in self._get(index, getter, handle, default=[]) or []:
                used = proc.usedGpuMemory  # bytes, None where the driver cannot tell
                out[int(proc.pid)] = max(out.get(int(proc.pid), 0), int(used or 0) // MIB)
        return out

    def sample(self) -> list[GpuSample]:
        nv = self._nvml
        out = []
        for i, h in enumerate(self._handles):
            util = self._get(i, nv.nvmlDeviceGetUtilizationRates, h)
            mem = self._get(i, nv.nvmlDeviceGetMemoryInfo, h)
            power_mw = self._get(i, nv.nvmlDeviceGetPowerUsage, h, default=0)
            ecc = self._get(i, nv.nvmlDeviceGetTotalEccErrors, h,
                            nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC,
                            default=0)
            sample_kwargs = {
                "index": i,
                "utilization_pct": float(util.gpu) if util is not None else 0.0,
                "memory_utilization_pct": float(util.memory) if util is not None else 0.0,
                "memory_used_mib": int(mem.used // MIB) if mem is not None else 0,
                "temperature_c": float(self._get(i, nv.nvmlDeviceGetTemperature, h,
                                                 nv.NVML_TEMPERATURE_GPU, default=0)),
                "power_w": power_mw / 1000.0,
                "sm_clock_mhz": int(self._get(i, nv.nvmlDeviceGetClockInfo, h,
                                              nv.NVML_CLOCK_SM, default=0)),
                "mem_clock_mhz": int(self._get(i, nv.nvmlDeviceGetClockInfo, h,
                                               nv.NVML_CLOCK_MEM, default=0)),
                "ecc_errors": int(ecc),
                "process_memory_mib": self._process_memory(i, h),
            }
            self._drain_xids(i)
            if i in self._lost and self._last_xid[i] != XID_GPU_LOST:
                self._xid_count[i] += 1
                self._last_xid[i] = XID_GPU_LOST
            out.append(GpuSample(xid_errors=self._xid_count[i], last_xid=self._last_xid[i],
                                 **sample_kwargs))
        return out

    def close(self) -> None:
        nv = self._nvml
        for event_set in self._event_sets:
            if event_set is not None:
                try:
                    nv.nvmlEventSetFree(event_set)
                except nv.NVMLError:
                    pass
        self._event_sets = [None] * len(self._handles)
        try:
            nv.nvmlShutdown()
        except nv.NVMLError:
            pass


def _components(peers: dict[int, set[int]]) -> dict[int, int]:
    """Connected components numbered 0.. in order of their lowest GPU index."""
    domain: dict[int, int] = {}
    for start in sorted(peers):
        if start in domain:
            continue
        number = len(set(domain.values()))
        stack = [start]
        while stack:
            node = stack.pop()
            if node not in domain:
                domain[node] = number
                stack.extend(peers[node])
    return domain


def _numa_node(bus_id: str) -> int | None:
    if not bus_id:
        return None
    try:
        with open(f"/sys/bus/pci/devices/{bus_id}/numa_node") as f:
            node = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def probe(nvml: Any = None) -> dict[str, Any]:
    """Inventory and one telemetry sample, as plain data (the ``__main__`` output)."""
    backend = NvmlDevices(nvml)
    try:
        samples = backend.sample()
        return {
            "node": asdict(backend.node_facts()),  # driver and CUDA versions, fabric
            "devices": [asdict(d) for d in backend.devices()],
            "samples": [dict(asdict(s), degraded=s.degraded(), health=s.health_reasons())
                        for s in samples],
        }
    finally:
        backend.close()


def main() -> int:
    try:
        print(json.dumps(probe(), indent=2, sort_keys=True))
    except NvmlUnavailable as exc:
        print(json.dumps({"error": str(exc)}), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
