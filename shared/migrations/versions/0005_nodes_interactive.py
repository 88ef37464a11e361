"""Node cordon/drain and interactive environments (issue 5).

Revision ID: 0005
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def _run(sql: str) -> None:
    # asyncpg prepares each statement, so run them one at a time
    for stmt in sql.split(";"):
        if stmt.strip():
            op.execute(stmt)


def upgrade() -> None:
    # scheduler: a node's operator state ('' | cordoned | draining) and the generation
    # of the last command applied, so a replayed command is ignored after a failover.
    _run("""
    ALTER TABLE sched_nodes ADD COLUMN cordon text NOT NULL DEFAULT '';
    ALTER TABLE sched_nodes ADD COLUMN cordon_generation bigint NOT NULL DEFAULT 0;
    ALTER TABLE sched_nodes ADD COLUMN cordon_reason text NOT NULL DEFAULT ''
    """)
    # admission: the node read model's scheduling state (schedulable | cordoned |
    # draining | drained) with the generation that set it (commands count up from it),
    # and where an interactive environment's running attempt can be reached.
    _run("""
    ALTER TABLE nodes_view ADD COLUMN scheduling text NOT NULL DEFAULT 'schedulable';
    ALTER TABLE nodes_view ADD COLUMN scheduling_generation bigint NOT NULL DEFAULT 0;
    ALTER TABLE nodes_view ADD COLUMN scheduling_reason text NOT NULL DEFAULT '';
    ALTER TABLE jobs ADD COLUMN connection jsonb;
    ALTER TABLE jobs ADD COLUMN connection_attempt int;
    CREATE INDEX jobs_interactive_idx ON jobs (tenant, submitted_at)
        WHERE spec->>'kind' = 'Interactive'
    """)


def downgrade() -> None:
    _run("""
    DROP INDEX IF EXISTS jobs_interactive_idx;
    ALTER TABLE jobs DROP COLUMN IF EXISTS connection_attempt;
    ALTER TABLE jobs DROP COLUMN IF EXISTS connection;
    ALTER TABLE nodes_view DROP COLUMN IF EXISTS scheduling_reason;
    ALTER TABLE nodes_view DROP COLUMN IF EXISTS scheduling_generation;
    ALTER TABLE nodes_view DROP COLUMN IF EXISTS scheduling;
    ALTER TABLE sched_nodes DROP COLUMN IF EXISTS cordon_reason;
    ALTER TABLE sched_nodes DROP COLUMN IF EXISTS cordon_generation;
    ALTER TABLE sched_nodes DROP COLUMN IF EXISTS cordon
    """)
