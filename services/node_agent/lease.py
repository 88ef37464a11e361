"""The node's lease: proof that the monitor has heard from this node recently.

Every heartbeat the broker acknowledges renews it, as of the moment the heartbeat was
*sent* (the monitor saw it no earlier), so an acknowledgement that arrives late, after
a pause, cannot make the lease look fresher than it is. Unrenewed for
``fence_after_s``, it has expired: the monitor may declare the node lost (after its own
``lost_after_s``, which must be longer) and the scheduler may place its tasks elsewhere,
so the agent fences itself (``fencing.LeaseFence``).

The monotonic clock keeps running while the process is stopped (SIGSTOP), so a pause
shows up as an expired lease the moment the process runs again. The last renewal is
also kept on disk (wall clock), so a restarted agent knows how long the node went
unheard while it was down: in the node's own file, or, for an agent process hosting many
nodes, in one ``LeaseBook`` for all of them, written once per heartbeat round (writing a
file per node per heartbeat took more than half of a 250-node agent's CPU). A crash
before the book is written leaves the previous round's stamps: older than the truth,
so a restarted agent may fence sooner than it had to, never later.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path

from services.node_agent.atomic_file import write_json, write_text


class LeaseBook:
    """The last renewal (wall clock) of every lease of one agent process, in one file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamps: dict[str, float] = {}
        self._dirty = False
        with contextlib.suppress(OSError, ValueError, TypeError):
            self._stamps = {str(k): float(v)
                            for k, v in json.loads(path.read_text()).items()}

    def get(self, key: str) -> float | None:
        return self._stamps.get(key)

    def put(self, key: str, wall: float) -> None:
        self._stamps[key] = wall
        self._dirty = True

    def flush(self) -> None:
        """Write what changed since the last flush, atomically (a torn file would read as
        no stamp at all: a full lease)."""
        if not self._dirty:
            return
        write_json(self.path, self._stamps)
        self._dirty = False


class Lease:
    def __init__(self, fence_after_s: float, path: Path | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 book: LeaseBook | None = None, key: str = "") -> None:
        """``path``: the node's own stamp file. ``book`` (with the node's ``key``): the
        process's shared one, which the caller flushes after a round of renewals; a node
        not in the book yet reads its own file, if it has one (an older agent's)."""
        self.fence_after_s = fence_after_s
        self._path = path
        self._book, self._key = book, key
        self._clock = clock
        self.renewed_at = clock()  # a new agent starts with a full lease
        stamp = book.get(key) if book is not None else None
        if stamp is None:
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
        if self._book is not None:
            self._book.put(self._key, time.time() - (self._clock() - sent_at))
        elif self._path is not None:
            wall = time.time() - (self._clock() - sent_at)
            write_text(self._path, f"{wall:.3f}")

    def _load(self) -> float | None:
        if self._path is None:
            return None
        with contextlib.suppress(OSError, ValueError):
            return float(self._path.read_text())
        return None
