"""A lean HTTP/1.1 client for load generation: keep-alive connections, pre-encoded
requests, responses read by Content-Length.

The benchmarks run their load generator on the same two cores as the platform, so what
the generator spends is taken from what it measures: httpx spent 10-40 ms of CPU per
submit there (more as its pool queued), as much as the gateway itself. This client
spends a fraction of a millisecond (asyncio streams, no per-request objects beyond the
bytes), as wrk or vegeta would from outside. It speaks only what the gateway answers a
submit with: a status line, headers with Content-Length, a body.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any


class TransportError(Exception):
    """The connection failed or closed mid-exchange (the request may have been handled:
    a retry must carry the same Idempotency-Key)."""


class Response:
    __slots__ = ("body", "headers", "status_code")

    def __init__(self, status_code: int, headers: dict[str, str], body: bytes) -> None:
        self.status_code, self.headers, self.body = status_code, headers, body

    def json(self) -> Any:
        return json.loads(self.body)


class RawHttpClient:
    """At most ``connections`` keep-alive connections to ``host:port``; a request waits
    for a free one, as a browser's or httpx's pool does."""

    def __init__(self, host: str, port: int, connections: int = 128,
                 headers: dict[str, str] | None = None, timeout_s: float = 30) -> None:
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self._base = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._slots = asyncio.Semaphore(connections)

    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> Response:
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n{self._base}"
                + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
                + f"Content-Length: {len(body)}\r\n\r\n").encode()
        async with self._slots:
            conn = self._idle.pop() if self._idle else None
            try:
                if conn is None:
                    conn = await asyncio.wait_for(
                        asyncio.open_connection(self.host, self.port), self.timeout_s)
                reader, writer = conn
                writer.write(head + body)
                resp, keep = await asyncio.wait_for(self._read(reader), self.timeout_s)
            except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as exc:
                if conn is not None:
                    conn[1].close()
                raise TransportError(repr(exc)) from exc
            if keep:
                self._idle.append(conn)
            else:
                writer.close()
            return resp

    @staticmethod
    async def _read(reader: asyncio.StreamReader) -> tuple[Response, bool]:
        raw = await reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        keep = headers.get("connection", "").lower() != "close"
        return Response(status, headers, body), keep

    async def aclose(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()
