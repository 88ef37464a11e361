"""The share watchdog in the running agent, through the real broker: a task that grows
past its GPU-memory share is stopped and reported failed with the figures, its neighbour
on the same GPU keeps running. On a node with the local-process runtime and NVML (the
fake NVML of tests/fakes/fake_nvml.py: it implements the real pynvml contract, no GPU
here), and on a simulated node whose GPU memory follows its tasks."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.node_agent.devices import nvml as nvml_backend
from shared.events import Binding, BindingAction, GpuAssignment, TaskBinding
from tests.fakes.fake_nvml import FakeNvml, h100_hgx
from tests.node_agent.harness import running_agent, until

pytestmark = pytest.mark.broker
SLEEPER = ["sh", "-c", "echo ready; exec sleep 1000"]


def share_binding(node: str, job: str, memory_mib: int, compute_pct: int,
                  command: list[str] | None = None, env: dict[str, str] | None = None,
                  duration: float = 600) -> Binding:
    return Binding(binding_id=f"{job}-1-{node}", action=BindingAction.ALLOCATE, node_id=node,
                   epoch=1, job_id=job, duration_s=duration, grace_period_s=2, tasks=[
                       TaskBinding(task_id="w-0", task_name="w", role="worker", replica=0,
                                   rank=0, command=command or [], env=env or {},
                                   gpus=[GpuAssignment(index=2, uuid="GPU-2",
                                                       memory_mib=memory_mib,
                                                       compute_pct=compute_pct)])])


async def test_a_local_task_over_its_share_is_stopped_and_reported(
        broker: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(h100_hgx())
    monkeypatch.setattr(nvml_backend, "pynvml", fake)
    async with running_agent(broker, tmp_path, node_runtime="process", share_grace_s=2,
                             share_strikes=2) as run:
        node = run.agent().node_id
        assert run.agent().inventory.gpus[2].uuid == fake.gpus[2].uuid  # NVML's inventory
        greedy, modest = f"g{node}", f"m{node}"
        await run.send(share_binding(node, greedy, 20480, 25, SLEEPER))
        await run.send(share_binding(node, modest, 40960, 50, SLEEPER))
        for job in (greedy, modest):
            await run.feed.wait(job, "running")
        rt = run.agent().runtime
        await until(lambda: all("ready" in rt.logs(f"{j}/w-0/1") for j in (greedy, modest)))
        greedy_pid = max(rt.task_pids(f"{greedy}/w-0/1"))  # type: ignore[attr-defined]
        modest_pid = max(rt.task_pids(f"{modest}/w-0/1"))  # type: ignore[attr-defined]
        fake.gpus[2].run(modest_pid, 30_000)  # within its 40 GiB share
        fake.gpus[2].run(greedy_pid, 10_240)  # within its 20 GiB share, then it grows
        fake.gpus[2].run(greedy_pid, 24_576)

        failed = await run.feed.wait(greedy, "failed")
        assert failed.reason == ("gpu memory share exceeded: GPU 2 used 24576 MiB of its "
                                 "20480 MiB share")
        assert failed.task == "w-0" and failed.node_id == node
        assert failed.exit_code in (143, 137)  # SIGTERM (or SIGKILL after the grace)
        # the neighbour on the same GPU was judged by the same samples and keeps running
        assert run.agent().running(f"{modest}/w-0/1")
        assert [s.state.value for s in run.feed.statuses(modest)] == ["running"]

        fake.gpus[3].run(modest_pid, 512)  # now it escapes to a GPU it was not granted
        failed = await run.feed.wait(modest, "failed")
        assert failed.reason == ("gpu memory share exceeded: GPU 3 used 512 MiB but was "
                                 "not granted to it")


async def test_a_simulated_task_over_its_share_is_stopped_and_reported(
        broker: str, tmp_path: Path) -> None:
    async with running_agent(broker, tmp_path, share_grace_s=1) as run:
        node = run.agent().node_id
        hog, fine = f"h{node}", f"f{node}"
        # a simulated task uses ~90 % of its share, or what KAIROS_SIM_GPU_MEMORY_MIB says
        await run.send(share_binding(node, hog, 20480, 25,
                                     env={"KAIROS_SIM_GPU_MEMORY_MIB": "30000"}))
        await run.send(share_binding(node, fine, 20480, 25, duration=2))
        failed = await run.feed.wait(hog, "failed")
        assert failed.reason == ("gpu memory share exceeded: GPU 2 used 30000 MiB of its "
                                 "20480 MiB share")
        done = await run.feed.wait(fine, "succeeded")
        assert done.reason == "completed"
        assert [s.state.value for s in run.feed.statuses(fine)] == ["running", "succeeded"]
        assert run.agent().telemetry().gpus[2].memory_used_mib == 0  # both left the GPU
