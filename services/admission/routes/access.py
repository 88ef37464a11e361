"""Who calls (``/v1/me``), and the API tokens an admin creates, lists and revokes."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status

from services.admission import tokens
from services.admission.deps import Admin, Caller, EngineDep, TokenCacheDep
from services.admission.models.access import Me, TokenCreated, TokenIn, TokenOut, token_out

router = APIRouter()


@router.get("/v1/me", response_model=Me)
async def whoami(caller: Caller) -> Me:
    """The tenant, user and role of the calling token."""
    return Me(tenant=caller.tenant, user=caller.user, role=caller.role,
              token_id=caller.token_id)


@router.post("/v1/tokens", status_code=201, response_model=TokenCreated)
async def create_token(body: TokenIn, caller: Admin, engine: EngineDep) -> TokenCreated:
    """Create an API token (admin). The secret is in this answer only."""
    row, plaintext = await tokens.create_token(
        engine, body.tenant, body.role, body.name,
        timedelta(seconds=body.expires_in_s) if body.expires_in_s else None,
        created_by=caller.user)
    return TokenCreated(**token_out(row).model_dump(), token=plaintext)


@router.get("/v1/tokens", response_model=list[TokenOut])
async def list_tokens(
    caller: Admin, engine: EngineDep,
    tenant: Annotated[str | None, Query(max_length=63)] = None,
) -> list[TokenOut]:
    """Every token, without its secret (admin)."""
    return [token_out(r) for r in await tokens.list_tokens(engine, tenant)]


@router.delete("/v1/tokens/{token_id}", response_model=TokenOut)
async def revoke_token(token_id: str, caller: Admin, engine: EngineDep,
                       token_cache: TokenCacheDep) -> TokenOut:
    """Revoke a token at once (admin); its next request gets 401 'token revoked'."""
    row = await tokens.revoke_token(engine, token_id)
    token_cache.clear()  # refused from now on, on this replica at once
    if row is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no token {token_id}")
    return token_out(row)
