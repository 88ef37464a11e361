"""A few recent values kept by key, for memos that come back (a workload mix, a score
epoch): the one being left is put away, the one coming back taken out."""

from __future__ import annotations

from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


def swap(stash: dict[K, V], leaving: K, value: V, coming: K, keep: int) -> V | None:
    """Put ``value`` away under ``leaving`` and take out what ``coming`` left (None if it
    is not kept); beyond ``keep`` entries, the least recently left go."""
    stash[leaving] = value
    hit = stash.pop(coming, None)
    while len(stash) > keep:
        del stash[next(iter(stash))]
    return hit
