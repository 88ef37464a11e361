"""Forecasts (issue 18): the gateway's copy of each waiting job's latest forecast, from
``jobs.forecasts``; a status that ends the wait removes it.

Revision ID: 0012
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
    CREATE TABLE job_forecasts (
        job_id text PRIMARY KEY,
        as_of timestamptz NOT NULL,
        start timestamptz,
        finish timestamptz,
        start_low timestamptz,
        start_high timestamptz,
        nodes jsonb NOT NULL DEFAULT '[]'::jsonb,
        waits_for text,
        reason text
    )""")


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS job_forecasts")
