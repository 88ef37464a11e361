"""Kubernetes runtime: a task is a Pod bound to this node (``spec.nodeName``).

Kairos chooses the GPUs, so the Pod selects them by UUID through the NVIDIA container
runtime's ``NVIDIA_VISIBLE_DEVICES`` (``void`` for none: CUDA images default to ``all``)
and does NOT request ``nvidia.com/gpu``: the device plugin would book the GPUs a second
time. The node's NVIDIA container toolkit must accept the variable
(``accept-nvidia-visible-devices-envvar-when-unprivileged``, its default). Setting
``spec.nodeName`` bypasses the kube-scheduler, as a DaemonSet controller does.

Pods carry labels (managed-by, node, job, task, attempt) and the exact task key as an
annotation, so ``reconcile()`` after an agent restart lists this node's Pods, adopts the
running ones and returns those that ended unreported. A reported Pod is labelled
``kairos.io/reported=true`` and kept (its logs stay readable) until ``keep_done_s``.
The Pod name is derived from the key, so a redelivered binding meets 409 AlreadyExists
and starts nothing twice.

One poller lists this node's Pods every ``poll_s`` (one request per node per period,
not one per Pod). The ``kubernetes`` client is synchronous: every call runs in a thread.

Rendezvous across nodes: job Pods stay on the Pod network (no ``hostNetwork``, so two
jobs' ``MASTER_PORT`` on one node never collide). Every Pod of a job attempt is named in
DNS as ``rank-<rank>.<gang>.<namespace>.svc``: its ``hostname`` is ``rank-<rank>``, its
``subdomain`` the gang's headless Service (``gang_service``: ``clusterIP: None``,
``publishNotReadyAddresses``, selecting the attempt's Pods by the ``kairos.io/gang``
label). Whichever agent starts a Pod of the gang first creates the Service; each adds
its Pod to the Service's ``ownerReferences``, so Kubernetes' garbage collector deletes
the Service with the gang's last Pod. ``MASTER_ADDR`` and the hosts in ``TF_CONFIG``
are these names (``peer_host``), the same on every node; a Pod whose gang Service cannot
be made is deleted and its start fails, so a gang never waits for a name that will not
resolve.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import re
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from services.node_agent.isolation.mps import MpsDaemon, merge_env, share_env
from services.node_agent.runtimes import procfs
from services.node_agent.runtimes.base import (
    CHECKPOINT_ENV,
    ExitCallback,
    RuntimeStartError,
    TaskExit,
    TaskLaunch,
    read_checkpoint,
)
from services.node_agent.runtimes.local_process import exit_reason

log = logging.getLogger(__name__)

MANAGED_BY = "app.kubernetes.io/managed-by"
L_NODE, L_JOB, L_TASK, L_ATTEMPT = ("kairos.io/node", "kairos.io/job-id", "kairos.io/task-id",
                                   "kairos.io/attempt")
L_REPORTED = "kairos.io/reported"
L_GANG = "kairos.io/gang"  # the attempt's headless Service selects its Pods by this
A_KEY = "kairos.io/key"
CONTAINER = "task"
TERMINATION_LOG = "/dev/termination-log"  # the task's last checkpoint, read from the status
# waiting reasons that will not resolve by themselves: fail at once
FATAL_WAITING = frozenset({"InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError"})
SLOW_WAITING = frozenset({"ErrImagePull", "ImagePullBackOff", "CreateContainerError"})
TIMEOUT = 30  # seconds per API request


def _label_value(text: str) -> str:
    """A valid label value: <= 63 of [A-Za-z0-9._-], alphanumeric at both ends."""
    value = re.sub(r"[^A-Za-z0-9._-]", "-", text)[:63]
    return value.strip("._-") or "x"


def pod_name(key: str) -> str:
    slug = re.sub(r"[^a-z0-9-]", "-", key.lower().replace("/", "-"))
    digest = hashlib.sha1(key.encode()).hexdigest()[:10]
    return f"kairos-{slug[:45].strip('-')}-{digest}"  # a DNS label, unique per key


def gang_service(job_id: str, attempt: int) -> str:
    """The headless Service of a job attempt: a DNS-1035 label (<= 63, starts with a
    letter), the same on every node."""
    digest = hashlib.sha1(f"{job_id}/{attempt}".encode()).hexdigest()[:8]
    tail = f"-a{attempt}-{digest}"
    slug = re.sub(r"[^a-z0-9-]", "-", job_id.lower())[:63 - 3 - len(tail)].strip("-")
    return f"kj-{slug}{tail}" if slug else f"kj{tail}"


def pod_hostname(rank: int) -> str:
    return f"rank-{rank}"


def peer_host(job_id: str, attempt: int, rank: int, namespace: str) -> str:
    """The DNS name of the Pod of rank ``rank`` of a job attempt (any node)."""
    return f"{pod_hostname(rank)}.{gang_service(job_id, attempt)}.{namespace}.svc"


class KubernetesRuntime:
    name = "kubernetes"

    def __init__(
        self,
        on_exit: ExitCallback,
        node_name: str,
        api: k8s.CoreV1Api,
        *,
        namespace: str = "kairos",
        runtime_class: str | None = "nvidia",
        mps: MpsDaemon | None = None,
        device_memory_mib: Mapping[int, int] | None = None,
        termination_grace_s: int = 30,
        poll_s: float = 5.0,
        pending_timeout_s: float = 600.0,
        keep_done_s: float = 86400.0,
        service_account: str | None = None,
    ) -> None:
        self._on_exit = on_exit
        self._node = node_name
        self._api = api
        self._ns = namespace
        self._runtime_class = runtime_class
        self._mps = mps
        self._device_memory = dict(device_memory_mib or {})
        self._termination_grace_s = termination_grace_s
        self._poll_s = poll_s
        self._pending_timeout_s = pending_timeout_s
        self._keep_done_s = keep_done_s
        self._service_account = service_account
        self._tracked: dict[str, str] = {}  # key -> pod name
        self._uids: dict[str, str] = {}  # key -> pod uid
        self._pending_since: dict[str, float] = {}
        self._stopping: set[str] = set()
        self._poller: asyncio.Task[None] | None = None
        self._selector = f"{MANAGED_BY}=kairos,{L_NODE}={_label_value(node_name)}"

    @classmethod
    def from_config(cls, on_exit: ExitCallback, node_name: str, host: str | None = None,
                    **kwargs: Any) -> KubernetesRuntime:
        """In-cluster config (the agent's DaemonSet), else ~/.kube/config, else ``host``."""
        if host is not None:
            return cls(on_exit, node_name, k8s.CoreV1Api(k8s.ApiClient(k8s.Configuration(host=host))),
                       **kwargs)
        from kubernetes import config

        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        return cls(on_exit, node_name, k8s.CoreV1Api(), **kwargs)

    def peer_host(self, job_id: str, attempt: int, rank: int) -> str:
        """Where the other tasks of a gang reach this rank (rendezvous, TF_CONFIG)."""
        return peer_host(job_id, attempt, rank, self._ns)

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        fn = getattr(self._api, method)
        return await asyncio.to_thread(fn, *args, _request_timeout=TIMEOUT, **kwargs)

    # --- the Pod ------------------------------------------------------------------------

    async def _pod_spec(self, launch: TaskLaunch) -> k8s.V1Pod:
        grants = launch.gpus
        platform = {
            "NVIDIA_VISIBLE_DEVICES": ",".join(g.uuid or str(g.index) for g in grants) or "void",
            "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
            "KAIROS_JOB_ID": launch.job_id, "KAIROS_TASK_ID": launch.task_id,
            "KAIROS_ATTEMPT": str(launch.attempt),
            CHECKPOINT_ENV: TERMINATION_LOG,
        }
        share = share_env(grants, self._device_memory)  # ordinals: the container sees 0..n-1
        platform.update(share)
        use_mps = bool(share) and self._mps is not None and await self._mps.ensure_started()
        if use_mps:
            assert self._mps is not None
            platform.update(self._mps.client_env())
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
        labels = {MANAGED_BY: "kairos", L_NODE: _label_value(self._node),
                  L_JOB: _label_value(launch.job_id), L_TASK: _label_value(launch.task_id),
                  L_ATTEMPT: str(launch.attempt), L_GANG: gang}
        labels.update({k: _label_value(v) for k, v in launch.labels.items()})
        return k8s.V1Pod(
            api_version="v1", kind="Pod",
            metadata=k8s.V1ObjectMeta(name=pod_name(launch.key), namespace=self._ns,
                                      labels=labels, annotations={A_KEY: launch.key}),
            spec=k8s.V1PodSpec(
                node_name=self._node, restart_policy="Never",
                # rank-<r>.<gang>.<ns>.svc through the gang's headless Service (Pod network)
                hostname=pod_hostname(launch.rank), subdomain=gang,
                runtime_class_name=self._runtime_class or None,
                termination_grace_period_seconds=self._termination_grace_s,
                service_account_name=self._service_account,
                host_ipc=True if use_mps else None,  # MPS clients share the server's IPC
                volumes=[k8s.V1Volume(name="mps-pipe", host_path=k8s.V1HostPathVolumeSource(
                    path=env["CUDA_MPS_PIPE_DIRECTORY"], type="Directory"))] if use_mps else None,
                containers=[container],
            ),
        )

    def _service_spec(self, launch: TaskLaunch, pod: Any) -> k8s.V1Service:
        """The gang's headless Service, owned by this Pod (others add themselves)."""
        name = gang_service(launch.job_id, launch.attempt)
        ports = [k8s.V1ServicePort(name=port_name, port=int(launch.env[var]),
                                   target_port=int(launch.env[var]))
                 for port_name, var in (("rendezvous", "MASTER_PORT"), ("session", "KAIROS_PORT"))
                 if launch.env.get(var, "").isdigit()]
        return k8s.V1Service(
            api_version="v1", kind="Service",
            metadata=k8s.V1ObjectMeta(
                name=name, namespace=self._ns,
                labels={MANAGED_BY: "kairos", L_JOB: _label_value(launch.job_id),
                        L_ATTEMPT: str(launch.attempt), L_GANG: name},
                owner_references=[self._owner(pod)]),
            spec=k8s.V1ServiceSpec(
                cluster_ip="None", selector={L_GANG: name}, ports=ports or None,
                # names resolve as soon as a Pod has an address, before it is ready
                publish_not_ready_addresses=True))

    @staticmethod
    def _owner(pod: Any) -> k8s.V1OwnerReference:
        return k8s.V1OwnerReference(api_version="v1", kind="Pod", name=pod.metadata.name,
                                    uid=pod.metadata.uid)

    async def _ensure_service(self, launch: TaskLaunch, pod: Any) -> None:
        """Create the gang's Service, or add this Pod to its owners (strategic merge on
        ``ownerReferences`` merges by uid): it lives while any Pod of the gang does."""
        body = self._service_spec(launch, pod)
        name = gang_service(launch.job_id, launch.attempt)
        for _ in range(3):  # a Service being collected with its last owner is made again
            try:
                await self._call("create_namespaced_service", self._ns, body)
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise
            try:
                await self._call("patch_namespaced_service", name, self._ns,
                                 {"metadata": {"ownerReferences": [
                                     self._api.api_client.sanitize_for_serialization(
                                         self._owner(pod))]}},
                                 _content_type="application/strategic-merge-patch+json")
                return
            except ApiException as exc:
                if exc.status != 404:
                    raise
        raise ApiException(status=409, reason=f"service {name} kept changing")

    # --- Runtime ------------------------------------------------------------------------

    async def start(self, launch: TaskLaunch) -> None:
        key = launch.key
        if key in self._tracked:
            return
        self._ensure_poller()
        try:
            pod = await self._call("create_namespaced_pod", self._ns, await self._pod_spec(launch))
        except ApiException as exc:
            if exc.status != 409:
                raise RuntimeStartError(f"{key}: pod not created: {exc.status} {exc.reason}") from exc
            pod = await self._call("read_namespaced_pod", pod_name(key), self._ns)
            if self._is_terminal(pod) or (pod.metadata.labels or {}).get(L_REPORTED) == "true":
                await self._report(key, self._exit_of(key, pod))  # reported again, not rerun
                return
        try:
            await self._ensure_service(launch, pod)
        except ApiException as exc:  # its peers could never resolve it: do not run it
            with contextlib.suppress(ApiException):
                await self._call("delete_namespaced_pod", pod.metadata.name, self._ns,
                                 grace_period_seconds=0)
            raise RuntimeStartError(
                f"{key}: gang service {gang_service(launch.job_id, launch.attempt)} not "
                f"created: {exc.status} {exc.reason}") from exc
        self._track(key, pod)
        log.info("pod %s for %s on %s", pod.metadata.name, key, self._node)

    def _track(self, key: str, pod: Any) -> None:
        self._tracked[key] = pod.metadata.name
        self._uids[key] = pod.metadata.uid or ""

    async def stop(self, key: str, grace_s: float, reason: str = "stopped",
                   message: str = "") -> None:
        name = self._tracked.get(key)
        if name is None or key in self._stopping:
            return
        self._stopping.add(key)
        try:
            try:
                pod = await self._call("read_namespaced_pod", name, self._ns)
            except ApiException as exc:
                if exc.status != 404:
                    raise
                pod = None
            if pod is not None and self._is_terminal(pod):  # it ended on its own first
                self._untrack(key)
                await self._report(key, self._exit_of(key, pod))
                return
            code, last = await self._delete_and_wait(name, grace_s, pod)
        finally:
            self._stopping.discard(key)
        self._untrack(key)
        ran_s, checkpoint = self._work(last)
        await self._report(key, TaskExit(key, code, reason, message, ran_s, checkpoint),
                           mark=False)

    async def _delete_and_wait(self, name: str, grace_s: float, pod: Any) -> tuple[int, Any]:
        """Delete with a grace period; the container's exit code where seen, else a guess,
        and the last state of the Pod seen (for the work it did)."""
        code = 128 + 15
        with contextlib.suppress(ApiException):
            await self._call("delete_namespaced_pod", name, self._ns,
                             grace_period_seconds=math.ceil(max(grace_s, 0)))
        deadline = time.monotonic() + grace_s + 2 * self._poll_s + 5
        while time.monotonic() < deadline:
            try:
                pod = await self._call("read_namespaced_pod", name, self._ns)
            except ApiException as exc:
                if exc.status == 404:
                    return code, pod
                raise
            terminated = self._terminated(pod)
            if terminated is not None:
                code = terminated.exit_code
            await asyncio.sleep(min(self._poll_s, 1.0))
        with contextlib.suppress(ApiException):
            await self._call("delete_namespaced_pod", name, self._ns, grace_period_seconds=0)
        return 128 + 9, pod

    async def running(self) -> list[str]:
        return sorted(self._tracked)

    async def reconcile(self) -> list[TaskExit]:
        self._ensure_poller()
        pods = await self._call("list_namespaced_pod", self._ns, label_selector=self._selector)
        ended = []
        for pod in pods.items:
            key = (pod.metadata.annotations or {}).get(A_KEY)
            if key is None or key in self._tracked:
                continue
            if (pod.metadata.labels or {}).get(L_REPORTED) == "true":
                await self._maybe_delete_old(pod)
            elif self._is_terminal(pod):
                ended.append(self._exit_of(key, pod, "ended while the agent was down"))
            else:
                self._track(key, pod)
                log.info("adopted pod %s (%s)", pod.metadata.name, key)
        return ended

    async def _maybe_delete_old(self, pod: Any) -> None:
        created = pod.metadata.creation_timestamp
        if isinstance(created, datetime):
            age = (datetime.now(UTC) - created).total_seconds()
            if age > self._keep_done_s:
                with contextlib.suppress(ApiException):
                    await self._call("delete_namespaced_pod", pod.metadata.name, self._ns)

    async def forget(self, key: str) -> None:
        """The exit of ``key`` was published: label its Pod reported."""
        await self._mark_reported(key)

    async def _mark_reported(self, key: str) -> None:
        try:
            await self._call("patch_namespaced_pod", pod_name(key), self._ns,
                             {"metadata": {"labels": {L_REPORTED: "true"}}},
                             _content_type="application/merge-patch+json")
        except ApiException as exc:
            if exc.status != 404:
                log.warning("could not mark %s reported: %s", key, exc.reason)

    def logs(self, key: str, tail: int | None = None) -> str:
        """Blocking (an HTTP call): use ``asyncio.to_thread``."""
        try:
            return self._api.read_namespaced_pod_log(
                pod_name(key), self._ns, container=CONTAINER, tail_lines=tail,
                _request_timeout=TIMEOUT)
        except ApiException as exc:
            if exc.status == 404:
                raise KeyError(key) from exc
            raise

    def task_pids(self, key: str) -> set[int]:
        """Host pids of the task's Pod, by cgroup (for the share watchdog; needs hostPID)."""
        return procfs.pids_of_pod(self._uids.get(key, "")) if key in self._tracked else set()

    async def close(self) -> None:
        """Stop following; the Pods keep running and are adopted by the next agent run."""
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
            self._poller = None
        self._tracked.clear()

    # --- following ----------------------------------------------------------------------

    def _ensure_poller(self) -> None:
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll())

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._poll_s)
            if not self._tracked:
                continue
            try:
                await self.poll_once()
            except Exception:
                log.exception("following pods on %s failed", self._node)

    async def poll_once(self) -> None:
        pods = await self._call("list_namespaced_pod", self._ns, label_selector=self._selector)
        by_name = {p.metadata.name: p for p in pods.items}
        for key, name in list(self._tracked.items()):
            if key in self._stopping or self._tracked.get(key) != name:
                continue  # being stopped, or handled while this pass awaited
            pod = by_name.get(name)
            if pod is None:
                self._untrack(key)
                await self._report(key, TaskExit(key, 128 + 9, "killed",
                                                 "pod deleted outside Kairos"), mark=False)
            elif self._is_terminal(pod):
                self._untrack(key)
                await self._report(key, self._exit_of(key, pod))
            else:
                await self._check_pending(key, pod)

    async def _check_pending(self, key: str, pod: Any) -> None:
        waiting = self._waiting(pod)
        if waiting is None:
            self._pending_since.pop(key, None)
            return
        since = self._pending_since.setdefault(key, time.monotonic())
        if waiting.reason in FATAL_WAITING or (
                waiting.reason in SLOW_WAITING
                and time.monotonic() - since >= self._pending_timeout_s):
            self._untrack(key)
            with contextlib.suppress(ApiException):
                await self._call("delete_namespaced_pod", pod.metadata.name, self._ns,
                                 grace_period_seconds=0)
            await self._report(key, TaskExit(key, 128, "error",
                                             f"{waiting.reason}: {waiting.message or ''}".strip()),
                               mark=False)

    def _untrack(self, key: str) -> None:
        self._tracked.pop(key, None)
        self._pending_since.pop(key, None)

    async def _report(self, key: str, exit_: TaskExit, mark: bool = True) -> None:
        try:
            await self._on_exit(exit_)
        except Exception:
            log.exception("reporting the exit of %s failed", key)
            return
        if mark:
            await self._mark_reported(key)

    # --- reading Pod status ---------------------------------------------------------------

    @staticmethod
    def _is_terminal(pod: Any) -> bool:
        return pod.status is not None and pod.status.phase in ("Succeeded", "Failed")

    @staticmethod
    def _container_state(pod: Any) -> Any:
        for cs in (pod.status.container_statuses or []) if pod.status else []:
            if cs.name == CONTAINER:
                return cs.state
        return None

    def _terminated(self, pod: Any) -> Any:
        state = self._container_state(pod)
        return state.terminated if state is not None else None

    def _waiting(self, pod: Any) -> Any:
        state = self._container_state(pod)
        return state.waiting if state is not None else None

    def _work(self, pod: Any) -> tuple[float | None, str | None]:
        """Seconds the container ran (to its end, or now) and the checkpoint it left in
        its termination message; None where the Pod never ran."""
        state = self._container_state(pod) if pod is not None else None
        terminated = state.terminated if state is not None else None
        started = (terminated.started_at if terminated is not None else
                   state.running.started_at if state is not None and state.running else None)
        if started is None and pod is not None and pod.status is not None:
            started = pod.status.start_time
        ended = (terminated.finished_at if terminated is not None else None) or datetime.now(UTC)
        ran_s = (round(max(0.0, (ended - started).total_seconds()), 3)
                 if isinstance(started, datetime) else None)
        return ran_s, read_checkpoint(terminated.message if terminated is not None else None)

    def _exit_of(self, key: str, pod: Any, message: str = "") -> TaskExit:
        terminated = self._terminated(pod)
        ran_s, checkpoint = self._work(pod)
        if terminated is None:  # e.g. evicted before the container ran
            reason = pod.status.reason if pod.status else None
            return TaskExit(key, 0 if pod.status and pod.status.phase == "Succeeded" else 1,
                            "completed" if pod.status and pod.status.phase == "Succeeded"
                            else "error", message or (reason or ""), ran_s, checkpoint)
        code = terminated.exit_code
        detail = terminated.reason if terminated.reason not in (None, "Completed", "Error") else ""
        return TaskExit(key, code, exit_reason(code), "; ".join(filter(None, [message, detail])),
                        ran_s, checkpoint)
