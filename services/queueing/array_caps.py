"""A job array's ``%N``: at most N of its elements hold quota at once (admitted, or being
reclaimed); the next waits with reason ``array_limit`` until one ends."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from shared.events import JobSubmitted


class ArrayCaps:
    def __init__(self, holding: Iterable[JobSubmitted]) -> None:
        self._holding = Counter(e.array_id for e in holding if e.array_id is not None)

    def full(self, e: JobSubmitted) -> str | None:
        """Why ``e`` may not be admitted now, if its array is at its cap."""
        cap = e.array_max_running
        if e.array_id is None or cap is None or self._holding[e.array_id] < cap:
            return None
        return f"array {e.array_id} runs at most {cap} elements at once"

    def add(self, e: JobSubmitted) -> None:
        if e.array_id is not None:
            self._holding[e.array_id] += 1
