"""A dry-run submit (``POST /v1/jobs?dryRun=All``, the Kubernetes API's convention):
everything a submit checks, then what would happen, and nothing stored or published.

1. the same refusals as a real submit (``Intake.check``: array size, size and fit
   policy, the queue and its quota ceiling; and the event size limit), with the same
   status codes;
2. the quota verdict now: ``Quotas.check`` (queueing's own admission check, with the
   GPU model it would be admitted against) over
   the usage queueing last announced on ``queues.events``;
3. the forecast: the forecaster service replays the live cluster with the job added
   (``forecaster.what_if``); when it is not configured, down, slow or without a
   snapshot, the answer comes without one and says why.
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime
from typing import Any

from services.admission import forecaster, queues_view
from services.admission.accept import Intake
from services.admission.arrays import element_spec
from services.admission.auth import Principal
from services.admission.event_ids import submitted_event_id
from services.admission.models.dry_run import DryRunForecast, DryRunOut, DryRunQuota, QuotaDemand
from services.admission.queue_check import quota_trees
from services.admission.store import new_job_id
from shared.bus import check_size
from shared.durations import in_words
from shared.events import Envelope, JobSubmitted, utcnow
from shared.events.reasons import WaitReason, mig_never_fits
from shared.gpu_models import expand
from shared.job_array import element_id, new_array_id
from shared.jobspec import JobSpec
from shared.model_quota import Quotas
from shared.queuespec import RESOURCES
from shared.quota_tree import QueueTree, Vec, spec_demand

NOW_S = 5.0  # a start this close is "now"
# why a job that would never start waits, in its spec's words
CONSTRAINED = {
    WaitReason.GPU_MODEL: "no node with a GPU of the models it asks for (gpuModel) that "
                          "its nodeSelector and tolerations allow has room for it",
    WaitReason.NO_MATCHING_NODE: "no node matches its nodeSelector and tolerates the "
                                 "node's taints (tolerations)",
    WaitReason.NEVER_FITS: "larger than any node it may use",
    WaitReason.AFFINITY: "its required affinity or antiAffinity rules cannot all be kept "
                         "(too few nodes or racks apart, or none near)",
}
NODES_NAMED = 6  # more are counted, not named


async def dry_run(intake: Intake, caller: Principal, spec: JobSpec) -> DryRunOut:
    await intake.check(caller, spec)
    one = _fits_an_event(spec, caller, intake.settings.max_event_bytes)
    quota = await quota_verdict(intake, spec)
    arr = spec.array_indices
    out = DryRunOut(name=spec.name, queue=spec.queue, tenant=caller.tenant, user=caller.user,
                    array_size=arr.size if arr else None, quota=quota, summary="")
    try:
        out.forecast = await forecast(intake, caller, on_model(one, quota.gpu_model))
    except forecaster.ForecastUnavailable as exc:
        out.forecast_unavailable = str(exc)
    out.summary = summary(out, utcnow().timestamp(), spec.mig_profiles)
    return out


def _fits_an_event(spec: JobSpec, caller: Principal, max_bytes: int) -> JobSpec:
    """The job as queueing would get it (an array's largest-indexed element), held to
    the event size limit as a submit holds it (``EventTooLarge``: 413)."""
    arr = spec.array_indices
    if arr is None:
        one, job_id, extra = spec, new_job_id(), {}
    else:
        array_id, index = new_array_id(), max(arr.indices)
        one, job_id = element_spec(spec, arr, array_id, index), element_id(array_id, index)
        extra = {"array_id": array_id, "array_index": index,
                 "array_max_running": arr.max_running}
    event = JobSubmitted(job_id=job_id, queue=spec.queue, tenant=caller.tenant,
                         user=caller.user, spec=one, submitted_at=utcnow(), **extra)
    check_size(Envelope.wrap(event, "admission", submitted_event_id(job_id)), max_bytes)
    return one


def _status(row: dict[str, Any]) -> dict[str, Any]:
    st = row.get("status")
    return (st if isinstance(st, dict) else json.loads(st)) if st else {}


def _vec(d: dict[str, Any] | None) -> Vec:
    v = [float((d or {}).get(k) or 0.0) for k in RESOURCES]
    return (v[0], v[1], v[2])


async def quota_verdict(intake: Intake, spec: JobSpec) -> DryRunQuota:
    """Would the queue's quota admit the job now? Queueing's check, on its last announced
    usage (``queue.status``: each queue's ``used`` counts its subtree; the check wants
    each queue's own)."""
    rows = await intake.queues.rows(intake.engine)
    ask = spec_demand(spec)
    amounts = QuotaDemand(gpus=ask[0], cpu_milli=ask[1], memory_mib=ask[2])
    tree, models = quota_trees(rows, intake.queues)
    if spec.queue not in tree.specs:  # the default queue before queueing announced it
        return DryRunQuota(admitted=True, ask=amounts,
                           detail=f"queue {spec.queue} has no quota: nothing limits it")
    # the usage read now, not from the submit checks' cache: queue.status changes every
    # queueing cycle, and a dry run is rare enough to read it fresh
    fresh = {r["name"]: r for r in await queues_view.list_queues(intake.engine, None)}
    status = {n: _status(fresh[n]) for n in tree.specs if n in fresh}
    used = {n: _vec(s.get("used")) for n, s in status.items()}
    by_model = {n: s.get("used_by_model") or {} for n, s in status.items()}
    quotas = Quotas.of(models, [])
    for n, own in _own(tree, used).items():
        quotas.total.add(n, own)
    for key, state in quotas.models.items():  # GPUs of each model, as (gpus, 0, 0)
        held = {n: (float(m.get(key) or 0.0), 0.0, 0.0) for n, m in by_model.items()}
        for n, own in _own(tree, held).items():
            state.add(n, own)
    verdict = quotas.check(spec.queue, ask, models.choices(spec.queue, ask[0],
                                                           spec.gpu_model_names))
    decision, model = verdict.decision, verdict.choice.key or None
    waiting = int(status.get(spec.queue, {}).get("pending") or 0)
    if decision.admitted:
        return DryRunQuota(admitted=True, borrowing=decision.borrowing, ask=amounts,
                           gpu_model=model, waiting_ahead=waiting, detail=(
                               f"queue {spec.queue} has room for it now" + (
                                   f" on its {model} quota" if model else "") + (
                                   ", above its guarantee: borrowed from its cohort, "
                                   "reclaimable" if decision.borrowing else "")))
    at = decision.at or spec.queue
    blocker = (f"reclaim in cohort `{at}`" if decision.reason == WaitReason.RECLAIM
               else f"quota of {tree.specs[at].kind} `{at}`")
    return DryRunQuota(admitted=False, blocked_by=blocker, detail=decision.detail,
                       ask=amounts, waiting_ahead=waiting)


def on_model(spec: JobSpec, key: str | None) -> JobSpec:
    """The job as the scheduler would get it once admitted against model ``key``'s quota:
    its gpuModel narrowed to that model (the forecast then places it there only)."""
    if not key:
        return spec
    inside = set(expand(key))
    models = [m for m in spec.gpu_models if m in inside] or list(expand(key))
    return spec.model_copy(update={"gpu_model": models})


def _own(tree: QueueTree, used: dict[str, Vec]) -> dict[str, Vec]:
    """Each queue's own usage from ``queue.status``'s, which counts its subtree."""
    own: dict[str, Vec] = {}
    for n, u in used.items():
        kids = [used.get(k, (0.0, 0.0, 0.0)) for k in tree.children[n]]
        v = [max(0.0, u[r] - sum(k[r] for k in kids)) for r in range(3)]
        own[n] = (v[0], v[1], v[2])
    return own


def _time(t: float | None) -> datetime | None:
    return None if t is None else datetime.fromtimestamp(t, UTC)


async def forecast(intake: Intake, caller: Principal, one: JobSpec) -> DryRunForecast:
    """The forecaster's answer for the job alone (``ForecastUnavailable`` without one)."""
    job_id = f"dryrun-{uuid.uuid4().hex[:12]}"
    as_of, got = await forecaster.what_if(
        intake.settings.forecaster_url, intake.settings.forecaster_timeout_s,
        [{"job_id": job_id, "queue": one.queue, "tenant": caller.tenant, "user": caller.user,
          "spec": one.model_dump(mode="json", by_alias=True)}])
    now = utcnow().timestamp()  # after the answer: "in N seconds" counts from it
    f = got.get(job_id)
    if f is None:
        raise forecaster.ForecastUnavailable("the forecaster's answer has no forecast for "
                                             "this job")
    return DryRunForecast(
        as_of=datetime.fromtimestamp(as_of, UTC), start=_time(f.start),
        finish=_time(f.finish), start_low=_time(f.start_low), start_high=_time(f.start_high),
        in_seconds=None if f.start is None else max(0.0, f.start - now), nodes=f.nodes,
        waits_for=f.waits_for, reason=f.reason)


def _band(point: str, low: str, high: str) -> str:
    """``between 8 and 20`` when all three are in one unit (the point says which)."""
    unit = re.fullmatch(r"\d+ (s|min)", point)
    if unit and all(re.fullmatch(rf"\d+ {unit[1]}", x) for x in (low, high)):
        return f"between {low.split()[0]} and {high.split()[0]}"
    return f"between {low} and {high}"


def _nodes(nodes: list[str]) -> str:
    named = ", ".join(nodes[:NODES_NAMED])
    more = len(nodes) - NODES_NAMED
    return named + (f" and {more} more" if more > 0 else "")


def summary(out: DryRunOut, now: float, mig: tuple[str, ...] = ()) -> str:
    """The answer in one sentence: "would start in about 12 min (between 8 and 20) on
    node3-1, node3-2; would finish about 2 h 10 min from now; blocked meanwhile by:
    quota of queue `research`"."""
    parts = []
    f = out.forecast
    if f is not None and f.start is not None:
        wait = f.start.timestamp() - now
        when = "now" if wait <= NOW_S else f"in about {in_words(wait)}"
        if f.start_low is not None and f.start_high is not None and wait > NOW_S:
            low, high = ("now" if t.timestamp() - now <= NOW_S else in_words(t.timestamp() - now)
                         for t in (f.start_low, f.start_high))
            when += f" ({_band(in_words(wait), low, high)})"
        parts.append(f"would start {when}" + (f" on {_nodes(f.nodes)}" if f.nodes else ""))
        if f.finish is not None:
            parts.append(f"would finish about {in_words(f.finish.timestamp() - now)} from now")
    elif f is not None:
        why = mig_never_fits(mig) if mig and f.reason is WaitReason.NEVER_FITS else CONSTRAINED.get(f.reason)
        parts.append("no start expected within the forecast's horizon" + (f": {why}" if why else ""))
    else:
        parts.append("would be accepted")
    blockers = [b for b in (out.quota.blocked_by, f.waits_for if f else None) if b]
    if blockers:
        parts.append("blocked meanwhile by: " + ", ".join(dict.fromkeys(blockers)))
    elif f is None:
        parts.append(f"the quota of queue `{out.queue}` admits it now")
    if out.quota.admitted and out.quota.gpu_model:
        parts.append(f"admitted against the {out.quota.gpu_model} quota of queue "
                     f"`{out.queue}`: it runs on {out.quota.gpu_model} GPUs")
    if out.forecast_unavailable:
        parts.append(f"no forecast: {out.forecast_unavailable}")
    if out.array_size is not None:  # the forecast is one element's, alone
        if f is None:
            parts[0] = f"an array of {out.array_size} jobs would be accepted"
        else:
            parts.insert(0, f"an array of {out.array_size} jobs, forecast for one element "
                            "alone")
    return "; ".join(parts)
