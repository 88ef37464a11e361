"""The local process runtime with real subprocesses (sh, sleep) in a temporary state dir."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.node_agent.runtimes import procfs
from services.node_agent.runtimes.base import GpuGrant, RuntimeStartError
from services.node_agent.runtimes.local_process import LocalProcessRuntime
from tests.node_agent.helpers import Exits, launch, until

UUID0 = "GPU-4a3d0a3c-52b1-0c6e-8f1e-1b2c3d4e5f00"
UUID3 = "GPU-4a3d0a3c-52b1-0c6e-8f1e-1b2c3d4e5f03"


def sh(script: str) -> tuple[str, ...]:
    return ("sh", "-c", script)


@pytest.fixture
def exits() -> Exits:
    return Exits()


@pytest.fixture
async def runtime(tmp_path: Path, exits: Exits):
    rt = LocalProcessRuntime(exits, tmp_path / "state", poll_s=0.02,
                             device_memory_mib={0: 81559, 3: 81559})
    yield rt
    for key in await rt.running():
        await rt.stop(key, 0)
    await rt.close()


async def test_runs_command_with_gpus_env_and_captures_logs(runtime: LocalProcessRuntime,
                                                          exits: Exits) -> None:
    task = launch("j1", "worker-0", 1, *sh("env | sort; echo to-stderr >&2"),
                  env={"MASTER_ADDR": "10.0.0.5", "RANK": "3"},
                  gpus=(GpuGrant(0, UUID0), GpuGrant(3, UUID3)))
    await runtime.start(task)
    done = await exits.wait(task.key)
    assert (done.exit_code, done.reason) == (0, "completed")
    out = runtime.logs(task.key)
    assert f"CUDA_VISIBLE_DEVICES={UUID0},{UUID3}" in out
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in out
    assert "MASTER_ADDR=10.0.0.5" in out
    assert "RANK=3" in out
    assert "KAIROS_JOB_ID=j1" in out
    assert "to-stderr" in out
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in out  # whole GPUs: no share limits
    assert runtime.logs(task.key, tail=1) == "to-stderr\n"


async def test_share_limits_reach_the_task_and_job_env_cannot_override_them(
        runtime: LocalProcessRuntime, exits: Exits) -> None:
    task = launch("j2", "w", 1, *sh("env | sort"),
                  env={"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=80000M",
                       "TF_FORCE_GPU_ALLOW_GROWTH": "false"},
                  gpus=(GpuGrant(3, UUID3, memory_mib=20390, compute_pct=25),))
    await runtime.start(task)
    await exits.wait(task.key)
    out = runtime.logs(task.key)
    assert f"CUDA_VISIBLE_DEVICES={UUID3}" in out
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20390M" in out  # ordinal as the task sees it
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in out
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION=0.25" in out
    assert "TF_FORCE_GPU_ALLOW_GROWTH=false" in out  # a hint: the job may override it


async def test_a_mig_grant_sees_its_instance_alone_and_no_share_limits(
        runtime: LocalProcessRuntime, exits: Exits) -> None:
    mig = "MIG-7c3b5e1a-0f42-5d9e-b8a1-2e4f6a8c0d13"
    # memory and compute given anyway: meaningless for an instance, never made a share
    task = launch("j-mig", "w", 1, *sh("env | sort"),
                  env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"},
                  gpus=(GpuGrant(3, mig, memory_mib=20390, compute_pct=25,
                                 mig_profile="1g.10gb", mig_start=3),))
    await runtime.start(task)
    await exits.wait(task.key)
    out = runtime.logs(task.key).splitlines()
    assert [line for line in out if line.startswith("CUDA_VISIBLE_DEVICES=")] == [
        f"CUDA_VISIBLE_DEVICES={mig}"]  # the job's own value cannot widen it
    # hardware isolation: no MPS limits, no framework hints of a share
    assert not [line for line in out if line.startswith(("CUDA_MPS_", "KAIROS_GPU_",
                                                         "XLA_PYTHON_CLIENT_MEM"))]


async def test_no_gpus_hides_all_gpus(runtime: LocalProcessRuntime, exits: Exits) -> None:
    task = launch("j3", "ps-0", 1, *sh('echo "[$CUDA_VISIBLE_DEVICES]"'))
    await runtime.start(task)
    await exits.wait(task.key)
    assert runtime.logs(task.key) == "[]\n"


async def test_failure_exit_code(runtime: LocalProcessRuntime, exits: Exits) -> None:
    task = launch("j4", "w", 1, *sh("exit 3"))
    await runtime.start(task)
    done = await exits.wait(task.key)
    assert (done.exit_code, done.reason) == (3, "error")


async def test_unknown_command_fails_to_start(runtime: LocalProcessRuntime) -> None:
    with pytest.raises(RuntimeStartError, match="not found"):
        await runtime.start(launch("j5", "w", 1, "no-such-binary-kairos"))
    with pytest.raises(RuntimeStartError):
        await runtime.start(launch("j5", "w", 2))


async def test_stop_sends_checkpoint_signal_first(runtime: LocalProcessRuntime,
                                                  exits: Exits) -> None:
    script = "trap 'echo checkpointed; exit 0' TERM; echo ready; while :; do sleep 0.05; done"
    task = launch("j6", "w", 1, *sh(script))
    await runtime.start(task)
    await until(lambda: "ready" in runtime.logs(task.key))
    await runtime.stop(task.key, grace_s=30)
    done = await exits.wait(task.key)
    assert (done.exit_code, done.reason) == (0, "stopped")
    assert "checkpointed" in runtime.logs(task.key)
    assert await runtime.running() == []
    await runtime.stop(task.key, grace_s=30)  # idempotent
    assert len(exits.exits) == 1


async def test_stop_kills_after_grace(runtime: LocalProcessRuntime, exits: Exits) -> None:
    task = launch("j7", "w", 1, *sh("trap '' TERM; echo ready; while :; do sleep 0.05; done"))
    await runtime.start(task)
    await until(lambda: "ready" in runtime.logs(task.key))
    pids = runtime.task_pids(task.key)
    assert len(pids) >= 2  # the wrapper shell, the task's shell (and its sleep)
    await runtime.stop(task.key, grace_s=0.1, reason="preempted", message="by job j9")
    done = await exits.wait(task.key)
    assert (done.exit_code, done.reason, done.message) == (137, "preempted", "by job j9")
    await until(lambda: not any(procfs.alive(p) for p in pids))


async def test_restart_adopts_running_and_reports_ended_tasks(tmp_path: Path) -> None:
    state = tmp_path / "state"
    go = tmp_path / "go"
    wait_then_exit = sh(f"echo up; while [ ! -e {go} ]; do sleep 0.02; done; exit 5")
    survivor = launch("j8", "a", 1, *wait_then_exit)
    ended = launch("j8", "b", 1, *sh("echo up; while [ ! -e " + f"{go}b ]; do sleep 0.02; done; exit 4"))
    first_exits = Exits()
    first = LocalProcessRuntime(first_exits, state, poll_s=0.02)
    await first.start(survivor)
    await first.start(ended)
    await first.close()  # the agent goes away; its tasks do not

    (tmp_path / "gob").touch()  # b ends while no agent runs
    pid_b = first._read_state(ended.key)["pid"]
    await until(lambda: not procfs.alive(pid_b))

    exits = Exits()
    second = LocalProcessRuntime(exits, state, poll_s=0.02)
    reported = await second.reconcile()
    assert [(e.key, e.exit_code, e.reason) for e in reported] == [(ended.key, 4, "error")]
    assert await second.running() == [survivor.key]
    pid_a = second._read_state(survivor.key)["pid"]
    await second.start(survivor)  # a redelivered binding starts nothing twice
    assert second._read_state(survivor.key)["pid"] == pid_a
    assert second.logs(survivor.key) == "up\n"

    await second.forget(ended.key)
    assert await second.reconcile() == []
    await second.start(ended)  # a finished attempt is reported again, not rerun
    assert (await exits.wait(ended.key)).exit_code == 4
    assert second.logs(ended.key) == "up\n"

    go.touch()
    done = await exits.wait(survivor.key)
    assert (done.exit_code, done.reason) == (5, "error")
    assert await second.running() == []
    await second.close()


def test_pids_of_pod_by_cgroup() -> None:
    own = Path("/proc/self/cgroup").read_text().strip().rsplit("/", 1)[-1]
    assert procfs.pids_of_pod("") == set()
    if own:  # our own cgroup's last path element stands in for a pod uid
        assert procfs.pids_of_pod(own)
