"""An admin's labels and taints per node (``kairos node label|taint``), beside what its
agent reports: in the gateway's read model (``nodes_view``) and in the scheduler's own
rows (``sched_nodes``), so they survive restarts of either and re-registrations of the
node. ``labels_generation`` rises with each change; replays are ignored.

Revision ID: 0016
"""

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ("nodes_view", "sched_nodes"):
        op.execute(f"""ALTER TABLE {table}
            ADD COLUMN admin_labels jsonb NOT NULL DEFAULT '{{}}'::jsonb,
            ADD COLUMN admin_taints jsonb NOT NULL DEFAULT '[]'::jsonb,
            ADD COLUMN labels_generation bigint NOT NULL DEFAULT 0""")


def downgrade() -> None:
    for table in ("nodes_view", "sched_nodes"):
        op.execute(f"""ALTER TABLE {table} DROP COLUMN admin_labels,
            DROP COLUMN admin_taints, DROP COLUMN labels_generation""")
