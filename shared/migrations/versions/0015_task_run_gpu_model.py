"""Each task replica run records the GPU model of the node it ran on
(``task_runs.gpu_model``; empty for runs before this and for runs without GPUs), so usage
can be reported per model and billed at each queue's weights per model.

Revision ID: 0015
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE task_runs ADD COLUMN gpu_model text NOT NULL DEFAULT ''")


def downgrade() -> None:
    op.execute("ALTER TABLE task_runs DROP COLUMN gpu_model")
