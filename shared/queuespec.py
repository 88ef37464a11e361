"""The queue spec: one node of the queue tree, as the queues file, the admin API and
the ``queue.changed`` event carry it. Admission validates with it; queueing applies it.

Units: GPUs (fractions count GPU shares), CPU millicores, memory MiB.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator

from shared.gpu_models import expand

NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
TENANT_PATTERN = r"^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)?$"
DEFAULT_QUEUE = "default"


class QueueState(StrEnum):
    OPEN = "open"  # accepts submits, admits its jobs
    CLOSED = "closed"  # refuses submits and admits nothing; what runs keeps running
    DRAINING = "draining"  # refuses submits; admits and runs the jobs it already holds


class Amount(BaseModel):
    """Some resources; a missing one is not limited."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    gpus: float | None = Field(None, ge=0, description="GPUs (fractions count GPU shares)")
    cpu_milli: int | None = Field(None, ge=0)
    memory_mib: int | None = Field(None, ge=0)

    def values(self) -> tuple[float | None, float | None, float | None]:
        return (self.gpus, None if self.cpu_milli is None else float(self.cpu_milli),
                None if self.memory_mib is None else float(self.memory_mib))


RESOURCES = ("gpus", "cpu_milli", "memory_mib")
MAX_MODEL_QUOTAS = 16


def model_key(name: str) -> str:
    """The name a quota gives a GPU model: the family (``H100``: every size of it) or the
    family with its memory (``A100-80GB``). Raises ValueError for an unknown model."""
    names = expand(name)
    return names[0] if len(names) == 1 else names[-1]


class ModelQuota(BaseModel):
    """A queue's GPUs of one model (Kueue's quota per ResourceFlavor): as ``guaranteed``,
    ``borrowing_limit`` and ``lending_limit`` of the queue, counted in GPUs of this model
    only; a missing number is not limited by this queue (a cohort's guaranteed: the sum
    of its children's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    model: str = Field(max_length=128, description="a GPU family (H100) or family with its "
                       "memory (A100-80GB), as a job's gpuModel")
    guaranteed: float | None = Field(None, ge=0, validation_alias=AliasChoices(
        "guaranteed", "nominal"))
    borrowing_limit: float | None = Field(None, ge=0)
    lending_limit: float | None = Field(None, ge=0)

    @field_validator("model")
    @classmethod
    def _known(cls, v: str) -> str:
        return model_key(v)  # a ValueError names what is wrong


def _overlap(a: str, b: str) -> bool:
    return bool(set(expand(a)) & set(expand(b)))


class QueueSpec(BaseModel):
    """One node of the queue tree: a queue (holds jobs) or a cohort (only groups)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(pattern=NAME_PATTERN, description="lower-case letters, digits, '-'")
    kind: Literal["queue", "cohort"] = "queue"
    parent: str | None = Field(None, validation_alias=AliasChoices("parent", "cohort"),
                               description="the cohort or queue above it; none = top level")
    tenant: str = Field("", pattern=TENANT_PATTERN, description="whose queue it is; "
                        "empty = its parent's tenant, or shared by every tenant at the top")
    guaranteed: Amount | None = Field(None, validation_alias=AliasChoices(
        "guaranteed", "nominal"), description="nominal quota; none = the sum of its children's")
    borrowing_limit: Amount | None = Field(None, description="how far above guaranteed it "
                                           "may go with its cohort's unused quota")
    lending_limit: Amount | None = Field(None, description="how much of its guarantee others "
                                         "may borrow (the rest is kept for it)")
    weight: float = Field(1.0, gt=0, description="fair-share weight")
    state: QueueState = QueueState.OPEN
    strategy: Literal["best_effort", "strict"] = Field(
        "best_effort", description="strict: a job that must wait holds back those after it")
    gpu_models: tuple[ModelQuota, ...] | None = Field(
        None, max_length=MAX_MODEL_QUOTAS, description="GPU quota per model, in the order "
        "its jobs try them: a GPU job of a tree that names models is admitted against the "
        "first of them (its own gpuModel first) whose quota has room, and runs on it")
    billing_weights: dict[str, float] | None = Field(
        None, max_length=32, description="what one GPU-hour of a model counts as in usage "
        "and fair share (H100: 4, V100: 1), as Slurm's TRESBillingWeights; inherited from "
        "its parent, model by model; a model none names counts 1")
    description: str = Field("", max_length=500)

    @field_validator("billing_weights")
    @classmethod
    def _weights(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v is None:
            return v
        out: dict[str, float] = {}
        for name, w in v.items():
            key = model_key(name)  # a ValueError names an unknown model
            if not (w > 0 and w <= 1e6):
                raise ValueError(f"{name}: a billing weight is above 0 and at most 1e6")
            if any(_overlap(key, k) for k in out):
                raise ValueError(f"{name} overlaps a model named before: name each once")
            out[key] = float(w)
        return out

    @field_validator("gpu_models")
    @classmethod
    def _distinct_models(cls, v: tuple[ModelQuota, ...] | None) -> tuple[ModelQuota, ...] | None:
        for i, a in enumerate(v or ()):
            for b in (v or ())[:i]:
                if _overlap(a.model, b.model):
                    raise ValueError(f"{a.model} and {b.model} overlap: name each GPU model once")
        return v

    def model_quota(self, key: str) -> ModelQuota | None:
        return next((m for m in self.gpu_models or () if m.model == key), None)

    def public(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self.public(), sort_keys=True).encode()).hexdigest()


