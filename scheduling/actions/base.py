"""The action interface: one step of a cycle over the ``Session`` (Volcano's
``framework.Action``), and the steps the allocate action asks about a blocked job."""

from __future__ import annotations

from typing import ClassVar, NamedTuple

from scheduling.arrays import BoolArray, IntArray
from scheduling.framework import JobInfo
from scheduling.model import PendingReason
from scheduling.session import Session


class Action:
    """Built once per scheduler from the config. What an action carries from one cycle
    to the next is its own state, named where it is kept."""

    name: ClassVar[str] = ""

    def open(self, s: Session) -> None:
        """Start of a cycle: reset what the action keeps for one cycle only."""

    def execute(self, s: Session) -> None:
        """The action's pass over the cycle (none for one only asked about blocked jobs)."""

    def close(self) -> None:
        """End of a cycle: keep what the next cycle needs."""


class ShapeGroups(NamedTuple):
    """The ordered pending jobs grouped by (shape, static priority, tenant), as the
    bulk skip groups them: one job of each group, each job's group, each job's side
    (1: reservations keep it off the reserved nodes)."""

    first: IntArray
    inverse: IntArray
    sides: IntArray


class BlockedJobAction(Action):
    """An action that acts for a job that did not fit for want of room, asked in config
    order by the allocate action right then: what it does (nodes claimed for a
    preemptor, nodes reserved) changes what the jobs after it may use."""

    def rescue(self, s: Session, info: JobInfo, block: BoolArray | None, soft: bool) -> PendingReason | None:
        """Act for the blocked job; a reason replaces its own (None: it keeps it)."""
        return None

    def settled(self, s: Session, info: JobInfo, soft: bool) -> bool:
        """Whether this action would no longer try anything for this job this cycle."""
        return True

    def unsettled(self, s: Session, ordered: list[JobInfo], groups: ShapeGroups, live: BoolArray) -> BoolArray:
        """``settled`` negated for every ordered job at once; ``live``: the jobs that
        failed for want of room and are otherwise settled."""
        return live & False


def settled(rescuers: list[BlockedJobAction], s: Session, info: JobInfo, soft: bool) -> bool:
    """Neither a preemption nor a reservation (nor any blocked-job action) would be
    tried for this job."""
    return all(a.settled(s, info, soft) for a in rescuers)
