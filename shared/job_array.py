"""Job arrays, as Slurm's ``--array``: one submit, many jobs, each knowing its index.

The syntax is Slurm's: indices and ranges separated by commas, a range may step
(``0-15:4`` is 0, 4, 8, 12), and ``%N`` at the end caps how many elements hold quota
at once (``0-999%50``). Each element is a job of its own (``<array id>-<index>``) with
the array's spec; its tasks get the index in their environment, under Kairos' names and
Slurm's, so a script written for ``sbatch --array`` runs unchanged.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

MAX_INDEX = 999_999  # Slurm's MaxArraySize is a setting too; indices stay below a million
MAX_ELEMENTS = 100_000  # what a spec may ask for at all; admission's own limit is lower
_RANGE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


@dataclass(frozen=True, slots=True)
class ArrayIndices:
    indices: tuple[int, ...]  # ascending, no repeats
    max_running: int | None  # the "%N" cap; None: as many as quota allows

    @property
    def size(self) -> int:
        return len(self.indices)


def parse_array(text: str, max_elements: int = MAX_ELEMENTS) -> ArrayIndices:
    """Read ``0-9``, ``1,3,5-7``, ``0-15:4``, ``0-999%50``; ValueError says what is wrong."""
    body, _, cap = text.strip().partition("%")
    max_running = None
    if cap:
        if not cap.isdigit() or int(cap) < 1:
            raise ValueError(f"'%{cap}': the cap on elements running at once must be a "
                             "whole number of at least 1")
        max_running = int(cap)
    if not body:
        raise ValueError("no indices: write them as 0-9, 1,3,5-7 or 0-15:4")
    seen: set[int] = set()
    for part in body.split(","):
        m = _RANGE.match(part.strip())
        if m is None:
            raise ValueError(f"'{part}' is not an index or a range (0-9, or 0-15:4 with a step)")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        step = int(m.group(3)) if m.group(3) is not None else 1
        if hi < lo:
            raise ValueError(f"'{part}': a range goes up ({lo} is past {hi})")
        if step < 1:
            raise ValueError(f"'{part}': the step must be at least 1")
        if hi > MAX_INDEX:
            raise ValueError(f"'{part}': indices go up to {MAX_INDEX}")
        if len(seen) + (hi - lo) // step + 1 > max_elements:
            raise ValueError(f"an array has at most {max_elements} elements")
        seen.update(range(lo, hi + 1, step))
    return ArrayIndices(tuple(sorted(seen)), max_running)


def new_array_id() -> str:
    return "a-" + uuid.uuid4().hex[:16]


def is_array_id(value: str) -> bool:
    return value.startswith("a-") and "-" not in value[2:]


def element_id(array_id: str, index: int) -> str:
    return f"{array_id}-{index}"


def element_env(array_id: str, index: int, arr: ArrayIndices) -> dict[str, str]:
    """What an element's tasks find in their environment (Slurm's names beside ours)."""
    return {
        "KAIROS_ARRAY_ID": array_id,
        "KAIROS_ARRAY_INDEX": str(index),
        "SLURM_ARRAY_JOB_ID": array_id,
        "SLURM_ARRAY_TASK_ID": str(index),
        "SLURM_ARRAY_TASK_COUNT": str(arr.size),
        "SLURM_ARRAY_TASK_MIN": str(arr.indices[0]),
        "SLURM_ARRAY_TASK_MAX": str(arr.indices[-1]),
    }
