"""The Kubernetes runtime against ``tests/fakes/fake_k8s.py``.

The fake is NOT Kubernetes: a FastAPI app served over real HTTP (uvicorn, 127.0.0.1,
random port) that implements the API contract of exactly the calls the runtime makes
(create/read/list/patch/delete namespaced Pod, Pod log), reached through the official
``kubernetes`` client configured with ``kubernetes.client.Configuration(host=...)``. It
moves Pods Pending -> Running -> Succeeded/Failed on each read, as the container env asks.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s

from services.node_agent.isolation.mps import MpsDaemon
from services.node_agent.runtimes.base import GpuGrant, TaskLaunch
from services.node_agent.runtimes.kubernetes import KubernetesRuntime
from services.node_agent.runtimes.kubernetes_names import pod_name
from tests.fakes.fake_k8s import FakeKubernetes
from tests.node_agent.helpers import Exits, install_fake_mps, launch, until

UUIDS = ("GPU-4a3d0a3c-52b1-0c6e-8f1e-1b2c3d4e5f00", "GPU-4a3d0a3c-52b1-0c6e-8f1e-1b2c3d4e5f01")


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeKubernetes]:
    server = FakeKubernetes()
    server.start()
    yield server
    server.stop()


def runtime(fake: FakeKubernetes, exits: Exits, **kwargs: object) -> KubernetesRuntime:
    options: dict[str, object] = {"poll_s": 0.05, **kwargs}
    return KubernetesRuntime.from_config(exits, "gpu-node-7", host=fake.host, **options)


def task(job: str, *command: str, **env: str) -> TaskLaunch:
    return launch(job, "worker-0", 1, *(command or ("python", "train.py")), env=env,
                  gpus=(GpuGrant(0, UUIDS[0]), GpuGrant(1, UUIDS[1])), image="pytorch:2.4")


async def test_pod_is_bound_to_the_node_and_selects_gpus_by_uuid(fake: FakeKubernetes) -> None:
    exits = Exits()
    rt = runtime(fake, exits)
    t = task("k1", RANK="0")
    await rt.start(t)
    pod = fake.pod(pod_name(t.key))
    spec = pod["spec"]
    assert spec["nodeName"] == "gpu-node-7"
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["restartPolicy"] == "Never"
    container = spec["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(UUIDS)
    assert env["RANK"] == "0"
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env
    resources = container["resources"]
    assert resources == {"requests": {"cpu": "1000m", "memory": "512Mi"},
                         "limits": {"memory": "512Mi"}}
    assert "nvidia.com/gpu" not in str(resources)  # the device plugin must not book them too
    labels = pod["metadata"]["labels"]
    assert labels["kairos.io/job-id"] == "k1"
    assert labels["kairos.io/node"] == "gpu-node-7"
    assert pod["metadata"]["annotations"]["kairos.io/key"] == t.key
    assert await rt.running() == [t.key]

    done = await exits.wait(t.key)
    assert (done.exit_code, done.reason) == (0, "completed")
    await until(lambda: fake.pod(pod_name(t.key))["metadata"]["labels"].get(
        "kairos.io/reported") == "true")
    assert await rt.running() == []
    assert "ran: python train.py" in rt.logs(t.key)
    assert rt.logs(t.key, tail=1) == "done\n"

    await rt.start(t)  # a redelivered binding: 409, the exit is reported again, no new Pod
    assert len(exits.exits) == 2
    assert exits.exits[1] == done
    await rt.close()


async def test_failure_and_shares(fake: FakeKubernetes) -> None:
    exits = Exits()
    rt = runtime(fake, exits, device_memory_mib={3: 81559})
    t = launch("k2", "w", 1, "run", env={"FAKE_K8S_EXIT": "3"},
               gpus=(GpuGrant(3, "GPU-x", memory_mib=20389, compute_pct=25),))
    await rt.start(t)
    env = {e["name"]: e["value"] for e in fake.pod(pod_name(t.key))["spec"]["containers"][0]["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-x"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20389M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    done = await exits.wait(t.key)
    assert (done.exit_code, done.reason) == (3, "error")

    cpu_only = launch("k2", "ps", 1, "serve", env={"FAKE_K8S_EXIT": "never"})
    await rt.start(cpu_only)
    env = {e["name"]: e["value"]
           for e in fake.pod(pod_name(cpu_only.key))["spec"]["containers"][0]["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"  # CUDA images default to "all"
    await rt.stop(cpu_only.key, 0)
    await rt.close()


async def test_a_mig_instance_is_selected_by_its_uuid_alone_without_mps(
        fake: FakeKubernetes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = install_fake_mps(tmp_path, monkeypatch.setenv)
    exits = Exits()
    rt = runtime(fake, exits, device_memory_mib={2: 81920},
                 mps=MpsDaemon(tmp_path / "state"))
    mig = "MIG-7c3b5e1a-0f42-5d9e-b8a1-2e4f6a8c0d13"
    t = launch("k-mig", "w", 1, "run", env={"FAKE_K8S_EXIT": "never"},
               gpus=(GpuGrant(2, mig, mig_profile="1g.10gb", mig_start=3),))
    await rt.start(t)
    pod = fake.pod(pod_name(t.key))
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == mig  # that instance, not GPU 2
    assert not any(k.startswith(("CUDA_MPS", "KAIROS_GPU_")) for k in env)
    assert "nvidia.com" not in str(container["resources"])  # no gpu, no mig-* resource
    assert not pod["spec"].get("hostIPC") and not pod["spec"].get("volumes")
    assert not calls.exists()  # a MIG instance is no share: MPS never started
    await rt.stop(t.key, 0)
    await rt.close()


async def test_stop_deletes_with_grace_period(fake: FakeKubernetes) -> None:
    exits = Exits()
    rt = runtime(fake, exits)
    t = task("k3", FAKE_K8S_EXIT="never")
    await rt.start(t)
    await rt.stop(t.key, grace_s=30, reason="preempted", message="by k9")
    assert (pod_name(t.key), 30) in fake.deletions
    done = await exits.wait(t.key)
    assert (done.exit_code, done.reason, done.message) == (143, "preempted", "by k9")
    assert fake.pod(pod_name(t.key)) is None
    assert await rt.running() == []
    await rt.stop(t.key, grace_s=30)  # idempotent
    assert len(exits.exits) == 1
    await rt.close()


async def test_image_that_cannot_be_pulled_fails_the_task(fake: FakeKubernetes) -> None:
    exits = Exits()
    rt = runtime(fake, exits, pending_timeout_s=0)
    t = task("k4", FAKE_K8S_WAITING="ImagePullBackOff")
    await rt.start(t)
    done = await exits.wait(t.key)
    assert done.reason == "error"
    assert done.message.startswith("ImagePullBackOff")
    assert fake.pod(pod_name(t.key)) is None
    await rt.close()


async def test_pod_deleted_outside_kairos_is_reported(fake: FakeKubernetes) -> None:
    exits = Exits()
    rt = runtime(fake, exits)
    t = task("k5", FAKE_K8S_EXIT="never")
    await rt.start(t)
    api = k8s.CoreV1Api(k8s.ApiClient(k8s.Configuration(host=fake.host)))
    api.delete_namespaced_pod(pod_name(t.key), "kairos", grace_period_seconds=0)
    done = await exits.wait(t.key)
    assert (done.reason, done.message) == ("killed", "pod deleted outside Kairos")
    await rt.close()


async def test_restart_adopts_running_pods_and_reports_ended_ones(fake: FakeKubernetes) -> None:
    first = runtime(fake, Exits(), poll_s=3600)  # never polls: the agent "dies" at once
    survivor = task("k6", FAKE_K8S_EXIT="never")
    ended = launch("k6", "worker-1", 1, "run", env={"FAKE_K8S_EXIT": "4"})
    await first.start(survivor)
    await first.start(ended)
    await first.close()
    api = k8s.CoreV1Api(k8s.ApiClient(k8s.Configuration(host=fake.host)))
    while api.read_namespaced_pod(pod_name(ended.key), "kairos").status.phase != "Failed":
        pass  # each read moves the fake Pod on: it ends while no agent runs

    exits = Exits()
    second = runtime(fake, exits)
    found = await second.reconcile()
    assert [(e.key, e.exit_code, e.reason) for e in found] == [(ended.key, 4, "error")]
    assert await second.running() == [survivor.key]
    pods_before = len(fake.pods)
    await second.start(survivor)  # starts nothing twice
    assert len(fake.pods) == pods_before

    await second.forget(ended.key)
    assert await second.reconcile() == []
    await second.stop(survivor.key, 0)
    assert (await exits.wait(survivor.key)).reason == "stopped"
    await second.close()


async def test_stop_of_a_pod_that_already_ended_reports_its_real_exit(
        fake: FakeKubernetes) -> None:
    exits = Exits()
    rt = runtime(fake, exits, poll_s=3600)  # the poller has not seen the end yet
    t = task("k7", FAKE_K8S_EXIT="0")
    await rt.start(t)
    api = k8s.CoreV1Api(k8s.ApiClient(k8s.Configuration(host=fake.host)))
    while api.read_namespaced_pod(pod_name(t.key), "kairos").status.phase != "Succeeded":
        pass
    await rt.stop(t.key, grace_s=30, reason="preempted")
    done = await exits.wait(t.key)
    assert (done.exit_code, done.reason) == (0, "completed")
    assert all(name != pod_name(t.key) for name, _ in fake.deletions)
    await rt.close()


async def test_the_work_done_comes_from_the_pod_status(fake: FakeKubernetes) -> None:
    """Run time from the container's start and finish; the checkpoint from its
    termination message (what it wrote to KAIROS_CHECKPOINT_FILE = terminationMessagePath)."""
    exits = Exits()
    rt = runtime(fake, exits)
    ended = task("k8", FAKE_K8S_EXIT="0", FAKE_K8S_CHECKPOINT="s3://ckpt/step-900\n")
    await rt.start(ended)
    container = fake.pod(pod_name(ended.key))["spec"]["containers"][0]
    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert container["terminationMessagePolicy"] == "File"
    assert {e["name"]: e["value"] for e in container["env"]}[
        "KAIROS_CHECKPOINT_FILE"] == "/dev/termination-log"
    done = await exits.wait(ended.key)
    assert (done.reason, done.checkpoint) == ("completed", "s3://ckpt/step-900")
    assert done.ran_s is not None and done.ran_s >= 0

    await rt.close()

    # a stop reads the terminated status while the Pod is being deleted (no poller here
    # to see it first: the fake shows a deleted Pod's end to one reader only)
    quiet = runtime(fake, exits, poll_s=3600)
    stopped = task("k9", FAKE_K8S_EXIT="never", FAKE_K8S_CHECKPOINT="step-12")
    await quiet.start(stopped)
    api = k8s.CoreV1Api(k8s.ApiClient(k8s.Configuration(host=fake.host)))
    while api.read_namespaced_pod(pod_name(stopped.key), "kairos").status.phase != "Running":
        pass
    await quiet.stop(stopped.key, grace_s=5, reason="preempted")
    done = await exits.wait(stopped.key)
    assert (done.exit_code, done.reason, done.checkpoint) == (143, "preempted", "step-12")
    assert done.ran_s is not None and done.ran_s >= 0
    await quiet.close()
