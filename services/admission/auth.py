"""Bearer-token authentication and roles.

Every /v1 route depends on ``Caller`` (any active token) or ``Admin`` (an admin token).
Tokens live hashed in ``api_tokens`` (``services.admission.tokens``). Refusals:

- no token, or not ``Authorization: Bearer ...``: 401 with ``WWW-Authenticate: Bearer``;
- unknown, expired or revoked token: 401 whose detail says which;
- a ``user`` token on an admin route: 403.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from services.admission import tokens

_bearer = HTTPBearer(auto_error=False, description="an API token: `kairos token create`")


@dataclass(frozen=True)
class Principal:
    tenant: str
    user: str
    role: str  # "user" | "admin"
    token_id: str | None = None

    @property
    def admin(self) -> bool:
        return self.role == "admin"


async def authenticate(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    if credentials is None or not credentials.credentials:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="missing bearer token: send 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    try:
        row = await tokens.resolve(request.app.state.engine, credentials.credentials,
                                   getattr(request.app.state, "token_cache", None))
    except tokens.TokenRefused as exc:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, detail=exc.reason,
            headers={"WWW-Authenticate": f'Bearer error="invalid_token", '
                                         f'error_description="{exc.reason}"'},
        ) from exc
    return Principal(tenant=row["tenant"], user=row["name"], role=row["role"],
                     token_id=row["id"])


def require_admin(caller: Annotated[Principal, Depends(authenticate)]) -> Principal:
    if not caller.admin:
        raise HTTPException(status.HTTP_403_FORBIDDEN,
                            detail=f"admin role required (this token's role is {caller.role})")
    return caller
