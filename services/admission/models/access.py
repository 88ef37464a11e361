"""Who calls (``/v1/me``) and the API tokens an admin manages."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from services.admission import tokens


class Me(BaseModel):
    tenant: str
    user: str
    role: str = Field(description="user or admin")
    token_id: str | None


class TokenIn(BaseModel):
    model_config = {"extra": "forbid"}
    tenant: str = Field(pattern=tokens.TENANT_RE.pattern, max_length=63,
                        description="the tenant whose jobs the token submits and sees")
    role: Literal["user", "admin"] = "user"
    name: str | None = Field(default=None, pattern=tokens.NAME_RE.pattern, max_length=63,
                             description="who or what uses it (jobs' user); default the tenant")
    expires_in_s: int | None = Field(default=None, ge=1, le=10 * 366 * 86400,
                                     description="seconds until it expires; empty = never")


class TokenOut(BaseModel):
    id: str
    tenant: str
    name: str
    role: Literal["user", "admin"]
    state: Literal["active", "expired", "revoked"]
    created_at: datetime
    created_by: str | None
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None


class TokenCreated(TokenOut):
    token: str = Field(description="the secret: shown this once, stored only as a hash")


def token_out(row: dict[str, Any]) -> TokenOut:
    return TokenOut(**{k: v for k, v in row.items() if k in TokenOut.model_fields},
                    state=tokens.token_state(row))
