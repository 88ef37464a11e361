"""A stand-in for the forecaster service in gateway tests: a small HTTP server with the
service's contract, ``POST /v1/what-if`` with ``{"candidates": [...]}`` answered
``{"as_of", "forecasts": [{"job_id", "start", "finish", "start_low", "start_high",
"nodes", "waits_for"}]}`` (epoch seconds), or 503 without a snapshot. Each candidate is
answered alone with what the test set. The end-to-end test runs the real service."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from kairos.embedded import free_port
from shared.http import HttpServer


@dataclass
class StubForecaster:
    """The forecaster's HTTP contract, answering each candidate alone with ``answer``
    (seconds from now; or ``answer_for(candidate)``), or with ``status`` / after
    ``delay_s`` as a test sets."""

    url: str = ""
    asked: list[dict[str, Any]] = field(default_factory=list)
    answer: dict[str, Any] = field(default_factory=dict)
    status: int = 200
    delay_s: float = 0.0
    garbage: bool = False
    answer_for: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/what-if")
        async def what_if(request: Request) -> JSONResponse:
            body = await request.json()
            self.asked.append(body)
            await asyncio.sleep(self.delay_s)
            if self.status != 200:
                return JSONResponse({"detail": "no snapshot yet"}, status_code=self.status)
            if self.garbage:
                return JSONResponse({"forecasts": "soon"})
            now = time.time()

            def forecast(c: dict[str, Any]) -> dict[str, Any]:
                a = self.answer_for(c) if self.answer_for else self.answer
                out = {k: None if a.get(k) is None else now + a[k]
                       for k in ("start", "finish", "start_low", "start_high")}
                return {"job_id": c["job_id"], **out, "nodes": a.get("nodes", []),
                        "waits_for": a.get("waits_for")}

            return JSONResponse({"as_of": now - 1, "forecasts": [
                forecast(c) for c in body["candidates"]]})

        return app


@asynccontextmanager
async def running_stub() -> AsyncIterator[StubForecaster]:
    """A stub serving on a free local port (its ``url``) until the block ends."""
    stub = StubForecaster()
    port = free_port()
    server = HttpServer(stub.app(), "127.0.0.1", port)
    await server.start()
    stub.url = f"http://127.0.0.1:{port}"
    try:
        yield stub
    finally:
        await server.stop()
