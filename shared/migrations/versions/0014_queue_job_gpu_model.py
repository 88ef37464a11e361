"""Queueing remembers which GPU model's quota an admitted job holds (``queue_jobs.gpu_model``;
empty where the tree gives models no quota of their own), so usage per model survives a
restart.

Revision ID: 0014
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE queue_jobs ADD COLUMN gpu_model text NOT NULL DEFAULT ''")


def downgrade() -> None:
    op.execute("ALTER TABLE queue_jobs DROP COLUMN gpu_model")
