"""Queueing's hierarchical queues (issue 5).

Queueing owns ``queues`` (the configuration it applies: from its file at start, then from
admin commands), ``queue_requests`` (admin commands already answered, so a replay is not
applied twice) and ``queue_jobs`` (the jobs it holds, now with the quota they reserve).
Admission keeps a read model built from ``queues.events``: ``queues_view`` (each queue's
settings and its last status), ``queue_waiting_view`` (why each waiting job waits) and
``queue_requests_view`` (the answer to each admin command).

Revision ID: 0003
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def _run(sql: str) -> None:
    # asyncpg prepares each statement, so run them one at a time
    for stmt in sql.split(";"):
        if stmt.strip():
            op.execute(stmt)


def upgrade() -> None:
    # queueing: the queue tree and the quota each held job reserves
    _run("""
    CREATE TABLE queues (
        name text PRIMARY KEY,
        config jsonb NOT NULL,
        version int NOT NULL DEFAULT 1,
        source text NOT NULL,
        file_hash text,
        updated_at timestamptz NOT NULL DEFAULT now()
    );
    CREATE TABLE queue_requests (
        request_id text PRIMARY KEY,
        queue text NOT NULL,
        outcome text NOT NULL,
        error text NOT NULL DEFAULT '',
        applied_at timestamptz NOT NULL DEFAULT now()
    );
    ALTER TABLE queue_jobs
        ADD COLUMN attempt int NOT NULL DEFAULT 1,
        ADD COLUMN phase text NOT NULL DEFAULT '',
        ADD COLUMN borrowing boolean NOT NULL DEFAULT false,
        ADD COLUMN reason text NOT NULL DEFAULT '',
        ADD COLUMN notices int NOT NULL DEFAULT 0,
        ADD COLUMN admitted_at timestamptz,
        ADD COLUMN started_at timestamptz;
    CREATE INDEX queue_jobs_active_idx ON queue_jobs (queue)
        WHERE state IN ('queued', 'admitted', 'reclaiming');
    """)
    # admission's read model of the queues
    _run("""
    CREATE TABLE queues_view (
        name text PRIMARY KEY,
        parent text,
        tenant text NOT NULL DEFAULT '',
        state text NOT NULL,
        settings jsonb NOT NULL,
        version int NOT NULL DEFAULT 0,
        status jsonb NOT NULL DEFAULT '{}'::jsonb,
        updated_at timestamptz NOT NULL DEFAULT now()
    );
    CREATE TABLE queue_waiting_view (
        job_id text PRIMARY KEY,
        queue text NOT NULL,
        position int NOT NULL,
        reason text NOT NULL,
        detail text NOT NULL DEFAULT '',
        estimated_start timestamptz,
        updated_at timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX queue_waiting_view_queue_idx ON queue_waiting_view (queue);
    CREATE TABLE queue_requests_view (
        request_id text PRIMARY KEY,
        queue text NOT NULL,
        outcome text NOT NULL,
        error text NOT NULL DEFAULT '',
        at timestamptz NOT NULL DEFAULT now()
    );
    """)


def downgrade() -> None:
    _run("""
    DROP TABLE IF EXISTS queue_requests_view, queue_waiting_view, queues_view,
        queue_requests, queues;
    DROP INDEX IF EXISTS queue_jobs_active_idx;
    ALTER TABLE queue_jobs DROP COLUMN IF EXISTS attempt, DROP COLUMN IF EXISTS phase,
        DROP COLUMN IF EXISTS borrowing, DROP COLUMN IF EXISTS reason,
        DROP COLUMN IF EXISTS notices, DROP COLUMN IF EXISTS admitted_at,
        DROP COLUMN IF EXISTS started_at
    """)
