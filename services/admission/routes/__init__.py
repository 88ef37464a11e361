"""The gateway's routes, one ``APIRouter`` per group, all under /v1."""

from __future__ import annotations

from fastapi import APIRouter

from services.admission.routes import (
    access,
    arrays,
    environments,
    forecasts,
    job_stream,
    jobs,
    logs,
    node_ops,
    nodes,
    queues,
    usage,
)
from services.admission.settings import AdmissionSettings


def api_router(settings: AdmissionSettings) -> APIRouter:
    """Every route group, in the order the OpenAPI document lists them."""
    api = APIRouter()
    api.include_router(jobs.router)
    api.include_router(jobs.listing_router(settings.max_page_size))
    api.include_router(forecasts.router)
    for group in (nodes, access, node_ops, environments, job_stream, usage, logs, queues,
                  arrays):
        api.include_router(group.router)
    return api
