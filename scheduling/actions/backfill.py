"""The backfill action (EASY): the first blocked job(s) get a reservation, a start time
and nodes from the running jobs' expected ends (scheduling.reservation); jobs after
them may use those nodes only if their estimate says they end before it.

Every starved job also gets its own start time (conservative backfill for them), so
one starved job behind another does not stop the cluster.
"""

from __future__ import annotations

import numpy as np

from scheduling.actions.base import BlockedJobAction, ShapeGroups
from scheduling.arrays import BoolArray
from scheduling.config import BackfillArgs
from scheduling.framework import JobInfo
from scheduling.model import JobRequest, PendingReason, Reservation
from scheduling.reservation import reserve
from scheduling.session import Session

STARVED_RESERVATIONS = 16  # starved jobs beyond the EASY head that get a reservation per cycle
_Kept = tuple[JobRequest, float, Reservation]  # the job, when its reservation was searched, the reservation


class Backfill(BlockedJobAction):
    name = "backfill"

    def __init__(self, args: BackfillArgs) -> None:
        self.args = args
        # kept across cycles (``interval_s``): the reservations of jobs still waiting for one
        self.reservations: dict[str, _Kept] = {}
        self.open_cycle()

    def open_cycle(self) -> None:
        self.tries = 0  # head jobs given their reservation search this cycle (``depth``)
        self.starved = 0  # starved jobs given one beyond them
        self.kept: dict[str, _Kept] = {}  # this cycle's reservations worth keeping

    def open(self, s: Session) -> None:
        self.open_cycle()

    def close(self) -> None:
        self.reservations = self.kept

    def rescue(self, s: Session, info: JobInfo, block: BoolArray | None, soft: bool) -> PendingReason | None:
        if self.tries < self.args.depth:
            self.tries += 1  # EASY: only the head job(s), found or not
            s.memo_grew = True
            self._reserve(s, info)
        elif info.starved and self.starved < STARVED_RESERVATIONS:
            self.starved += 1
            self._reserve(s, info)
        return None

    def settled(self, s: Session, info: JobInfo, soft: bool) -> bool:
        return self.tries >= self.args.depth

    def unsettled(self, s: Session, ordered: list[JobInfo], groups: ShapeGroups, live: BoolArray) -> BoolArray:
        return np.full(len(live), self.tries < self.args.depth)

    def _reserve(self, s: Session, info: JobInfo) -> None:
        now, job = s.cycle.now, info.job
        kept = self.reservations.get(job.job_id)
        idx = s.cycle.table.index
        if (kept is not None and kept[0] is job and now - kept[1] < self.args.interval_s and kept[2].start_time > now
                and all(n in idx for n in kept[2].node_ids)):
            res: Reservation | None = kept[2]  # recent, and its start is still ahead: kept
            self.kept[job.job_id] = kept
        else:
            res = self.search(s, info)
            if res is not None and self.args.interval_s > 0:
                self.kept[job.job_id] = (job, now, res)
        if res is None:
            return
        s.plan.reservations.append(res)
        s.reserve(res.node_ids, res.start_time, job.job_id)

    def search(self, s: Session, info: JobInfo) -> Reservation | None:
        """The job's reservation, from the state once the stopping jobs and this cycle's
        victims are gone."""
        base = s.future if s.future is not None else s.cycle.state
        victims = s.victims
        running = np.asarray([k for k, r in enumerate(s.cycle.running)
                              if not r.run.terminating and r.job.job_id not in victims], dtype=np.int64)
        if s.future is None and any(r.run.terminating for r in s.cycle.running):
            base = s.future_state()
        return reserve(s.placer, base, info, info.min_members, running, self.args.default_runtime_s, s.gone)
