"""Bearer-token authentication. Today: the development token of the embedded stack.

Every /v1 route depends on ``Caller``; per-tenant tokens later slot in here without
changing any route or test.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from fastapi import HTTPException, Request, status


@dataclass(frozen=True)
class Principal:
    tenant: str
    user: str
    role: str  # "user" | "admin"


def authenticate(request: Request) -> Principal:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="missing bearer token: send 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    dev_token: str = request.app.state.settings.dev_token
    if dev_token and hmac.compare_digest(token, dev_token):
        return Principal(tenant="default", user="dev", role="admin")
    raise HTTPException(
        status.HTTP_401_UNAUTHORIZED,
        detail="invalid or expired token",
        headers={"WWW-Authenticate": "Bearer"},
    )
