"""Nodes as the scheduler sees them: registered, heard from, degraded, lost, and the
operator's cordon / drain / uncordon."""

from __future__ import annotations

from dataclasses import replace

from services.scheduler.bindings import Bindings
from services.scheduler.jobs import Lifecycle
from services.scheduler.model import SOURCE, Cluster, NodeView, Output
from shared.events import (
    EndCause,
    JobState,
    JobStatus,
    NodeAction,
    NodeCommand,
    NodeHeartbeat,
    NodeLabels,
    NodeLost,
    NodeRegistered,
    NodeSchedulingChanged,
    NodeTelemetry,
)
from shared.logging import get_logger

log = get_logger(__name__)

CORDON_OF = {NodeAction.CORDON: "cordoned", NodeAction.DRAIN: "draining",
             NodeAction.UNCORDON: ""}


class NodeOps:
    def __init__(self, cluster: Cluster, bindings: Bindings, lifecycle: Lifecycle) -> None:
        self.cluster = cluster
        self.bindings = bindings
        self.lifecycle = lifecycle

    def on_registered(self, ev: NodeRegistered, out: Output) -> None:
        nodes = self.cluster.nodes
        node_id = ev.inventory.node_id
        old = nodes.get(node_id)
        nodes[node_id] = NodeView(ev.inventory) if old is None \
            else replace(old, inventory=ev.inventory, lost=False)  # keeps a cordon
        self.cluster.nodes_changed()
        out.dirty_nodes.add(node_id)
        self.bindings.reconcile(node_id, out, "registered")

    def on_heartbeat(self, ev: NodeHeartbeat, out: Output) -> None:
        view = self.cluster.nodes.get(ev.node_id)
        if view is None:
            return
        if view.lost:
            view.lost = False
            self.cluster.nodes_changed()
            out.dirty_nodes.add(ev.node_id)
            self.bindings.reconcile(ev.node_id, out, "back after it was declared lost")
        if ev.datasets is not None and frozenset(ev.datasets) != view.current_datasets():
            view.datasets = frozenset(ev.datasets)
            self.cluster.nodes_changed()

    def on_telemetry(self, ev: NodeTelemetry) -> None:
        self.cluster.telemetry[ev.node_id] = ev
        view = self.cluster.nodes.get(ev.node_id)
        if view is not None:
            degraded = frozenset(g.index for g in ev.gpus if g.health != "healthy")
            if degraded != view.degraded_gpus:
                view.degraded_gpus = degraded
                self.cluster.nodes_changed()

    def on_lost(self, ev: NodeLost, out: Output) -> None:
        """Its tasks hold nothing any more: each job with a current task there is
        retried (a lost node does not spend its retries) or, cancelled, ends."""
        view = self.cluster.nodes.get(ev.node_id)
        if view is None or view.lost:
            return
        view.lost = True
        self.cluster.nodes_changed()
        out.dirty_nodes.add(ev.node_id)
        for job in list(self.cluster.jobs.values()):
            hit = [p for p in job.live() if p.node_id == ev.node_id]
            if not hit:
                continue
            for p in hit:  # the node is gone: its tasks hold nothing any more
                p.state = JobState.FAILED
            out.dirty_jobs.add(job.job_id)
            if job.state in (JobState.BOUND, JobState.RUNNING) and any(
                    p.attempt == job.attempt and not p.removed for p in hit):
                if job.ending:
                    self.lifecycle.advance(job, JobStatus(
                        job_id=job.job_id, state=JobState.FAILED, reason="node lost",
                        attempt=job.attempt), out)
                else:
                    self.lifecycle.retry_or_fail(job, out, f"node {ev.node_id} lost", None,
                                                 node_lost=True)

    # --- cordon / drain / uncordon ----------------------------------------------------

    def on_command(self, cmd: NodeCommand, out: Output) -> None:
        view = self.cluster.nodes.get(cmd.node_id)
        if view is None:
            log.warning("node command for an unknown node ignored", node=cmd.node_id)
            return
        if cmd.generation and cmd.generation <= view.cordon_generation:
            return  # a replay (or an older command delivered late)
        view.cordon_generation = cmd.generation or view.cordon_generation
        view.cordon_reason = cmd.reason
        view.drained = False
        view.cordon = CORDON_OF[cmd.action]
        self.cluster.nodes_changed()
        out.dirty_nodes.add(cmd.node_id)
        log.info("node command applied", node=cmd.node_id, action=cmd.action.value,
                 by=cmd.requested_by)
        if cmd.action is NodeAction.DRAIN:
            self._drain(cmd.node_id, cmd.grace_period_s, out)
        self._announce(view, out)
        self.check_drained(cmd.node_id, out)

    def on_labels(self, ev: NodeLabels, out: Output) -> None:
        """An admin's labels and taints for a node: the whole set, newest generation wins;
        kept through re-registrations (``on_registered`` keeps the view)."""
        view = self.cluster.nodes.get(ev.node_id)
        if view is None:
            log.warning("node labels for an unknown node ignored", node=ev.node_id)
            return
        if ev.generation <= view.labels_generation:
            return  # a replay (or an older change delivered late)
        view.admin_labels, view.admin_taints = dict(ev.labels), tuple(ev.taints)
        view.labels_generation = ev.generation
        self.cluster.nodes_changed()
        out.dirty_nodes.add(ev.node_id)
        log.info("node labels applied", node=ev.node_id, labels=ev.labels, taints=ev.taints,
                 by=ev.requested_by)

    def _drain(self, node_id: str, grace_s: float, out: Output) -> None:
        """Stop every job with a task of its current attempt there, gracefully
        (checkpoint signal, grace period), as a preemption would, and requeue it: the
        attempt does not count against its maxRetry."""
        for job in self.cluster.jobs.values():
            if job.state not in (JobState.BOUND, JobState.RUNNING) or job.ending \
                    or job.preempted or not any(p.node_id == node_id for p in job.active()):
                continue
            job.ask_stop(EndCause.DRAINED, f"drain of node {node_id}")
            out.dirty_jobs.add(job.job_id)
            self.bindings.stop(job, out, f"preempted (drain) for node {node_id}",
                               EndCause.DRAINED, grace_s=grace_s)

    def check_drained(self, node_id: str, out: Output) -> None:
        """A draining node where nothing of ours runs any more is announced drained."""
        view = self.cluster.nodes.get(node_id)
        if view is None or view.cordon != "draining" or view.drained:
            return
        if any(p.node_id == node_id for job in self.cluster.jobs.values() for p in job.live()):
            return
        view.drained = True
        self._announce(view, out)

    @staticmethod
    def _announce(view: NodeView, out: Output) -> None:
        state = view.scheduling
        node_id = view.inventory.node_id
        out.emit(NodeSchedulingChanged(node_id=node_id, scheduling=state,
                                       generation=view.cordon_generation,
                                       reason=view.cordon_reason), SOURCE,
                 event_id=f"node-{state.value}-{node_id}-g{view.cordon_generation}")
