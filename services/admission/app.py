"""The HTTP gateway's app: its state (one of each per app, handed to the routes by
``deps``), middleware, Swagger UI and the route groups of ``routes``, all under /v1.

Tenants: a job's tenant is its submitter's token's tenant (a spec cannot name one). A
`user` token sees only its tenant's jobs; another tenant's job is answered 404 exactly
like a job that does not exist. An `admin` token sees every tenant and alone manages
tokens.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from sqlalchemy.ext.asyncio import AsyncEngine

from services.admission import openapi_errors, queues_view, tokens
from services.admission.db_errors import DatabaseErrors
from services.admission.docs import add_docs
from services.admission.job_events import JobEventsFeed
from services.admission.limits import BodyLimit
from services.admission.overload import OverloadGuard, SubmitGate
from services.admission.policy import ClusterShapes
from services.admission.request_metrics import RequestMetrics
from services.admission.routes import api_router
from services.admission.settings import AdmissionSettings, LogProxySettings
from shared.http import ReadyCheck, add_ops_routes


def create_app(settings: AdmissionSettings, engine: AsyncEngine, ready: ReadyCheck,
               guard: OverloadGuard | None = None) -> FastAPI:
    """``guard``: the overload bounds, kept current by the service's sampling loop (a
    guard nobody samples bounds only the submits in flight)."""
    app = FastAPI(
        title="Kairos gateway",
        version="1",
        description="Submit GPU training jobs, follow them, and see the cluster.",
        docs_url=None,  # add_docs serves it from the packaged Swagger UI: works offline
        redoc_url=None,  # ReDoc loads from a CDN only; add_docs points /redoc at /docs
    )
    add_docs(app)
    # what the dependencies (deps.py) hand the routes: one of each per app
    app.state.settings = settings
    app.state.engine = engine
    app.state.overload = guard = guard or OverloadGuard.from_settings(settings)
    app.state.token_cache = tokens.TokenCache(settings.token_cache_s)
    app.state.queue_cache = queues_view.QueueCache(settings.queue_cache_s)
    app.state.cluster_shapes = ClusterShapes(engine)
    app.state.job_events_feed = JobEventsFeed(engine, settings.stream_poll_s)
    app.state.log_proxy = LogProxySettings()
    add_ops_routes(app, ready)
    # each added middleware wraps those before it: RequestMetrics > SubmitGate > BodyLimit >
    # DatabaseErrors > the routes. So RequestMetrics counts every answer, 429, 413 and 503
    # included, an overloaded gateway refuses a submit before it reads anything, and an
    # oversized body is refused before anything reads the database.
    app.add_middleware(DatabaseErrors, retry_after_s=settings.db_retry_after_s)
    app.add_middleware(BodyLimit, max_bytes=settings.max_request_bytes)
    app.add_middleware(SubmitGate, guard=guard)
    app.add_middleware(RequestMetrics)
    app.add_exception_handler(RequestValidationError, openapi_errors.request_refused)
    app.include_router(api_router(settings))
    openapi_errors.install(app)  # after every route: documents each one's refusals
    return app