def _path(loc: Sequence[int | str]) -> str:
    return ".".join(str(x) for x in loc) or "<root>"


def validation_errors(exc: ValidationError, prefix: str = "") -> list[tuple[str, str]]:
    return [(f"{prefix}.{_path(e['loc'])}" if prefix else _path(e["loc"]), e["msg"])
            for e in exc.errors(include_url=False)]


def tree_errors(specs: Mapping[str, QueueSpec], where: Mapping[str, str]) -> list[tuple[str, str]]:
    """What a set of queues cannot be, beyond each one's own fields: an unknown parent, a
    cycle, a tenant that differs from its parent's, a lending limit above the guarantee or
    a borrowing limit without a parent. ``where`` maps a name to its field path prefix."""
    errors: list[tuple[str, str]] = []
    for name, q in specs.items():
        at = where.get(name, name)
        if q.parent is not None:
            if q.parent not in specs:
                near = difflib.get_close_matches(q.parent, list(specs), n=1)
                hint = f" (did you mean {near[0]!r}?)" if near else ""
                errors.append((f"{at}.parent", f"unknown queue or cohort {q.parent!r}{hint}"))
            elif q.parent == name:
                errors.append((f"{at}.parent", "a queue cannot be its own parent"))
        seen = {name}
        p = q.parent
        while p is not None and p in specs:
            if p in seen:
                errors.append((f"{at}.parent", f"the parents of {name!r} form a cycle"))
                break
            seen.add(p)
            p = specs[p].parent
        if q.tenant and q.parent is not None and q.parent in specs:
            above = effective_tenant(specs, q.parent)
            if above and above != q.tenant:
                errors.append((f"{at}.tenant", f"{q.tenant!r} differs from its parent "
                               f"{q.parent!r}'s tenant {above!r}"))
        if q.borrowing_limit is not None and q.parent is None:
            errors.append((f"{at}.borrowing_limit", "needs a parent to borrow from"))
        for k, m in enumerate(q.gpu_models or ()):
            if m.borrowing_limit is not None and q.parent is None:
                errors.append((f"{at}.gpu_models.{k}.borrowing_limit", "needs a parent to "
                               "borrow from"))
            if None not in (m.lending_limit, m.guaranteed) and m.lending_limit > m.guaranteed:  # type: ignore[operator]
                errors.append((f"{at}.gpu_models.{k}.lending_limit", f"{m.lending_limit:g} "
                               f"exceeds the guaranteed {m.guaranteed:g}"))
        if q.lending_limit is not None:
            g = q.guaranteed.values() if q.guaranteed else (None, None, None)
            for r, lend, nom in zip(RESOURCES, q.lending_limit.values(), g, strict=True):
                if lend is not None and nom is not None and lend > nom:
                    errors.append((f"{at}.lending_limit.{r}", f"{lend:g} exceeds the "
                                   f"guaranteed {nom:g}"))
    return errors + _model_overlaps(specs, where)


def _top(specs: Mapping[str, QueueSpec], name: str) -> str:
    seen = {name}
    while (p := specs[name].parent) is not None and p in specs and p not in seen:
        seen.add(p)
        name = p
    return name


def _model_overlaps(specs: Mapping[str, QueueSpec], where: Mapping[str, str]
                    ) -> list[tuple[str, str]]:
    """One tree names each GPU model one way: ``H100`` in one queue and ``H100-80GB`` in
    another would be two quotas of the same GPUs."""
    first: dict[str, dict[str, str]] = {}  # top -> model key -> the queue naming it first
    errors: list[tuple[str, str]] = []
    for name in sorted(specs):
        keys = first.setdefault(_top(specs, name), {})
        for k, m in enumerate(specs[name].gpu_models or ()):
            clash = next((o for o in keys if o != m.model and _overlap(o, m.model)), None)
            if clash is not None:
                errors.append((f"{where.get(name, name)}.gpu_models.{k}.model", (
                    f"{m.model} overlaps {clash} of queue {keys[clash]} in the same tree: "
                    "name each GPU model one way")))
            keys.setdefault(m.model, name)
    return errors


def effective_tenant(specs: Mapping[str, QueueSpec], name: str) -> str:
    """Its own tenant, else its nearest ancestor's; empty = shared by every tenant."""
    seen: set[str] = set()
    q = specs.get(name)
    while q is not None and q.name not in seen:
        if q.tenant:
            return q.tenant
        seen.add(q.name)
        q = specs.get(q.parent) if q.parent else None
    return ""
