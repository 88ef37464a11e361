"""The scheduler's lease gets a time to live and its holder's session (issue 15): a
standby takes over a leader paused past its lease, and at once one whose session ended.

Revision ID: 0009
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def _run(sql: str) -> None:
    # asyncpg prepares each statement, so run them one at a time
    for stmt in sql.split(";"):
        if stmt.strip():
            op.execute(stmt)


def upgrade() -> None:
    _run("""
    ALTER TABLE scheduler_leases ADD COLUMN expires_at timestamptz;
    ALTER TABLE scheduler_leases ADD COLUMN holder_pid int;
    ALTER TABLE scheduler_leases ADD COLUMN holder_since timestamptz
    """)


def downgrade() -> None:
    _run("""
    ALTER TABLE scheduler_leases DROP COLUMN holder_since;
    ALTER TABLE scheduler_leases DROP COLUMN holder_pid;
    ALTER TABLE scheduler_leases DROP COLUMN expires_at
    """)
