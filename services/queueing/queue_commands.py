"""How the queue tree changes: the queues file at start, and the admin API's commands.

Pure: the stored queues in, the new specs out, or a refusal (``errors.py``) naming
what is wrong. The service stores the result and announces it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from services.queueing.config import QueueConfigError
from services.queueing.errors import (
    InvalidQueueSettings,
    QueueExists,
    QueueNotFound,
    QueueStateConflict,
)
from shared.events import QueueAction, QueueCommand
from shared.queuespec import DEFAULT_QUEUE, QueueSpec, QueueState, tree_errors, validation_errors

if TYPE_CHECKING:
    from services.queueing.store import QueueRow

_STATE_OF = {QueueAction.CLOSE: QueueState.CLOSED, QueueAction.DRAIN: QueueState.DRAINING,
             QueueAction.OPEN: QueueState.OPEN}
_CHANGE_TO = {QueueState.CLOSED: "closed", QueueState.DRAINING: "draining",
              QueueState.OPEN: "opened"}
_VERB = {QueueAction.CLOSE: "closed", QueueAction.DRAIN: "drained", QueueAction.OPEN: "opened"}


def merge_file(stored: Mapping[str, QueueRow], file_specs: Sequence[QueueSpec]
               ) -> list[QueueSpec]:
    """The specs to write at start: a queue the file names, when it is new or its entry
    in the file changed since it was last applied (otherwise what is stored, maybe
    changed through the admin API, stands), and ``default`` unless one exists. Raises
    ``QueueConfigError`` when the file and what is stored make no valid tree."""
    merged = {n: r.spec for n, r in stored.items()}
    changed = []
    for spec in file_specs:
        row = stored.get(spec.name)
        if row is None or row.file_hash != spec.fingerprint():
            merged[spec.name] = spec
            changed.append(spec)
    if DEFAULT_QUEUE not in merged:
        merged[DEFAULT_QUEUE] = QueueSpec(name=DEFAULT_QUEUE,
                                          description="the queue of jobs that name none")
        changed.append(merged[DEFAULT_QUEUE])
    errors = tree_errors(merged, {})
    if errors:
        raise QueueConfigError(errors, "queues (the file with what is stored)")
    return changed


def apply_command(cmd: QueueCommand, specs: dict[str, QueueSpec]) -> tuple[QueueSpec, Any]:
    """The queue ``cmd`` makes of ``specs``, and the change (``QueueChanged.change``)."""
    name = cmd.queue
    current = specs.get(name)
    if cmd.action is QueueAction.CREATE and current is not None:
        raise QueueExists(f"queue {name} already exists")
    if cmd.action is not QueueAction.CREATE and current is None:
        raise QueueNotFound(f"no queue {name}")
    if cmd.action in (QueueAction.CREATE, QueueAction.UPDATE):
        base = current.public() if current is not None else {}
        data = {**base, **cmd.settings, "name": name}
        try:
            spec = QueueSpec.model_validate(data)
        except ValidationError as exc:
            raise InvalidQueueSettings(
                "; ".join(f"{p}: {m}" for p, m in validation_errors(exc))) from exc
        errors = tree_errors({**specs, name: spec}, {})
        mine = [f"{p}: {m}" for p, m in errors if p.split(".")[0] == name]
        if errors:
            raise InvalidQueueSettings("; ".join(mine or [f"{p}: {m}" for p, m in errors]))
        return spec, "created" if current is None else "updated"
    assert current is not None
    if current.kind == "cohort":
        raise QueueStateConflict(f"{name} is a cohort: it holds no jobs, so it cannot be "
                                 + _VERB[cmd.action])
    state = _STATE_OF[cmd.action]
    if current.state is state:
        raise QueueStateConflict(f"queue {name} is already {state.value}")
    return current.model_copy(update={"state": state}), _CHANGE_TO[state]
