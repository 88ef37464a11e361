"""The base of every event payload: frozen, tolerant of newer fields, versioned.

Consumers tolerate unknown newer fields (``extra="ignore"``) so producers can add
optional fields without a coordinated deploy.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import ClassVar

from pydantic import BaseModel, ConfigDict


def utcnow() -> datetime:
    return datetime.now(UTC)


class Event(BaseModel):
    """Base of every payload: frozen, tolerant of newer fields, versioned."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    TYPE: ClassVar[str] = ""
    VERSION: ClassVar[int] = 1

    def key(self) -> str:  # pragma: no cover - every subclass overrides
        raise NotImplementedError
