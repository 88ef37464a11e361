"""Whether a submit may go to its queue: a queue of the caller's tenant or a shared one,
open, and with a quota that could ever admit the job. The queue routes use the same
visibility rule and tree check for the admin's changes."""

from __future__ import annotations

import json
from typing import Any

from fastapi import HTTPException, status
from sqlalchemy.ext.asyncio import AsyncEngine

from services.admission import queues_view
from services.admission.auth import Principal
from services.admission.ratelimit import REFUSED
from shared.jobspec import JobSpec
from shared.model_quota import ModelTrees
from shared.queuespec import DEFAULT_QUEUE, QueueSpec
from shared.quota_tree import BIG, EPS, RESOURCE_KEYS, UNITS, QueueTree, fmt, spec_demand


def visible(row: dict[str, Any] | None, caller: Principal) -> bool:
    """A user token sees its tenant's queues and the shared ones; an admin, every one."""
    return row is not None and (caller.admin or row["tenant"] in ("", caller.tenant))


def queue_specs(rows: list[dict[str, Any]]) -> dict[str, QueueSpec]:
    """The read model's queue rows as specs, by name."""
    out = {}
    for r in rows:
        s = r["settings"] if isinstance(r["settings"], dict) else json.loads(r["settings"])
        s = {k: v for k, v in s.items() if k in QueueSpec.model_fields}
        out[r["name"]] = QueueSpec.model_validate(s)
    return out


def unprocessable(errors: list[tuple[str, str]]) -> HTTPException:
    """A 422 listing (field, message) pairs."""
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=[
        {"field": f, "message": m, "type": "value_error"} for f, m in errors])


async def check_queue(engine: AsyncEngine, queue: str, caller: Principal,
                      spec: JobSpec | None = None,
                      cache: queues_view.QueueCache | None = None) -> None:
    """A job may go to an open queue of the caller's tenant or a shared one, and ask no
    more than that queue's quota could ever admit. The default queue is open before
    queueing has announced any queue (a fresh stack). ``cache``: the gateway's copy of
    the queues (one read a second rather than two a submit)."""
    rows = await (cache or queues_view.QueueCache(0)).rows(engine)
    row = rows.get(queue)
    if row is None and queue == DEFAULT_QUEUE:
        return
    if not visible(row, caller):
        names = [r["name"] for r in rows.values() if visible(r, caller)
                 and queue_specs([r])[r["name"]].kind == "queue" and r["state"] == "open"]
        raise unprocessable([("queue", f"no queue {queue!r}" + (
            f"; open queues: {', '.join(names)}" if names else ""))])
    assert row is not None
    if queue_specs([row])[queue].kind == "cohort":
        raise unprocessable([("queue", f"{queue!r} is a cohort: submit to one of its queues")])
    if row["state"] != "open":
        raise HTTPException(status.HTTP_409_CONFLICT, detail=(
            f"queue {queue} is {row['state']}: it accepts no new jobs"))
    if spec is not None:
        tree, models = quota_trees(rows, cache)
        check_ceiling(tree, queue, spec, models)


def quota_trees(rows: dict[str, dict[str, Any]], cache: queues_view.QueueCache | None
                ) -> tuple[QueueTree, ModelTrees]:
    """The queue tree and its GPU models from the read model's rows, built once per
    read of ``cache`` (kept in its ``derived``)."""
    derived = cache.derived if cache is not None else {}
    tree = derived.get("tree") or QueueTree(queue_specs(list(rows.values())).values())
    models = derived.get("models")
    if models is None or models.tree is not tree:
        models = ModelTrees(tree)
    derived["tree"], derived["models"] = tree, models
    return tree, models


def _amounts(v: tuple[float, float, float]) -> dict[str, float | None]:
    return {k: (x if x < BIG / 2 else None) for k, x in zip(RESOURCE_KEYS, v, strict=True)}


def check_ceiling(tree: QueueTree, queue: str, spec: JobSpec,
                  models: ModelTrees | None = None) -> None:
    """422 for a job larger than its queue's quota ceiling (guarantee plus all it may
    borrow, up the tree: ``QueueTree.ceiling``), or than the ceiling of every GPU model
    it may be admitted against: queueing would hold it forever with reason ``quota``.
    A tree without limits has no ceiling."""
    if queue not in tree.specs:
        return
    ceiling, ask = tree.ceiling(queue), spec_demand(spec)
    over = ceiling.exceeded(ask)
    if not over:
        _check_model_ceilings(models or ModelTrees(tree), queue, spec, ask[0])
        return
    REFUSED.labels("over_quota").inc()
    r = over[0]
    at = ceiling.at[r]
    where = "its guarantee with all it may borrow" + (
        f", bounded by {at} above it" if at != queue else "")
    raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=[{
        "field": "tasks", "type": "over_quota", "message": (
            f"the job asks for {fmt(ask[r])} {UNITS[r]} at once; queue {queue} can never "
            f"hold more than {fmt(ceiling.amount[r])} ({where}): it would wait forever"),
        "queue": queue, "limited_at": at, "ceiling": _amounts(ceiling.amount),
        "ask": _amounts(ask)}])


def _check_model_ceilings(models: ModelTrees, queue: str, spec: JobSpec, gpus: float) -> None:
    choices = models.choices(queue, gpus, spec.gpu_model_names)
    caps = {c.key: models.ceiling(queue, c.key) for c in choices}
    if any(gpus <= cap + EPS for cap in caps.values()):
        return
    REFUSED.labels("over_quota").inc()
    most = ", ".join(f"{fmt(cap)} {key}" for key, cap in caps.items())
    raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=[{
        "field": "gpuModel" if spec.gpu_model is not None else "tasks", "type": "over_quota",
        "message": (f"the job asks for {fmt(gpus)} GPUs at once; queue {queue} can never hold "
                    f"more than {most} GPUs (each model's guarantee with all it may borrow): "
                    "it would wait forever"),
        "queue": queue, "ceiling_by_model": caps, "ask": {"gpus": gpus}}])
