"""The migrate action: a running job moves to faster GPUs that no waiting job took
this cycle, when what it gains pays for its restart several times over.

Only jobs that give their speed per GPU model (``JobRequest.gpu_speeds``) move, and
only whole-GPU jobs not protected from preemption (non-preemptible, minimum runtime,
already stopping). What a move gains is the time its remaining work takes on its
slowest GPU now less on the faster model; what it costs is the grace to checkpoint, a
restart, and the work since its last checkpoint, done again. Its remaining work is its
runtime estimate less the work done; a job past its estimate, or without one, is
expected to run as long again as it has (heavy-tailed runtimes: the longer a job has
run, the longer it is likely to run). The job is stopped as a preemption for itself
(reason ``faster_gpu``); the next cycle places it again, and the throughput plugin's
score sends it to the faster GPUs that are still free.

Time-sliced moves in the other direction (Gavel's rounds) are not made: every move
costs a restart, so one is made only toward a gain PAYBACK times that cost.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from scheduling.actions.base import Action
from scheduling.arrays import IntArray
from scheduling.diagnosis import CAPACITY
from scheduling.framework import RunningInfo
from scheduling.model import Preemption, PreemptReason
from scheduling.plugins.throughput import relative_speeds
from scheduling.session import Session

RESTART_S = 60.0  # a restart's own cost besides the grace and the redone work (restore, warm-up)
PAYBACK = 2.0  # a move is made when it gains at least this many times what it costs


class Migrate(Action):
    name: ClassVar[str] = "migrate"

    def execute(self, s: Session) -> None:
        cycle = s.cycle
        if not any(r.job.gpu_speeds for r in cycle.running):
            return
        tbl = cycle.table
        idle: IntArray = np.where(tbl.schedulable, cycle.state.idle, 0)  # whole GPUs free, per node
        if not idle.any():
            return
        # a node's model: the one model of its GPUs (nodes mixing models are left out)
        first = tbl.gmodel[:, 0]
        single = ((tbl.gmodel == first[:, None]) | ~tbl.exists).all(axis=1)
        node_model: IntArray = np.where(single, first, -1)
        # GPUs a waiting job may run on go to it, not to a move: only models no job
        # waiting for room may use are free to move to
        waiting = [i.job for i in s.infos if s.plan.pending.get(i.job.job_id) in CAPACITY]
        if any(not job.gpu_models for job in waiting):
            return
        taken = {tbl.models.index(m) for job in waiting for m in job.gpu_models if m in tbl.models}
        node_model[np.isin(node_model, list(taken))] = -1
        if (node_model < 0).all():
            return
        runs = cycle.runs()
        stopping = {p.job_id for p in s.plan.preemptions}
        moves = []
        for k, ri in enumerate(cycle.running):
            job = ri.job
            if (not job.gpu_speeds or bool(runs.protected[k]) or job.job_id in stopping
                    or any(not t.gpu for t in job.tasks)):
                continue
            move = self._best_move(s, ri, k, node_model, idle)
            if move is not None:
                moves.append(move)
        allocs = cycle.snapshot.allocations
        for _gain, _, k, model in sorted(moves, key=lambda m: (-m[0], m[1])):
            ri = cycle.running[k]
            after = _after_move(ri, node_model == model, idle)
            if after is None:
                continue  # an earlier move took the room
            idle = after
            s.plan.preemptions.append(Preemption(
                ri.job.job_id, PreemptReason.FASTER_GPU, ri.job.job_id, ri.job.checkpoint_grace_s,
                tuple(allocs[a].task_id for a in ri.allocs), tuple(sorted({allocs[a].node_id for a in ri.allocs}))))
            s.account(ri.job.tenant, ri.demand, -1)

    def _best_move(self, s: Session, ri: RunningInfo, k: int, node_model: IntArray,
                   idle: IntArray) -> tuple[float, str, int, int] | None:
        cycle = s.cycle
        tbl, runs, job = cycle.table, cycle.runs(), ri.job
        speed = relative_speeds(job, tbl.models)
        allocs = cycle.snapshot.allocations
        held = [int(m) for a in ri.allocs if (part := tbl.parts(allocs[a])) is not None
                for m in tbl.gmodel[part[0], part[3]]]
        if not held:
            return None
        now_speed = min(speed[m] for m in held)
        ran = cycle.now - float(runs.start[k])
        done = (float(runs.attained[k]) / max(ri.gpus, 1.0) + ran) * now_speed  # reference seconds
        est = job.runtime_estimate_s
        left = est - done if est is not None and est > done else done
        if left <= 0:
            return None
        since = float(runs.since_checkpoint[k])
        best: tuple[float, str, int, int] | None = None
        allowed = set(job.gpu_models)
        for m, v in enumerate(speed):
            if v <= now_speed or (allowed and tbl.models[m] not in allowed):
                continue
            gain = left / now_speed - left / v
            cost = job.checkpoint_grace_s + RESTART_S + since * now_speed / v
            if (gain >= PAYBACK * cost and _after_move(ri, node_model == m, idle) is not None
                    and (best is None or gain > best[0])):
                best = (gain, job.job_id, k, m)
        return best


def _after_move(ri: RunningInfo, nodes: np.ndarray, idle: IntArray) -> IntArray | None:
    """The idle GPUs per node once every replica of the job has taken room on the given
    nodes, fullest first as the packing would; None: there is not room for them all."""
    room = idle.copy()
    where = np.flatnonzero(nodes)
    for t in ri.job.tasks:
        left = t.replicas
        for i in where[np.argsort(-room[where])].tolist():
            n = min(left, int(room[i] // t.gpu))
            room[i] -= n * t.gpu
            left -= n
            if not left:
                break
        if left:
            return None
    return room
