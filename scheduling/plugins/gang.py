"""Gang scheduling: a job's replicas start together or not at all."""

from __future__ import annotations

from scheduling.framework import JobInfo, Plugin, register


@register
class Gang(Plugin):
    """All-or-nothing: place at least ``minAvailable`` (else every) replica, or none.

    Without it a job may start with any number of its replicas (plain pods).
    """

    name = "gang"

    def min_members(self, info: JobInfo) -> int | None:
        return info.job.min_members
