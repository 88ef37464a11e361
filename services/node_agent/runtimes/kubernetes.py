"""Kubernetes runtime: a task is a Pod bound to this node, followed until it ends.

The only module that calls the API server: ``tests/deploy/test_deploy_helm.py`` checks
the agent's RBAC Role against the calls made here. What it sends is built in
``kubernetes_manifests.py``; what it reads back is judged in ``kubernetes_status.py``.

``reconcile()`` after an agent restart lists this node's Pods, adopts the running ones
and returns those that ended unreported. A reported Pod is labelled
``kairos.io/reported=true`` and kept (its logs stay readable) until ``keep_done_s``. A
redelivered binding meets 409 AlreadyExists (the Pod is named after the key): nothing
starts twice. One poller lists this node's Pods every ``poll_s`` (one request per node
per period, not one per Pod); the synchronous client's calls run in a thread.

Gangs: whichever agent starts a Pod of a gang first creates the gang's headless Service;
each adds its Pod to the Service's ``ownerReferences``, so the garbage collector deletes
it with the gang's last Pod. A Pod whose gang Service cannot be made is deleted and its
start fails, so a gang never waits for a name (``peer_host``) that will not resolve.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from services.node_agent.isolation.mps import MpsDaemon, share_env
from services.node_agent.runtimes import procfs
from services.node_agent.runtimes.base import (
    ExitCallback,
    RuntimeStartError,
    TaskExit,
    TaskLaunch,
)
from services.node_agent.runtimes.kubernetes_manifests import (
    A_KEY,
    CONTAINER,
    L_REPORTED,
    PodTemplate,
    gang_service_manifest,
    node_selector,
    owner_reference,
    pod_manifest,
)
from services.node_agent.runtimes.kubernetes_names import gang_service, peer_host, pod_name
from services.node_agent.runtimes.kubernetes_status import (
    FATAL_WAITING,
    SLOW_WAITING,
    exit_of,
    is_terminal,
    terminated,
    waiting,
    work_done,
)

log = logging.getLogger(__name__)

TIMEOUT = 30  # seconds per API request


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
        self._template = PodTemplate(node_name, namespace, runtime_class, termination_grace_s,
                                     service_account)
        self._mps = mps
        self._device_memory = dict(device_memory_mib or {})
        self._poll_s = poll_s
        self._pending_timeout_s = pending_timeout_s
        self._keep_done_s = keep_done_s
        self._tracked: dict[str, str] = {}  # key -> pod name
        self._uids: dict[str, str] = {}  # key -> pod uid
        self._pending_since: dict[str, float] = {}
        self._stopping: set[str] = set()
        self._poller: asyncio.Task[None] | None = None
        self._selector = node_selector(node_name)

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
        share = share_env(launch.gpus, self._device_memory)  # ordinals: the container sees 0..n-1
        use_mps = bool(share) and self._mps is not None and await self._mps.ensure_started()
        mps_env = self._mps.client_env() if use_mps and self._mps is not None else None
        return pod_manifest(launch, self._template, share, mps_env)

    async def _ensure_service(self, launch: TaskLaunch, pod: Any) -> None:
        """Create the gang's Service, or add this Pod to its owners (strategic merge on
        ``ownerReferences`` merges by uid): it lives while any Pod of the gang does."""
        body = gang_service_manifest(launch, self._ns, pod)
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
                                         owner_reference(pod))]}},
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
            if is_terminal(pod) or (pod.metadata.labels or {}).get(L_REPORTED) == "true":
                await self._report(key, exit_of(key, pod))  # reported again, not rerun
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
            if pod is not None and is_terminal(pod):  # it ended on its own first
                self._untrack(key)
                await self._report(key, exit_of(key, pod))
                return
            code, last = await self._delete_and_wait(name, grace_s, pod)
        finally:
            self._stopping.discard(key)
        self._untrack(key)
        ran_s, checkpoint = work_done(last)
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
            ended = terminated(pod)
            if ended is not None:
                code = ended.exit_code
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
            elif is_terminal(pod):
                ended.append(exit_of(key, pod, "ended while the agent was down"))
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
            elif is_terminal(pod):
                self._untrack(key)
                await self._report(key, exit_of(key, pod))
            else:
                await self._check_pending(key, pod)

    async def _check_pending(self, key: str, pod: Any) -> None:
        stuck = waiting(pod)
        if stuck is None:
            self._pending_since.pop(key, None)
            return
        since = self._pending_since.setdefault(key, time.monotonic())
        if stuck.reason in FATAL_WAITING or (
                stuck.reason in SLOW_WAITING
                and time.monotonic() - since >= self._pending_timeout_s):
            self._untrack(key)
            with contextlib.suppress(ApiException):
                await self._call("delete_namespaced_pod", pod.metadata.name, self._ns,
                                 grace_period_seconds=0)
            await self._report(key, TaskExit(key, 128, "error",
                                             f"{stuck.reason}: {stuck.message or ''}".strip()),
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
