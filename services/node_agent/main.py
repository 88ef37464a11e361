"""The node-agent process: hosts one real node, or N simulated nodes for scale tests.

It reads only the bindings partitions its nodes hash to (manual assignment, no group
rebalancing), so at 1,000 nodes an agent does not read every binding.

Every acknowledged heartbeat renews each node's lease; a separate loop checks the
leases, so a heartbeat stuck on an unreachable broker still ends in a fence on time.
The first heartbeat goes out as soon as the broker is reached, before the slow part of
a start (consumer positions, adopting tasks), so a restart under load is not taken for
a lost node.
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path

from aiokafka import TopicPartition

from services.node_agent.agent import NodeAgent
from services.node_agent.datasets import DatasetCache
from services.node_agent.devices.base import DeviceBackend
from services.node_agent.devices.simulated import SimulatedDevices
from services.node_agent.inventory import node_inventory
from services.node_agent.lease import Lease, LeaseBook
from services.node_agent.logs_api import add_log_routes
from services.node_agent.runtimes.base import ExitCallback, Runtime
from services.node_agent.runtimes.simulated import SimulatedRuntime
from services.node_agent.settings import AgentSettings
from services.node_agent.shares import ShareLimits
from shared.bus import Consumer, ConsumerOptions, partition_for
from shared.events import Binding, Envelope, Event, NodeRegistered, utcnow
from shared.http import HttpServer, ops_app
from shared.logging import get_logger
from shared.service import ServiceRuntime, run_main
from shared.topics import BINDINGS, topic_for

log = get_logger(__name__)
RuntimeFactory = Callable[[ExitCallback], Runtime]


def real_devices(settings: AgentSettings) -> DeviceBackend:
    """NVML where the node has it; simulated GPUs otherwise (a CPU-only test node)."""
    from services.node_agent.devices.nvml import NvmlDevices, NvmlUnavailable

    try:
        return NvmlDevices()
    except NvmlUnavailable as exc:
        log.warning("no NVML here: simulated GPUs stand in", error=str(exc))
        return sim_devices(settings, settings.node_id)


def sim_devices(settings: AgentSettings, name: str) -> SimulatedDevices:
    """Simulated GPUs of node ``name``; KAIROS_SIM_MIG_* written wrong stops the agent."""
    profiles = [p.strip() for p in settings.sim_mig_profiles.split(",") if p.strip()]
    try:
        return SimulatedDevices(name, settings.sim_gpus_per_node, settings.sim_gpu_model,
                                settings.sim_gpu_memory_mib, mig_profiles=profiles,
                                mig_gpus=settings.sim_mig_gpus,
                                driver_version=settings.sim_driver_version,
                                cuda_version=settings.sim_cuda_version)
    except ValueError as exc:
        raise SystemExit(f"KAIROS_SIM_MIG_PROFILES: {exc}") from exc


def sim_nvlink_domain(settings: AgentSettings, index: int) -> str:
    """The NVLink domain of this process's simulated node ``index``: KAIROS_NVLINK_DOMAIN,
    or with KAIROS_SIM_NVLINK_DOMAIN_NODES=n the n-node domain its number in the group
    falls in (numbered across the group's agent processes by KAIROS_SIM_FIRST_NODE)."""
    n = settings.sim_nvlink_domain_nodes
    if n <= 0:
        return settings.nvlink_domain
    stem = settings.nvlink_domain or settings.node_id
    return f"{stem}-nvl{(settings.sim_first_node + index) // n}"


class AgentHost:
    def __init__(self, settings: AgentSettings, rt: ServiceRuntime) -> None:
        self.settings = settings
        self.rt = rt
        self.started_at = utcnow()
        self.agents: dict[str, NodeAgent] = {}
        self.registered = False  # the first registration (after adoption) went out
        # every node's lease stamp in one file, written once a heartbeat round
        self.lease_book = LeaseBook(Path(settings.state_dir, f"{settings.node_id}.leases.json")
                                    ) if settings.state_dir else None
        if settings.fence_after_s <= 2 * settings.heartbeat_s:
            log.warning("fence_after_s leaves no room for a missed heartbeat",
                        fence_after_s=settings.fence_after_s, heartbeat_s=settings.heartbeat_s)
        if settings.node_runtime == "simulated":
            names = ([settings.node_id] if settings.sim_nodes <= 1 else
                     [f"{settings.node_id}-{i}" for i in range(settings.sim_nodes)])
            for i, name in enumerate(names):
                devices = sim_devices(settings, name)
                state = Path(settings.state_dir, name) if settings.state_dir else None
                self._add(name, devices, partial(SimulatedRuntime, state_dir=state),
                          sim_nvlink_domain(settings, i))
        elif settings.node_runtime in ("process", "kubernetes"):
            real = real_devices(settings)
            self._add(settings.node_id, real, lambda on_exit: self._real_runtime(real, on_exit),
                      settings.nvlink_domain)
        else:
            raise SystemExit(f"KAIROS_NODE_RUNTIME must be simulated, process or kubernetes, "
                             f"not {settings.node_runtime!r}")

    def _add(self, name: str, devices: DeviceBackend, runtime_factory: RuntimeFactory,
             nvlink_domain: str) -> None:
        s = self.settings
        datasets = DatasetCache.from_setting(s.datasets_dir, s.datasets)
        try:
            inv = node_inventory(name, devices, s.node_cpu_milli, s.node_memory_mib, s.rack,
                                 runtime=s.node_runtime, address=s.node_address or "127.0.0.1",
                                 agent_url=self.agent_url(), datasets=datasets.list(),
                                 labels=s.node_labels, taints=s.node_taints,
                                 nvlink_domain=nvlink_domain)
        except ValueError as exc:  # KAIROS_NODE_LABELS / _TAINTS / _NVLINK_DOMAIN
            raise SystemExit(f"node {name}: {exc}") from exc
        lease = Lease(s.fence_after_s, Path(s.state_dir, name, "lease") if s.state_dir else None,
                      book=self.lease_book, key=name)
        self.agents[name] = NodeAgent(
            inv, devices, runtime_factory, self.publish, s.state_dir, datasets=datasets,
            shares=ShareLimits(s.share_grace_s, s.share_strikes, s.share_tolerance_mib),
            lease=lease)

    def agent_url(self) -> str:
        """Where the gateway reaches this process's HTTP port (it serves every node here):
        KAIROS_AGENT_URL, else the node's address, else the host it listens on; listening
        on every interface (compose, a Pod), the address its hostname resolves to."""
        s = self.settings
        if s.agent_url:
            return s.agent_url
        host = s.node_address or s.http_host
        if host in ("", "0.0.0.0", "::"):
            try:
                host = socket.gethostbyname(socket.gethostname())
            except OSError:
                host = "127.0.0.1"
        return f"http://{host}:{s.http_port}"

    def _real_runtime(self, devices: DeviceBackend, on_exit: ExitCallback) -> Runtime:
        """The node's runtime with its GPU-share isolation: the MPS control daemon where
        enabled (``KAIROS_MPS_ENABLED``; it says itself when the binary is missing or will
        not start, and shares then run on hints and the watchdog) and each GPU's memory,
        so frameworks get a memory fraction of their share."""
        from services.node_agent.isolation.mps import MpsDaemon

        s = self.settings
        # absolute: under Kubernetes the MPS pipe directory is a hostPath of the job Pods
        state = Path(s.state_dir or ".kairos/agent").resolve() / s.node_id
        memory = {d.index: d.memory_mib for d in devices.devices()}
        mps = MpsDaemon(state) if s.mps_enabled else None
        if s.node_runtime == "kubernetes":
            from services.node_agent.runtimes.kubernetes import KubernetesRuntime

            return KubernetesRuntime.from_config(on_exit, s.node_id, namespace=s.pod_namespace,
                                                 mps=mps, device_memory_mib=memory)
        from services.node_agent.runtimes.local_process import LocalProcessRuntime

        return LocalProcessRuntime(on_exit, state, mps=mps, device_memory_mib=memory)

    async def publish(self, event: Event, event_id: str | None) -> None:
        await self.rt.producer.publish(event, event_id=event_id)

    async def publish_all(self, events: Sequence[Event]) -> None:
        """Every node's event in one batch: one wait for the acknowledgements, not one
        round trip per node (300 simulated nodes: ~0.5 s a round otherwise)."""
        producer = self.rt.producer
        await producer.publish_many([(Envelope.wrap(e, producer.source, None), topic_for(e).name)
                                     for e in events])

    async def handle(self, env: Envelope, event: Event) -> None:
        if isinstance(event, Binding):
            agent = self.agents.get(event.node_id)
            if agent is not None:  # other nodes share our partitions
                await agent.handle(event, sent_at=env.occurred_at.timestamp())

    async def partitions(self) -> list[TopicPartition]:
        """Only the bindings partitions our nodes' keys land in."""
        count = await self.rt.producer.partition_count(BINDINGS.name)
        return sorted({TopicPartition(BINDINGS.name, partition_for(n, count))
                       for n in self.agents}, key=lambda tp: tp.partition)

    def group_id(self) -> str:
        digest = hashlib.sha1(",".join(sorted(self.agents)).encode()).hexdigest()[:10]
        return f"node-agent.{self.settings.node_id}.{digest}"

    async def register(self, agents: Sequence[NodeAgent] | None = None) -> None:
        agents = list(self.agents.values()) if agents is None else agents
        await self.publish_all([NodeRegistered(inventory=agent.inventory,
                                               agent_started_at=self.started_at)
                                for agent in agents])
        self.registered = True
        for agent in agents:
            agent.needs_register = False

    async def beat(self) -> None:
        """One heartbeat for every node. Acknowledged, it renews their leases (as of
        its sending); a node whose fence lifts registers again."""
        agents = list(self.agents.values())
        for agent in agents:
            agent.check_lease()  # a pause is noticed before a renewal can hide it
        sent = time.monotonic()
        try:
            await self.publish_all([agent.heartbeat() for agent in agents])
        except Exception as exc:  # the lease is not renewed: a fence comes in time
            log.warning("heartbeat not acknowledged", error=repr(exc))
            return
        for agent in agents:
            agent.renewed(sent)
        if self.lease_book is not None:
            self.lease_book.flush()  # one write for the round, whatever the node count
        again = [agent for agent in agents if agent.needs_register]
        if again and self.registered:  # before the first registration: that one will do
            try:
                await self.register(again)
            except Exception as exc:
                log.warning("registration after a fence not acknowledged", error=repr(exc))

    @staticmethod
    async def _every(period_s: float, beat: Callable[[], Awaitable[None]]) -> None:
        """At a fixed rate: the time a round takes does not stretch the interval (a
        round that overran starts the next one at once, never a burst of catch-ups)."""
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            due = max(due + period_s, loop.time())
            await asyncio.sleep(due - loop.time())
            await beat()

    async def heartbeats(self) -> None:
        await self._every(self.settings.heartbeat_s, self.beat)

    async def leases(self) -> None:
        """Check every lease often: a fence must not wait for a heartbeat that hangs."""
        period = min(1.0, self.settings.fence_after_s / 4)
        while True:
            await asyncio.sleep(period)
            for agent in self.agents.values():
                agent.check_lease()

    async def telemetry(self) -> None:
        async def beat() -> None:  # each sample also feeds that node's share watchdog
            samples = [await agent.tick() for agent in self.agents.values()]
            try:
                await self.publish_all(samples)
            except Exception as exc:  # the broker is away: the next interval tries again
                log.warning("telemetry not published", error=repr(exc))

        await self._every(self.settings.telemetry_s, beat)

    async def reconcile(self) -> None:
        for agent in self.agents.values():
            adopted = await agent.reconcile()
            if adopted:
                log.info("adopted running tasks after a restart", node=agent.node_id,
                         tasks=adopted)

    async def close(self) -> None:
        for agent in self.agents.values():
            await agent.close()


async def start(settings: AgentSettings) -> tuple[ServiceRuntime, AgentHost, HttpServer]:
    """Connect, adopt what still runs, register: ready for ``rt.run(http)``."""
    rt = ServiceRuntime(settings, use_db=False)
    await rt.start_dependencies()
    host = AgentHost(settings, rt)
    await host.beat()  # alive, as early as can be: the rest of a start may be slow
    consumer = Consumer(
        settings,
        ConsumerOptions(host.group_id(), [BINDINGS.name], assign=await host.partitions(),
                        from_beginning=False),
        host.handle, rt.producer)
    await consumer.start()  # positions fixed before the scheduler can see us
    rt.add_consumer(consumer)
    rt.add_loop(host.heartbeats)
    rt.add_loop(host.leases)
    rt.add_loop(host.telemetry)
    await host.reconcile()  # before the first binding: nothing starts twice
    await host.register()
    app = ops_app(rt.ready)
    add_log_routes(app, host.agents, settings.agent_token)
    return rt, host, HttpServer(app, settings.http_host, settings.http_port)


async def main(settings: AgentSettings | None = None) -> None:
    rt, host, http = await start(settings or AgentSettings())
    try:
        await rt.run(http)
    finally:
        await host.close()


def run() -> None:
    run_main(main)
