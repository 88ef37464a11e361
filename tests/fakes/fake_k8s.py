"""A fake Kubernetes API server for the Pod and Service calls the Kubernetes runtime makes.

This is a FAKE, not Kubernetes: a small FastAPI app, served over real HTTP by uvicorn on
127.0.0.1 (random port), implementing the REST contract of exactly the calls
``services/node_agent/runtimes/kubernetes.py`` makes through the official ``kubernetes``
client: create / read / list (label selectors) / merge-patch / delete (grace period) of
namespaced Pods, reading a Pod's log, and create / read / strategic-merge-patch / delete
of namespaced Services, with the API's status codes and ``Status`` error bodies (404
NotFound, 409 AlreadyExists, 415 for patch types it does not implement, 422 Invalid for
names that are not DNS labels). It also does what the contract promises beyond the API
calls, as far as the runtime relies on it:

- the garbage collector: a Service whose ``ownerReferences`` all name Pods that no
  longer exist is deleted (at once here; eventually in Kubernetes); a strategic merge
  patch of ``ownerReferences`` merges by ``uid``, as ``ObjectMeta`` declares;
- cluster DNS for Pods (``resolve``): ``<hostname>.<subdomain>.<namespace>.svc`` is the
  Pod's IP when a headless Service named ``<subdomain>`` in its namespace selects it and
  the Pod has an IP (``publishNotReadyAddresses``: a running Pod counts; a Pod that ended
  is not an endpoint);
- a running Pod gets a ``podIP`` on the Pod network (10.244.0.0/16);
- the termination message: the container's ``FAKE_K8S_CHECKPOINT`` env stands for what
  it wrote to its ``terminationMessagePath``; the terminated state returns it as
  ``message``, as the kubelet does.

No kubelet runs: each read or list of a Pod advances it one step, Pending -> Running ->
Succeeded/Failed, as the container env asks:
``FAKE_K8S_EXIT`` ("0" by default, "N" fails with exit code N, "never" keeps running),
``FAKE_K8S_WAITING`` (stays Pending with that waiting reason, e.g. ErrImagePull),
``FAKE_K8S_STEPS`` (reads spent Running before the container ends, default 1).
A deleted Pod is shown once more terminated by SIGTERM (exit 143), then is gone.
"""

from __future__ import annotations

import itertools
import re
import socket
import threading
import uuid
from datetime import UTC, datetime
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(code: int, reason: str, message: str) -> JSONResponse:
    return JSONResponse(status_code=code, content={
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code})


DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def _label_problem(value: str | None, pattern: re.Pattern[str], what: str) -> str:
    if value is None or (len(value) <= 63 and pattern.match(value)):
        return ""
    return f"{what}: Invalid value: {value!r}: a lowercase RFC 1123 label (<= 63 characters)"


def _matches(labels: dict[str, str], selector: str | None) -> bool:
    """Equality-based label selectors: ``a=b``, ``a==b``, ``a!=b``, ``a``, ``!a``."""
    for term in filter(None, (selector or "").split(",")):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k) != v:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


