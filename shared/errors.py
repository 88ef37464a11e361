"""Root exceptions. The retry decision lives on the error; the consumer wrapper acts on it."""


class KairosError(Exception):
    """Root of every Kairos error."""


class Retryable(KairosError):
    """A transient failure: retry with backoff (database busy, broker hiccup)."""


class NonRetryable(KairosError):
    """A permanent failure for this message: dead-letter it and move on."""


class DecodeError(NonRetryable):
    """The message is not a valid envelope or payload."""


class EventTooLarge(NonRetryable):
    """An event whose encoded size passes the bus limit: it can never be published."""


def database_unavailable(exc: BaseException) -> bool:
    """True when ``exc`` itself (not its causes) says PostgreSQL cannot be reached now:
    no socket, refused or lost connection, a server shutting down or starting up, too
    many connections, a pool that lent nothing in time. The one list of these, for the
    consumers' retries (``is_transient``) and the gateway's 503s."""
    import asyncpg
    from sqlalchemy import exc as sa

    if isinstance(exc, sa.DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, OSError  # the driver connects first and raises these unwrapped
                      | sa.OperationalError | sa.InterfaceError
                      | sa.TimeoutError | sa.DisconnectionError  # the pool waited in vain
                      | asyncpg.PostgresConnectionError  # SQLSTATE 08
                      | asyncpg.CannotConnectNowError | asyncpg.AdminShutdownError
                      | asyncpg.CrashShutdownError  # 57P: restarting or starting up
                      | asyncpg.InsufficientResourcesError  # 53: too many connections
                      | asyncpg.InterfaceError)


def is_transient(exc: BaseException) -> bool:
    """True when ``exc`` says a dependency (PostgreSQL, the broker) is away for now, not
    that the message or the request is wrong: the caller waits and tries again, without
    spending the message's retries or dead-lettering it. Imports stay local so that
    ``shared.errors`` has no driver dependency."""
    from aiokafka import errors as kafka
    from sqlalchemy import exc as sa

    if isinstance(exc, Retryable | TimeoutError | ConnectionError) or database_unavailable(exc):
        return True
    if isinstance(exc, sa.DBAPIError):  # a constraint violation is the caller's bug
        return exc.orig is not None and is_transient(exc.orig)
    if isinstance(exc, kafka.KafkaError):
        # the client says most trouble with a generic KafkaError ("unable to get cluster
        # metadata"); only a message the broker can never take is permanent
        return not isinstance(exc, kafka.MessageSizeTooLargeError | kafka.RecordTooLargeError
                              | kafka.InvalidTopicError | kafka.UnsupportedVersionError
                              | kafka.TopicAuthorizationFailedError
                              | kafka.InvalidRequiredAcksError)
    # only an explicit ``raise ... from`` (drivers wrap that way): an error raised while
    # handling a transient one may be a plain bug
    return exc.__cause__ is not None and is_transient(exc.__cause__)
