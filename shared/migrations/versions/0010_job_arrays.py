"""Job arrays and the intake lag (issue 16): one submit, many jobs. The array keeps the request (its spec,
indices and cap, the Idempotency-Key a retry is known by); each element is a job row
that names its array and index. The gateway's overload bound reads the oldest job
queueing has not taken up yet, often: a partial index keeps that one row away.

Revision ID: 0010
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def _run(sql: str) -> None:
    # asyncpg prepares each statement, so run them one at a time
    for stmt in sql.split(";"):
        if stmt.strip():
            op.execute(stmt)


def upgrade() -> None:
    _run("""
    CREATE TABLE job_arrays (
        id text PRIMARY KEY,
        name text NOT NULL,
        queue text NOT NULL,
        tenant text NOT NULL,
        "user" text NOT NULL,
        spec jsonb NOT NULL,
        indices text NOT NULL,
        size int NOT NULL,
        max_running int,
        idempotency_key text,
        submitted_at timestamptz NOT NULL,
        UNIQUE (tenant, idempotency_key)
    );
    ALTER TABLE jobs ADD COLUMN array_id text;
    ALTER TABLE jobs ADD COLUMN array_index int;
    CREATE INDEX jobs_by_array ON jobs (array_id, array_index) WHERE array_id IS NOT NULL;
    CREATE INDEX jobs_unseen ON jobs (submitted_at) WHERE state = 'pending' AND reason = 'accepted'
    """)


def downgrade() -> None:
    _run("""
    DROP INDEX jobs_unseen;
    DROP INDEX jobs_by_array;
    ALTER TABLE jobs DROP COLUMN array_index;
    ALTER TABLE jobs DROP COLUMN array_id;
    DROP TABLE job_arrays
    """)