class FakeKubernetes:
    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.services: dict[tuple[str, str], dict[str, Any]] = {}
        self.denied: set[str] = set()  # resources ("services") answered 403, as RBAC would
        self._ips = itertools.count(2)
        self.calls: list[tuple[str, str, dict[str, str]]] = []  # (method, path, query)
        self.deletions: list[tuple[str, int | None]] = []  # (name, gracePeriodSeconds)
        self._lock = threading.Lock()
        self._rv = 0
        self.app = self._build()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.host = ""

    # --- Pod life without a kubelet ------------------------------------------------------

    @staticmethod
    def _env(pod: dict[str, Any]) -> dict[str, str]:
        container = pod["spec"]["containers"][0]
        return {e["name"]: e.get("value", "") for e in container.get("env") or []}

    def _advance(self, key: tuple[str, str]) -> dict[str, Any] | None:
        pod = self.pods.get(key)
        if pod is None:
            return None
        status, env = pod["status"], self._env(pod)
        name = pod["spec"]["containers"][0]["name"]
        if pod["metadata"].get("deletionTimestamp"):
            if status.get("_shown_deleted"):
                del self.pods[key]
                self._collect_garbage()
                return None
            status["_shown_deleted"] = True
            self._terminate(pod, 143, "Error")
        elif status["phase"] == "Pending":
            if env.get("FAKE_K8S_WAITING"):
                status["containerStatuses"] = [{"name": name, "ready": False, "restartCount": 0,
                                                "image": "", "imageID": "",
                                                "state": {"waiting": {"reason": env["FAKE_K8S_WAITING"],
                                                                      "message": "fake"}}}]
            else:
                n = next(self._ips)
                status.update(phase="Running", startTime=_now(),
                              podIP=f"10.244.{n // 250}.{n % 250 + 1}")
                status["containerStatuses"] = [{"name": name, "ready": True, "restartCount": 0,
                                                "image": "", "imageID": "",
                                                "state": {"running": {"startedAt": _now()}}}]
                status["_steps"] = int(env.get("FAKE_K8S_STEPS", "1"))
        elif status["phase"] == "Running":
            outcome = env.get("FAKE_K8S_EXIT", "0")
            status["_steps"] -= 1
            if outcome != "never" and status["_steps"] < 0:
                self._terminate(pod, int(outcome), "Completed" if outcome == "0" else "Error")
        self._rv += 1
        pod["metadata"]["resourceVersion"] = str(self._rv)
        return pod

    @classmethod
    def _terminate(cls, pod: dict[str, Any], code: int, reason: str) -> None:
        status = pod["status"]
        if status["phase"] in ("Succeeded", "Failed"):
            return
        status["phase"] = "Succeeded" if code == 0 else "Failed"
        running = (status.get("containerStatuses") or [{}])[0].get("state", {}).get("running")
        terminated: dict[str, Any] = {
            "exitCode": code, "reason": reason, "finishedAt": _now(),
            "startedAt": (running or {}).get("startedAt", _now())}
        checkpoint = cls._env(pod).get("FAKE_K8S_CHECKPOINT")
        if checkpoint:  # what the container left at its terminationMessagePath
            terminated["message"] = checkpoint
        status["containerStatuses"] = [{
            "name": pod["spec"]["containers"][0]["name"], "ready": False, "restartCount": 0,
            "image": "", "imageID": "", "state": {"terminated": terminated}}]

    def _collect_garbage(self) -> None:
        """Kubernetes' garbage collector: a dependent whose owners are all gone goes."""
        uids = {p["metadata"]["uid"] for p in self.pods.values()}
        for key, svc in list(self.services.items()):
            owners = svc["metadata"].get("ownerReferences") or []
            if owners and not any(o.get("uid") in uids for o in owners):
                del self.services[key]

    def resolve(self, name: str) -> str | None:
        """Cluster DNS for a Pod behind a headless Service: its IP, or None (NXDOMAIN)."""
        parts = name.removesuffix(".cluster.local").split(".")
        if len(parts) != 4 or parts[3] != "svc":
            return None
        hostname, subdomain, namespace = parts[:3]
        with self._lock:
            svc = self.services.get((namespace, subdomain))
            if svc is None or svc["spec"].get("clusterIP") != "None":
                return None
            selector = svc["spec"].get("selector") or {}
            for (ns, _), pod in self.pods.items():
                spec, status = pod["spec"], pod["status"]
                labels = pod["metadata"].get("labels") or {}
                if (ns == namespace and spec.get("hostname") == hostname
                        and spec.get("subdomain") == subdomain and selector
                        and all(labels.get(k) == v for k, v in selector.items())
                        and status.get("podIP") and status["phase"] == "Running"):
                    return str(status["podIP"])
        return None

    @staticmethod
    def _public(pod: dict[str, Any]) -> dict[str, Any]:
        out = dict(pod)
        out["status"] = {k: v for k, v in pod["status"].items() if not k.startswith("_")}
        return out

    # --- REST ----------------------------------------------------------------------------

    def _build(self) -> FastAPI:
        app = FastAPI()
        base = "/api/v1/namespaces/{namespace}/pods"

        @app.middleware("http")
        async def record(request: Request, call_next: Any) -> Any:
            self.calls.append((request.method, request.url.path, dict(request.query_params)))
            parts = request.url.path.split("/")  # /api/v1/namespaces/<ns>/<resource>/...
            if len(parts) > 5 and parts[5] in self.denied:
                return _status(403, "Forbidden", f'{parts[5]} is forbidden: User '
                               f'"system:serviceaccount:kairos:node-agent" cannot '
                               f'{request.method.lower()} resource "{parts[5]}"')
            return await call_next(request)

        @app.post(base)
        async def create(namespace: str, request: Request) -> Any:
            body = await request.json()
            name = body.get("metadata", {}).get("name")
            if not name or not body.get("spec", {}).get("containers"):
                return _status(422, "Invalid", "metadata.name and spec.containers are required")
            spec = body["spec"]
            problem = (_label_problem(spec.get("hostname"), DNS1123_LABEL, "spec.hostname")
                       or _label_problem(spec.get("subdomain"), DNS1123_LABEL, "spec.subdomain"))
            if problem:
                return _status(422, "Invalid", problem)
            with self._lock:
                if (namespace, name) in self.pods:
                    return _status(409, "AlreadyExists", f'pods "{name}" already exists')
                body["apiVersion"], body["kind"] = "v1", "Pod"
                body["metadata"].update(namespace=namespace, uid=str(uuid.uuid4()),
                                        creationTimestamp=_now(), resourceVersion="1")
                body["status"] = {"phase": "Pending"}
                self.pods[(namespace, name)] = body
                return JSONResponse(status_code=201, content=self._public(body))

        @app.get(base)
        async def list_pods(namespace: str, labelSelector: str | None = None) -> Any:
            with self._lock:
                items = []
                for key in [k for k in self.pods if k[0] == namespace]:
                    pod = self._advance(key)
                    if pod and _matches(pod["metadata"].get("labels") or {}, labelSelector):
                        items.append(self._public(pod))
            return {"kind": "PodList", "apiVersion": "v1",
                    "metadata": {"resourceVersion": str(self._rv)}, "items": items}

        @app.get(base + "/{name}")
        async def read(namespace: str, name: str) -> Any:
            with self._lock:
                pod = self._advance((namespace, name))
                if pod is None:
                    return _status(404, "NotFound", f'pods "{name}" not found')
                return self._public(pod)

        @app.patch(base + "/{name}")
        async def patch(namespace: str, name: str, request: Request) -> Any:
            kind = request.headers.get("content-type", "")
            if kind not in ("application/merge-patch+json",
                            "application/strategic-merge-patch+json"):
                return _status(415, "UnsupportedMediaType", f"the fake does not do {kind}")
            body = await request.json()
            with self._lock:
                pod = self.pods.get((namespace, name))
                if pod is None:
                    return _status(404, "NotFound", f'pods "{name}" not found')
                for field in ("labels", "annotations"):
                    for k, v in (body.get("metadata", {}).get(field) or {}).items():
                        target = pod["metadata"].setdefault(field, {})
                        if v is None:
                            target.pop(k, None)
                        else:
                            target[k] = v
                return self._public(pod)

        @app.delete(base + "/{name}")
        async def delete(namespace: str, name: str, request: Request,
                         gracePeriodSeconds: int | None = None) -> Any:
            raw = await request.body()
            body = await request.json() if raw else {}
            grace = gracePeriodSeconds if gracePeriodSeconds is not None else body.get(
                "gracePeriodSeconds")
            with self._lock:
                pod = self.pods.get((namespace, name))
                if pod is None:
                    return _status(404, "NotFound", f'pods "{name}" not found')
                self.deletions.append((name, grace))
                if grace == 0 or pod["status"]["phase"] in ("Succeeded", "Failed"):
                    del self.pods[(namespace, name)]
                    self._collect_garbage()
                else:
                    pod["metadata"]["deletionTimestamp"] = _now()
                    pod["metadata"]["deletionGracePeriodSeconds"] = grace
                return self._public(pod)

        @app.get(base + "/{name}/log")
        async def log(namespace: str, name: str, container: str | None = None,
                      tailLines: int | None = None) -> Any:
            pod = self.pods.get((namespace, name))
            if pod is None:
                return _status(404, "NotFound", f'pods "{name}" not found')
            command = " ".join(pod["spec"]["containers"][0].get("command") or [])
            lines = [f"container {container} of {name}", f"ran: {command}", "done"]
            if tailLines is not None:
                lines = lines[-tailLines:] if tailLines else []
            return PlainTextResponse("".join(line + "\n" for line in lines))

        services = "/api/v1/namespaces/{namespace}/services"

        @app.post(services)
        async def create_service(namespace: str, request: Request) -> Any:
            body = await request.json()
            name = body.get("metadata", {}).get("name")
            problem = _label_problem(name or "", DNS1035_LABEL, "metadata.name")
            if problem:
                return _status(422, "Invalid", problem)
            with self._lock:
                if (namespace, name) in self.services:
                    return _status(409, "AlreadyExists", f'services "{name}" already exists')
                body["apiVersion"], body["kind"] = "v1", "Service"
                body["metadata"].update(namespace=namespace, uid=str(uuid.uuid4()),
                                        creationTimestamp=_now(), resourceVersion="1")
                body.setdefault("spec", {}).setdefault("type", "ClusterIP")
                body["status"] = {"loadBalancer": {}}
                self.services[(namespace, name)] = body
                self._collect_garbage()  # its owners may already be gone
                return JSONResponse(status_code=201, content=body)

        @app.get(services + "/{name}")
        async def read_service(namespace: str, name: str) -> Any:
            svc = self.services.get((namespace, name))
            if svc is None:
                return _status(404, "NotFound", f'services "{name}" not found')
            return svc

        @app.patch(services + "/{name}")
        async def patch_service(namespace: str, name: str, request: Request) -> Any:
            kind = request.headers.get("content-type", "")
            if kind != "application/strategic-merge-patch+json":
                return _status(415, "UnsupportedMediaType", f"the fake does not do {kind}")
            body = await request.json()
            with self._lock:
                svc = self.services.get((namespace, name))
                if svc is None:
                    return _status(404, "NotFound", f'services "{name}" not found')
                meta = svc["metadata"]
                owners = {o["uid"]: o for o in meta.get("ownerReferences") or []}
                for ref in body.get("metadata", {}).get("ownerReferences") or []:
                    owners[ref["uid"]] = {**owners.get(ref["uid"], {}), **ref}  # by uid
                meta["ownerReferences"] = list(owners.values())
                for field in ("labels", "annotations"):
                    meta.setdefault(field, {}).update(
                        body.get("metadata", {}).get(field) or {})
                return svc

        @app.delete(services + "/{name}")
        async def delete_service(namespace: str, name: str) -> Any:
            with self._lock:
                svc = self.services.pop((namespace, name), None)
            if svc is None:
                return _status(404, "NotFound", f'services "{name}" not found')
            return svc

        return app

    # --- serving -------------------------------------------------------------------------

    def start(self) -> str:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.host = f"http://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(self.app, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        daemon=True)
        self._thread.start()
        while not self._server.started:
            threading.Event().wait(0.01)
        return self.host

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    def pod(self, name: str, namespace: str = "kairos") -> dict[str, Any] | None:
        return self.pods.get((namespace, name))

    def service(self, name: str, namespace: str = "kairos") -> dict[str, Any] | None:
        return self.services.get((namespace, name))
