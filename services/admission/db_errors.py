"""What PostgreSQL's errors mean for the client, never a 500 (a pure ASGI middleware).

Unavailable: while PostgreSQL is down, restarting or refusing connections, whatever
route touches it (the token lookup of every /v1 route included) answers 503
``{"detail": "database unavailable, retry"}`` with ``Retry-After``. Nothing is held for
the outage: the engine's pool pings a connection before it lends it (``pool_pre_ping``)
and opens a new one when the old is gone, so the first request after PostgreSQL is back
succeeds without restarting the gateway.

Unstorable text: a NUL character, in a path, a query parameter or a body field, which
PostgreSQL's text and jsonb types refuse, is 400 saying so, whichever route passed it
on. Job specs refuse NUL themselves, naming the field (shared.jobspec).

Both are decided on the exception and the errors it was raised from (SQLAlchemy's
``orig``, ``raise ... from``), never on what it happened to be handling: a bug stays a
500.
"""

from __future__ import annotations

from collections.abc import Callable

import asyncpg
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.errors import EventTooLarge, database_unavailable
from shared.logging import get_logger

log = get_logger(__name__)
DETAIL = "database unavailable, retry"
UNSTORABLE = "the request holds text that cannot be stored: a NUL character (\\u0000)"

_UNSTORABLE: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.CharacterNotInRepertoireError,  # 22021: NUL in a text parameter
    asyncpg.exceptions.UntranslatableCharacterError,  # 22P05: \u0000 in a jsonb one
)


def unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` means PostgreSQL cannot be reached now (retry later)."""
    # shared.errors' list, and any SQLSTATE 57 besides: a statement cancelled by
    # statement_timeout is worth a retry to a client, not to a consumer that would retry
    # the same statement forever
    return _caused_by(exc, lambda e: database_unavailable(e) or isinstance(
        e, asyncpg.exceptions.OperatorInterventionError))


def unstorable(exc: BaseException) -> bool:
    """Whether ``exc`` means PostgreSQL refused the request's text."""
    return _caused_by(exc, lambda e: isinstance(e, _UNSTORABLE))


def _caused_by(exc: BaseException, test: Callable[[BaseException], bool]) -> bool:
    if isinstance(exc, BaseExceptionGroup):  # every member must say so
        _, rest = exc.split(lambda e: not isinstance(e, BaseExceptionGroup) and
                            _caused_by(e, test))
        return rest is None
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if test(e):
            return True
        todo += [c for c in (getattr(e, "orig", None), e.__cause__)
                 if isinstance(c, BaseException)]
    return False


def _root(exc: BaseException) -> BaseException:
    """The innermost cause: the driver's own message, without SQLAlchemy's statement and
    parameters (which a log must not carry)."""
    for _ in range(16):  # a chain is a few links long; never loop on a cycle
        nxt = getattr(exc, "orig", None) or exc.__cause__
        if not isinstance(nxt, BaseException):
            break
        exc = nxt
    return exc


class DatabaseErrors:
    def __init__(self, app: ASGIApp, retry_after_s: int) -> None:
        self.app, self.retry_after_s = app, retry_after_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception as exc:
            if started:  # a streamed answer already begun cannot become another one
                raise
            if unavailable(exc):
                root = _root(exc)
                log.warning("database unavailable", path=scope.get("path"),
                            error=f"{type(root).__name__}: {str(root)[:200]}")
                response = JSONResponse({"detail": DETAIL}, status_code=503,
                                        headers={"Retry-After": str(self.retry_after_s)})
            elif unstorable(exc):
                response = JSONResponse({"detail": UNSTORABLE}, status_code=400)
            elif isinstance(exc, EventTooLarge):  # what it asked would not fit an event
                response = JSONResponse({"detail": f"request too large: {exc}"},
                                        status_code=413)
            else:
                raise  # a bug stays a 500
            await response(scope, receive, send)
