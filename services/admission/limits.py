"""The request body limit, on every route: a pure ASGI middleware.

A declared ``Content-Length`` over the limit is refused before the app runs, so an
oversized request costs no token lookup, no rate-limit token and no parsing. A body
without one (chunked) is counted as it streams in: the read that passes the limit
raises ``BodyTooLarge``, an HTTPException, so FastAPI's own body parsing lets it
through and the app answers it like any other refusal. Either way the answer is 413
with ``{"detail": "... the limit is N bytes"}``; nothing past the limit is kept.

Before answering, the rest of the body is read and dropped, up to ``DRAIN_BYTES`` in
all: a client still sending when the server closes gets a reset connection instead of
the 413 (uvicorn reads nothing more once the answer is sent). A larger upload is cut
off at that point, so refusing one costs a bounded read.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

DRAIN_BYTES = 16 * 1024 * 1024


def too_large(limit: int, what: str = "the request body") -> str:
    return f"{what} is larger than this gateway accepts: the limit is {limit} bytes"


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int, what: str = "the request body") -> None:
        # the client may still be sending: ask it to close rather than reuse the connection
        super().__init__(413, detail=too_large(limit, what), headers={"Connection": "close"})


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            if declared <= DRAIN_BYTES:
                await _drain(receive, 0)
            await _refuse(BodyTooLarge(self.max_bytes), scope, receive, send)
            return
        seen = 0
        started = False

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    if message.get("more_body", False):
                        await _drain(receive, seen)
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except BodyTooLarge as exc:
            # raised where nothing turned it into a response (outside a route's handler)
            if started:
                raise
            await _refuse(exc, scope, receive, send)


async def _drain(receive: Receive, seen: int) -> None:
    """Read and drop the rest of the body, until it ends or ``DRAIN_BYTES`` were read."""
    while seen <= DRAIN_BYTES:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return
        seen += len(message.get("body", b""))


async def _refuse(error: BodyTooLarge, scope: Scope, receive: Receive, send: Send) -> None:
    response = JSONResponse({"detail": error.detail}, status_code=413, headers=error.headers)
    await response(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:  # the server refuses a malformed one; counting still holds
                return None
    return None
