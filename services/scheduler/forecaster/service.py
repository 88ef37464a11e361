"""The forecaster's process: a round every ``forecast_every_s`` (read the rows, learn
what finished, forecast, publish what moved), and its HTTP surface: /healthz, /readyz,
/metrics and ``POST /v1/what-if``.

A round's replays are CPU work of up to seconds on a big cluster: they run in a worker
thread, so /metrics and the what-if keep answering while one runs. The what-if forecasts
against the last round's snapshot (at most one interval old) and its learnt durations.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from fastapi import FastAPI, HTTPException
from prometheus_client import Counter, Gauge, Histogram
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.ext.asyncio import AsyncEngine

from scheduling import JobRequest, SchedulerConfig, Snapshot
from services.scheduler.forecaster.load import Queued, RowReader, read_queued, snapshot_of
from services.scheduler.forecaster.publish import Publisher
from services.scheduler.forecaster.round import forecast_round, what_if
from services.scheduler.forecaster.settings import ForecasterSettings
from services.scheduler.history import JobHistory, gpu_key
from shared.bus import Producer
from shared.events import Envelope, utcnow
from shared.events.reasons import WaitCode
from shared.http import HttpServer, ReadyCheck, add_ops_routes
from shared.job_request import job_request
from shared.jobspec import JobSpec
from shared.leader import AdvisoryLock
from shared.logging import get_logger
from shared.service import ServiceRuntime, run_main
from shared.topics import JOBS_FORECASTS

log = get_logger(__name__)

ROUND_SECONDS = Histogram("kairos_forecaster_round_seconds",
                          "A forecast round by phase (load, forecast, publish, total)", ["phase"],
                          buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30))
WAITING = Gauge("kairos_forecaster_waiting_jobs", "Jobs the last round forecast, by kind "
                "(scheduler: admitted and waiting for GPUs; quota: waiting in queueing)",
                ["kind"])
PUBLISHED = Counter("kairos_forecaster_published_total", "job.forecast events published")
IS_PUBLISHER = Gauge("kairos_forecaster_publisher", "1 on the replica elected to publish")
LAST_ROUND = Gauge("kairos_forecaster_last_round_timestamp_seconds",
                   "When the last round's snapshot was taken (epoch s)")
WHAT_IF = Histogram("kairos_forecaster_what_if_seconds", "A what-if request's forecast time",
                    buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10))


def load_config(settings: ForecasterSettings) -> SchedulerConfig:
    """The scheduler's policy (its settings' names): a bad file fails the start."""
    if settings.policy_file:
        return SchedulerConfig.from_yaml(Path(settings.policy_file).read_text())
    return SchedulerConfig.preset(settings.policy)


def pause(took_s: float, every_s: float, max_busy: float) -> float:
    """The wait after a round that took ``took_s``: the rest of the interval, but at least
    what keeps rounds busy no more than ``max_busy`` of the time."""
    return max(every_s - took_s, took_s * (1 - max_busy) / max_busy)


class Forecaster:
    """The rounds' state: the last snapshot (for what-ifs), the history, what was sent."""

    def __init__(self, settings: ForecasterSettings, engine: AsyncEngine, producer: Producer,
                 config: SchedulerConfig) -> None:
        self.settings = settings
        self.engine = engine
        self.producer = producer
        self.config = config
        self.reader = RowReader(first_read=settings.forecast_history)
        self.publisher = Publisher(settings.forecast_move_ratio, settings.forecast_move_s,
                                   settings.forecast_refresh_s)
        self.snapshot: Snapshot | None = None
        self.queued: Queued | None = None  # the last round's jobs held for quota
        self.rounds = 0
        self.publishing = True  # main() elects one publisher among replicas

    def history(self) -> JobHistory | None:
        """What the replay's requests are estimated from, as the scheduler's are."""
        return self.reader.history if self.settings.history_estimates else None

    def estimated(self, jobs: list[JobRequest], names: list[str]) -> list[JobRequest]:
        """Jobs not the scheduler's yet (named ``names``), with the estimates and learnt
        speeds it will give them."""
        h = self.history()
        return jobs if h is None else [h.fill(j, gpu_key(j), n) for j, n in zip(jobs, names, strict=True)]

    async def round_once(self) -> int:
        """One round; returns the events published."""
        t0 = time.perf_counter()
        async with self.engine.connect() as conn:
            rows = await self.reader.read(conn)
            queued = await read_queued(conn)
        now = time.time()
        t1 = time.perf_counter()
        ROUND_SECONDS.labels("load").observe(t1 - t0)
        snap, who = snapshot_of(rows, now, self.history())
        queued.held = self.estimated(queued.held, queued.names)
        forecasts = await asyncio.to_thread(
            forecast_round, self.config, snap, who, self.reader.history,
            resolution=self.settings.forecast_resolution, queued=queued)
        t2 = time.perf_counter()
        ROUND_SECONDS.labels("forecast").observe(t2 - t1)
        self.snapshot, self.queued = snap, queued
        WAITING.labels("scheduler").set(len(snap.pending))
        WAITING.labels("quota").set(len(forecasts) - len(snap.pending))
        if not self.publishing:  # a standby: forecasts for its what-ifs, sends nothing
            ROUND_SECONDS.labels("total").observe(time.perf_counter() - t0)
            LAST_ROUND.set(now)
            self.rounds += 1
            return 0
        send = self.publisher.select(forecasts, now)
        for i in range(0, len(send), 500):  # batches: the broker's acks overlap
            await self.producer.publish_many([(Envelope.wrap(f, self.settings.service_name),
                                               JOBS_FORECASTS.name) for f in send[i:i + 500]])
        self.publisher.mark_sent(send, now)
        PUBLISHED.inc(len(send))
        ROUND_SECONDS.labels("publish").observe(time.perf_counter() - t2)
        ROUND_SECONDS.labels("total").observe(time.perf_counter() - t0)
        LAST_ROUND.set(now)
        self.rounds += 1
        return len(send)

    async def run(self) -> None:
        """Rounds until stopped. A round that failed for PostgreSQL or the broker being
        away ends this loop; the runtime starts it again when they are back, and the
        next round starts over from the rows (nothing is lost, at most re-sent)."""
        while True:
            started = time.monotonic()
            sent = await self.round_once()
            if self.rounds == 1 or sent:
                log.info("forecast round", published=sent, rounds=self.rounds,
                         waiting=len(self.snapshot.pending) if self.snapshot else 0)
            await asyncio.sleep(pause(time.monotonic() - started, self.settings.forecast_every_s,
                                      self.settings.forecast_max_busy))


