"""A fake ``pynvml`` implementing the real nvidia-ml-py contract for the calls Kairos makes.

This is a FAKE, not NVML: it implements exactly the functions that
``services/node_agent/devices/nvml.py`` calls, with the real names and parameter lists
(checked against the installed nvidia-ml-py by ``test_fake_matches_real_pynvml``), the
real error classes and constants (taken from the installed ``pynvml`` module, so
``NVMLError(NVML_ERROR_NOT_SUPPORTED)`` is an ``NVMLError_NotSupported``), and the real
return shapes (the same ctypes structures: ``c_nvmlMemory_t`` in bytes,
``c_nvmlUtilization_t``, ``nvmlPciInfo_t`` whose ``busId`` is bytes, process info objects
with ``pid``/``usedGpuMemory`` where ``usedGpuMemory`` may be ``None``; the GPU fabric
info filled in through the pointer it is given, as ``c_nvmlGpuFabricInfoV_t``). The
values come from real devices: an 8-GPU HGX H100 (NVSwitch) node and A100 PCIe cards
joined in pairs by NVLink bridges, and MIG geometry as an A100 80GB in MIG mode reports
it. The GB200 NVL72 compute tray (``gb200_tray``) has the real shape of its fabric info,
but its cluster UUID, clique id and bus ids are made up.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any

import pynvml as _real

MIB = 1024 * 1024

# DGX H100 / HGX H100 PCI bus ids of its eight GPUs
HGX_H100_BUS = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]


@dataclass
class FakeGpuInstance:
    """A MIG GPU instance: its placement in memory slices."""

    start: int
    size: int
    profile_id: int = 0  # NVML_GPU_INSTANCE_PROFILE_*; not read by the backend


@dataclass
class FakeMigDevice:
    """A MIG device: one compute instance of a GPU instance, as CUDA enumerates it."""

    gi_id: int
    name: str  # "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
    uuid: str  # "MIG-..."


@dataclass
class FakeGpu:
    name: str
    uuid: str
    bus: str  # e.g. "18"
    memory_total: int  # bytes, as NVML reports it
    cc: tuple[int, int]
    nvlinks: list[tuple[str, str]] = field(default_factory=list)  # (kind, remote bus)
    memory_used: int = 0
    util_gpu: int = 0
    util_mem: int = 0
    temperature: int = 33
    power_mw: int = 71_000
    sm_clock: int = 345
    mem_clock: int = 2619
    ecc_uncorrected: int = 0
    mig: tuple[int, int] = (0, 0)
    processes: dict[int, int | None] = field(default_factory=dict)  # pid -> bytes
    mps_processes: dict[int, int | None] = field(default_factory=dict)
    unsupported: set[str] = field(default_factory=set)  # function names -> NotSupported
    lost: bool = False
    pending_events: list[tuple[int, int]] = field(default_factory=list)
    max_mig_devices: int = 0  # nvmlDeviceGetMaxMigDeviceCount (7 on A100/H100); 0: no MIG
    gpu_instances: dict[int, FakeGpuInstance] = field(default_factory=dict)  # by GI id
    mig_devices: dict[int, FakeMigDevice] = field(default_factory=dict)  # by MIG index
    # GPU fabric info (multi-node NVLink, GB200 NVL72): (cluster UUID, clique id, state);
    # None: the GPU has none (NVMLError_NotSupported)
    fabric: tuple[bytes, int, int] | None = None

    @property
    def bus_id(self) -> bytes:
        return f"00000000:{self.bus}:00.0".encode()

    def run(self, pid: int, mib: int | None, mps: bool = False) -> None:
        """A process allocates ``mib`` MiB on this GPU (None: the driver cannot tell)."""
        (self.mps_processes if mps else self.processes)[pid] = None if mib is None else mib * MIB
        self.memory_used = sum(v or 0 for v in [*self.processes.values(),
                                                *self.mps_processes.values()])

    def xid(self, code: int) -> None:
        self.pending_events.append((_real.nvmlEventTypeXidCriticalError, code))


def enable_mig(gpu: FakeGpu, instances: list[tuple[str, int, int]],
               compute_instances: dict[int, int] | None = None) -> None:
    """MIG mode with these GPU instances ((profile, start, size)); ``compute_instances``:
    GPU instance position -> how many compute instances it is split into (1 by default).
    MIG devices are numbered as the driver does, not by placement, with unused indices."""
    gpu.mig, gpu.max_mig_devices = (1, 1), 7
    gpu.gpu_instances, gpu.mig_devices = {}, {}
    slot = 0
    for pos, (profile, start, size) in reversed(list(enumerate(instances))):
        gi_id = 1 + pos * 2  # GI ids are the driver's, not consecutive
        gpu.gpu_instances[gi_id] = FakeGpuInstance(start, size)
        split = (compute_instances or {}).get(pos, 1)
        for ci in range(split):
            name = profile if split == 1 else f"{int(profile[0]) // split}c.{profile}"
            gpu.mig_devices[slot] = FakeMigDevice(
                gi_id, f"{gpu.name} MIG {name}",
                f"MIG-{gpu.uuid[4:12]}-{gi_id:04x}-{ci:04x}-a1b2-c3d4e5f6a7b8")
            slot += 2 if ci == split - 1 else 1  # an empty index after each GPU instance
    gpu.max_mig_devices = max(gpu.max_mig_devices, slot)


def h100_hgx(count: int = 8) -> list[FakeGpu]:
    """HGX H100 80GB: 18 NVLink 4 links per GPU, all to NVSwitches."""
    return [
        FakeGpu(
            name="NVIDIA H100 80GB HBM3",
            uuid=f"GPU-4a3d0a3c-52b1-0c6e-8f1e-1b2c3d4e5f{i:02d}",
            bus=HGX_H100_BUS[i],
            memory_total=85_520_809_984,  # 81559 MiB
            cc=(9, 0),
            nvlinks=[("switch", "")] * 18,
            memory_used=555_745_280,  # 530 MiB reserved by the driver on an idle H100
        )
        for i in range(count)
    ]


def a100_pcie_bridged(count: int = 4) -> list[FakeGpu]:
    """A100 80GB PCIe, NVLink bridges joining GPUs 0-1 and 2-3 (12 links per bridge)."""
    buses = ["17", "31", "B1", "CA"][:count]
    gpus = []
    for i in range(count):
        peer = buses[i ^ 1] if (i ^ 1) < count else ""
        gpus.append(FakeGpu(
            name="NVIDIA A100 80GB PCIe",
            uuid=f"GPU-9b1e77c2-7d0a-4f52-a1c3-0e5f6a7b8c{i:02d}",
            bus=buses[i],
            memory_total=85_899_345_920,  # 81920 MiB
            cc=(8, 0),
            nvlinks=[("gpu", peer)] * 12 if peer else [],
            power_mw=43_000,
        ))
    return gpus


NVL72_CLUSTER = bytes.fromhex("5f0c9a2e41d84b7c9e3a6d1b2c8f4e70")  # made up


def gb200_tray(clique: int = 32766, cluster: bytes = NVL72_CLUSTER,
               state: int = _real.NVML_GPU_FABRIC_STATE_COMPLETED) -> list[FakeGpu]:
    """A GB200 NVL72 compute tray: 4 GPUs, 18 NVLink 5 links each to the rack's NVSwitch
    trays, registered with the rack's fabric (one cluster UUID and clique for the rack)."""
    return [
        FakeGpu(
            name="NVIDIA GB200",
            uuid=f"GPU-0d5e3c1a-8b2f-4c6d-9e7a-1f2b3c4d5e{i:02d}",
            bus=["01", "02", "41", "42"][i],
            memory_total=189_471 * MIB,  # GB200: 192GB, NVML reports a little under
            cc=(10, 0),
            nvlinks=[("switch", "")] * 18,
            fabric=(cluster, clique, state),
        )
        for i in range(4)
    ]


