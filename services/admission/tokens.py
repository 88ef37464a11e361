"""API tokens: per tenant, role ``user`` or ``admin``, stored hashed in PostgreSQL.

A token is ``kairos_`` + 256 random bits. Only its SHA-256 is stored (``api_tokens``);
the plaintext is returned once, at creation. A request's token is looked up by its hash
(a random secret of that size needs no salt or slow hash: nothing can be guessed from
the digest), then checked for revocation and expiry.

Bootstrap, for a fresh deployment without any admin token (runs the migrations first)::

    python -m services.admission.tokens create --tenant ops --role admin --name root
    python -m services.admission.tokens list
    python -m services.admission.tokens revoke t-0123456789ab

The database is ``KAIROS_DATABASE_URL`` (or ``--database-url``). The embedded stack
needs none of this: admission registers its development token (``KAIROS_DEV_TOKEN``) at
start as an admin token of tenant ``default`` named ``dev``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import re
import secrets
import sys
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from shared.db import autocommit
from shared.durations import parse_duration
from shared.events import utcnow

ROLES = ("user", "admin")
TENANT_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")  # a DNS label, like queues
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,62}$")
PREFIX = "kairos_"
DEV_TOKEN_SOURCE = "KAIROS_DEV_TOKEN"  # created_by of the development token's row
DEV_TENANT = "default"
LAST_USED_EVERY = timedelta(seconds=60)  # last_used_at is refreshed at most this often
# the columns an API may show: never the hash
PUBLIC_COLUMNS = ("id, tenant, name, role, created_at, created_by, expires_at, revoked_at,"
                  " last_used_at")


class TokenRefused(Exception):
    """The token is unknown, expired or revoked; ``reason`` is what the 401 says."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def new_secret() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def hash_token(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


def new_token_id() -> str:
    return "t-" + uuid.uuid4().hex[:12]


def check_fields(tenant: str, role: str, name: str | None) -> None:
    if not TENANT_RE.match(tenant):
        raise ValueError(f"tenant {tenant!r} must be lowercase letters, digits and '-'")
    if role not in ROLES:
        raise ValueError(f"role {role!r} must be one of {', '.join(ROLES)}")
    if name is not None and not NAME_RE.match(name):
        raise ValueError(f"name {name!r} must be letters, digits and . _ @ - (at most 63)")


def token_state(row: dict[str, Any], now: datetime | None = None) -> str:
    if row["revoked_at"] is not None:
        return "revoked"
    if row["expires_at"] is not None and row["expires_at"] <= (now or utcnow()):
        return "expired"
    return "active"


async def create_token(
    engine: AsyncEngine, tenant: str, role: str = "user", name: str | None = None,
    expires_in: timedelta | None = None, created_by: str | None = None,
) -> tuple[dict[str, Any], str]:
    """Create a token; returns (its row without the hash, the plaintext: shown once)."""
    check_fields(tenant, role, name)
    plaintext = new_secret()
    now = utcnow()
    async with engine.begin() as conn:
        row = (await conn.execute(
            text(f"""INSERT INTO api_tokens (id, tenant, name, role, token_sha256, created_at,
                         created_by, expires_at)
                     VALUES (:id, :tenant, :name, :role, :h, :now, :by, :exp)
                     RETURNING {PUBLIC_COLUMNS}"""),
            {"id": new_token_id(), "tenant": tenant, "name": name or tenant, "role": role,
             "h": hash_token(plaintext), "now": now, "by": created_by,
             "exp": now + expires_in if expires_in else None},
        )).mappings().one()
    return dict(row), plaintext


async def ensure_dev_token(engine: AsyncEngine, plaintext: str) -> bool:
    """Register the development token as admin ``dev`` of tenant ``default``, once, and
    revoke any earlier development token (a restart with a new one retires the old).
    A development token revoked through the API stays revoked. Returns True if added."""
    h = hash_token(plaintext)
    async with engine.begin() as conn:
        await conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('kairos-dev-token'))"))
        await conn.execute(
            text("""UPDATE api_tokens SET revoked_at = now()
                    WHERE created_by = :src AND token_sha256 <> :h AND revoked_at IS NULL"""),
            {"src": DEV_TOKEN_SOURCE, "h": h})
        added = await conn.scalar(
            text("""INSERT INTO api_tokens (id, tenant, name, role, token_sha256, created_by)
                    VALUES (:id, :tenant, 'dev', 'admin', :h, :src)
                    ON CONFLICT (token_sha256) DO NOTHING RETURNING id"""),
            {"id": new_token_id(), "tenant": DEV_TENANT, "h": h, "src": DEV_TOKEN_SOURCE})
    return added is not None


async def list_tokens(engine: AsyncEngine, tenant: str | None = None) -> list[dict[str, Any]]:
    where = "WHERE tenant = :tenant" if tenant else ""
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(f"SELECT {PUBLIC_COLUMNS} FROM api_tokens {where} ORDER BY created_at, id"),
            {"tenant": tenant})
        return [dict(r) for r in rows.mappings()]


