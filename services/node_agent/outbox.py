"""Reports the agent could not publish yet: kept in order until the broker takes them.

A task that ended while the broker was unreachable (or while the agent was fenced) is
still reported, once the agent can publish again. With a directory each report is also
a file, so one that was pending when the agent died is published by the next run.
Bounded: past ``limit`` the oldest report goes (logged).
"""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path

from services.node_agent.atomic_file import write_json
from shared.events import EVENT_TYPES, Event
from shared.logging import get_logger

log = get_logger(__name__)


class Outbox:
    def __init__(self, path: Path | None = None, limit: int = 10_000) -> None:
        self._path = path
        self._limit = limit
        self._items: deque[tuple[Event, str | None, Path | None]] = deque()
        self._seq = 0
        if path is not None and path.is_dir():
            for file in sorted(path.glob("*.json")):
                try:
                    raw = json.loads(file.read_text())
                    event = EVENT_TYPES[raw["type"]].model_validate(raw["data"])
                except (OSError, ValueError, KeyError) as exc:
                    log.warning("unreadable pending report dropped", file=str(file),
                                error=repr(exc))
                    file.unlink(missing_ok=True)
                    continue
                self._items.append((event, raw.get("id"), file))
                self._seq = max(self._seq, int(file.stem) + 1)

    def __len__(self) -> int:
        return len(self._items)

    @property
    def durable(self) -> bool:
        """What it keeps survives the agent (it has a directory)."""
        return self._path is not None

    def put(self, event: Event, event_id: str | None) -> None:
        file = None
        if self._path is not None:
            file = self._path / f"{self._seq:012d}.json"
            write_json(file, {"type": event.TYPE, "id": event_id,
                              "data": event.model_dump(mode="json")})
        self._seq += 1
        self._items.append((event, event_id, file))
        if len(self._items) > self._limit:
            dropped, _, old = self._items.popleft()
            log.error("too many pending reports: the oldest is dropped", kind=dropped.TYPE)
            if old is not None:
                old.unlink(missing_ok=True)

    def head(self) -> tuple[Event, str | None]:
        event, event_id, _ = self._items[0]
        return event, event_id

    def pop(self) -> None:
        """The head was published."""
        _, _, file = self._items.popleft()
        if file is not None:
            file.unlink(missing_ok=True)
