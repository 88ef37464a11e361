"""The supervisor's schedule and bookkeeping, on a fake clock with fake children."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path

from kairos.supervisor import Supervisor, backoff_s, describe_exit


def test_the_first_restart_is_at_once_then_the_wait_doubles_to_a_30_s_cap() -> None:
    assert [backoff_s(n) for n in range(1, 10)] == [0, 0.5, 1, 2, 4, 8, 16, 30, 30]


def test_exit_descriptions() -> None:
    assert describe_exit(3) == "exit code 3"
    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert describe_exit(None) == "exit status unknown"


@dataclass
class FakeChild:
    name: str
    log: Path | None = None
    gone: bool = False
    code: int | None = None
    restarts: int = 0
    fail: bool = False

    def exited(self) -> tuple[bool, int | None]:
        return self.gone, self.code

    def restart(self) -> None:
        if self.fail:
            raise RuntimeError("port busy")
        self.restarts += 1
        self.gone, self.code = False, None

    def die(self, code: int) -> None:
        self.gone, self.code = True, code


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_restarts_after_the_backoff_and_says_why(tmp_path: Path) -> None:
    log = tmp_path / "queueing.log"
    log.write_text("starting\nTraceback: boom\n")
    clock, notes = Clock(), []
    sup = Supervisor(say=notes.append, clock=clock)
    child = FakeChild("queueing", log)
    sup.poll([child])
    child.die(-signal.SIGKILL)
    sup.poll([child])  # the first restart: in the poll that noticed the exit
    assert child.restarts == 1
    assert "queueing exited (killed by SIGKILL); restart #1 now" in notes[-2]
    assert "Traceback: boom" in notes[-2]  # the last lines of its log
    assert "supervisor: queueing exited (killed by SIGKILL)" in log.read_text()
    assert log.read_text().rstrip().endswith("supervisor: queueing restarted")
    # it dies again at once: it waits, and the wait doubles
    child.die(1)
    sup.poll([child])
    assert "(exit code 1); restart #2 in 0.5s" in notes[-1]
    clock.now += 0.4
    sup.poll([child])
    assert child.restarts == 1  # still waiting
    clock.now += 0.1
    sup.poll([child])
    assert child.restarts == 2
    child.die(1)
    sup.poll([child])
    assert "(exit code 1); restart #3 in 1s" in notes[-1]
    clock.now += 0.9
    sup.poll([child])
    assert child.restarts == 2
    clock.now += 0.1
    sup.poll([child])
    assert child.restarts == 3


def test_backoff_starts_over_once_a_child_ran_a_minute() -> None:
    clock, notes = Clock(), []
    sup = Supervisor(say=notes.append, clock=clock)
    child = FakeChild("scheduler")
    sup.poll([child])
    for _ in range(3):  # three quick failures: 0, 0.5, 1
        child.die(1)
        sup.poll([child])
        clock.now += 2
        sup.poll([child])
    assert child.restarts == 3
    clock.now += 60
    sup.poll([child])
    child.die(1)
    sup.poll([child])
    assert "restart #1 now" in notes[-2]


def test_a_failed_restart_is_retried_with_more_backoff() -> None:
    clock, notes = Clock(), []
    sup = Supervisor(say=notes.append, clock=clock)
    broker = FakeChild("broker", fail=True)
    sup.poll([broker])
    broker.die(-signal.SIGTERM)
    sup.poll([broker])  # restart #1 at once fails
    assert "broker exited (restart failed: port busy); restart #2 in 0.5s" in notes[-1]
    clock.now += 0.5
    sup.poll([broker])
    assert "broker exited (restart failed: port busy); restart #3 in 1s" in notes[-1]
    broker.fail = False
    clock.now += 1
    sup.poll([broker])
    assert broker.restarts == 1


def test_a_child_no_longer_listed_is_left_alone() -> None:
    clock = Clock()
    sup = Supervisor(say=lambda _: None, clock=clock)
    a, b = FakeChild("a"), FakeChild("b")
    sup.poll([a, b])
    for _ in range(2):  # restarted at once, then they die again: both wait 0.5 s
        a.die(0)
        b.die(0)
        sup.poll([a, b])
    clock.now += 1
    sup.poll([b])  # a was stopped on purpose meanwhile
    assert (a.restarts, b.restarts) == (1, 2)
