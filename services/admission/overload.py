"""Graceful overload: past what the platform can take, a submit is refused at once with
429 and ``Retry-After`` instead of waiting in a queue nobody sees.

Two bounds, each cheap to check on every submit (a pure ASGI middleware in front of the
submit routes, before the body is read or a token looked up):

- **in flight**: submits this replica is handling now. Past its limit, each new one
  would only wait behind the others for the same CPU, so the answer is 429 now and the
  accepted ones keep a bounded latency. The limit adapts to what this machine does
  (AIMD, as TCP's window or Netflix's concurrency-limits), on the moving average of
  how long the submits let in took (a few slow ones among many fast do not count as
  overload): while it is over ``submit_latency_target_s`` the limit shrinks by a tenth
  once per target interval; while it is within, each submit grows it by 1/limit. It
  stays between a few and ``max_submits_in_flight``: on a quiet gateway it sits at the
  maximum, so a burst is accepted; on a saturated one it settles where the submits it
  lets in finish, on average, within the target.
- **intake lag**: how long the oldest accepted job has gone without queueing taking it
  up (still ``pending`` with reason ``accepted``: its event unpublished, unread, or not
  yet ordered). It covers the outbox, the broker and queueing in one figure, and every
  replica reads the same one from PostgreSQL (sampled every ``intake_sample_s``). Past
  ``max_intake_lag_s`` the platform is behind, and more work would only lengthen what
  every job waits: new submits are refused until it catches up.

Nothing accepted is lost either way: a refusal stores nothing, and a client retries
after ``Retry-After`` (with its Idempotency-Key, a retry is safe).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

from prometheus_client import Gauge, Histogram
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.admission.ratelimit import REFUSED
from services.admission.settings import AdmissionSettings

SUBMIT_PATHS = ("/v1/jobs", "/v1/environments")
LATENCY_WEIGHT = 0.05  # of the latest submit in the moving average (about the last 20)
MIN_IN_FLIGHT = 4  # the adaptive limit never shuts a replica to fewer submits at once
SUBMIT_LIMIT = Gauge("kairos_admission_submit_limit",
                     "Submits this replica takes at once now (adapts to its latency)")
IN_FLIGHT = Gauge("kairos_admission_submits_in_flight", "Submits being handled now")
SUBMIT_SECONDS = Histogram(
    "kairos_admission_submit_seconds", "Submits let through, from the gate to the answer, "
    "by outcome (accepted: 2xx; refused: any other answer)", ["outcome"],
    buckets=(.01, .025, .05, .1, .25, .5, .75, 1, 1.5, 2, 3, 5, 10, 30))
INTAKE_LAG = Gauge("kairos_admission_intake_lag_seconds",
                   "Age of the oldest accepted job queueing has not taken up yet")
_OLDEST_UNSEEN = text("""SELECT EXTRACT(EPOCH FROM now() - min(submitted_at)) FROM jobs
                         WHERE state = 'pending' AND reason = 'accepted'""")


class OverloadGuard:
    """What the bounds are and where the platform stands against them."""

    def __init__(self, max_in_flight: int, max_intake_lag_s: float,
                 sample_s: float = 1.0, latency_target_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_in_flight = max_in_flight
        self.min_in_flight = min(MIN_IN_FLIGHT, max_in_flight)
        self.limit = float(max_in_flight)
        self.latency_target_s = latency_target_s
        self.max_intake_lag_s = max_intake_lag_s
        self.sample_s = sample_s
        self.in_flight = 0
        self.intake_lag_s = 0.0
        self._clock = clock
        self._shrunk_at = -1e9
        self.latency_s = 0.0  # moving average of the submits let in
        SUBMIT_LIMIT.set(self.limit)

    @classmethod
    def from_settings(cls, settings: AdmissionSettings) -> OverloadGuard:
        return cls(settings.max_submits_in_flight, settings.max_intake_lag_s,
                   settings.intake_sample_s, settings.submit_latency_target_s)

    def refusal(self) -> tuple[str, int] | None:
        """(why, Retry-After seconds) when a new submit is to be refused now."""
        if self.max_in_flight and self.in_flight >= int(self.limit):
            return (f"this gateway is handling {self.in_flight} submits, as many as it "
                    "takes at once now: retry shortly"), 1
        if self.max_intake_lag_s and self.intake_lag_s > self.max_intake_lag_s:
            behind = self.intake_lag_s - self.max_intake_lag_s
            return (f"the platform is {self.intake_lag_s:.0f} s behind taking up accepted "
                    f"jobs (the bound is {self.max_intake_lag_s:g} s): retry when it has "
                    "caught up"), max(1, min(30, math.ceil(behind)))
        return None

    def finished(self, seconds: float) -> None:
        """A submit let through took ``seconds``: adapt the in-flight limit."""
        if not self.max_in_flight or not self.latency_target_s:
            return
        now = self._clock()
        self.latency_s += LATENCY_WEIGHT * (seconds - self.latency_s)
        if self.latency_s > self.latency_target_s:
            if now - self._shrunk_at >= self.latency_target_s:
                self.limit = max(float(self.min_in_flight), self.limit * 0.9)
                self._shrunk_at = now
        else:
            self.limit = min(float(self.max_in_flight), self.limit + 1.0 / self.limit)
        SUBMIT_LIMIT.set(self.limit)

    async def sample(self, engine: AsyncEngine) -> None:
        async with engine.connect() as conn:
            lag = await conn.scalar(_OLDEST_UNSEEN)
        self.intake_lag_s = max(0.0, float(lag or 0.0))
        INTAKE_LAG.set(self.intake_lag_s)

    async def watch(self, engine: AsyncEngine) -> None:
        """The service loop that keeps ``intake_lag_s`` current."""
        while True:
            started = time.monotonic()
            await self.sample(engine)
            await asyncio.sleep(max(0.0, self.sample_s - (time.monotonic() - started)))


class SubmitGate:
    """The ASGI middleware: refuses a submit past a bound, counts those let through."""

    def __init__(self, app: ASGIApp, guard: OverloadGuard) -> None:
        self.app, self.guard = app, guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" \
                or scope["path"] not in SUBMIT_PATHS:
            await self.app(scope, receive, send)
            return
        refused = self.guard.refusal()
        if refused is not None:
            why, retry_after = refused
            REFUSED.labels("overload").inc()
            await JSONResponse({"detail": why}, status_code=429, headers={
                "Retry-After": str(retry_after)})(scope, receive, send)
            return
        self.guard.in_flight += 1
        IN_FLIGHT.inc()
        started = time.monotonic()
        status = [500]

        async def noted(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, noted)
        finally:
            self.guard.in_flight -= 1
            IN_FLIGHT.dec()
            took = time.monotonic() - started
            self.guard.finished(took)
            SUBMIT_SECONDS.labels("accepted" if status[0] < 300 else "refused").observe(took)
