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

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError

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
    description: str = Field("", max_length=500)

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
        if q.lending_limit is not None:
            g = q.guaranteed.values() if q.guaranteed else (None, None, None)
            for r, lend, nom in zip(RESOURCES, q.lending_limit.values(), g, strict=True):
                if lend is not None and nom is not None and lend > nom:
                    errors.append((f"{at}.lending_limit.{r}", f"{lend:g} exceeds the "
                                   f"guaranteed {nom:g}"))
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