# --- POST /v1/what-if ---------------------------------------------------------------------


class Candidate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    job_id: str = Field(min_length=1, max_length=200)
    queue: str = Field(min_length=1, max_length=63)
    tenant: str = Field(min_length=1, max_length=63)
    user: str = Field(default="", max_length=200)
    spec: JobSpec


class WhatIfIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    candidates: list[Candidate] = Field(min_length=1, max_length=64)


class WhatIfForecast(BaseModel):
    job_id: str
    start: float | None = Field(description="expected start (epoch s); empty: beyond the horizon")
    finish: float | None
    start_low: float | None
    start_high: float | None
    nodes: list[str]
    waits_for: str | None = Field(description="the job it would wait behind, if one")
    reason: WaitCode | None = Field(default=None, description=(
        "why it would wait (the scheduler's pending reason in the replay), if it would"))


class WhatIfOut(BaseModel):
    as_of: float = Field(description="the snapshot the candidates were forecast against")
    forecasts: list[WhatIfForecast]


def create_app(fc: Forecaster, ready: ReadyCheck) -> FastAPI:
    app = FastAPI(title="Kairos forecaster", docs_url=None, redoc_url=None)
    add_ops_routes(app, ready)

    @app.post("/v1/what-if", response_model=WhatIfOut)
    async def post_what_if(body: WhatIfIn) -> WhatIfOut:
        """Each candidate alone against the latest snapshot, as a job submitted now."""
        snap = fc.snapshot
        if snap is None:
            raise HTTPException(503, detail="no snapshot loaded yet: the forecaster's first "
                                "round has not finished; try again in a few seconds")
        now = utcnow()
        # estimated as the scheduler will estimate them once admitted
        reqs = fc.estimated([job_request(c.spec, job_id=c.job_id, queue=c.queue, tenant=c.tenant,
                                         user=c.user, submitted_at=now, attempt=1)
                             for c in body.candidates], [c.spec.name for c in body.candidates])
        t0 = time.perf_counter()
        try:
            got = await asyncio.to_thread(what_if, fc.config, snap, fc.reader.history, reqs,
                                          resolution=fc.settings.forecast_resolution, queued=fc.queued)
        except ValueError as exc:
            raise HTTPException(422, detail=str(exc)) from exc
        WHAT_IF.observe(time.perf_counter() - t0)
        return WhatIfOut(as_of=snap.now, forecasts=[WhatIfForecast(
            job_id=f.job_id, start=f.start, finish=f.finish, start_low=f.start_low,
            start_high=f.start_high, nodes=f.nodes, waits_for=f.waits_for, reason=f.reason)
            for f in got])

    return app


def publisher_election(fc: Forecaster) -> Callable[[], Awaitable[None]]:
    """The campaign that makes ``fc`` its replicas' one publisher while it holds the lock
    (until then it only forecasts, for its what-ifs); a newly elected one sends every
    forecast once, as a restarted one does."""
    s = fc.settings
    fc.publishing = False
    election = AdvisoryLock(s.database_url, f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}",
                            s.election_key, "forecaster", poll_s=s.election_poll_s)

    async def elected() -> None:
        fc.publisher = Publisher(s.forecast_move_ratio, s.forecast_move_s, s.forecast_refresh_s)
        fc.publishing = True
        IS_PUBLISHER.set(1)

    async def deposed() -> None:
        fc.publishing = False
        IS_PUBLISHER.set(0)

    async def campaign() -> None:
        try:
            await election.run(elected, deposed)
        finally:
            await deposed()

    return campaign


async def main(settings: ForecasterSettings | None = None) -> None:
    settings = settings or ForecasterSettings()
    config = load_config(settings)
    if settings.forecast_nice:
        # before any thread starts: on Linux niceness is per thread, and new ones inherit it
        os.nice(settings.forecast_nice)
    rt = ServiceRuntime(settings)
    await rt.start_dependencies()
    assert rt.engine is not None
    fc = Forecaster(settings, rt.engine, rt.producer, config)
    rt.add_loop(fc.run)
    rt.add_loop(publisher_election(fc))
    await rt.run(HttpServer(create_app(fc, rt.ready), settings.http_host, settings.http_port))


def run() -> None:
    run_main(main)
