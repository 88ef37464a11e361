"""Queueing's errors: one root, and the refusals of an admin command.

A refusal names what is wrong, not how to answer it: the reply to the admin API gives
it an HTTP status (``messages.rejected``), and only there.
"""

from __future__ import annotations


class QueueingError(Exception):
    """The root of queueing's errors."""


class CommandRefused(QueueingError):
    """An admin command on a queue that cannot be applied; ``str()`` says why."""


class QueueNotFound(CommandRefused):
    """The command names a queue that does not exist."""


class QueueExists(CommandRefused):
    """A create names a queue that exists already."""


class InvalidQueueSettings(CommandRefused):
    """The settings do not validate, or would make the tree invalid."""


class QueueStateConflict(CommandRefused):
    """The queue cannot take that state: it is a cohort, or it is in it already."""
