"""Node agent: logs, dataset cache (issue 6); GPU health in the node read model.

Revision ID: 0006
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def _run(sql: str) -> None:
    # asyncpg prepares each statement, so run them one at a time
    for stmt in sql.split(";"):
        if stmt.strip():
            op.execute(stmt)


def upgrade() -> None:
    # admission: the node read model's unhealthy GPUs from nodes.telemetry (a list of
    # {index, health, readings}), the set in short form that decides a write, and when
    # it last changed.
    _run("""
    ALTER TABLE nodes_view ADD COLUMN gpu_health jsonb NOT NULL DEFAULT '[]';
    ALTER TABLE nodes_view ADD COLUMN gpu_health_key text NOT NULL DEFAULT '';
    ALTER TABLE nodes_view ADD COLUMN gpu_health_changed_at timestamptz
    """)


def downgrade() -> None:
    _run("""
    ALTER TABLE nodes_view DROP COLUMN IF EXISTS gpu_health_changed_at;
    ALTER TABLE nodes_view DROP COLUMN IF EXISTS gpu_health_key;
    ALTER TABLE nodes_view DROP COLUMN IF EXISTS gpu_health
    """)
