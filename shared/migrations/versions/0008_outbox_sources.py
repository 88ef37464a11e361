"""Every service's decisions go through the outbox (issue 15): rows carry their source,
so each service's relay publishes its own; a row that can never be published is set
aside with its reason instead of blocking those behind it.

Revision ID: 0008
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def _run(sql: str) -> None:
    # asyncpg prepares each statement, so run them one at a time
    for stmt in sql.split(";"):
        if stmt.strip():
            op.execute(stmt)


def upgrade() -> None:
    _run("""
    ALTER TABLE outbox ADD COLUMN source text NOT NULL DEFAULT 'admission';
    ALTER TABLE outbox ADD COLUMN dead_reason text;
    DROP INDEX outbox_unpublished_idx;
    CREATE INDEX outbox_unpublished_idx ON outbox (source, seq) WHERE published_at IS NULL;
    CREATE INDEX outbox_dead_idx ON outbox (seq) WHERE dead_reason IS NOT NULL
    """)


def downgrade() -> None:
    _run("""
    DROP INDEX outbox_dead_idx;
    DROP INDEX outbox_unpublished_idx;
    CREATE INDEX outbox_unpublished_idx ON outbox (seq) WHERE published_at IS NULL;
    ALTER TABLE outbox DROP COLUMN dead_reason;
    ALTER TABLE outbox DROP COLUMN source
    """)
