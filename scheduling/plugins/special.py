"""Plugins that switch on a phase of the cycle: gang, backfill, elastic resizing."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from scheduling.framework import JobInfo, Plugin, register


@register
class Gang(Plugin):
    """All-or-nothing: place at least ``minAvailable`` (else every) replica, or none.

    Without it a job may start with any number of its replicas (plain pods).
    """

    name = "gang"

    def min_members(self, info: JobInfo) -> int | None:
        return info.job.min_members


class BackfillArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    depth: int = Field(1, ge=1, description="blocked jobs that get a reservation (1 = EASY)")
    default_runtime_s: float | None = Field(
        None, gt=0, description="assumed runtime of jobs without an estimate; None: they never end"
    )
    interval_s: float = Field(0.0, ge=0, description="a job's reservation is kept this long before it "
                              "is searched again (Slurm's bf_interval), while the job waits and its "
                              "start is ahead; 0: searched every cycle")


@register
class Backfill(Plugin):
    """EASY backfill: the blocked head job gets a reservation (nodes and a start time
    from running jobs' estimated ends); later jobs may use those nodes only if their
    estimate says they end before it; elsewhere they start freely."""

    name = "backfill"
    Args = BackfillArgs
    args: BackfillArgs


class ElasticArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    grow: bool = True
    shrink: bool = True


@register
class Elastic(Plugin):
    """Elastic jobs grow into idle GPUs (up to max replicas) and, under pressure, give
    replicas back down to their minimum before anything is preempted."""

    name = "elastic"
    Args = ElasticArgs
    args: ElasticArgs
