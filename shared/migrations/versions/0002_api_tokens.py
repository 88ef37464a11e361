"""Admission's API tokens: per tenant, with a role, stored as a SHA-256 hash only.

Revision ID: 0002
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def _run(sql: str) -> None:
    # asyncpg prepares each statement, so run them one at a time
    for stmt in sql.split(";"):
        if stmt.strip():
            op.execute(stmt)


def upgrade() -> None:
    # The plaintext is shown once at creation and never stored: a token is looked up by
    # the SHA-256 of its (256-bit random) secret.
    _run("""
    CREATE TABLE api_tokens (
        id text PRIMARY KEY,
        tenant text NOT NULL,
        name text NOT NULL,
        role text NOT NULL CHECK (role IN ('user', 'admin')),
        token_sha256 text NOT NULL UNIQUE CHECK (token_sha256 ~ '^[0-9a-f]{64}$'),
        created_at timestamptz NOT NULL DEFAULT now(),
        created_by text,
        expires_at timestamptz,
        revoked_at timestamptz,
        last_used_at timestamptz
    );
    CREATE INDEX api_tokens_tenant_idx ON api_tokens (tenant, created_at);
    """)


def downgrade() -> None:
    _run("DROP TABLE IF EXISTS api_tokens")
