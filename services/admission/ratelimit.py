"""Per-tenant submit rate limits: a token bucket per tenant, kept in PostgreSQL so that
every gateway replica draws from the same bucket.

One statement takes a token: it refills the bucket for the time since its last use
(``rate`` a second, up to ``burst``) and takes one if there is one, under the row's
lock, so concurrent submits of a tenant on any replica are counted exactly. A refusal is
429 with ``Retry-After``: the seconds until the next token.
"""

from __future__ import annotations

import math

from fastapi import HTTPException, status
from prometheus_client import Counter
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.admission.settings import AdmissionSettings, SubmitLimit
from shared.db import autocommit

REFUSED = Counter("kairos_admission_refusals_total",
                  "Submits refused by admission policy, by reason", ["reason"])

_TAKE = text("""
    INSERT INTO submit_buckets AS b (tenant, tokens, updated_at)
    VALUES (:tenant, :burst - 1, now())
    ON CONFLICT (tenant) DO UPDATE SET
        tokens = LEAST(:burst, b.tokens + :rate * GREATEST(0, EXTRACT(EPOCH FROM now()
                 - b.updated_at))) - 1,
        updated_at = GREATEST(b.updated_at, now())
    WHERE LEAST(:burst, b.tokens + :rate * GREATEST(0, EXTRACT(EPOCH FROM now()
          - b.updated_at))) >= 1
    RETURNING tokens""")
_LEVEL = text("""
    SELECT LEAST(:burst, tokens + :rate * GREATEST(0, EXTRACT(EPOCH FROM now() - updated_at)))
    FROM submit_buckets WHERE tenant = :tenant""")


def limit_for(settings: AdmissionSettings, tenant: str) -> SubmitLimit:
    return settings.tenant_submit_limits.get(tenant) or SubmitLimit(
        rate_per_s=settings.submit_rate_per_s, burst=settings.submit_burst)


async def take(engine: AsyncEngine, tenant: str, limit: SubmitLimit) -> float | None:
    """Take one submit from the tenant's bucket: None if allowed, else the seconds to
    wait for the next token."""
    if limit.rate_per_s <= 0:
        return None
    params = {"tenant": tenant, "rate": limit.rate_per_s, "burst": float(limit.burst)}
    async with autocommit(engine).connect() as conn:  # one statement, atomic by itself
        if await conn.scalar(_TAKE, params) is not None:
            return None
        level = float(await conn.scalar(_LEVEL, params) or 0.0)
    return max(0.0, (1.0 - level) / limit.rate_per_s)


async def check_submit(engine: AsyncEngine, settings: AdmissionSettings, tenant: str) -> None:
    """Raise 429 with Retry-After when the tenant has submitted faster than its limit."""
    limit = limit_for(settings, tenant)
    wait = await take(engine, tenant, limit)
    if wait is None:
        return
    REFUSED.labels("rate_limited").inc()
    retry = max(1, math.ceil(wait))
    raise HTTPException(
        status.HTTP_429_TOO_MANY_REQUESTS,
        detail=(f"tenant {tenant} may submit {limit.rate_per_s:g} jobs a second (bursts of "
                f"{limit.burst}): retry in {retry} s"),
        headers={"Retry-After": str(retry)})
