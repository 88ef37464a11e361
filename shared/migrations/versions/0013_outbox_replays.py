"""Outbox rows count the refills that marked them (``replays``): a relay marks a row
published only if no refill marked it since the relay read it, so a send that an empty
broker's refill overtook is sent again instead of being marked lost as published.

Revision ID: 0013
"""

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE outbox ADD COLUMN replays integer NOT NULL DEFAULT 0")


def downgrade() -> None:
    op.execute("ALTER TABLE outbox DROP COLUMN replays")
