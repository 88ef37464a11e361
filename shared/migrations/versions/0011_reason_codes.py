"""Reasons as codes (issue 18): a transition's code beside its text in the history, and
the job a waiting job waits behind (``priority``, ``backfill_blocked``).

Revision ID: 0011
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # a row from before has no code: readers classify its text (shared/events/reasons.py)
    op.execute("ALTER TABLE job_events ADD COLUMN reason_code text")
    op.execute("ALTER TABLE queue_waiting_view ADD COLUMN blocked_by text")


def downgrade() -> None:
    op.execute("ALTER TABLE queue_waiting_view DROP COLUMN blocked_by")
    op.execute("ALTER TABLE job_events DROP COLUMN reason_code")
