"""Which forecasts to publish: a job's first, one that moved materially since the last
one sent (its start or finish by more than ``move_ratio`` of the time to its start and
more than ``move_s``; a start where there was none, its reason or blocker at all), and every one again
``refresh_s`` after it was last sent, so a reader that missed one (or started after it)
catches up within that. A change of nodes alone is not material: the replay's choice
among equal nodes moves with every arrival, and rides along with the next send. The topic stays small: a steady queue costs one event per job a
minute, not one per round. Pure: the caller passes the time."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from shared.events import JobForecast


def _moved(old: float | None, new: float | None, now: float, ratio: float, floor_s: float) -> bool:
    if (old is None) != (new is None):
        return True
    if old is None or new is None:
        return False
    return abs(new - old) > max(floor_s, ratio * max(0.0, min(old, new) - now))


@dataclass
class Publisher:
    move_ratio: float = 0.05
    move_s: float = 30.0
    refresh_s: float = 60.0
    sent: dict[str, tuple[JobForecast, float]] = field(default_factory=dict)  # by job, with when

    def changed(self, old: JobForecast, new: JobForecast, now: float) -> bool:
        if (old.waits_for, old.reason) != (new.waits_for, new.reason):
            return True
        return any(_moved(getattr(old, k), getattr(new, k), now, self.move_ratio, self.move_s)
                   for k in ("start", "finish", "start_low", "start_high"))

    def select(self, forecasts: Mapping[str, JobForecast], now: float) -> list[JobForecast]:
        """The forecasts to send now; forgets jobs that wait no longer."""
        out = []
        for job_id, f in forecasts.items():
            last = self.sent.get(job_id)
            if last is None or now - last[1] >= self.refresh_s or self.changed(last[0], f, now):
                out.append(f)
        for job_id in self.sent.keys() - forecasts.keys():
            del self.sent[job_id]
        return out

    def mark_sent(self, sent: list[JobForecast], now: float) -> None:
        """After the broker took them (a failed send is tried again next round)."""
        for f in sent:
            self.sent[f.job_id] = (f, now)
