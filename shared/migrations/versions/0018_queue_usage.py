"""Queueing's decayed past use per queue (fair share between queues over past usage,
``ordering.half_life_s`` of the queues file): GPU-seconds decayed to ``at`` and the GPUs
the queue held since, updated in each cycle of its tree under the tree's lock, so every
replica and a restarted one go on from the same figure.

Revision ID: 0018
"""

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""CREATE TABLE queue_usage (
        queue text PRIMARY KEY,
        gpu_s double precision NOT NULL,
        held double precision NOT NULL,
        at double precision NOT NULL)""")


def downgrade() -> None:
    op.execute("DROP TABLE queue_usage")
