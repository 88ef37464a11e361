"""The token store against real PostgreSQL: only hashes stored, expiry, revocation, the
development token, and the bootstrap command."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.admission import tokens
from shared.db import make_engine
from shared.durations import parse_duration

pytestmark = pytest.mark.db


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    e = make_engine(db_url, pool_size=2)
    yield e
    await e.dispose()


async def _raw_rows(engine: AsyncEngine) -> list[dict[str, object]]:
    async with engine.connect() as conn:
        return [dict(r) for r in (await conn.execute(text("SELECT * FROM api_tokens"))
                                  ).mappings()]


async def test_only_the_hash_of_a_token_is_stored(engine: AsyncEngine) -> None:
    row, plaintext = await tokens.create_token(engine, "vision", "user", "alice")
    assert plaintext.startswith("kairos_") and len(plaintext) > 40
    assert "token_sha256" not in row and plaintext not in str(row)
    [raw] = await _raw_rows(engine)
    assert raw["token_sha256"] == hashlib.sha256(plaintext.encode()).hexdigest()
    assert all(plaintext not in str(v) and plaintext[7:] not in str(v) for v in raw.values())
    assert (raw["tenant"], raw["name"], raw["role"]) == ("vision", "alice", "user")
    assert raw["expires_at"] is None and raw["revoked_at"] is None
    assert raw["last_used_at"] is None

    got = await tokens.resolve(engine, plaintext)
    assert (got["id"], got["tenant"], got["role"]) == (row["id"], "vision", "user")
    assert "token_sha256" not in got
    [raw] = await _raw_rows(engine)
    assert raw["last_used_at"] is not None

    second, other = await tokens.create_token(engine, "vision")
    assert other != plaintext and second["name"] == "vision"  # the name defaults to the tenant


async def test_unknown_expired_and_revoked_tokens_are_refused_with_the_reason(
        engine: AsyncEngine) -> None:
    with pytest.raises(tokens.TokenRefused, match=r"^invalid token$"):
        await tokens.resolve(engine, "kairos_not-a-token")
    row, plaintext = await tokens.create_token(engine, "nlp", expires_in=timedelta(days=30))
    assert row["expires_at"] - row["created_at"] == timedelta(days=30)
    await tokens.resolve(engine, plaintext)
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE api_tokens SET expires_at = now() - interval '1 s'"))
    with pytest.raises(tokens.TokenRefused, match=r"^token expired$"):
        await tokens.resolve(engine, plaintext)

    row, plaintext = await tokens.create_token(engine, "nlp", "admin")
    revoked = await tokens.revoke_token(engine, row["id"])
    assert revoked is not None and revoked["revoked_at"] is not None
    with pytest.raises(tokens.TokenRefused, match=r"^token revoked$"):
        await tokens.resolve(engine, plaintext)
    again = await tokens.revoke_token(engine, row["id"])  # idempotent: the first time stays
    assert again is not None and again["revoked_at"] == revoked["revoked_at"]
    assert await tokens.revoke_token(engine, "t-nope") is None
    states = {r["id"]: tokens.token_state(r) for r in await tokens.list_tokens(engine)}
    assert sorted(states.values()) == ["expired", "revoked"]
    assert await tokens.list_tokens(engine, "other") == []


async def test_bad_fields_are_refused_before_the_database(engine: AsyncEngine) -> None:
    for tenant, role, name in (("Vision", "user", None), ("a_b", "user", None),
                               ("ok", "root", None), ("ok", "user", "no spaces")):
        with pytest.raises(ValueError, match="must"):
            await tokens.create_token(engine, tenant, role, name)
    assert await _raw_rows(engine) == []


def test_durations() -> None:
    assert parse_duration("30d") == timedelta(days=30)
    assert parse_duration("12h") == timedelta(hours=12)
    assert parse_duration("90m") == timedelta(minutes=90)
    assert parse_duration("2w") == timedelta(weeks=2)
    assert parse_duration("3600") == timedelta(hours=1)
    for bad in ("", "0d", "-1d", "1y", "d"):
        with pytest.raises(ValueError, match="not a duration"):
            parse_duration(bad)


async def test_the_development_token_is_an_admin_registered_once(engine: AsyncEngine) -> None:
    assert await tokens.ensure_dev_token(engine, "kdev-one") is True
    assert await tokens.ensure_dev_token(engine, "kdev-one") is False  # a restart
    got = await tokens.resolve(engine, "kdev-one")
    assert (got["tenant"], got["name"], got["role"]) == ("default", "dev", "admin")
    # a new development token retires the old one
    assert await tokens.ensure_dev_token(engine, "kdev-two") is True
    with pytest.raises(tokens.TokenRefused, match="token revoked"):
        await tokens.resolve(engine, "kdev-one")
    two = await tokens.resolve(engine, "kdev-two")
    # revoked through the API, it stays revoked across restarts
    await tokens.revoke_token(engine, two["id"])
    assert await tokens.ensure_dev_token(engine, "kdev-two") is False
    with pytest.raises(tokens.TokenRefused, match="token revoked"):
        await tokens.resolve(engine, "kdev-two")
    assert "kdev" not in str(await _raw_rows(engine))


async def test_the_bootstrap_command_creates_lists_and_revokes(
        engine: AsyncEngine, db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    def run(*args: str) -> int:
        return tokens.main(["--database-url", db_url, *args])

    assert await asyncio.to_thread(run, "create", "--tenant", "ops", "--role", "admin",
                                   "--name", "root", "--expires-in", "7d") == 0
    out, err = capsys.readouterr()
    plaintext = out.strip()
    assert plaintext.startswith("kairos_") and "shown once" in err
    got = await tokens.resolve(engine, plaintext)
    assert (got["tenant"], got["name"], got["role"]) == ("ops", "root", "admin")
    assert got["expires_at"] is not None and got["created_by"] == "bootstrap"

    assert await asyncio.to_thread(run, "list") == 0
    out, _ = capsys.readouterr()
    assert got["id"] in out and "active" in out and plaintext not in out
    assert await asyncio.to_thread(run, "revoke", got["id"]) == 0
    assert await asyncio.to_thread(run, "revoke", "t-nope") == 1
    with pytest.raises(tokens.TokenRefused, match="token revoked"):
        await tokens.resolve(engine, plaintext)
    with pytest.raises(SystemExit) as exc:
        await asyncio.to_thread(run, "create", "--tenant", "Not_A_Label")
    assert exc.value.code == 2
