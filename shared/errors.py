"""Root exceptions. The retry decision lives on the error; the consumer wrapper acts on it."""


class KairosError(Exception):
    """Root of every Kairos error."""


class Retryable(KairosError):
    """A transient failure: retry with backoff (database busy, broker hiccup)."""


class NonRetryable(KairosError):
    """A permanent failure for this message: dead-letter it and move on."""


class DecodeError(NonRetryable):
    """The message is not a valid envelope or payload."""
