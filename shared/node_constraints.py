"""Where a job may run, in the shapes a Kubernetes user writes: node labels and a
``nodeSelector``, taints and ``tolerations``.

A node's taints come from its agent (``KAIROS_NODE_TAINTS``, Kubernetes' ``kubectl
taint`` syntax: ``key=value:NoSchedule``, comma-separated), its labels from its agent
(``KAIROS_NODE_LABELS``, ``key=value``) beside those the platform sets itself
(``kairos.io/gpu-model``, ``kairos.io/rack``). ``NoSchedule`` and ``NoExecute`` taints
keep out every job that does not tolerate them; ``PreferNoSchedule`` is a preference,
and the core, which places by hard rules here, does not hold a job to it.

The scheduling core takes a taint as the text ``key=value:Effect`` and a toleration as
either a key (tolerates every taint of that key) or that same text; ``core_tolerations``
writes a toleration so.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

# Kubernetes' label key: an optional DNS-subdomain prefix and a name of at most 63
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_KEY_RE = re.compile(rf"^([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_NAME}$")
LABEL_VALUE_RE = re.compile(rf"^({_NAME})?$")
LabelKey = Annotated[str, Field(max_length=317, pattern=LABEL_KEY_RE.pattern)]
LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_RE.pattern)]
MAX_SELECTOR = 32
MAX_TOLERATIONS = 32


class Effect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


HARD = (Effect.NO_SCHEDULE, Effect.NO_EXECUTE)


class Operator(StrEnum):
    EQUAL = "Equal"
    EXISTS = "Exists"


class Toleration(BaseModel):
    """Kubernetes' toleration: ``{key, operator: Equal, value, effect}`` tolerates that
    taint (every effect when ``effect`` is left out); ``operator: Exists`` every taint of
    the key. A key is required: a toleration of every taint would let a job onto nodes
    set apart for others."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True,
                              extra="forbid", frozen=True)
    key: LabelKey
    operator: Operator = Operator.EQUAL
    value: LabelValue = ""
    effect: Effect | None = None

    @model_validator(mode="after")
    def _exists_has_no_value(self) -> Toleration:
        if self.operator is Operator.EXISTS and self.value:
            raise ValueError("a toleration with operator Exists takes no value")
        return self


def core_tolerations(tolerations: list[Toleration]) -> tuple[str, ...]:
    """The tolerations as the core matches them (see the module's docstring)."""
    out: dict[str, None] = {}
    for t in tolerations:
        if t.operator is Operator.EXISTS:
            out[t.key] = None
        else:
            for effect in (t.effect,) if t.effect else HARD:
                out[f"{t.key}={t.value}:{effect}"] = None
    return tuple(out)


def parse_taint(text: str) -> tuple[str, Effect]:
    """``key=value:Effect`` or ``key:Effect`` (kubectl's syntax) as ``(key=value, effect)``.
    Raises ValueError naming what is wrong."""
    head, sep, effect = text.strip().rpartition(":")
    if not sep:
        raise ValueError(f"taint {text!r}: expected key=value:Effect (Effect one of "
                         f"{', '.join(Effect)})")
    try:
        eff = Effect(effect)
    except ValueError:
        raise ValueError(f"taint {text!r}: effect must be one of {', '.join(Effect)}") from None
    key, _, value = head.partition("=")
    if not LABEL_KEY_RE.match(key) or not LABEL_VALUE_RE.match(value):
        raise ValueError(f"taint {text!r}: key or value is not a valid label")
    return f"{key}={value}", eff


def parse_taints(text: str) -> list[str]:
    """A comma-separated list of taints, each written back as ``key=value:Effect``."""
    return [f"{kv}:{eff}" for kv, eff in (parse_taint(t) for t in text.split(",") if t.strip())]


def hard_taints(taints: list[str]) -> tuple[str, ...]:
    """The taints that keep a job out (PreferNoSchedule ones only ask)."""
    return tuple(t for t in taints if t.rpartition(":")[2] in HARD)


def parse_labels(text: str) -> dict[str, str]:
    """``key=value,key2=value2``; raises ValueError naming a bad one."""
    labels: dict[str, str] = {}
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not LABEL_KEY_RE.match(key) or not LABEL_VALUE_RE.match(value):
            raise ValueError(f"label {item!r}: expected key=value, each a valid label")
        labels[key] = value
    return labels
