"""MIG on the node agent: simulated MIG GPUs in the inventory, a binding's MIG assignment
carried out on its instance (a real process sees that instance's UUID alone), an
instance the node does not have refused, never run on the whole GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.node_agent.agent import NodeAgent
from services.node_agent.devices.simulated import SimulatedDevices
from services.node_agent.inventory import gpu_memory_mib, node_inventory
from services.node_agent.runtimes.base import ExitCallback, GpuGrant, Runtime
from services.node_agent.runtimes.local_process import LocalProcessRuntime
from services.node_agent.runtimes.simulated import SimulatedRuntime
from services.node_agent.settings import AgentSettings
from shared.events import (
    Binding,
    BindingAction,
    BindingRefused,
    GpuAssignment,
    JobStatus,
    TaskBinding,
)
from tests.services.test_agent_shell import Recorder, wait_for

A100 = ("NVIDIA A100-SXM4-80GB", 81920)
PROFILES = ["1g.10gb", "3g.40gb", "1g.10gb", "2g.20gb"]  # laid out larger first


def a100s(node: str = "n1", count: int = 4, mig_gpus: int = 2) -> SimulatedDevices:
    return SimulatedDevices(node, count, *A100, mig_profiles=PROFILES, mig_gpus=mig_gpus)


def mig(index: int, profile: str, start: int) -> GpuAssignment:
    return GpuAssignment(index=index, mig_profile=profile, mig_start=start)


def binding(job: str, *tasks: tuple[str, list[GpuAssignment]], command: list[str] | None = None,
            duration: float = 0.05) -> Binding:
    return Binding(binding_id=f"b-{job}", action=BindingAction.ALLOCATE, node_id="n1", epoch=1,
                   job_id=job, duration_s=duration, grace_period_s=1, tasks=[
                       TaskBinding(task_id=tid, task_name="w", role="worker", replica=i,
                                   rank=i, gpus=gpus, command=command or [])
                       for i, (tid, gpus) in enumerate(tasks)])


def statuses(rec: Recorder, job: str) -> list[JobStatus]:
    return [e for e in rec.events if isinstance(e, JobStatus) and e.job_id == job]


def test_simulated_mig_gpus_are_laid_out_as_nvidia_smi_would() -> None:
    devs = a100s().devices()
    assert [d.mig_mode for d in devs] == [True, True, False, False]
    # the only placement that fits: the 3g at slice 4 (a 1g may not begin at slice 7)
    assert [(m.profile, m.start, m.size) for m in devs[0].mig_instances] == [
        ("2g.20gb", 0, 2), ("1g.10gb", 2, 1), ("1g.10gb", 3, 1), ("3g.40gb", 4, 4)]
    assert devs[2].mig_instances == ()
    uuids = [m.uuid for d in devs for m in d.mig_instances]
    assert all(u.startswith("MIG-") for u in uuids) and len(set(uuids)) == 8
    assert [m.uuid for m in a100s().devices()[1].mig_instances] == [  # the same every start
        m.uuid for m in devs[1].mig_instances]
    assert a100s("n2").devices()[0].mig_instances[0].uuid != uuids[0]  # node's own
    assert all(d.mig_mode for d in a100s(mig_gpus=0).devices())  # 0: every GPU


@pytest.mark.parametrize(("profiles", "says"), [
    (["1g.5gb"], "A100-80GB has no MIG profile '1g.5gb'"),
    (["4g.40gb", "3g.40gb", "2g.20gb"], "do not fit together"),
])
def test_simulated_mig_written_wrong_says_what(profiles: list[str], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        SimulatedDevices("n1", 2, *A100, mig_profiles=profiles)


def test_the_agent_settings_build_mig_gpus_and_refuse_a_bad_layout() -> None:
    from services.node_agent.main import sim_devices

    s = AgentSettings(sim_gpus_per_node=4, sim_gpu_model=A100[0], sim_gpu_memory_mib=A100[1],
                      sim_mig_profiles=" 7g.80gb ", sim_mig_gpus=1)
    devs = sim_devices(s, "n1").devices()
    assert [len(d.mig_instances) for d in devs] == [1, 0, 0, 0]
    with pytest.raises(SystemExit, match=r"KAIROS_SIM_MIG_PROFILES: .*1g\.5gb"):
        sim_devices(s.model_copy(update={"sim_mig_profiles": "1g.5gb"}), "n1")


def test_the_inventory_carries_the_mig_instances() -> None:
    inv = node_inventory("n1", a100s(), 64_000, 512_000, "r0")
    g0, g2 = inv.gpus[0], inv.gpus[2]
    assert g0.mig_mode and not g2.mig_mode
    assert [(m.profile, m.start, m.size) for m in g0.mig_instances][2] == ("1g.10gb", 3, 1)
    assert g0.mig_instances[2].uuid == a100s().devices()[0].mig_instances[2].uuid
    assert g2.mig_instances == []
    assert inv.labels["kairos.io/mig"] == "enabled"
    assert gpu_memory_mib(inv, 0, 0) == 81920 * 2 // 8  # 2g.20gb: two memory slices
    assert gpu_memory_mib(inv, 0, 5) == 0  # no instance begins there
    assert gpu_memory_mib(inv, 0) == 81920


def process_agent(state: Path, rec: Recorder) -> NodeAgent:
    devices = a100s()

    def runtime(on_exit: ExitCallback) -> Runtime:
        return LocalProcessRuntime(on_exit, state, poll_s=0.05)

    return NodeAgent(node_inventory("n1", devices, 8000, 16384, "r0", runtime="process"),
                     devices, runtime, rec, str(state))


async def test_a_mig_task_sees_exactly_its_instance(tmp_path: Path) -> None:
    """Two instances of one GPU are apart: each task runs, and sees its own alone."""
    rec = Recorder()
    agent = process_agent(tmp_path, rec)
    inst = {m.start: m.uuid for m in agent.devices.devices()[1].mig_instances}
    await agent.handle(binding("M", ("w-0", [mig(1, "1g.10gb", 3)]),
                               ("w-1", [mig(1, "2g.20gb", 0)]),
                               command=["sh", "-c", 'echo "[$CUDA_VISIBLE_DEVICES]"']))
    await wait_for(lambda: [s.state.value for s in statuses(rec, "M")].count("succeeded") == 2,
                   timeout=30)
    logs = agent.runtime.logs  # type: ignore[attr-defined]
    assert logs("M/w-0/1") == f"[{inst[3]}]\n"
    assert logs("M/w-1/1") == f"[{inst[0]}]\n"
    assert not any(isinstance(e, BindingRefused) for e in rec.events)
    await agent.close()


@pytest.mark.parametrize(("gpus", "says"), [
    ([mig(1, "1g.10gb", 5)], "no MIG instance 1g.10gb at memory slice 5 of GPU 1 on n1"),
    ([mig(0, "2g.20gb", 2)], "no MIG instance 2g.20gb at memory slice 2 of GPU 0 on n1 "
                             "(it has 1g.10gb there)"),
    ([mig(2, "1g.10gb", 2)], "no MIG instance 1g.10gb at memory slice 2 of GPU 2 on n1"),
    ([mig(9, "1g.10gb", 2)], "of GPU 9 on n1"),
])
async def test_an_instance_the_node_lacks_refuses_the_binding(
        tmp_path: Path, gpus: list[GpuAssignment], says: str) -> None:
    """Refused whole (the other task, whose instance exists, does not start either), its
    tasks reported failed so the scheduler places them again; nothing runs."""
    rec = Recorder()
    agent = process_agent(tmp_path, rec)
    b = binding("R", ("w-0", [mig(0, "1g.10gb", 3)]), ("w-1", gpus),
                command=["sh", "-c", "sleep 30"])
    await agent.handle(b)
    (refused,) = [e for e in rec.events if isinstance(e, BindingRefused)]
    assert refused.binding_id == "b-R" and says in refused.reason
    ended = statuses(rec, "R")
    assert [(s.task, s.state.value, s.cause) for s in ended] == [
        ("w-0", "failed", "start_failed"), ("w-1", "failed", "start_failed")]
    assert all(says in s.reason for s in ended)
    assert await agent.runtime.running() == []
    await agent.handle(b)  # redelivered: refused and reported once
    assert len(statuses(rec, "R")) == 2
    assert len([e for e in rec.events if isinstance(e, BindingRefused)]) == 1
    await agent.close()


async def test_the_simulated_runtime_runs_a_mig_task_on_its_slices() -> None:
    rec = Recorder()
    devices = a100s()
    agent = NodeAgent(node_inventory("n1", devices, 64_000, 512_000, "r0"), devices,
                      SimulatedRuntime, rec)
    await agent.handle(binding("S", ("w-0", [mig(0, "3g.40gb", 4)]),
                               ("w-1", [mig(0, "1g.10gb", 3)]), duration=0.3))
    gpu0 = agent.telemetry().gpus[0]
    assert gpu0.utilization_pct == pytest.approx(0.95 * 100 * 4 / 7)  # 3 + 1 of 7 slices
    assert gpu0.memory_used_mib == int(0.9 * 81920 * 4 // 8) + int(0.9 * 81920 // 8)
    assert "GPUs 0 (MIG 3g.40gb at 4)" in agent.runtime.logs("S/w-0/1")
    assert not agent.shares.check(devices.sample())  # the share watchdog leaves it be
    await wait_for(lambda: len(statuses(rec, "S")) == 4)
    assert agent.telemetry().gpus[0].utilization_pct == 0
    await agent.close()


def test_a_mig_grant_is_never_a_share() -> None:
    from services.node_agent.isolation.mps import is_share, share_env
    from services.node_agent.isolation.watchdog import ShareWatchdog

    grant = GpuGrant(0, "MIG-x", memory_mib=10_000, compute_pct=14, mig_profile="1g.10gb",
                     mig_start=3)
    assert not is_share([grant]) and share_env([grant], {0: 81920}) == {}
    dog = ShareWatchdog(a100s(), object(), lambda key: set())
    dog.watch("t", [grant])
    assert not dog.watching
