"""GPU-share isolation: share env, the MPS control daemon (a stand-in binary, real
subprocesses), and the memory watchdog with the fake NVML (a fake implementing the real
pynvml contract, see tests/fakes/fake_nvml.py) stopping a real process."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.node_agent.devices import nvml as nvml_backend
from services.node_agent.devices.nvml import NvmlDevices
from services.node_agent.isolation.mps import MpsDaemon, merge_env, share_env
from services.node_agent.isolation.watchdog import ShareWatchdog
from services.node_agent.runtimes.base import GpuGrant
from services.node_agent.runtimes.local_process import LocalProcessRuntime
from services.node_agent.runtimes.simulated import SimulatedRuntime
from tests.fakes.fake_nvml import FakeNvml, h100_hgx
from tests.node_agent.helpers import Exits, install_fake_mps, launch, until

H100_MIB = 81559


def test_share_env_whole_gpus_is_empty() -> None:
    assert share_env([GpuGrant(0), GpuGrant(1)]) == {}


def test_share_env_limits_and_hints() -> None:
    env = share_env([GpuGrant(5, memory_mib=40779, compute_pct=50),
                     GpuGrant(6, memory_mib=20389, compute_pct=30)], {5: H100_MIB, 6: H100_MIB})
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=40779M,1=20389M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert env["KAIROS_GPU_MEMORY_LIMIT_MIB"] == "40779,20389"
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.24"  # the smaller share, rounded down
    assert env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"


def test_share_env_without_device_totals_disables_preallocation() -> None:
    env = share_env([GpuGrant(0, compute_pct=50)])
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env


def test_merge_env_job_overrides_hints_not_limits() -> None:
    platform = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25", "TF_FORCE_GPU_ALLOW_GROWTH": "true"}
    job = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100", "TF_FORCE_GPU_ALLOW_GROWTH": "false"}
    env = merge_env({"PATH": "/bin"}, job, platform)
    assert env == {"PATH": "/bin", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
                   "TF_FORCE_GPU_ALLOW_GROWTH": "false"}


async def test_mps_unavailable_is_reported_cleanly(tmp_path: Path) -> None:
    mps = MpsDaemon(tmp_path, binary="nvidia-cuda-mps-control-absent")
    assert not mps.available
    assert await mps.ensure_started() is False
    assert mps.reason.startswith("mps unavailable")
    await mps.stop()


@pytest.fixture
def fake_mps_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return install_fake_mps(tmp_path, monkeypatch.setenv)


async def test_mps_daemon_started_for_shares_and_stopped_on_close(
        tmp_path: Path, fake_mps_binary: Path) -> None:
    mps = MpsDaemon(tmp_path / "state")
    exits = Exits()
    rt = LocalProcessRuntime(exits, tmp_path / "state", mps=mps, poll_s=0.02)
    whole = launch("m", "whole", 1, "sh", "-c", "env")
    await rt.start(whole)
    await exits.wait(whole.key)
    assert not fake_mps_binary.exists()  # noqa: ASYNC240 - no share yet: no daemon
    assert "CUDA_MPS_PIPE_DIRECTORY" not in rt.logs(whole.key)

    shared = launch("m", "shared", 1, "sh", "-c", "env",
                    gpus=(GpuGrant(0, "GPU-a", memory_mib=1000, compute_pct=50),))
    await rt.start(shared)
    await exits.wait(shared.key)
    assert f"CUDA_MPS_PIPE_DIRECTORY={mps.pipe_dir}" in rt.logs(shared.key)
    assert await mps.ensure_started()  # started once
    await rt.close()
    calls = fake_mps_binary.read_text().splitlines()  # noqa: ASYNC240
    assert calls[0] == f"-d pipe={mps.pipe_dir} log={mps.log_dir}"
    assert calls[-1] == "stdin=quit"
    assert len([c for c in calls if c.startswith("-d")]) == 1

    again = MpsDaemon(tmp_path / "state")  # a daemon left running by an earlier agent
    (again.pipe_dir / "control").touch()
    assert await again.ensure_started()


async def test_watchdog_stops_a_task_that_outgrows_its_share(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(h100_hgx())
    monkeypatch.setattr(nvml_backend, "pynvml", fake)
    devices = NvmlDevices()
    exits = Exits()
    rt = LocalProcessRuntime(exits, tmp_path / "state", poll_s=0.02)
    loop = ("sh", "-c", "echo ready; exec sleep 1000")  # a stable process tree
    greedy = launch("g", "w", 1, *loop, gpus=(GpuGrant(2, "GPU-2", memory_mib=20480, compute_pct=25),))
    modest = launch("m", "w", 1, *loop, gpus=(GpuGrant(2, "GPU-2", memory_mib=40960, compute_pct=50),))
    watchdog = ShareWatchdog(devices, rt, rt.task_pids, grace_s=5, strikes=2)
    for task in (greedy, modest):
        await rt.start(task)
        watchdog.watch(task.key, task.gpus)
    await until(lambda: all("ready" in rt.logs(t.key) for t in (greedy, modest)))
    greedy_pid = max(rt.task_pids(greedy.key))  # a process of the task's tree uses the GPU
    modest_pid = max(rt.task_pids(modest.key))

    fake.gpus[2].run(greedy_pid, 10_240)
    fake.gpus[2].run(modest_pid, 30_000)
    assert await watchdog.check_once() == []
    fake.gpus[2].run(greedy_pid, 24_576)  # past its 20 GiB share
    assert await watchdog.check_once() == []  # first strike: a spike is tolerated
    found = await watchdog.check_once()
    assert [v.key for v in found] == [greedy.key]
    done = await exits.wait(greedy.key)
    assert done.reason == "share_exceeded"
    assert done.message == "GPU 2 used 24576 MiB of its 20480 MiB share"
    assert await rt.running() == [modest.key]

    fake.gpus[3].run(modest_pid, 512)  # escaped to a GPU it was not granted
    await watchdog.check_once()
    found = await watchdog.check_once()
    assert found[0].message == "GPU 3 used 512 MiB but was not granted to it"
    assert (await exits.wait(modest.key)).reason == "share_exceeded"
    await rt.close()
    devices.close()


async def test_simulated_runtime_reports_stop_reason() -> None:
    exits = Exits()
    rt = SimulatedRuntime(exits)
    task = launch("s", "w", 1)
    await rt.start(task)
    await rt.stop(task.key, 0, reason="share_exceeded", message="why")
    assert (await exits.wait(task.key)).reason == "share_exceeded"
    assert await rt.reconcile() == []
