"""The discrete-event simulator: arrivals, starts, completions, preemptions (with
checkpoint loss) and node failures over a described cluster, calling the SAME
scheduling core (``scheduling.Scheduler``) at every scheduling event.

Fixed rules (stated in every result, ``SimSettings.rules()``):
- a preempted job keeps the work up to its last checkpoint (every ``checkpoint_s`` of
  progress) and pays ``restore_s`` when it starts again; its victim stops after the
  job's checkpoint grace period (the core's ``Preemption.grace_period_s``);
- gangs run at full speed wherever placed (no topology slowdown model); on a mixed
  cluster a job whose trace gives speeds per GPU model runs at the speed of the slowest
  GPU it holds (a gang waits for its slowest member), and only on models it has a speed
  for; ``speeds="given"`` also tells the core those speeds (``JobRequest.gpu_speeds``);
- scheduling cycles run when something changed, at most one per ``cycle_s`` of
  simulated time (the core takes the whole pending set each cycle);
- what each policy knows: ``estimates="oracle"`` gives the true duration (SJF bound),
  ``"history"`` the median duration of the tenant's earlier finished jobs of the same
  size and those durations (submit-time knowledge, ``scheduling.estimates.DurationHistory``),
  ``"none"`` nothing.

Identity contract with the core: the ``nodes`` tuple is kept while the inventory is
unchanged; Allocation, JobRequest and RunningJob objects are reused across cycles.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from itertools import chain
from operator import attrgetter
from typing import Literal, cast

from scheduling import (
    Allocation,
    JobRequest,
    Node,
    Plan,
    RunningJob,
    Scheduler,
    SchedulerConfig,
    Snapshot,
    TaskRequest,
)
from scheduling.decay import DecayedUsage
from scheduling.estimates import DurationHistory
from scheduling.speeds import SpeedHistory
from sim.traces import TraceJob

Estimates = Literal["none", "oracle", "history"]
SpeedKnowledge = Literal["none", "given", "learned"]
_ALLOCS, _RUNNING, _REQUEST = attrgetter("allocs"), attrgetter("running"), attrgetter("request")
_FINISH, _STOP, _FAIL, _RECOVER, _ARRIVE, _TICK = 0, 1, 2, 3, 4, 5  # order of events at the same time


@dataclass(frozen=True, slots=True)
class SimSettings:
    checkpoint_s: float = 1800.0
    restore_s: float = 60.0
    cycle_s: float = 0.0  # 0: a cycle at every event time
    tick_s: float = 0.0  # >0: also a cycle this often while jobs wait (Tiresias' re-ranking)
    estimates: Estimates = "none"
    # history estimates: a job's are renewed at each start and stop, fixed while it waits or
    # runs (as the scheduler's snapshot; docs/design/simulator.md); False: fixed at arrival
    renew: bool = True
    node_failures: tuple[tuple[float, str, float], ...] = ()  # (time, node id, down for s)
    gpus_per_task: int = 8  # a job of more GPUs is a gang of tasks of this many
    cpu_per_gpu_milli: int = 4000
    mem_per_gpu_mib: int = 32_768
    max_time_s: float = float("inf")  # stop the clock here (jobs left are reported unfinished)
    skip_idle_cycles: bool = False  # non-preemptive policies: no cycle while no waiting job fits in the free GPUs
    # mixed clusters: "given" tells the core each job's speed per GPU model (a user's
    # hint or a profile, as Gavel assumes); "learned": its class's speeds on the models
    # where jobs of the class have started (scheduling.speeds: a running job reports its
    # rate within minutes, against runs of hours); "none": the core places blind to models
    speeds: SpeedKnowledge = "none"

    def rules(self) -> dict[str, object]:
        return {"checkpoint_every_s": self.checkpoint_s, "restore_s": self.restore_s,
                "preemption_grace": "job checkpoint_grace_s (core default 30 s)",
                "topology_slowdown": "off (gangs run at full speed wherever placed)",
                "cycle_s": self.cycle_s, "tick_s": self.tick_s, "estimates": self.estimates,
                "estimates_renewed": "at each start and stop" if self.renew else "never",
                "node_failures": len(self.node_failures), "speeds_known": self.speeds}


@dataclass(slots=True)
class JobRun:
    """What the simulator tracks of one job."""

    trace: TraceJob
    request: JobRequest
    remaining_s: float  # work left (s of full-speed running)
    first_start: float | None = None
    finish: float | None = None
    start: float = 0.0  # of the current attempt
    restore: float = 0.0  # restore time paid at the start of the current attempt
    allocs: tuple[Allocation, ...] = ()
    running: RunningJob | None = None
    preemptions: int = 0
    lost_work_s: float = 0.0  # GPU-seconds redone
    epoch: int = 0  # invalidates stale finish events
    queued_at: float = 0.0  # when it last (re)joined the queue
    requeue_wait_s: float = 0.0  # waits after preemptions (the first wait is first_start - submit)
    rate: float = 1.0  # work per second of the current attempt (its slowest GPU's speed)
    gpu_s_by_model: dict[str, float] = field(default_factory=dict)  # GPU-seconds held, per model (mixed clusters)

    @property
    def gpus(self) -> int:
        return self.trace.num_gpus


@dataclass(slots=True)
class SimResult:
    jobs: list[JobRun]
    samples: list[tuple[float, float, int, int]] = field(default_factory=list)  # t, GPUs allocated, queued, running
    capacity_gpus: int = 0
    cycles: int = 0
    end_time: float = 0.0
    settings: SimSettings = field(default_factory=SimSettings)


def to_request(t: TraceJob, s: SimSettings, estimate: float | None,
               samples: tuple[float, ...] = ()) -> JobRequest:
    per = min(t.num_gpus, s.gpus_per_task)
    replicas = -(-t.num_gpus // per)
    task = TaskRequest("w", "worker", replicas, gpu=per, cpu_milli=per * s.cpu_per_gpu_milli,
                       memory_mib=per * s.mem_per_gpu_mib)
    # the models a job can run on are a constraint every policy keeps (as a CUDA
    # capability is); its speeds on them are what only an aware policy is told
    models = tuple(m for m, v in t.speeds if v > 0)
    return JobRequest(t.job_id, (task,), tenant=t.tenant, queue=t.tenant, submit_time=t.submit_s,
                      runtime_estimate_s=estimate, runtime_samples=samples, gpu_models=models,
                      gpu_speeds=t.speeds if s.speeds == "given" else ())


class Simulation:
    def __init__(self, nodes: tuple[Node, ...], jobs: Sequence[TraceJob], config: SchedulerConfig,
                 settings: SimSettings | None = None,
                 on_progress: Callable[[int, int], None] | None = None,
                 watch: Callable[[float, Simulation], None] | None = None,
                 probes: Sequence[float] = ()) -> None:
        self.nodes = nodes
        self.trace = sorted(jobs, key=lambda j: j.submit_s)
        self.sched = Scheduler(config)
        half_life = config.decay_half_life_s()  # fair share over decayed past use
        self.decay = DecayedUsage(half_life) if half_life > 0 else None
        self.s = settings or SimSettings()
        self.on_progress = on_progress
        self.history = DurationHistory()  # what "history" estimates learn from (scheduling.estimates)
        # an observer (benchmarks): called with the simulation at each time in ``probes``
        # (between events: the state is the one at that time) and after every batch of
        # events, before the cycle; it must not change the simulation
        self.watch = watch
        self.probes = sorted(probes, reverse=True)
        self.events: list[tuple[float, int, int, object]] = []
        self.seq = 0
        self.pending: dict[str, JobRun] = {}  # insertion order = admission order
        self.runs: dict[str, JobRun] = {}  # running (incl. terminating)
        self.done: list[JobRun] = []
        self.all: list[JobRun] = []
        self.down: set[str] = set()
        self.capacity = sum(len(n.gpus) for n in nodes)
        self.used = 0  # GPUs held by self.runs
        self.waiting: Counter[int] = Counter()  # pending jobs by GPU count
        self.ticking = False
        self.next_cycle = 0.0
        # running jobs' next checkpoints: (time, job, epoch); the core sees the last one
        self.checkpoints: list[tuple[float, str, int]] = []
        self.gpu_model = {n.node_id: [g.model for g in n.gpus] for n in nodes}  # node -> model per GPU index
        self.speeds = SpeedHistory()  # what "learned" speeds know

    # --- events ---------------------------------------------------------------------
    def _push(self, t: float, kind: int, payload: object) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, kind, self.seq, payload))

    def _known(self, t: TraceJob) -> tuple[float | None, tuple[float, ...]]:
        """The history's estimate and samples for ``t`` now (``DurationHistory.known``, as
        the scheduler's ``JobHistory.fill``)."""
        if self.s.estimates != "history":
            return self._estimate(t), ()
        return self.history.known(t.tenant, t.num_gpus)

    def _renew(self, jr: JobRun) -> None:
        """What the history knows now, not what it knew when the job arrived: at each start
        and each stop (the scheduler's ``SnapshotBuilder``, services/scheduler/snapshot.py).
        In this engine a job's estimate is always the history's: no user gives one."""
        if not self.s.renew or self.s.estimates != "history":
            return
        est, samples = self._known(jr.trace)
        if samples is not jr.request.runtime_samples:
            jr.request = replace(jr.request, runtime_estimate_s=est, runtime_samples=samples)

    def _estimate(self, t: TraceJob) -> float | None:
        if self.s.estimates == "oracle":
            return t.duration_s
        if self.s.estimates == "history":
            return self.history.estimate(t.tenant, t.num_gpus)
        return None

    def run(self) -> SimResult:
        for tj in self.trace:
            self._push(tj.submit_s, _ARRIVE, tj)
        for ft, node, down in self.s.node_failures:
            self._push(ft, _FAIL, (node, down))
        res = SimResult(self.all, capacity_gpus=self.capacity, settings=self.s)
        self.next_cycle = 0.0  # no cycle before this simulated time (cycle_s)
        now = 0.0
        while self.events:
            now = max(self.events[0][0], self.next_cycle) if self.s.cycle_s else self.events[0][0]
            if now > self.s.max_time_s:
                break
            if self.watch is not None:
                while self.probes and self.probes[-1] < now:
                    self.watch(self.probes.pop(), self)
            changed = False
            while self.events and self.events[0][0] <= now:
                t, kind, _, payload = heapq.heappop(self.events)
                changed |= self._handle(t, kind, payload)
            if self.watch is not None:
                self.watch(now, self)
            if changed and self.pending and not (self.s.skip_idle_cycles and self._nothing_fits()):
                self._cycle(now)
                res.cycles += 1
                self.next_cycle = now + self.s.cycle_s
                if self.s.tick_s > 0 and self.pending and self.runs and not self.ticking:
                    self.ticking = True
                    self._push(now + self.s.tick_s, _TICK, None)
            res.samples.append((now, float(self.used), len(self.pending), len(self.runs)))
            if self.on_progress is not None:
                self.on_progress(len(self.done), len(self.trace))
        res.end_time = now
        return res

    def _handle(self, t: float, kind: int, payload: object) -> bool:
        if kind == _ARRIVE:
            tj = cast(TraceJob, payload)
            est, samples = self._known(tj)
            new = JobRun(tj, to_request(tj, self.s, est, samples), tj.duration_s, queued_at=t)
            self.all.append(new)
            self._queue(new)
            return True
        if kind == _FINISH:
            job_id, epoch = cast(tuple[str, int], payload)
            jr = self.runs.get(job_id)
            if jr is None or jr.epoch != epoch:
                return False  # stopped before it finished
            del self.runs[job_id]
            self.used -= jr.gpus
            self._held(jr, t)
            jr.finish, jr.remaining_s, jr.allocs, jr.running = t, 0.0, (), None
            self.done.append(jr)
            self.history.learn(jr.trace.tenant, jr.trace.num_gpus, jr.trace.duration_s)
            return True
        if kind == _STOP:
            job_id, epoch = cast(tuple[str, int], payload)
            jr = self.runs.get(job_id)
            if jr is None or jr.epoch != epoch:
                return False
            self._stop(jr, t)
            return True
        if kind == _FAIL:
            node, down = cast(tuple[str, float], payload)
            self.down.add(node)
            self._set_nodes()
            for jr in [r for r in self.runs.values() if any(a.node_id == node for a in r.allocs)]:
                self._stop(jr, t)
            self._push(t + down, _RECOVER, node)
            return True
        if kind == _TICK:
            self.ticking = False
            return bool(self.pending)
        if kind == _RECOVER:
            self.down.discard(cast(str, payload))
            self._set_nodes()
            return True
        return False

    def _nothing_fits(self) -> bool:
        """No waiting job asks for as few GPUs as are free (then a non-preemptive core
        cannot bind anything: the cycle is skipped, with the same outcome)."""
        free = self.capacity - self.used
        if self.down:
            free -= sum(len(n.gpus) for n in self.nodes if not n.schedulable)
        return min(self.waiting) > free

    def _set_nodes(self) -> None:
        self.nodes = tuple(replace(n, schedulable=n.node_id not in self.down) for n in self.nodes)

    def _stop(self, jr: JobRun, t: float) -> None:
        """The job stops: it keeps the work up to its last checkpoint and queues again."""
        progress = max(0.0, t - jr.start - jr.restore)
        kept = (progress // self.s.checkpoint_s) * self.s.checkpoint_s if self.s.checkpoint_s > 0 else 0.0
        kept = min(kept, jr.remaining_s / jr.rate)  # seconds of this attempt its checkpoint keeps
        jr.lost_work_s += (progress - kept) * jr.gpus
        jr.remaining_s -= kept * jr.rate
        self._held(jr, t)
        jr.preemptions += 1
        jr.epoch += 1
        attained = jr.request.attained_service_s + progress * jr.gpus
        jr.request = replace(jr.request, attained_service_s=attained, attempt=jr.request.attempt + 1)
        jr.allocs, jr.running = (), None
        self._renew(jr)
        del self.runs[jr.trace.job_id]
        self.used -= jr.gpus
        jr.queued_at = t
        self._queue(jr)

    def _queue(self, jr: JobRun) -> None:
        self.pending[jr.trace.job_id] = jr
        self.waiting[jr.gpus] += 1

    # --- a scheduling cycle ---------------------------------------------------------------
    def snapshot(self, now: float) -> Snapshot:
        """What the core sees now (C-level gathers: thousands of jobs wait on an
        overloaded cluster)."""
        self._checkpointed(now)
        allocs = tuple(chain.from_iterable(map(_ALLOCS, self.runs.values())))
        running = tuple(filter(None, map(_RUNNING, self.runs.values())))
        if self.s.speeds == "learned":
            self._learned()
        pending = tuple(map(_REQUEST, self.pending.values()))
        past = self.decay.advance(now) if self.decay is not None else {}
        return Snapshot(now, self.nodes, allocs, pending, running, past_usage=past)

    def _learned(self) -> None:
        """Waiting jobs carry what their class's speeds are now."""
        for jr in self.pending.values():
            sp = self.speeds.speeds((jr.trace.kind, jr.gpus))
            if sp is not jr.request.gpu_speeds:
                jr.request = replace(jr.request, gpu_speeds=sp)

    def _checkpointed(self, now: float) -> None:
        """Tell the core of the checkpoints running jobs passed (what a stop keeps)."""
        heap, every = self.checkpoints, self.s.checkpoint_s
        while heap and heap[0][0] <= now:
            _, job_id, epoch = heapq.heappop(heap)
            jr = self.runs.get(job_id)
            if jr is None or jr.epoch != epoch or jr.running is None:
                continue
            base = jr.start + jr.restore
            last = base + ((now - base) // every) * every
            while last + every <= now:
                # (now - base) / every can round down a whole checkpoint (4.99999... for
                # 5): the next one would be due now again, and this loop never end
                last += every
            jr.running = replace(jr.running, last_checkpoint_time=last)
            heapq.heappush(heap, (last + every, job_id, epoch))

    def _cycle(self, now: float) -> None:
        self._apply(self.sched.schedule(self.snapshot(now)), now)
        if self.decay is not None:  # what each tenant holds until the next cycle
            held: dict[str, float] = {}
            for jr in self.runs.values():
                held[jr.trace.tenant] = held.get(jr.trace.tenant, 0.0) + jr.gpus
            self.decay.hold(held)

    def _apply(self, plan: Plan, now: float) -> None:
        for p in plan.preemptions:
            jr = self.runs.get(p.job_id)
            if jr is None or jr.running is None or jr.running.terminating:
                continue
            jr.running = replace(jr.running, terminating=True)
            self._push(now + p.grace_period_s, _STOP, (p.job_id, jr.epoch))
        for job_id, binds in plan.binds_by_job().items():
            jr = self.pending.pop(job_id)
            self.waiting[jr.gpus] -= 1
            if not self.waiting[jr.gpus]:
                del self.waiting[jr.gpus]
            self.used += jr.gpus
            jr.allocs = tuple(Allocation(b.job_id, b.task_id, b.node_id, b.gpus, b.cpu_milli, b.memory_mib,
                                         b.task_name, b.role) for b in binds)
            if jr.first_start is None:
                jr.first_start = now
            else:
                jr.requeue_wait_s += now - jr.queued_at
            jr.start = now
            jr.restore = self.s.restore_s if jr.request.attempt > 1 else 0.0
            self._renew(jr)
            jr.running = RunningJob(jr.request, now, None)
            self.runs[job_id] = jr
            if self.s.checkpoint_s > 0:
                heapq.heappush(self.checkpoints, (now + jr.restore + self.s.checkpoint_s, job_id, jr.epoch))
            jr.rate = self._rate(jr) if jr.trace.speeds else 1.0
            if self.s.speeds == "learned" and jr.trace.speeds:
                models = set(self._models(jr))
                if len(models) == 1:  # a rate measured on one model (a gang across models: its slowest)
                    self.speeds.learn((jr.trace.kind, jr.gpus), models.pop(), jr.rate)
            self._push(now + jr.restore + jr.remaining_s / jr.rate, _FINISH, (job_id, jr.epoch))

    # --- mixed clusters ----------------------------------------------------------------
    def _models(self, jr: JobRun) -> list[str]:
        """The GPU model of every GPU the job holds."""
        return [self.gpu_model[a.node_id][u.index] for a in jr.allocs for u in a.gpus]

    def _rate(self, jr: JobRun) -> float:
        """The job's speed on what it holds: its slowest GPU's (a gang steps together)."""
        speeds = dict(jr.trace.speeds)
        rate = min(speeds.get(m, 0.0) for m in self._models(jr))
        if rate <= 0:
            raise ValueError(f"{jr.trace.job_id} placed on a GPU model it cannot run on: {self._models(jr)}")
        return rate

    def _held(self, jr: JobRun, t: float) -> None:
        """Count the GPU-seconds the attempt ending at ``t`` held, per model."""
        if not jr.trace.speeds:
            return
        held = jr.gpu_s_by_model
        for m in self._models(jr):
            held[m] = held.get(m, 0.0) + (t - jr.start)
