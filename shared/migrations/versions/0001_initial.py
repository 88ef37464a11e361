"""Initial schema: each service's own tables, prefixed by owner.

Revision ID: 0001
"""

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _run(sql: str) -> None:
    # asyncpg prepares each statement, so run them one at a time
    for stmt in sql.split(";"):
        if stmt.strip():
            op.execute(stmt)


def upgrade() -> None:
    # admission: jobs and their history (a read model fed by jobs.status), the outbox,
    # the node read model, and API tokens.
    _run("""
    CREATE TABLE jobs (
        id text PRIMARY KEY,
        name text NOT NULL,
        queue text NOT NULL,
        tenant text NOT NULL,
        "user" text NOT NULL,
        spec jsonb NOT NULL,
        state text NOT NULL,
        reason text NOT NULL DEFAULT '',
        attempt int NOT NULL DEFAULT 1,
        exit_code int,
        idempotency_key text,
        submitted_at timestamptz NOT NULL,
        updated_at timestamptz NOT NULL,
        UNIQUE (tenant, idempotency_key)
    );
    CREATE INDEX jobs_state_idx ON jobs (state);
    CREATE INDEX jobs_queue_idx ON jobs (queue, submitted_at);
    CREATE TABLE job_events (
        seq bigserial PRIMARY KEY,
        event_id text NOT NULL UNIQUE,
        job_id text NOT NULL,
        state text NOT NULL,
        reason text NOT NULL DEFAULT '',
        attempt int NOT NULL DEFAULT 1,
        exit_code int,
        task text,
        node_id text,
        message text,
        occurred_at timestamptz NOT NULL
    );
    CREATE INDEX job_events_job_idx ON job_events (job_id, seq);
    CREATE TABLE outbox (
        seq bigserial PRIMARY KEY,
        event_id text NOT NULL UNIQUE,
        topic text NOT NULL,
        key text NOT NULL,
        payload bytea NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now(),
        published_at timestamptz
    );
    CREATE INDEX outbox_unpublished_idx ON outbox (seq) WHERE published_at IS NULL;
    CREATE INDEX outbox_published_idx ON outbox (published_at);
    CREATE TABLE nodes_view (
        node_id text PRIMARY KEY,
        inventory jsonb NOT NULL,
        state text NOT NULL,
        last_heartbeat timestamptz,
        registered_at timestamptz NOT NULL
    );
    CREATE TABLE allocations_view (
        job_id text NOT NULL,
        task_id text NOT NULL,
        node_id text NOT NULL,
        attempt int NOT NULL,
        gpus jsonb NOT NULL,
        cpu_milli int NOT NULL,
        memory_mib int NOT NULL,
        bound_at timestamptz NOT NULL,
        PRIMARY KEY (job_id, task_id)
    );
    CREATE INDEX allocations_view_node_idx ON allocations_view (node_id);
    """)
    # queueing: the jobs it holds, in arrival order per queue.
    _run("""
    CREATE TABLE queue_jobs (
        job_id text PRIMARY KEY,
        seq bigserial NOT NULL,
        queue text NOT NULL,
        tenant text NOT NULL,
        state text NOT NULL,
        event jsonb NOT NULL,
        received_at timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX queue_jobs_waiting_idx ON queue_jobs (queue, seq) WHERE state = 'queued';
    """)
    # scheduler: leader epoch, the jobs it holds, and the node inventory it knows.
    _run("""
    CREATE TABLE scheduler_leases (
        name text PRIMARY KEY,
        epoch bigint NOT NULL,
        holder text NOT NULL,
        acquired_at timestamptz NOT NULL
    );
    CREATE TABLE sched_jobs (
        job_id text PRIMARY KEY,
        state text NOT NULL,
        attempt int NOT NULL,
        ready jsonb NOT NULL,
        placement jsonb NOT NULL DEFAULT '[]'::jsonb,
        tasks jsonb NOT NULL DEFAULT '{}'::jsonb,
        updated_at timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX sched_jobs_active_idx ON sched_jobs (state)
        WHERE state NOT IN ('succeeded', 'failed', 'cancelled');
    CREATE TABLE sched_nodes (
        node_id text PRIMARY KEY,
        inventory jsonb NOT NULL,
        state text NOT NULL,
        updated_at timestamptz NOT NULL DEFAULT now()
    );
    """)


def downgrade() -> None:
    _run("""
    DROP TABLE IF EXISTS sched_nodes, sched_jobs, scheduler_leases, queue_jobs,
        allocations_view, nodes_view, outbox, job_events, jobs;
    """)
