"""Queueing's hierarchical queues (issue 5).

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
    # Reserved so parallel work can each own one revision; no tables yet.
    _run("SELECT 1")


def downgrade() -> None:
    pass
