"""The production agent (``services.node_agent.main``) runs shared GPUs under MPS and
gives frameworks their memory fraction: a share bound through the real broker starts
with the MPS client variables (the daemon started once, through a stand-in
``nvidia-cuda-mps-control``: the real one needs a GPU) and the fraction of the node's GPU
memory; with ``KAIROS_MPS_ENABLED=false`` the hints and limits stay, MPS does not."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.node_agent.isolation.mps import MpsDaemon
from shared.events import Binding, BindingAction, GpuAssignment, TaskBinding
from tests.node_agent.harness import AgentRun, running_agent, until
from tests.node_agent.helpers import install_fake_mps

pytestmark = pytest.mark.broker


def share(node: str, job: str) -> Binding:
    return Binding(binding_id=f"{job}-1-{node}", action=BindingAction.ALLOCATE, node_id=node,
                   epoch=1, job_id=job, tasks=[TaskBinding(
                       task_id="w-0", task_name="w", role="worker", replica=0, rank=0,
                       command=["sh", "-c", "env | sort"],
                       gpus=[GpuAssignment(index=1, uuid="GPU-1", memory_mib=20389,
                                           compute_pct=25)])])


async def task_env(run: AgentRun, job: str) -> dict[str, str]:
    await run.send(share(run.agent().node_id, job))
    done = await run.feed.wait(job, "succeeded")
    assert done.exit_code == 0
    out = run.agent().runtime.logs(f"{job}/w-0/1")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


async def test_a_share_runs_under_mps_with_its_memory_fraction(
        broker: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = install_fake_mps(tmp_path, monkeypatch.setenv)
    async with running_agent(broker, tmp_path / "state", node_runtime="process") as run:
        mps = run.agent().runtime._mps  # type: ignore[attr-defined]
        assert isinstance(mps, MpsDaemon)
        env = await task_env(run, f"M{run.agent().node_id}")
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(mps.pipe_dir)
        assert mps.pipe_dir.is_absolute()  # a Pod's hostPath must be
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20389M"
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        # the node's GPUs (simulated here: no NVML) are 81559 MiB: 20389 MiB is 0.24 of one
        assert env["KAIROS_GPU_MEMORY_FRACTION"] == "0.24"
        assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.24"
        await until(lambda: calls.exists())
        assert calls.read_text().splitlines()[0].startswith("-d ")


async def test_mps_can_be_turned_off(broker: str, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    calls = install_fake_mps(tmp_path, monkeypatch.setenv)
    async with running_agent(broker, tmp_path / "state", node_runtime="process",
                             mps_enabled=False) as run:
        env = await task_env(run, f"N{run.agent().node_id}")
        assert "CUDA_MPS_PIPE_DIRECTORY" not in env
        assert env["KAIROS_GPU_MEMORY_FRACTION"] == "0.24"  # the hints still come
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20389M"
    assert not calls.exists()
