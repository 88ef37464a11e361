"""The NVML backend against ``tests/fakes/fake_nvml.py``.

The fake is NOT NVML: it implements the real nvidia-ml-py contract (names, parameters,
error classes, return structures) for exactly the functions the backend calls, with
values from real H100 HGX and A100 PCIe devices. ``test_fake_matches_real_pynvml`` keeps
it honest against the installed pynvml. On a real GPU host, run
``python -m services.node_agent.devices.nvml`` instead.
"""

from __future__ import annotations

import ctypes
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

from services.node_agent.devices import nvml as nvml_backend
from services.node_agent.devices.base import MigDevice, NodeFacts
from services.node_agent.devices.nvml import NvmlDevices, NvmlUnavailable
from services.node_agent.inventory import node_inventory
from tests.fakes.fake_nvml import (
    FAKE_FUNCTIONS,
    NVL72_CLUSTER,
    FakeNvml,
    a100_pcie_bridged,
    enable_mig,
    gb200_tray,
    h100_hgx,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def hgx(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml(h100_hgx())
    monkeypatch.setattr(nvml_backend, "pynvml", fake)
    return fake


def test_fake_matches_real_pynvml() -> None:
    for name in FAKE_FUNCTIONS:
        real = getattr(pynvml, name)
        fake_params = list(inspect.signature(getattr(FakeNvml, name)).parameters)[1:]
        assert list(inspect.signature(real).parameters) == fake_params, name


def test_inventory_of_an_hgx_h100(hgx: FakeNvml) -> None:
    backend = NvmlDevices()
    devices = backend.devices()
    assert len(devices) == 8
    d0 = devices[0]
    assert d0.model == "NVIDIA H100 80GB HBM3"
    assert d0.memory_mib == 81559
    assert d0.compute_capability == "9.0"
    assert d0.uuid.startswith("GPU-")
    assert d0.pci_bus_id == "0000:18:00.0"
    assert not d0.mig_mode
    # NVSwitch: every GPU reaches every other, one domain
    assert d0.nvlink_peers == (1, 2, 3, 4, 5, 6, 7)
    assert {d.nvlink_domain for d in devices} == {0}
    backend.close()
    assert not hgx.initialised
    assert hgx.freed_event_sets == 8


def test_bridged_pairs_form_two_domains(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml_backend, "pynvml", FakeNvml(a100_pcie_bridged()))
    devices = NvmlDevices().devices()
    assert [d.nvlink_peers for d in devices] == [(1,), (0,), (3,), (2,)]
    assert [d.nvlink_domain for d in devices] == [0, 0, 1, 1]
    assert devices[0].memory_mib == 81920


def test_no_nvlink_and_unsupported_fields_degrade_gracefully(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = a100_pcie_bridged(2)
    for gpu in gpus:
        gpu.nvlinks = []
        gpu.unsupported = {"nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetPowerUsage",
                           "nvmlDeviceGetMigMode", "nvmlDeviceRegisterEvents",
                           "nvmlDeviceGetMPSComputeRunningProcesses"}
    monkeypatch.setattr(nvml_backend, "pynvml", FakeNvml(gpus))
    backend = NvmlDevices()
    assert [d.nvlink_domain for d in backend.devices()] == [0, 1]
    assert all(d.nvlink_peers == () for d in backend.devices())
    s = backend.sample()[0]
    assert (s.ecc_errors, s.power_w, s.xid_errors) == (0, 0.0, 0)
    assert not s.degraded()


def test_sample_reads_telemetry_and_process_memory(hgx: FakeNvml) -> None:
    gpu = hgx.gpus[2]
    gpu.util_gpu, gpu.util_mem, gpu.temperature = 97, 41, 64
    gpu.power_mw, gpu.sm_clock = 612_345, 1980
    gpu.run(4242, 20_480)
    gpu.run(4343, 1_024, mps=True)
    gpu.run(4444, None)  # driver cannot tell (WDDM-like): counted as 0
    backend = NvmlDevices()
    s = backend.sample()[2]
    assert s.utilization_pct == 97.0
    assert s.memory_utilization_pct == 41.0
    assert s.memory_used_mib == 21_504
    assert s.temperature_c == 64.0
    assert s.power_w == pytest.approx(612.345)
    assert s.sm_clock_mhz == 1980
    assert s.mem_clock_mhz == 2619
    assert s.process_memory_mib == {4242: 20_480, 4343: 1_024, 4444: 0}
    assert not s.degraded()


def test_ecc_xid_temperature_and_lost_gpu_mark_degraded(hgx: FakeNvml) -> None:
    backend = NvmlDevices()
    hgx.gpus[0].ecc_uncorrected = 2
    hgx.gpus[1].xid(13)  # application error: not the GPU's fault
    hgx.gpus[2].xid(48)  # double-bit ECC error
    hgx.gpus[3].temperature = 93
    samples = backend.sample()
    assert samples[0].degraded()
    assert not samples[1].degraded()
    assert samples[2].degraded()
    assert samples[2].last_xid == 48
    assert "temperature 93C > 90C" in samples[3].health_reasons()
    assert not samples[4].degraded()
    hgx.gpus[5].lost = True
    lost = backend.sample()[5]
    assert lost.degraded()
    assert lost.last_xid == 79
    assert backend.sample()[5].xid_errors == 1  # counted once, stays degraded


MIXED = [("2g.20gb", 0, 2), ("1g.10gb", 2, 1), ("1g.10gb", 3, 1), ("3g.40gb", 4, 4)]


def test_mig_instances_are_read_with_profile_placement_and_uuid(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = a100_pcie_bridged(2)
    enable_mig(gpus[0], MIXED, compute_instances={3: 3})  # 3g.40gb split in three
    monkeypatch.setattr(nvml_backend, "pynvml", FakeNvml(gpus))
    d0, d1 = NvmlDevices().devices()
    assert d0.mig_mode and not d1.mig_mode
    assert d1.mig_instances == ()
    # one entry per GPU instance (its first compute instance), by start
    assert [(m.profile, m.start, m.size) for m in d0.mig_instances] == MIXED
    assert all(m.uuid.startswith("MIG-") for m in d0.mig_instances)
    assert len({m.uuid for m in d0.mig_instances}) == 4
    by_start = {m.start: m for m in d0.mig_instances}
    first_ci = next(m for m in gpus[0].mig_devices.values()
                    if m.name.endswith("MIG 1c.3g.40gb"))
    assert by_start[4].uuid == first_ci.uuid
    assert d0.mig_instance(3) == MigDevice("1g.10gb", 3, 1, by_start[3].uuid)
    assert d0.mig_instance(5) is None
    json.dumps(nvml_backend.asdict(d0))  # the probe prints them


@pytest.mark.parametrize("missing", ["nvmlDeviceGetMaxMigDeviceCount",
                                     "nvmlDeviceGetGpuInstanceById",
                                     "nvmlGpuInstanceGetInfo"])
def test_a_mig_call_unsupported_leaves_the_gpu_without_instances(
        monkeypatch: pytest.MonkeyPatch, missing: str) -> None:
    gpus = a100_pcie_bridged(1)
    enable_mig(gpus[0], MIXED)
    gpus[0].unsupported = {missing}
    monkeypatch.setattr(nvml_backend, "pynvml", FakeNvml(gpus))
    (d0,) = NvmlDevices().devices()
    assert d0.mig_mode
    assert d0.mig_instances == ()
    assert d0.uuid.startswith("GPU-")  # the rest of the GPU is still read


def test_a_pynvml_without_mig_calls_reports_no_instances(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = a100_pcie_bridged(1)
    enable_mig(gpus[0], MIXED)
    fake = FakeNvml(gpus)
    monkeypatch.setattr(type(fake), "nvmlDeviceGetMigDeviceHandleByIndex", property(
        lambda self: (_ for _ in ()).throw(AttributeError("old nvidia-ml-py"))))
    monkeypatch.setattr(nvml_backend, "pynvml", fake)
    assert NvmlDevices().devices()[0].mig_instances == ()


def test_no_driver_raises_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml_backend, "pynvml", FakeNvml(h100_hgx(), driver_loaded=False))
    with pytest.raises(NvmlUnavailable):
        NvmlDevices()


def test_probe_output_is_json(hgx: FakeNvml) -> None:
    out = nvml_backend.probe()
    assert out["node"] == {"driver_version": "550.90.07", "cuda_version": "12.4",
                           "fabric_domain": ""}
    assert len(out["devices"]) == 8
    assert len(out["samples"]) == 8
    json.dumps(out)


def test_module_runs_standalone_without_kairos_imports() -> None:
    """``python -m ...devices.nvml`` imports nothing of Kairos beyond devices/base.py."""
    code = (
        "import sys, runpy\n"
        "sys.argv = ['nvml']\n"
        "try:\n"
        "    runpy.run_module('services.node_agent.devices.nvml', run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "mods = sorted(m for m in sys.modules if m.startswith(('services', 'shared', 'scheduling')))\n"
        "print(mods)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, check=True)
    mods = eval(proc.stdout.strip().splitlines()[-1])
    assert set(mods) <= {"services", "services.node_agent", "services.node_agent.devices",
                         "services.node_agent.devices.base", "services.node_agent.devices.nvml"}
    # no GPU here: the probe says why, as JSON, instead of a traceback
    assert "error" in json.loads(proc.stderr.strip().splitlines()[-1])


# --- node facts: driver and CUDA versions, the multi-node NVLink domain ---------------------

NVL72_DOMAIN = f"{NVL72_CLUSTER.hex()}-32766"


def facts(monkeypatch: pytest.MonkeyPatch, fake: FakeNvml) -> NodeFacts:
    monkeypatch.setattr(nvml_backend, "pynvml", fake)
    return NvmlDevices().node_facts()


def test_driver_and_cuda_versions_become_node_labels(hgx: FakeNvml) -> None:
    backend = NvmlDevices()
    assert backend.node_facts() == NodeFacts("550.90.07", "12.4", "")
    labels = node_inventory("n1", backend, 8000, 16384, "r0").labels
    assert (labels["kairos.io/driver-version"], labels["kairos.io/cuda-version"]) == (
        "550.90.07", "12.4")
    assert "kairos.io/nvlink-domain" not in labels  # an HGX H100: no multi-node fabric


@pytest.mark.parametrize(("cuda", "want"), [(12040, "12.4"), (11080, "11.8"),
                                            (12090, "12.9"), (13000, "13.0")])
def test_the_cuda_version_is_read_as_major_minor(monkeypatch: pytest.MonkeyPatch,
                                                 cuda: int, want: str) -> None:
    assert facts(monkeypatch, FakeNvml(h100_hgx(1), cuda_version=cuda)).cuda_version == want


def test_a_version_the_driver_cannot_give_leaves_its_label_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(h100_hgx(1), cuda_version=None, driver_version="550.54.15 (beta)")
    monkeypatch.setattr(nvml_backend, "pynvml", fake)
    backend = NvmlDevices()
    assert backend.node_facts().cuda_version == ""  # no libcuda: LIBRARY_NOT_FOUND
    labels = node_inventory("n1", backend, 8000, 16384, "r0").labels
    # not a label value: left out, the node still starts
    assert not {"kairos.io/driver-version", "kairos.io/cuda-version"} & set(labels)
    assert labels["kairos.io/gpu-model"] == "H100-80GB"


def test_an_nvl72_tray_is_labelled_with_its_fabric_domain(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(gb200_tray(), driver_version="570.133.20", cuda_version=12080)
    monkeypatch.setattr(nvml_backend, "pynvml", fake)
    backend = NvmlDevices()
    assert backend.node_facts() == NodeFacts("570.133.20", "12.8", NVL72_DOMAIN)
    inv = node_inventory("tray-1", backend, 8000, 16384, "r0")
    assert inv.labels["kairos.io/nvlink-domain"] == NVL72_DOMAIN
    assert inv.labels["kairos.io/gpu-model"] == "GB200-192GB"
    # another tray of the rack: the same domain; of another clique: not
    other = FakeNvml(gb200_tray(clique=7))
    assert facts(monkeypatch, FakeNvml(gb200_tray())).fabric_domain == NVL72_DOMAIN
    assert facts(monkeypatch, other).fabric_domain == f"{NVL72_CLUSTER.hex()}-7"
    # the operator's domain wins over the fabric's
    assert node_inventory("tray-1", backend, 8000, 16384, "r0", nvlink_domain="rack7").labels[
        "kairos.io/nvlink-domain"] == "rack7"


def test_the_fabric_is_read_through_a_pointer_to_a_versioned_struct() -> None:
    """The fake holds the backend to the real calling convention."""
    fake = FakeNvml(gb200_tray())
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    info = pynvml.c_nvmlGpuFabricInfoV_t()
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetGpuFabricInfoV(h, info)  # by value: NVML would not see it
    bare = pynvml.c_nvmlGpuFabricInfo_v2_t.__new__(pynvml.c_nvmlGpuFabricInfo_v2_t)
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        fake.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(bare))  # version not set
    assert fake.nvmlDeviceGetGpuFabricInfoV(h, ctypes.pointer(info)) == pynvml.NVML_SUCCESS
    assert bytes(info.clusterUuid) == NVL72_CLUSTER and info.cliqueId == 32766


@pytest.mark.parametrize("case", ["unsupported", "in progress", "zero uuid", "disagree",
                                  "one gpu lost", "old nvidia-ml-py"])
def test_no_single_completed_fabric_means_no_domain(monkeypatch: pytest.MonkeyPatch,
                                                   case: str) -> None:
    gpus = gb200_tray()
    fake = FakeNvml(gpus)
    if case == "unsupported":
        gpus[2].unsupported = {"nvmlDeviceGetGpuFabricInfoV"}
    elif case == "in progress":  # the fabric manager has not registered the GPU yet
        gpus[1].fabric = (NVL72_CLUSTER, 32766, pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS)
    elif case == "zero uuid":
        for g in gpus:
            g.fabric = (bytes(16), 0, pynvml.NVML_GPU_FABRIC_STATE_COMPLETED)
    elif case == "disagree":
        gpus[3].fabric = (NVL72_CLUSTER, 9, pynvml.NVML_GPU_FABRIC_STATE_COMPLETED)
    elif case == "one gpu lost":
        gpus[0].lost = True
    else:
        monkeypatch.delattr(FakeNvml, "nvmlDeviceGetGpuFabricInfoV")
    monkeypatch.setattr(nvml_backend, "pynvml", fake)
    backend = NvmlDevices()
    assert backend.node_facts().fabric_domain == ""
    assert "kairos.io/nvlink-domain" not in node_inventory("n", backend, 1, 1, "r0").labels
    assert backend.node_facts().driver_version == "550.90.07"  # the rest is still read
