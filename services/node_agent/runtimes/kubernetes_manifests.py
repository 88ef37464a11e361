"""What the Kubernetes runtime asks the API server for: a task's Pod and its gang's
headless Service. Pure: the runtime sends them.

Kairos chooses the GPUs, so the Pod selects them by UUID through the NVIDIA container
runtime's ``NVIDIA_VISIBLE_DEVICES`` (``void`` for none: CUDA images default to ``all``;
a MIG instance by its ``MIG-`` UUID, which the toolkit mounts alone) and does NOT request
``nvidia.com/gpu`` (nor ``nvidia.com/mig-*``): the device plugin would book the GPUs a second
time (the node's NVIDIA container toolkit must accept the variable:
``accept-nvidia-visible-devices-envvar-when-unprivileged``, its default).
``spec.nodeName`` binds the Pod to this node, bypassing the kube-scheduler as a
DaemonSet controller does.

Pods carry labels (managed-by, node, job, task, attempt, gang) and the exact task key as
an annotation, so a restarted agent finds them again. Job Pods stay on the Pod network
(no ``hostNetwork``, so two jobs' ``MASTER_PORT`` on one node never collide); the gang's
Service (``clusterIP: None``, ``publishNotReadyAddresses``) selects the attempt's Pods by
the gang label and is owned by them, so it goes with the gang's last Pod.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s

from services.node_agent.isolation.mps import merge_env
from services.node_agent.runtimes.base import CHECKPOINT_ENV, TaskLaunch
from services.node_agent.runtimes.kubernetes_names import (
    gang_service,
    label_value,
    pod_hostname,
    pod_name,
)

MANAGED_BY = "app.kubernetes.io/managed-by"
L_NODE, L_JOB, L_TASK, L_ATTEMPT = ("kairos.io/node", "kairos.io/job-id", "kairos.io/task-id",
                                   "kairos.io/attempt")
L_REPORTED = "kairos.io/reported"
L_GANG = "kairos.io/gang"  # the attempt's headless Service selects its Pods by this
A_KEY = "kairos.io/key"
CONTAINER = "task"
TERMINATION_LOG = "/dev/termination-log"  # the task's last checkpoint, read from the status


@dataclass(frozen=True)
class PodTemplate:
    """What every Pod of this node's runtime shares."""

    node: str
    namespace: str
    runtime_class: str | None
    termination_grace_s: int
    service_account: str | None


def node_selector(node: str) -> str:
    """The label selector of the Pods Kairos runs on ``node``."""
    return f"{MANAGED_BY}=kairos,{L_NODE}={label_value(node)}"


def pod_manifest(launch: TaskLaunch, template: PodTemplate, share: dict[str, str],
                 mps_env: dict[str, str] | None) -> k8s.V1Pod:
    """The task's Pod. ``share``: the GPU-share environment (empty for whole GPUs);
    ``mps_env``: the MPS client's, where the share runs under a started MPS daemon."""
    platform = {
        "NVIDIA_VISIBLE_DEVICES": ",".join(g.uuid or str(g.index) for g in launch.gpus) or "void",
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
        "KAIROS_JOB_ID": launch.job_id, "KAIROS_TASK_ID": launch.task_id,
        "KAIROS_ATTEMPT": str(launch.attempt),
        CHECKPOINT_ENV: TERMINATION_LOG,
    }
    platform.update(share)
    use_mps = mps_env is not None
    if mps_env is not None:
        platform.update(mps_env)
    env = merge_env({}, launch.env, platform)
    resources = {"cpu": f"{launch.cpu_milli}m"} if launch.cpu_milli else {}
    if launch.memory_mib:
        resources["memory"] = f"{launch.memory_mib}Mi"
    container = k8s.V1Container(
        name=CONTAINER, image=launch.image, command=list(launch.command) or None,
        env=[k8s.V1EnvVar(name=k, value=v) for k, v in sorted(env.items())],
        # CPU is requested, not limited (throttling hurts training); memory is limited.
        # No nvidia.com/gpu: the GPUs are Kairos's, chosen by UUID above.
        resources=k8s.V1ResourceRequirements(
            requests=resources or None,
            limits={"memory": resources["memory"]} if "memory" in resources else None),
        volume_mounts=[k8s.V1VolumeMount(name="mps-pipe", mount_path=env[
            "CUDA_MPS_PIPE_DIRECTORY"])] if use_mps else None,
        # the task writes its last checkpoint here; the status returns it at the end
        termination_message_path=TERMINATION_LOG, termination_message_policy="File",
    )
    gang = gang_service(launch.job_id, launch.attempt)
    labels = {MANAGED_BY: "kairos", L_NODE: label_value(template.node),
              L_JOB: label_value(launch.job_id), L_TASK: label_value(launch.task_id),
              L_ATTEMPT: str(launch.attempt), L_GANG: gang}
    labels.update({k: label_value(v) for k, v in launch.labels.items()})
    return k8s.V1Pod(
        api_version="v1", kind="Pod",
        metadata=k8s.V1ObjectMeta(name=pod_name(launch.key), namespace=template.namespace,
                                  labels=labels, annotations={A_KEY: launch.key}),
        spec=k8s.V1PodSpec(
            node_name=template.node, restart_policy="Never",
            # rank-<r>.<gang>.<ns>.svc through the gang's headless Service (Pod network)
            hostname=pod_hostname(launch.rank), subdomain=gang,
            runtime_class_name=template.runtime_class or None,
            termination_grace_period_seconds=template.termination_grace_s,
            service_account_name=template.service_account,
            host_ipc=True if use_mps else None,  # MPS clients share the server's IPC
            volumes=[k8s.V1Volume(name="mps-pipe", host_path=k8s.V1HostPathVolumeSource(
                path=env["CUDA_MPS_PIPE_DIRECTORY"], type="Directory"))] if use_mps else None,
            containers=[container],
        ),
    )


def owner_reference(pod: Any) -> k8s.V1OwnerReference:
    return k8s.V1OwnerReference(api_version="v1", kind="Pod", name=pod.metadata.name,
                                uid=pod.metadata.uid)


def gang_service_manifest(launch: TaskLaunch, namespace: str, pod: Any) -> k8s.V1Service:
    """The gang's headless Service, owned by this Pod (others add themselves)."""
    name = gang_service(launch.job_id, launch.attempt)
    ports = [k8s.V1ServicePort(name=port_name, port=int(launch.env[var]),
                               target_port=int(launch.env[var]))
             for port_name, var in (("rendezvous", "MASTER_PORT"), ("session", "KAIROS_PORT"))
             if launch.env.get(var, "").isdigit()]
    return k8s.V1Service(
        api_version="v1", kind="Service",
        metadata=k8s.V1ObjectMeta(
            name=name, namespace=namespace,
            labels={MANAGED_BY: "kairos", L_JOB: label_value(launch.job_id),
                    L_ATTEMPT: str(launch.attempt), L_GANG: name},
            owner_references=[owner_reference(pod)]),
        spec=k8s.V1ServiceSpec(
            cluster_ip="None", selector={L_GANG: name}, ports=ports or None,
            # names resolve as soon as a Pod has an address, before it is ready
            publish_not_ready_addresses=True))
