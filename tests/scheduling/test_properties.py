"""Hypothesis properties of every plan: no over-commit, gangs whole, quotas held,
starved jobs not overtaken, victims legitimate, deterministic."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling import (
    GpuStats,
    JobRequest,
    PendingReason,
    Plan,
    RunningJob,
    Scheduler,
    SchedulerConfig,
    Snapshot,
    first_fit,
)
from scheduling.plugins.ordering import Priority
from tests.scheduling.builders import job, node, quota

CLASSES = ["low", "normal", "high"]
# MIG geometries of an A100-80GB, as operators configure them, and the profiles jobs ask for
GEOMETRIES = [("7g.80gb",), ("4g.40gb", "3g.40gb"), ("3g.40gb", "3g.40gb"), ("4g.40gb", "2g.20gb", "1g.10gb"),
              ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"), ("2g.20gb",) * 3 + ("1g.10gb",),
              ("1g.10gb",) * 7, ("1g.20gb",) * 4]
PROFILES = ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "7g.80gb"]
TENANTS = ["a", "b", "c"]


@st.composite
def jobs(draw, prefix: str, n: int) -> list[JobRequest]:
    out = []
    for k in range(n):
        b = job(f"{prefix}{k}").tenant(draw(st.sampled_from(TENANTS))).klass(draw(st.sampled_from(CLASSES)))
        b.submit(draw(st.floats(0, 900))).priority(draw(st.integers(-5, 5))).cpu(draw(st.sampled_from([0, 2000])))
        kind = draw(st.sampled_from(["whole", "whole", "share", "gang", "ps", "mig"]))
        if kind == "whole":
            b.gpus(draw(st.integers(1, 8)))
        elif kind == "share":
            b.share(draw(st.sampled_from([0, 10_000, 40_000])), draw(st.sampled_from([10, 30, 50, 70])))
            b.replicas(draw(st.integers(1, 3)))
        elif kind == "gang":
            b.gpus(draw(st.sampled_from([2, 4, 8]))).gang(draw(st.integers(2, 4)))
            if draw(st.booleans()):
                b.min_available(2)
        elif kind == "mig":
            b.mig(draw(st.sampled_from(PROFILES))).replicas(draw(st.integers(1, 3)))
        else:
            b.named("ps").cpu(1000).task("worker").gpus(draw(st.integers(1, 4))).replicas(draw(st.integers(1, 3)))
        if draw(st.booleans()):
            b.estimate(draw(st.floats(10, 5000)))
        if draw(st.integers(0, 4)) == 0:
            b.elastic(1, 4) if kind != "ps" else None
        if draw(st.integers(0, 5)) == 0:
            b.not_preemptible()
        out.append(b.build())
    return out


@st.composite
def snapshots(draw) -> Snapshot:
    nodes = []
    for i in range(draw(st.integers(1, 4))):
        b = node(f"n{i}").gpus(draw(st.sampled_from([1, 2, 4, 8]))).rack(f"r{i % 2}")
        b.cpu(draw(st.sampled_from([16_000, 64_000])))
        if draw(st.integers(0, 4)) == 0:
            b.unhealthy(0)
        if draw(st.integers(0, 3)) == 0:
            b.mig(*draw(st.sampled_from(GEOMETRIES)))
        nodes.append(b.build())
    nodes_t = tuple(nodes)
    running_req = draw(jobs("r", draw(st.integers(0, 6))))
    # running jobs are placed by plain first fit, so their allocations are valid
    pre = first_fit(Snapshot(0.0, nodes_t, (), tuple(running_req)))
    from scheduling import Allocation

    allocs = tuple(Allocation(b.job_id, b.task_id, b.node_id, b.gpus, b.cpu_milli, b.memory_mib, b.task_name,
                              b.role) for b in pre.binds)
    placed = {b.job_id for b in pre.binds}
    running = tuple(RunningJob(j, draw(st.floats(0, 900)), None, draw(st.integers(0, 6)) == 0)
                    for j in running_req if j.job_id in placed)
    pending = tuple(draw(jobs("p", draw(st.integers(1, 8)))))
    quotas = ()
    if draw(st.booleans()):
        cohort = draw(st.sampled_from(["", "c"]))
        quotas = tuple(quota(t, draw(st.sampled_from([2, 8, 16])), cohort,
                             borrow=draw(st.sampled_from([None, 0, 4])), lend=draw(st.sampled_from([None, 2])))
                       for t in TENANTS)
    tele = {}
    if draw(st.booleans()):
        tele = {n.node_id: tuple(GpuStats(g.index, draw(st.floats(0, 100)), 0, draw(st.floats(30, 90)))
                                 for g in n.gpus) for n in nodes}
    return Snapshot(1000.0, nodes_t, allocs, pending, running, quotas, tele)


CONFIGS = {
    "default": SchedulerConfig(),
    "no-backfill": SchedulerConfig.load({"plugins": [
        {"name": "gang"}, {"name": "priority", "args": {"starvation_bound_s": 300}}, {"name": "fairshare"},
        {"name": "topology"}, {"name": "binpack"}, {"name": "fgd"}, {"name": "elastic"}]}),
    "starving": SchedulerConfig.load({"plugins": [
        {"name": "gang"}, {"name": "priority", "args": {"starvation_bound_s": 300}}, {"name": "fairshare"},
        {"name": "binpack", "args": {"strategy": "spread"}}, {"name": "backfill"}]}),
    "tiresias": SchedulerConfig.preset("tiresias"),
}

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def all_binds(plan: Plan):
    return [*plan.binds, *(b for rz in plan.resizes for b in rz.binds)]


@SETTINGS
@given(snapshots(), st.sampled_from(sorted(CONFIGS)))
def test_no_gpu_memory_or_compute_is_overcommitted(snap, cfg) -> None:
    plan = Scheduler(CONFIGS[cfg]).schedule(snap)
    nodes = {n.node_id: n for n in snap.nodes}
    whole = defaultdict(int)
    mem = defaultdict(int)
    cmp_ = defaultdict(int)
    cpu = defaultdict(int)
    mig = defaultdict(int)
    profile = {(b.job_id, b.task_name): t.mig_profile for j in snap.pending for t in j.tasks
               for b in all_binds(plan) if b.job_id == j.job_id and b.task_name == t.name}
    for a in [*snap.allocations, *all_binds(plan)]:
        cpu[a.node_id] += a.cpu_milli
        for u in a.gpus:
            key = (a.node_id, u.index)
            if u.mig_slots:  # one whole instance of the profile asked for, held by one task
                slot = nodes[a.node_id].gpus[u.index]
                assert slot.mig_mode and not mig[key] & u.mig_slots, (key, u)
                inst = [x for x in slot.mig if x.mask == u.mig_slots]
                assert inst and inst[0].profile == profile.get((a.job_id, a.task_name), inst[0].profile)
                mig[key] |= u.mig_slots
                continue
            assert not nodes[a.node_id].gpus[u.index].mig_mode  # MIG GPUs serve only instances
            if u.whole:
                whole[key] += 1
            mem[key] += u.memory_mib
            cmp_[key] += u.compute_pct
    for b in all_binds(plan):
        n = nodes[b.node_id]
        assert n.schedulable
        for u in b.gpus:
            assert n.gpus[u.index].healthy
    for (nid, g), c in cmp_.items():
        slot = nodes[nid].gpus[g]
        assert c <= 100, (nid, g)
        assert whole[(nid, g)] == 0 or (whole[(nid, g)] == 1 and c == 100)
        assert mem[(nid, g)] <= slot.memory_mib
    for nid, c in cpu.items():
        assert c <= nodes[nid].cpu_milli


@SETTINGS
@given(snapshots(), st.sampled_from(sorted(CONFIGS)))
def test_gangs_are_all_or_nothing_and_every_job_is_answered(snap, cfg) -> None:
    plan = Scheduler(CONFIGS[cfg]).schedule(snap)
    by_job = plan.binds_by_job()
    for j in snap.pending:
        binds = by_job.get(j.job_id, [])
        assert bool(binds) != (j.job_id in plan.pending)
        if binds:
            assert len(binds) >= j.min_members
            ids = [b.task_id for b in binds]
            assert len(set(ids)) == len(ids)
            reps = {t.name: t.replicas for t in j.tasks}
            assert all(b.replica < reps[b.task_name] and b.task_id == f"{b.task_name}-{b.replica}" for b in binds)


@SETTINGS
@given(snapshots())
def test_quotas_hold_except_where_borrowing_allows(snap) -> None:
    plan = Scheduler().schedule(snap)
    quotas = {q.tenant: q for q in snap.quotas}
    tenant_of = {r.job.job_id: r.job.tenant for r in snap.running} | {j.job_id: j.tenant for j in snap.pending}
    before = defaultdict(float)
    added = defaultdict(float)
    for a in snap.allocations:
        before[tenant_of[a.job_id]] += sum(1.0 if u.whole else u.compute_pct / 100 for u in a.gpus)
    for b in all_binds(plan):
        added[tenant_of[b.job_id]] += sum(1.0 if u.whole else u.compute_pct / 100 for u in b.gpus)
    gone = {p.job_id for p in plan.preemptions}
    for a in snap.allocations:
        if a.job_id in gone:
            before[tenant_of[a.job_id]] -= sum(1.0 if u.whole else u.compute_pct / 100 for u in a.gpus)
    for t, add in added.items():
        q = quotas.get(t)
        if q is None or add == 0:
            continue
        after = before[t] + add
        if not q.cohort:
            assert after <= q.nominal.gpu + 1e-6
            continue
        if q.borrowing_limit is not None:
            assert after <= q.nominal.gpu + q.borrowing_limit.gpu + 1e-6
        lent = sum(min(o.nominal.gpu, o.lending_limit.gpu if o.lending_limit else o.nominal.gpu)
                   for o in snap.quotas if o.cohort == q.cohort and o.tenant != t)
        assert after <= q.nominal.gpu + lent + 1e-6


@SETTINGS
@given(snapshots(), st.sampled_from(["no-backfill", "starving"]))
def test_no_starved_job_is_overtaken(snap, cfg) -> None:
    plan = Scheduler(CONFIGS[cfg]).schedule(snap)
    bound_jobs = set(plan.binds_by_job())
    capacity = {PendingReason.NO_FIT, PendingReason.GANG_INCOMPLETE, PendingReason.AFFINITY}
    est = {j.job_id: j.runtime_estimate_s for j in snap.pending}
    for pos, jid in enumerate(plan.order):
        starved = snap.now - next(j for j in snap.pending if j.job_id == jid).submit_time >= 300
        if not starved or plan.pending.get(jid) not in capacity:
            continue
        later = [k for k in plan.order[pos + 1:] if k in bound_jobs]
        res = [r for r in plan.reservations if r.job_id == jid]
        if not res:
            assert later == []  # it holds the line
            continue
        for k in later:
            on_reserved = [b for b in plan.binds if b.job_id == k and b.node_id in res[0].node_ids]
            assert not on_reserved or (est[k] is not None and snap.now + est[k] <= res[0].start_time), k


@SETTINGS
@given(snapshots(), st.sampled_from(sorted(CONFIGS)))
def test_victims_are_legitimate(snap, cfg) -> None:
    plan = Scheduler(CONFIGS[cfg]).schedule(snap)
    running = {r.job.job_id: r for r in snap.running}
    for p in plan.preemptions:
        r = running[p.job_id]
        assert r.job.preemptible
        assert not r.terminating
        assert snap.now - r.start_time >= r.job.min_runtime_s
        assert plan.pending[p.preemptor] == PendingReason.PREEMPTING
    assert len({p.job_id for p in plan.preemptions}) == len(plan.preemptions)


@SETTINGS
@given(snapshots(), st.sampled_from(sorted(CONFIGS)))
def test_the_plan_is_deterministic(snap, cfg) -> None:
    s = Scheduler(CONFIGS[cfg])
    first = s.schedule(snap)
    # with the scheduler's caches warm; the victim-search backoff is policy carried from
    # one cycle to the next (a job that found no victims sits the next search out), not a
    # cache: start it afresh, as on a first cycle
    s.action("preempt").backoff = set()
    prio = s.by_name.get("priority")
    if isinstance(prio, Priority):  # so is the priority plugin's memory of overtaken jobs
        prio.passed_over, prio.promoted = set(), set()
    assert s.schedule(snap) == first
    assert Scheduler(CONFIGS[cfg]).schedule(replace(snap, nodes=tuple(snap.nodes))) == first


@SETTINGS
@given(snapshots(), snapshots())
def test_incremental_state_equals_a_rebuild(first, second) -> None:
    """The free capacity carried across cycles by allocation identity is exact."""
    from scheduling.state import ClusterState

    s = Scheduler()
    s.schedule(first)
    later = replace(second, nodes=first.nodes, allocations=first.allocations[: len(first.allocations) // 2]
                    + tuple(a for a in second.allocations if a.node_id in {n.node_id for n in first.nodes}))
    cycle = s.open_cycle(later)
    fresh = ClusterState(cycle.table)
    fresh.apply(later.allocations)
    for name in ("cpu_free", "mem_free", "gmem_free", "gcmp_free", "mig_free", "idle", "dom_idle", "cmp_sum"):
        assert (getattr(cycle.state, name) == getattr(fresh, name)).all(), name


@SETTINGS
@given(snapshots(), st.integers(0, 3))
def test_running_jobs_kept_across_cycles_have_the_figures_of_a_fresh_cycle(snap, drop) -> None:
    """RunningInfo and its RunTable row are kept per running-job object: when the same
    running jobs hold other allocations (some ended, as an elastic job shrinks) the
    figures follow them, as a fresh scheduler's do."""
    import numpy as np

    s = Scheduler()
    s.schedule(snap)
    later = replace(snap, now=snap.now + 60.0, allocations=snap.allocations[drop:])
    warm, fresh = s.open_cycle(later), Scheduler().open_cycle(later)
    assert [r.run for r in warm.running] == [r.run for r in fresh.running]
    assert warm.usage == fresh.usage
    a, b = warm.runs(), fresh.runs()
    assert a.tenants == b.tenants
    for name in ("tenant", "static", "gpus", "start", "attained", "estimate", "demand", "lost", "protected",
                 "waited"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


@SETTINGS
@given(snapshots(), st.sampled_from(sorted(CONFIGS)), st.integers(1, 6))
def test_bulk_settling_gives_the_plan_of_one_by_one(snap, cfg, copies) -> None:
    """Jobs left over once the cluster is full for them get their reasons in bulk: the
    plan is the same as trying them one by one (many same-shape jobs waiting)."""
    from scheduling.actions import Allocate

    pending = tuple(replace(j, job_id=f"{j.job_id}-{k}", submit_time=j.submit_time + k)
                    for k in range(copies) for j in snap.pending)
    snap = replace(snap, pending=pending)
    bulk = Scheduler(CONFIGS[cfg]).schedule(snap)
    Allocate.bulk = False
    try:
        one_by_one = Scheduler(CONFIGS[cfg]).schedule(snap)
    finally:
        Allocate.bulk = True
    assert bulk == one_by_one


@SETTINGS
@given(snapshots(), st.sampled_from(sorted(CONFIGS)), st.integers(1, 4))
def test_memoised_scores_give_the_plan_of_scoring_every_candidate(snap, cfg, copies) -> None:
    """Scores kept by node state (and per node) choose exactly what scoring every
    candidate afresh chooses, with many same-shape replicas placed one after another."""
    from scheduling.placer import Placer

    pending = tuple(replace(j, job_id=f"{j.job_id}-{k}", submit_time=j.submit_time + k)
                    for k in range(copies) for j in snap.pending)
    snap = replace(snap, pending=pending)
    kept = Scheduler(CONFIGS[cfg]).schedule(snap)
    Placer.memo = False
    try:
        fresh = Scheduler(CONFIGS[cfg]).schedule(snap)
    finally:
        Placer.memo = True
    assert kept == fresh


@st.composite
def alike_nodes(draw) -> Snapshot:
    """Many nodes of one kind (equal states are common), told apart by telemetry, rack
    and datasets only; single-replica jobs of a few shapes, some with a dataset."""
    from scheduling import Allocation, GpuUse

    nodes = tuple(node(f"n{i}").gpus(4).nvlink(*draw(st.sampled_from([(0, 0, 0, 0), (0, 0, 1, 1)])))
                  .rack(f"r{i % 3}").datasets(*draw(st.sets(st.sampled_from("xyz")))).build()
                  for i in range(draw(st.integers(2, 8))))
    # running work on random GPUs, so that nodes often hold the same state in another order
    allocs, running = [], []
    for n in nodes:
        for g in sorted(draw(st.sets(st.integers(0, 3), max_size=3))):
            use = GpuUse(g) if draw(st.booleans()) else GpuUse(g, 20_000, draw(st.sampled_from([25, 50])))
            r = job(f"r-{n.node_id}-{g}").gpus(1).build()
            allocs.append(Allocation(r.job_id, "w-0", n.node_id, (use,), 0, 0))
            running.append(RunningJob(r, 0.0))
    pending = []
    for k in range(draw(st.integers(1, 24))):
        b = job(f"p{k}").submit(float(k)).cpu(draw(st.sampled_from([0, 2000])))
        if draw(st.booleans()):
            b.gpus(draw(st.sampled_from([1, 2])))
        else:
            b.share(draw(st.sampled_from([10_000, 40_000])), draw(st.sampled_from([25, 50])))
        ds = draw(st.sampled_from(["", "x", "y"]))
        if ds:
            b.dataset(ds)
        pending.append(b.build())
    tele = {n.node_id: tuple(GpuStats(g.index, draw(st.floats(0, 100)), 0, draw(st.floats(30, 90)))
                             for g in n.gpus) for n in nodes} if draw(st.booleans()) else {}
    return Snapshot(1000.0, nodes, tuple(allocs), tuple(pending), tuple(running), (), tele)


@SETTINGS
@given(alike_nodes())
def test_memoised_scores_tell_alike_nodes_apart(snap) -> None:
    from scheduling.placer import Placer

    kept = Scheduler().schedule(snap)
    Placer.memo = False
    try:
        fresh = Scheduler().schedule(snap)
    finally:
        Placer.memo = True
    assert kept == fresh


@SETTINGS
@given(st.one_of(snapshots(), alike_nodes()))
def test_equal_state_ids_mean_equal_nodes_and_free_capacity(snap) -> None:
    from scheduling.node_table import NodeTable
    from scheduling.state import ClusterState

    table = NodeTable(snap.nodes)
    state = ClusterState(table)
    state.apply(snap.allocations)
    ids = state.state_ids().copy()
    def gpus(i: int) -> list[tuple[int, ...]]:
        cols = zip(table.gpu_class[i].tolist(), state.gmem_free[i].tolist(), state.gcmp_free[i].tolist(),
                   state.mig_free[i].tolist(), strict=True)
        return sorted(cols) if table.gpu_order_free[i] else list(cols)

    for i in range(table.n):
        for j in range(table.n):
            same = (state.cpu_free[i] == state.cpu_free[j] and state.mem_free[i] == state.mem_free[j]
                    and table.node_class[i] == table.node_class[j] and gpus(i) == gpus(j))
            assert (ids[i] == ids[j]) == same
    from scheduling import state as state_module

    bulk, state_module.FEW_ROWS = state_module.FEW_ROWS, -1  # every row through the bulk path
    try:
        again = ClusterState(table)
        again.apply(snap.allocations)
        assert (again.state_ids() == ids).all()  # row by row and in bulk: the same ids
        state_module.FEW_ROWS = 1 << 30  # every row through the row path, its raw-row memo warm
        for _ in range(2):
            warm = ClusterState(table)
            warm.apply(snap.allocations)
            assert (warm.state_ids() == ids).all()
    finally:
        state_module.FEW_ROWS = bulk
    copy = state.copy()
    if table.n:
        state.take(0, 1, 0, ())  # the copy keeps the ids of its own rows
        assert (copy.state_ids() == ids).all()
        assert state.state_ids()[0] != ids[0]


@SETTINGS
@given(st.one_of(snapshots(), alike_nodes()))
def test_taking_replica_by_replica_keeps_the_figures_a_rebuild_has(snap) -> None:
    """``take`` updates idle GPUs and free compute incrementally: the same as a bulk load."""
    from scheduling import Allocation
    from scheduling.node_table import NodeTable
    from scheduling.state import ClusterState

    table = NodeTable(snap.nodes)
    plan = Scheduler().schedule(snap)
    one = ClusterState(table)
    one.apply(snap.allocations)
    for b in plan.binds:
        one.take(table.index[b.node_id], b.cpu_milli, b.memory_mib, b.gpus)
    bulk = ClusterState(table)
    bulk.apply([*snap.allocations, *(Allocation(b.job_id, b.task_id, b.node_id, b.gpus, b.cpu_milli,
                                                b.memory_mib) for b in plan.binds)])
    for name in ("cpu_free", "mem_free", "gmem_free", "gcmp_free", "mig_free", "idle", "dom_idle", "cmp_sum"):
        assert (getattr(one, name) == getattr(bulk, name)).all(), name
    for b in plan.binds:
        one.release(table.index[b.node_id], b.cpu_milli, b.memory_mib, b.gpus)
    empty = ClusterState(table)
    empty.apply(snap.allocations)
    assert (one.idle == empty.idle).all() and (one.cmp_sum == empty.cmp_sum).all()


@SETTINGS
@given(snapshots(), snapshots())
def test_the_workload_mix_kept_across_cycles_equals_a_fresh_count(first, second) -> None:
    """FGD counts task types by the jobs that came and went: the same as counting anew."""
    from types import SimpleNamespace

    from scheduling.plugins.fgd import Fgd, FgdArgs, task_shapes

    def fresh(snap: Snapshot) -> list:
        tasks = [(t, j.gpu_models, t.replicas) for j in snap.pending for t in j.tasks]
        tasks += [(t, r.job.gpu_models, t.replicas) for r in snap.running for t in r.job.tasks]
        return sorted(task_shapes(tasks), key=repr)

    fgd = Fgd(FgdArgs())
    # the second cycle keeps some of the first one's job objects and brings new ones
    second = replace(second, pending=first.pending[::2] + second.pending)
    for snap in (first, second, first):
        assert sorted(fgd._count_tasks(SimpleNamespace(snapshot=snap)), key=repr) == fresh(snap)


@SETTINGS
@given(st.lists(st.integers(0, 40), max_size=60))
def test_grouping_codes_by_counting_equals_numpy_unique(codes) -> None:
    """``jobcols.groups`` (the bulk settling and fair share group thousands of waiting
    jobs by interned code every cycle) gives what ``np.unique`` gives."""
    import numpy as np

    from scheduling.jobcols import groups

    a = np.asarray(codes, dtype=np.int64)
    uniq, first, inverse = groups(a)
    u2, f2, i2 = np.unique(a, return_index=True, return_inverse=True)
    assert uniq.tolist() == u2.tolist() and first.tolist() == f2.tolist() and inverse.tolist() == i2.tolist()
