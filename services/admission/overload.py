"""Graceful overload: past what the platform can take, a submit is refused at once with
429 and ``Retry-After`` instead of waiting in a queue nobody sees.

Two bounds, each cheap to check on every submit (a pure ASGI middleware in front of the
submit routes, before the body is read or a token looked up):

- **a bounded wait for a slot**: a replica handles ``max_submits_in_flight`` submits at
  once; the next ones wait their turn, first come first served, and one that has waited
  too long without getting a slot is refused. This is CoDel's rule (judge the time spent
  queued, not the time spent served), in the form Facebook's RPC servers use: a burst
  into a queue that was empty within the last ``submit_burst_wait_s`` may wait that
  long, but once the queue has stood that long (sustained overload) a submit waits at
  most ``submit_queue_wait_s``. The wait in the gate is the one part of a submit's
  latency that only overload makes, so it tells overload apart from a machine that is
  merely slower, and a client's burst apart from a rate the platform cannot take. A slower machine serves fewer submits per second, not
  fewer submits at once, so the gateway takes all it can serve and refuses the rest;
  accepted submits take at most the wait bound plus their own service time.
  (An earlier limit adapted to the whole submit latency: on a busy machine that latency
  rose with everyone's CPU, the limit shrank, and the gateway refused submits it could
  have served: half the throughput of no gate at all under overload.)
- **intake lag**: how long the oldest accepted job has gone without queueing taking it
  up (still ``pending`` with reason ``accepted``: its event unpublished, unread, or not
  yet ordered). It covers the outbox, the broker and queueing in one figure, and every
  replica reads the same one from PostgreSQL (sampled every ``intake_sample_s``). Past
  ``max_intake_lag_s`` the platform is behind, and more work would only lengthen what
  every job waits: new submits are refused until it catches up.

A job stuck behind for twice the bound has its submit event sent again (marked in the
outbox for its relay): if that event was lost on the way (a broker that died with it),
the platform heals instead of refusing every submit from then on; queueing takes a
duplicate up once. It is sent again at most once per twice the bound.

Nothing accepted is lost either way: a refusal stores nothing, and a client retries
after ``Retry-After`` (with its Idempotency-Key, a retry is safe).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from urllib.parse import parse_qs

from prometheus_client import Gauge, Histogram
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from services.admission.arrays import SOURCE
from services.admission.event_ids import SUBMITTED_EVENT_PREFIX
from services.admission.ratelimit import REFUSED
from services.admission.request_metrics import recording_status
from services.admission.settings import AdmissionSettings
from shared.logging import get_logger
from shared.outbox import channel

log = get_logger(__name__)

SUBMIT_PATHS = ("/v1/jobs", "/v1/environments")
IN_FLIGHT = Gauge("kairos_admission_submits_in_flight", "Submits being handled now")
WAITING = Gauge("kairos_admission_submits_waiting", "Submits waiting for a slot now")
SUBMIT_SECONDS = Histogram(
    "kairos_admission_submit_seconds", "Submits let through, from the gate (their wait "
    "for a slot included) to the answer, "
    "by outcome (accepted: 2xx; refused: any other answer)", ["outcome"],
    buckets=(.01, .025, .05, .1, .25, .5, .75, 1, 1.5, 2, 3, 5, 10, 30))
INTAKE_LAG = Gauge("kairos_admission_intake_lag_seconds",
                   "Age of the oldest accepted job queueing has not taken up yet")
# submit events of jobs behind for ``age`` seconds, published that long ago: send again
_RESEND_STUCK = text(f"""UPDATE outbox SET published_at = NULL, replays = replays + 1
    WHERE event_id IN (SELECT '{SUBMITTED_EVENT_PREFIX}' || id FROM jobs WHERE state = 'pending'
                       AND reason = 'accepted' AND submitted_at < now() - make_interval(secs => :age))
      AND published_at < now() - make_interval(secs => :age) AND dead_reason IS NULL
    RETURNING event_id""")
_OLDEST_UNSEEN = text("""SELECT EXTRACT(EPOCH FROM now() - min(submitted_at)) FROM jobs
                         WHERE state = 'pending' AND reason = 'accepted'""")


class OverloadGuard:
    """What the bounds are, where the platform stands against them, and the slots."""

    def __init__(self, max_in_flight: int, max_intake_lag_s: float,
                 sample_s: float = 1.0, queue_wait_s: float = 0.5,
                 burst_wait_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_in_flight = max_in_flight
        self.queue_wait_s = queue_wait_s
        self.burst_wait_s = max(burst_wait_s, queue_wait_s)
        self._clock = clock
        self._empty_at = clock()  # when no submit last waited for a slot
        self.max_intake_lag_s = max_intake_lag_s
        self.sample_s = sample_s
        self.in_flight = 0
        self.intake_lag_s = 0.0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @classmethod
    def from_settings(cls, settings: AdmissionSettings) -> OverloadGuard:
        return cls(settings.max_submits_in_flight, settings.max_intake_lag_s,
                   settings.intake_sample_s, settings.submit_queue_wait_s,
                   settings.submit_burst_wait_s)

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def lag_refusal(self) -> tuple[str, int] | None:
        """(why, Retry-After seconds) when the platform is too far behind its intake."""
        if self.max_intake_lag_s and self.intake_lag_s > self.max_intake_lag_s:
            behind = self.intake_lag_s - self.max_intake_lag_s
            return (f"the platform is {self.intake_lag_s:.0f} s behind taking up accepted "
                    f"jobs (the bound is {self.max_intake_lag_s:g} s): retry when it has "
                    "caught up"), max(1, min(30, math.ceil(behind)))
        return None

    async def acquire(self) -> tuple[str, int] | None:
        """Take a slot, waiting at most ``queue_wait_s`` behind earlier submits; on
        refusal (nothing taken) return (why, Retry-After seconds)."""
        if not self.max_in_flight:
            self._take()
            return None
        if self.in_flight < self.max_in_flight and not self._waiters:
            self._take()
            return None
        now = self._clock()
        if not self._waiters:
            self._empty_at = now
        # a queue standing longer than the burst allowance is overload: short waits
        wait = self.queue_wait_s if now - self._empty_at > self.burst_wait_s \
            else self.burst_wait_s
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        WAITING.set(len(self._waiters))
        try:
            async with asyncio.timeout(wait):
                await asyncio.shield(waiter)
        except TimeoutError:
            if waiter.done():  # a slot was handed over as the wait ran out: keep it
                return None
            self._forget(waiter)
            return (f"this gateway is handling {self.in_flight} submits, as many as it "
                    f"takes at once, and this one waited {wait:g} s for a turn: retry "
                    "shortly"), 1
        except BaseException:  # the client went away while it waited
            if waiter.done():
                self.release()  # the slot it was handed goes on to the next one
            else:
                self._forget(waiter)
            raise
        return None

    def _forget(self, waiter: asyncio.Future[None]) -> None:
        self._waiters.remove(waiter)
        WAITING.set(len(self._waiters))

    def _take(self) -> None:
        self.in_flight += 1
        IN_FLIGHT.set(self.in_flight)

    def release(self) -> None:
        """A submit is answered: its slot goes to the longest waiting one, if any."""
        while self._waiters:
            waiter = self._waiters.popleft()
            WAITING.set(len(self._waiters))
            if not waiter.done():
                waiter.set_result(None)  # the slot passes on: in_flight stays
                return
        self.in_flight -= 1
        IN_FLIGHT.set(self.in_flight)

    async def sample(self, engine: AsyncEngine) -> None:
        async with engine.connect() as conn:
            lag = await conn.scalar(_OLDEST_UNSEEN)
        self.intake_lag_s = max(0.0, float(lag or 0.0))
        INTAKE_LAG.set(self.intake_lag_s)

    async def resend_stuck(self, engine: AsyncEngine) -> list[str]:
        """Send again the submit events of jobs behind for twice the bound (ids)."""
        if not self.max_intake_lag_s or self.intake_lag_s <= 2 * self.max_intake_lag_s:
            return []
        async with engine.begin() as conn:
            ids = list((await conn.execute(_RESEND_STUCK, {"age": 2 * self.max_intake_lag_s})).scalars())
            if ids:
                await conn.execute(text(f"NOTIFY {channel(SOURCE)}"))
        if ids:
            log.warning("accepted jobs not taken up: their submit events are sent again",
                        events=ids[:20], count=len(ids), lag_s=round(self.intake_lag_s, 1))
        return ids

    async def watch(self, engine: AsyncEngine) -> None:
        """The service loop that keeps ``intake_lag_s`` current."""
        while True:
            started = time.monotonic()
            await self.sample(engine)
            await self.resend_stuck(engine)
            await asyncio.sleep(max(0.0, self.sample_s - (time.monotonic() - started)))


def _dry_run(scope: Scope) -> bool:
    """A dry run stores nothing: it is not a submit to bound (the route refuses a bad
    ``dryRun`` value itself)."""
    return b"dryRun" in scope.get("query_string", b"") and "dryRun" in parse_qs(
        scope["query_string"].decode("latin-1"), keep_blank_values=True)


class SubmitGate:
    """The ASGI middleware: refuses a submit past a bound, counts those let through."""

    def __init__(self, app: ASGIApp, guard: OverloadGuard) -> None:
        self.app, self.guard = app, guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" \
                or scope["path"] not in SUBMIT_PATHS or _dry_run(scope):
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        refused = self.guard.lag_refusal() or await self.guard.acquire()
        if refused is not None:
            why, retry_after = refused
            REFUSED.labels("overload").inc()
            await JSONResponse({"detail": why}, status_code=429, headers={
                "Retry-After": str(retry_after)})(scope, receive, send)
            return
        status, noted = recording_status(send)
        try:
            await self.app(scope, receive, noted)
        finally:
            self.guard.release()
            SUBMIT_SECONDS.labels("accepted" if status[0] < 300 else "refused").observe(
                time.monotonic() - started)
