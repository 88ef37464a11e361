"""Bearer-token authentication and roles.

Every /v1 route depends on ``Caller`` (any active token) or ``Admin`` (an admin token),
both in ``services.admission.deps``. Tokens live hashed in ``api_tokens``
(``services.admission.tokens``). Refusals:

- no token, or not ``Authorization: Bearer ...``: 401 with ``WWW-Authenticate: Bearer``;
- unknown, expired or revoked token: 401 whose detail says which;
- a ``user`` token on an admin route: 403.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import HTTPException, status
from sqlalchemy.ext.asyncio import AsyncEngine

from services.admission import tokens


@dataclass(frozen=True)
class Principal:
    tenant: str
    user: str
    role: str  # "user" | "admin"
    token_id: str | None = None

    @property
    def admin(self) -> bool:
        return self.role == "admin"


async def principal_of(engine: AsyncEngine, secret: str | None,
                       cache: tokens.TokenCache | None) -> Principal:
    """The caller a bearer token's secret names; 401 for none, or a token refused."""
    if not secret:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="missing bearer token: send 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    try:
        row = await tokens.resolve(engine, secret, cache)
    except tokens.TokenRefused as exc:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, detail=exc.reason,
            headers={"WWW-Authenticate": f'Bearer error="invalid_token", '
                                         f'error_description="{exc.reason}"'},
        ) from exc
    return Principal(tenant=row["tenant"], user=row["name"], role=row["role"],
                     token_id=row["id"])


def admin_only(caller: Principal) -> Principal:
    """The caller, if an admin; 403 otherwise."""
    if not caller.admin:
        raise HTTPException(status.HTTP_403_FORBIDDEN,
                            detail=f"admin role required (this token's role is {caller.role})")
    return caller
