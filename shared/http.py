"""Each service's own HTTP surface: /healthz, /readyz and /metrics, served by uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import uvicorn
from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

ReadyCheck = Callable[[], Awaitable[dict[str, bool]]]


def add_ops_routes(app: FastAPI, ready: ReadyCheck) -> None:
    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", include_in_schema=False)
    async def readyz(response: Response) -> dict[str, object]:
        """200 when every dependency answers; 503 naming those that do not."""
        checks = await ready()
        failing = [name for name, up in checks.items() if not up]
        response.status_code = 503 if failing else 200
        body: dict[str, object] = {"ready": not failing, "checks": checks}
        if failing:
            body["detail"] = f"not ready: {', '.join(failing)} unreachable"
        return body

    @app.get("/metrics", include_in_schema=False)
    async def metrics_endpoint() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


def ops_app(ready: ReadyCheck) -> FastAPI:
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    add_ops_routes(app, ready)
    return app


class HttpServer:
    """uvicorn inside the service's event loop, stopped with the service."""

    def __init__(self, app: FastAPI, host: str, port: int) -> None:
        # a long keep-alive: a client reusing a connection the server just closed sees a
        # transport error (load balancers hold connections for 60 s and more)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning",
                                access_log=False, lifespan="off", timeout_keep_alive=75)
        self._server = uvicorn.Server(config)
        # the service owns SIGINT/SIGTERM (ServiceRuntime.run); uvicorn must not take them
        self._server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._task is not None:
            return
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                self._task.result()
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        self._server.should_exit = True
        if self._task is not None:
            await self._task
