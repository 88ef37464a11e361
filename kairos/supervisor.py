"""Restart what exits: the embedded stack's services, broker and PostgreSQL.

The supervisor holds no processes itself: each ``poll()`` gets the children that
should be running, notices those that exited, and restarts them once their backoff
is over. The clock is a parameter, so the schedule is tested without sleeping.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from shared import retry

BASE_S = 0.5
CAP_S = 30.0
STABLE_S = 60.0  # a child that ran this long starts its backoff over


def backoff_s(failures: int, base_s: float = BASE_S, cap_s: float = CAP_S) -> float:
    """The wait before restart number ``failures`` (1 = the first) of a child that keeps
    exiting: none for the first (a crash after a stable run costs only the process's own
    start, as kubelet restarts a container), then 0.5, 1, 2 ... capped at 30 s."""
    return 0.0 if failures <= 1 else retry.backoff_s(failures - 1, base_s, cap_s)


def describe_exit(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:  # Popen's way to say a signal ended it
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def log_tail(log: Path | None, lines: int = 10) -> str:
    if log is None or not log.exists():
        return ""
    with open(log, "rb") as f:
        f.seek(max(0, f.seek(0, 2) - 8192))  # the end is all we show
        text = f.read().decode(errors="replace")
    return "\n".join(text.splitlines()[-lines:])


class Child(Protocol):
    """Something the supervisor keeps running."""

    name: str

    @property
    def log(self) -> Path | None: ...

    def exited(self) -> tuple[bool, int | None]:
        """(whether it is gone, its exit code: negative for a signal, None if unknown)."""
        ...

    def restart(self) -> None:
        """Start it again like the first time (same port, data, environment)."""
        ...


@dataclass
class _Track:
    started_at: float
    failures: int = 0
    restart_at: float | None = None  # set while it is down, waiting for its backoff


class Supervisor:
    def __init__(self, say: Callable[[str], None] = print,
                 clock: Callable[[], float] = time.monotonic,
                 stable_s: float = STABLE_S) -> None:
        self.say = say
        self.clock = clock
        self.stable_s = stable_s
        self._tracks: dict[str, _Track] = {}

    def poll(self, children: Iterable[Child]) -> None:
        """One step: note who exited, restart those whose wait is over."""
        now = self.clock()
        seen = set()
        for child in children:
            seen.add(child.name)
            t = self._tracks.setdefault(child.name, _Track(started_at=now))
            if t.restart_at is None:
                gone, code = child.exited()
                if gone:
                    if now - t.started_at >= self.stable_s:
                        t.failures = 0
                    self._schedule(child, t, now, describe_exit(code), tail=True)
            if t.restart_at is not None and now >= t.restart_at:  # a first restart: at once
                try:
                    child.restart()
                except Exception as exc:  # any failure to start is retried with backoff
                    self._schedule(child, t, self.clock(), f"restart failed: {exc}")
                else:
                    t.started_at, t.restart_at = self.clock(), None
                    self._note(child, f"supervisor: {child.name} restarted")
        for name in set(self._tracks) - seen:  # stopped on purpose, or gone from the stack
            del self._tracks[name]

    def _schedule(self, child: Child, t: _Track, now: float, why: str,
                  tail: bool = False) -> None:
        t.failures += 1
        delay = backoff_s(t.failures)
        t.restart_at = now + delay
        at = time.strftime("%H:%M:%S", time.localtime(time.time() + delay))
        msg = (f"supervisor: {child.name} exited ({why}); restart #{t.failures} "
               + (f"in {delay:g}s at {at}" if delay else "now"))
        last = log_tail(child.log) if tail else ""
        self._note(child, msg + (f"; last lines of {child.log}:\n{last}" if last else ""))

    def _note(self, child: Child, msg: str) -> None:
        self.say(msg)
        if child.log is not None:  # the service's own log tells the same story
            try:
                with open(child.log, "a") as f:
                    f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {msg.splitlines()[0]}\n")
            except OSError:
                pass