class _Handle:
    def __init__(self, index: int) -> None:
        self.index = index


class _MigHandle:
    def __init__(self, index: int, slot: int) -> None:
        self.index = index  # the GPU
        self.slot = slot  # its MIG device index


class _GpuInstance:
    def __init__(self, index: int, gi_id: int) -> None:
        self.index = index
        self.gi_id = gi_id


class _EventSet:
    def __init__(self) -> None:
        self.devices: list[int] = []


class FakeNvml:
    """Stands in for the ``pynvml`` module; patch it where the backend imports it."""

    # the struct nvmlDeviceGetGpuFabricInfoV fills (v2: its version set by its constructor)
    c_nvmlGpuFabricInfoV_t = _real.c_nvmlGpuFabricInfoV_t

    def __init__(self, gpus: list[FakeGpu], driver_loaded: bool = True,
                 driver_version: str = "550.90.07", cuda_version: int | None = 12040) -> None:
        self.gpus = gpus
        self.driver_loaded = driver_loaded
        self.driver_version = driver_version
        self.cuda_version = cuda_version  # None: libcuda not found (LIBRARY_NOT_FOUND)
        self.initialised = False
        self.freed_event_sets = 0
        for name in dir(_real):
            if name.startswith(("NVML_", "NVMLError", "nvmlEventType")):
                setattr(self, name, getattr(_real, name))

    # --- helpers (not part of pynvml) --------------------------------------------------

    @staticmethod
    def _raise(code: int) -> None:
        raise _real.NVMLError(code)

    def _dev(self, handle: Any, fn: str) -> FakeGpu:
        if not self.initialised:
            self._raise(_real.NVML_ERROR_UNINITIALIZED)
        if not isinstance(handle, _Handle):
            self._raise(_real.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[handle.index]
        if gpu.lost:
            self._raise(_real.NVML_ERROR_GPU_IS_LOST)
        if fn in gpu.unsupported:
            self._raise(_real.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def _mig(self, handle: Any, fn: str) -> FakeMigDevice:
        """A MIG device handle's device (a GPU's handle is not one: invalid argument)."""
        if not isinstance(handle, _MigHandle):
            self._raise(_real.NVML_ERROR_INVALID_ARGUMENT)
        self._dev(_Handle(handle.index), fn)
        return self.gpus[handle.index].mig_devices[handle.slot]

    # --- the pynvml functions the backend calls ----------------------------------------

    def nvmlInit(self) -> None:
        if not self.driver_loaded:
            self._raise(_real.NVML_ERROR_LIBRARY_NOT_FOUND)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        if not self.initialised:
            self._raise(_real.NVML_ERROR_UNINITIALIZED)
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        if not self.initialised:
            self._raise(_real.NVML_ERROR_UNINITIALIZED)
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        if not self.initialised:
            self._raise(_real.NVML_ERROR_UNINITIALIZED)
        if self.cuda_version is None:
            self._raise(_real.NVML_ERROR_LIBRARY_NOT_FOUND)
        return self.cuda_version

    def nvmlDeviceGetCount(self) -> int:
        if not self.initialised:
            self._raise(_real.NVML_ERROR_UNINITIALIZED)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        if not 0 <= index < len(self.gpus):
            self._raise(_real.NVML_ERROR_INVALID_ARGUMENT)
        handle = _Handle(index)
        self._dev(handle, "nvmlDeviceGetHandleByIndex")
        return handle

    def nvmlDeviceGetName(self, handle: Any) -> str:
        if isinstance(handle, _MigHandle):
            return self._mig(handle, "nvmlDeviceGetName").name
        return self._dev(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        if isinstance(handle, _MigHandle):
            return self._mig(handle, "nvmlDeviceGetUUID").uuid
        return self._dev(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        gpu = self._dev(device, "nvmlDeviceGetMaxMigDeviceCount")
        if not gpu.max_mig_devices:
            self._raise(_real.NVML_ERROR_NOT_SUPPORTED)
        return gpu.max_mig_devices

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> _MigHandle:
        gpu = self._dev(device, "nvmlDeviceGetMigDeviceHandleByIndex")
        if not 0 <= index < gpu.max_mig_devices:
            self._raise(_real.NVML_ERROR_INVALID_ARGUMENT)
        if index not in gpu.mig_devices:
            self._raise(_real.NVML_ERROR_NOT_FOUND)
        return _MigHandle(device.index, index)

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        return self._mig(device, "nvmlDeviceGetGpuInstanceId").gi_id

    def nvmlDeviceGetGpuInstanceById(self, device: Any, gpuInstanceId: int) -> _GpuInstance:
        gpu = self._dev(device, "nvmlDeviceGetGpuInstanceById")
        if gpuInstanceId not in gpu.gpu_instances:
            self._raise(_real.NVML_ERROR_NOT_FOUND)
        return _GpuInstance(device.index, gpuInstanceId)

    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> Any:
        if not isinstance(gpuInstance, _GpuInstance):
            self._raise(_real.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self._dev(_Handle(gpuInstance.index), "nvmlGpuInstanceGetInfo")
        gi = gpu.gpu_instances[gpuInstance.gi_id]
        return _real.c_nvmlGpuInstanceInfo_t(
            id=gpuInstance.gi_id, profileId=gi.profile_id,
            placement=_real.c_nvmlGpuInstancePlacement_t(start=gi.start, size=gi.size))

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        gpu = self._dev(handle, "nvmlDeviceGetMemoryInfo")
        return _real.c_nvmlMemory_t(total=gpu.memory_total, free=gpu.memory_total - gpu.memory_used,
                                    used=gpu.memory_used)

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        return self._dev(handle, "nvmlDeviceGetCudaComputeCapability").cc

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        return list(self._dev(device, "nvmlDeviceGetMigMode").mig)

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        gpu = self._dev(handle, "nvmlDeviceGetPciInfo")
        return _real.nvmlPciInfo_t(busId=gpu.bus_id, domain=0, bus=int(gpu.bus, 16), device=0)

    def _link(self, device: Any, link: int, fn: str) -> tuple[str, str]:
        gpu = self._dev(device, fn)
        if not gpu.nvlinks:
            self._raise(_real.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < len(gpu.nvlinks):
            self._raise(_real.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.nvlinks[link]

    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        self._link(device, link, "nvmlDeviceGetNvLinkState")
        return _real.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        kind, _ = self._link(handle, link, "nvmlDeviceGetNvLinkRemoteDeviceType")
        return (_real.NVML_NVLINK_DEVICE_TYPE_SWITCH if kind == "switch"
                else _real.NVML_NVLINK_DEVICE_TYPE_GPU)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: Any, link: int) -> Any:
        _kind, bus = self._link(device, link, "nvmlDeviceGetNvLinkRemotePciInfo")
        bus = bus or "00"
        return _real.nvmlPciInfo_t(busId=f"00000000:{bus}:00.0".encode(), bus=int(bus, 16))

    def nvmlDeviceGetGpuFabricInfoV(self, device: Any, gpuFabricInfo: Any) -> int:
        """Fills the struct ``gpuFabricInfo`` points to (``ctypes.byref``/``pointer``): a
        struct passed by value would not reach NVML, a wrong version is refused."""
        gpu = self._dev(device, "nvmlDeviceGetGpuFabricInfoV")
        info = getattr(gpuFabricInfo, "_obj", None)  # ctypes.byref(info)
        if isinstance(gpuFabricInfo, ctypes._Pointer):
            info = gpuFabricInfo.contents
        if not isinstance(info, (_real.c_nvmlGpuFabricInfo_v2_t, _real.c_nvmlGpuFabricInfo_v3_t)):
            self._raise(_real.NVML_ERROR_INVALID_ARGUMENT)
        if info.version not in (_real.nvmlGpuFabricInfo_v2, _real.nvmlGpuFabricInfo_v3):
            self._raise(_real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        if gpu.fabric is None:
            self._raise(_real.NVML_ERROR_NOT_SUPPORTED)
        cluster, clique, state = gpu.fabric
        info.clusterUuid[:] = list(cluster)
        info.status, info.cliqueId, info.state = _real.NVML_SUCCESS, clique, state
        return _real.NVML_SUCCESS

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu = self._dev(handle, "nvmlDeviceGetUtilizationRates")
        return _real.c_nvmlUtilization_t(gpu=gpu.util_gpu, memory=gpu.util_mem)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        assert sensor == _real.NVML_TEMPERATURE_GPU
        return self._dev(handle, "nvmlDeviceGetTemperature").temperature

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._dev(handle, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        gpu = self._dev(handle, "nvmlDeviceGetClockInfo")
        return {_real.NVML_CLOCK_SM: gpu.sm_clock, _real.NVML_CLOCK_MEM: gpu.mem_clock}[type]

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        gpu = self._dev(handle, "nvmlDeviceGetTotalEccErrors")
        assert (errorType, counterType) == (_real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                            _real.NVML_VOLATILE_ECC)
        return gpu.ecc_uncorrected

    @staticmethod
    def _procs(procs: dict[int, int | None]) -> list[Any]:
        return [_real.nvmlFriendlyObject({"pid": pid, "usedGpuMemory": used,
                                          "gpuInstanceId": 0xFFFFFFFF,
                                          "computeInstanceId": 0xFFFFFFFF})
                for pid, used in procs.items()]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        return self._procs(self._dev(handle, "nvmlDeviceGetComputeRunningProcesses").processes)

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: Any) -> list[Any]:
        gpu = self._dev(handle, "nvmlDeviceGetMPSComputeRunningProcesses")
        return self._procs(gpu.mps_processes)

    def nvmlEventSetCreate(self) -> _EventSet:
        return _EventSet()

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: _EventSet) -> None:
        self._dev(handle, "nvmlDeviceRegisterEvents")
        eventSet.devices.append(handle.index)

    def nvmlEventSetWait(self, eventSet: _EventSet, timeoutms: int) -> Any:
        for index in eventSet.devices:
            if self.gpus[index].pending_events:
                kind, data = self.gpus[index].pending_events.pop(0)
                return _real.c_nvmlEventData_t(eventType=kind, eventData=data)
        raise _real.NVMLError(_real.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, eventSet: _EventSet) -> None:
        self.freed_event_sets += 1


FAKE_FUNCTIONS = sorted(n for n in dir(FakeNvml) if n.startswith("nvml"))
