"""The node's lease: proof that the monitor has heard from this node recently.

Every heartbeat the broker acknowledges renews it, as of the moment the heartbeat was
*sent* (the monitor saw it no earlier), so an acknowledgement that arrives late, after
a pause, cannot make the lease look fresher than it is. Unrenewed for
``fence_after_s``, it has expired: the monitor may declare the node lost (after its own
``lost_after_s``, which must be longer) and the scheduler may place its tasks elsewhere,
so the agent fences itself (``NodeAgent.check_lease``).

The monotonic clock keeps running while the process is stopped (SIGSTOP), so a pause
shows up as an expired lease the moment the process runs again. The last renewal is
also kept on disk (wall clock), so a restarted agent knows how long the node went
unheard while it was down.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path


class Lease:
    def __init__(self, fence_after_s: float, path: Path | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.fence_after_s = fence_after_s
        self._path = path
        self._clock = clock
        self.renewed_at = clock()  # a new agent starts with a full lease
        stamp = self._load()
        if stamp is not None:  # a restart: the lease is as old as the last renewal
            self.renewed_at -= max(0.0, time.time() - stamp)

    def age(self) -> float:
        return self._clock() - self.renewed_at

    def expired(self) -> bool:
        return self.age() > self.fence_after_s

    def renew(self, sent_at: float) -> None:
        """A heartbeat sent at ``sent_at`` (this lease's clock) was acknowledged."""
        if sent_at <= self.renewed_at:
            return
        self.renewed_at = sent_at
        if self._path is not None:
            wall = time.time() - (self._clock() - sent_at)
            self._path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self._path.with_suffix(".tmp")
            tmp.write_text(f"{wall:.3f}")
            tmp.replace(self._path)

    def _load(self) -> float | None:
        if self._path is None:
            return None
        with contextlib.suppress(OSError, ValueError):
            return float(self._path.read_text())
        return None
