"""Monitor replicas (issue 7).

Revision ID: 0007
"""

from alembic import op

revision = "0007"
down_revision = "0006"
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
