"""Gateway operations (issue 5): usage accounting and per-tenant submit rate limits.

Revision ID: 0004
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def _run(sql: str) -> None:
    # asyncpg prepares each statement, so run them one at a time
    for stmt in sql.split(";"):
        if stmt.strip():
            op.execute(stmt)


def upgrade() -> None:
    # admission: one row per task replica run (an attempt of it on a node), from its
    # `running` report to its end, with the GPUs it holds (a share counts its fraction).
    # GET /v1/usage sums gpus x the part of [started_at, ended_at) inside a range.
    _run("""
    CREATE TABLE task_runs (
        job_id text NOT NULL,
        task_id text NOT NULL,
        attempt int NOT NULL,
        tenant text NOT NULL,
        queue text NOT NULL,
        node_id text,
        gpus double precision NOT NULL,
        shared boolean NOT NULL DEFAULT false,
        started_at timestamptz NOT NULL,
        ended_at timestamptz,
        PRIMARY KEY (job_id, task_id, attempt),
        CHECK (ended_at IS NULL OR ended_at >= started_at)
    );
    CREATE INDEX task_runs_tenant_idx ON task_runs (tenant, started_at);
    CREATE INDEX task_runs_started_idx ON task_runs (started_at);
    CREATE INDEX task_runs_open_idx ON task_runs (job_id) WHERE ended_at IS NULL;
    CREATE TABLE submit_buckets (
        tenant text PRIMARY KEY,
        tokens double precision NOT NULL,
        updated_at timestamptz NOT NULL
    );
    CREATE INDEX jobs_tenant_list_idx ON jobs (tenant, submitted_at, id);
    CREATE INDEX jobs_list_idx ON jobs (submitted_at, id)
    """)
    # Runs recorded before this revision, rebuilt from the job history: a task's
    # `running` report, ended by its own end report or by the job moving past it.
    _run(r"""
    INSERT INTO task_runs (job_id, task_id, attempt, tenant, queue, node_id, gpus, shared,
                           started_at, ended_at)
    SELECT DISTINCT ON (e.job_id, e.task, e.attempt)
           e.job_id, e.task, e.attempt, j.tenant, j.queue, e.node_id,
           CASE WHEN COALESCE((t.spec->'resources'->>'gpu')::int, 0) > 0
                THEN (t.spec->'resources'->>'gpu')::double precision
                ELSE COALESCE((t.spec->'resources'->>'gpuCompute')::double precision, 0) / 100
           END,
           COALESCE((t.spec->'resources'->>'gpu')::int, 0) = 0,
           e.occurred_at,
           CASE WHEN ends.at IS NOT NULL THEN GREATEST(e.occurred_at, ends.at) END
    FROM job_events e
    JOIN jobs j ON j.id = e.job_id
    LEFT JOIN LATERAL (
        SELECT ts AS spec FROM jsonb_array_elements(j.spec->'tasks') ts
        WHERE ts->>'name' = regexp_replace(e.task, '-[0-9]+(\.[0-9]+)?$', '') LIMIT 1) t
        ON true
    LEFT JOIN LATERAL (
        SELECT LEAST(
            (SELECT min(x.occurred_at) FROM job_events x
              WHERE x.job_id = e.job_id AND x.task = e.task AND x.attempt = e.attempt
                AND x.seq > e.seq
                AND x.state IN ('succeeded', 'failed', 'cancelled', 'preempted')),
            (SELECT min(x.occurred_at) FROM job_events x
              WHERE x.job_id = e.job_id AND x.task IS NULL AND x.seq > e.seq
                AND (x.attempt > e.attempt
                     OR x.state IN ('succeeded', 'failed', 'cancelled', 'preempted')))) AS at
        ) ends ON true
    WHERE e.task IS NOT NULL AND e.state = 'running'
    ORDER BY e.job_id, e.task, e.attempt, e.seq
    ON CONFLICT DO NOTHING
    """)


def downgrade() -> None:
    _run("""
    DROP INDEX IF EXISTS jobs_list_idx;
    DROP INDEX IF EXISTS jobs_tenant_list_idx;
    DROP TABLE IF EXISTS submit_buckets, task_runs
    """)
