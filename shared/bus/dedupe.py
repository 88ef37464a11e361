"""A bounded memory of the event ids a consumer already handled."""

from __future__ import annotations

from collections import OrderedDict


class Dedupe:
    """Remembers the last ``capacity`` ids, forgetting the oldest first."""

    def __init__(self, capacity: int) -> None:
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._capacity = capacity

    def seen(self, event_id: str) -> bool:
        return event_id in self._seen

    def add(self, event_id: str) -> None:
        self._seen[event_id] = None
        if len(self._seen) > self._capacity:
            self._seen.popitem(last=False)
