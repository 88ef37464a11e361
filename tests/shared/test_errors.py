"""Which failures mean "a dependency is away, try again" (shared.errors): the one list
the consumers' retries and the gateway's 503s both read."""

from __future__ import annotations

import asyncpg
import pytest
from aiokafka import errors as kafka
from sqlalchemy import exc as sa

from services.admission.db_errors import unavailable
from shared.errors import EventTooLarge, Retryable, is_transient


def _wrapped(orig: BaseException, cls: type[sa.DBAPIError] = sa.DBAPIError,
             invalidated: bool = False) -> sa.DBAPIError:
    return cls("SELECT 1", {}, orig, connection_invalidated=invalidated)  # type: ignore[arg-type]


def _caused(exc: BaseException, cause: BaseException, explicit: bool) -> BaseException:
    if explicit:
        exc.__cause__ = cause
    else:
        exc.__context__ = cause  # raised while handling it: maybe a plain bug
    return exc


CASES = [  # (failure, consumer waits and retries, gateway answers 503)
    (OSError(111, "connection refused"), True, True),
    (TimeoutError(), True, True),
    (asyncpg.CannotConnectNowError("the database system is starting up"), True, True),
    (asyncpg.AdminShutdownError("terminating connection"), True, True),
    (asyncpg.TooManyConnectionsError("too many clients"), True, True),
    (asyncpg.ConnectionDoesNotExistError("connection was closed"), True, True),
    (asyncpg.QueryCanceledError("statement timeout"), False, True),
    (asyncpg.UniqueViolationError("duplicate key"), False, False),
    (_wrapped(asyncpg.UniqueViolationError("dup"), sa.IntegrityError), False, False),
    (_wrapped(asyncpg.CannotConnectNowError("starting up")), True, True),
    (_wrapped(ValueError("?"), invalidated=True), True, True),
    (sa.TimeoutError("QueuePool limit reached"), True, True),
    (kafka.KafkaConnectionError("broker away"), True, False),
    (kafka.KafkaError("Unable to update metadata"), True, False),
    (kafka.MessageSizeTooLargeError(), False, False),
    (EventTooLarge("2 MB"), False, False),
    (Retryable("busy"), True, False),
    (_caused(RuntimeError("x"), OSError("gone"), explicit=True), True, True),
    (_caused(RuntimeError("x"), OSError("gone"), explicit=False), False, False),
    (ValueError("a bug"), False, False),
]


@pytest.mark.parametrize(("exc", "transient", "gateway_503"), CASES,
                         ids=[type(c[0]).__name__ + str(i) for i, c in enumerate(CASES)])
def test_a_failure_is_classified_once(exc: BaseException, transient: bool,
                                      gateway_503: bool) -> None:
    assert is_transient(exc) is transient
    assert unavailable(exc) is gateway_503
