"""What the gateway's routes depend on, as ``Annotated[..., Depends(...)]`` aliases (the
FastAPI full-stack template's ``api/deps.py``). Each reads ``request.app.state``, which
``app.create_app`` fills once per app, so a route names what it needs and nothing else.

Every dependency is ``async def`` though none awaits: FastAPI runs a plain ``def``
dependency in a worker thread, a thread hand-off per dependency per request (measured:
+40% gateway CPU per submit with them sync, ``bench/admission_submit.py``).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.ext.asyncio import AsyncEngine

from services.admission.accept import Intake
from services.admission.auth import Principal, admin_only, principal_of
from services.admission.job_events import JobEventsFeed
from services.admission.policy import ClusterShapes
from services.admission.queues_view import QueueCache
from services.admission.settings import AdmissionSettings, LogProxySettings
from services.admission.tokens import TokenCache

_bearer = HTTPBearer(auto_error=False, description="an API token: `kairos token create`")


async def get_engine(request: Request) -> AsyncEngine:
    engine: AsyncEngine = request.app.state.engine
    return engine


async def get_settings(request: Request) -> AdmissionSettings:
    settings: AdmissionSettings = request.app.state.settings
    return settings


async def get_token_cache(request: Request) -> TokenCache:
    cache: TokenCache = request.app.state.token_cache
    return cache


async def get_queue_cache(request: Request) -> QueueCache:
    cache: QueueCache = request.app.state.queue_cache
    return cache


async def get_cluster_shapes(request: Request) -> ClusterShapes:
    shapes: ClusterShapes = request.app.state.cluster_shapes
    return shapes


async def get_log_proxy(request: Request) -> LogProxySettings:
    proxy: LogProxySettings = request.app.state.log_proxy
    return proxy


async def get_job_events_feed(request: Request) -> JobEventsFeed:
    feed: JobEventsFeed = request.app.state.job_events_feed
    return feed


EngineDep = Annotated[AsyncEngine, Depends(get_engine)]
SettingsDep = Annotated[AdmissionSettings, Depends(get_settings)]
TokenCacheDep = Annotated[TokenCache, Depends(get_token_cache)]
QueueCacheDep = Annotated[QueueCache, Depends(get_queue_cache)]
ClusterShapesDep = Annotated[ClusterShapes, Depends(get_cluster_shapes)]
LogProxyDep = Annotated[LogProxySettings, Depends(get_log_proxy)]
JobEventsFeedDep = Annotated[JobEventsFeed, Depends(get_job_events_feed)]


async def get_intake(engine: EngineDep, settings: SettingsDep, queues: QueueCacheDep,
               shapes: ClusterShapesDep) -> Intake:
    return Intake(engine, settings, queues, shapes)


IntakeDep = Annotated[Intake, Depends(get_intake)]


async def authenticate(
    engine: EngineDep, cache: TokenCacheDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """The calling token's principal (``auth.principal_of``: 401 without an active one)."""
    return await principal_of(engine, credentials.credentials if credentials else None, cache)


Caller = Annotated[Principal, Depends(authenticate)]


async def require_admin(caller: Caller) -> Principal:
    return admin_only(caller)


Admin = Annotated[Principal, Depends(require_admin)]