async def revoke_token(engine: AsyncEngine, token_id: str) -> dict[str, Any] | None:
    """Revoke a token (again: a no-op keeping the first time). None if there is none."""
    async with engine.begin() as conn:
        row = (await conn.execute(
            text(f"""UPDATE api_tokens SET revoked_at = COALESCE(revoked_at, now())
                     WHERE id = :id RETURNING {PUBLIC_COLUMNS}"""), {"id": token_id})
        ).mappings().first()
    return dict(row) if row else None


class TokenCache:
    """Token rows this replica read in the last ``ttl_s`` seconds, by digest: a submit
    then authenticates without a database round trip. Expiry is still judged on every
    request (from the row); a revocation is seen at once on the replica that made it
    (``clear``) and within ``ttl_s`` on the others, as Kubernetes' webhook token
    authenticator caches its answers for a while."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._rows: dict[str, tuple[float, dict[str, Any]]] = {}

    def get(self, digest: str) -> dict[str, Any] | None:
        hit = self._rows.get(digest)
        if hit is None or time.monotonic() >= hit[0]:
            return None
        return hit[1]

    def put(self, digest: str, row: dict[str, Any]) -> None:
        if self.ttl_s <= 0:
            return
        if len(self._rows) > 10_000:  # bounded: a flood of distinct bad tokens is not kept
            self._rows.clear()
        self._rows[digest] = (time.monotonic() + self.ttl_s, row)

    def clear(self) -> None:
        self._rows.clear()


async def resolve(engine: AsyncEngine, plaintext: str,
                  cache: TokenCache | None = None) -> dict[str, Any]:
    """The row of an active token, or TokenRefused saying why not."""
    digest = hash_token(plaintext)
    row = cache.get(digest) if cache is not None else None
    if row is None:
        async with autocommit(engine).connect() as conn:
            found = (await conn.execute(
                text(f"SELECT {PUBLIC_COLUMNS}, token_sha256 FROM api_tokens"
                     " WHERE token_sha256 = :h"), {"h": digest})).mappings().first()
        if found is None or not hmac.compare_digest(found["token_sha256"], digest):
            raise TokenRefused("invalid token")
        row = dict(found)
        if cache is not None:
            cache.put(digest, row)
    now = utcnow()
    state = token_state(row, now)
    if state != "active":
        raise TokenRefused(f"token {state}")
    if row["last_used_at"] is None or now - row["last_used_at"] > LAST_USED_EVERY:
        async with autocommit(engine).connect() as conn:
            await conn.execute(
                text("UPDATE api_tokens SET last_used_at = :now WHERE id = :id"),
                {"now": now, "id": row["id"]})
        row["last_used_at"] = now  # the cached row too: one update per interval
    out = dict(row)
    del out["token_sha256"]
    return out


# --- the bootstrap command: straight to the database, no token needed -------------------


def _print_rows(rows: list[dict[str, Any]]) -> None:
    print(f"{'id':16} {'tenant':16} {'name':16} {'role':6} {'state':8} expires")
    for r in rows:
        exp = r["expires_at"].isoformat(timespec="seconds") if r["expires_at"] else "never"
        print(f"{r['id']:16} {r['tenant']:16} {r['name']:16} {r['role']:6} "
              f"{token_state(r):8} {exp}")


async def _main(args: argparse.Namespace) -> int:
    from services.admission.settings import AdmissionSettings
    from shared.db import make_engine, prepare_database

    url = args.database_url or AdmissionSettings().database_url
    await prepare_database(url)
    engine = make_engine(url, pool_size=1)
    try:
        if args.command == "create":
            expires = parse_duration(args.expires_in) if args.expires_in else None
            row, plaintext = await create_token(engine, args.tenant, args.role, args.name,
                                                expires, created_by="bootstrap")
            print(f"created {row['id']}: tenant {row['tenant']}, role {row['role']}, "
                  f"name {row['name']} (the token is shown once)", file=sys.stderr)
            print(plaintext)
        elif args.command == "list":
            _print_rows(await list_tokens(engine, args.tenant))
        else:
            if await revoke_token(engine, args.id) is None:
                print(f"no token {args.id}", file=sys.stderr)
                return 1
            print(f"revoked {args.id}")
        return 0
    finally:
        await engine.dispose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services.admission.tokens",
        description="Manage API tokens directly in the database (bootstrap an admin).")
    parser.add_argument("--database-url", help="default: KAIROS_DATABASE_URL")
    sub = parser.add_subparsers(dest="command", required=True)
    create = sub.add_parser("create", help="create a token; prints it once on stdout")
    create.add_argument("--tenant", required=True)
    create.add_argument("--role", choices=ROLES, default="user")
    create.add_argument("--name", help="who or what uses it (default: the tenant)")
    create.add_argument("--expires-in", help="e.g. 30d, 12h; default: never")
    listing = sub.add_parser("list", help="tokens without their secrets")
    listing.add_argument("--tenant")
    revoke = sub.add_parser("revoke", help="revoke a token by id")
    revoke.add_argument("id")
    args = parser.parse_args(argv)
    try:
        if args.command == "create":
            check_fields(args.tenant, args.role, args.name)
            if args.expires_in:
                parse_duration(args.expires_in)
    except ValueError as exc:
        parser.error(str(exc))
    return asyncio.run(_main(args))


if __name__ == "__main__":
    sys.exit(main())
