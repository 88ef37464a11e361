"""The scheduler's decayed past use per tenant (fair share over past usage, the
fairshare plugin's ``half_life_s``): GPU-seconds decayed to ``at`` (epoch seconds), so a
new leader goes on from where the last one left it.

Revision ID: 0017
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""CREATE TABLE sched_usage (
        tenant text PRIMARY KEY,
        gpu_s double precision NOT NULL,
        at double precision NOT NULL)""")


def downgrade() -> None:
    op.execute("DROP TABLE sched_usage")
