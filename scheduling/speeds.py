"""What a job class runs at on each GPU model, learned from the jobs that ran.

A job that gives no speeds of its own (``JobRequest.gpu_speeds``) may borrow its class's:
the speeds similar jobs were measured at (the rate a running job reports, steps or
samples per second, as Gavel measures throughput online). A class is what the caller
names it by (the simulator: Gavel's job type and GPU count; the platform: the job's
name and size). The speeds are relative to the class's fastest model measured (1.0); a
model never measured for the class counts, in the core, at its slowest measured speed
(``scheduling.plugins.throughput.relative_speeds``), so an unmeasured model is neither
sought nor avoided, and the class is measured there the first time it lands there.
"""

from __future__ import annotations

import statistics
from collections.abc import Hashable

_TYPICAL = object()  # the key the typical class's speeds are kept under


class SpeedHistory:
    """Per class, the last rate measured on each GPU model (a rate is steady for a
    class on a model: the mean of a few would do no better in a simulator, and a
    platform's rate reports already average over the run)."""

    def __init__(self) -> None:
        self._rates: dict[Hashable, dict[str, float]] = {}
        self._speeds: dict[Hashable, tuple[tuple[str, float], ...]] = {}

    def learn(self, kind: Hashable, model: str, rate: float) -> None:
        """A job of ``kind`` ran at ``rate`` (any unit, the same for the class) on ``model``."""
        if rate <= 0:
            return
        rates = self._rates.setdefault(kind, {})
        if rates.get(model) != rate:
            rates[model] = rate
            self._speeds.clear()  # the typical class may move too

    def speeds(self, kind: Hashable) -> tuple[tuple[str, float], ...]:
        """The class's speed per measured model over its fastest, sorted (the same tuple
        object while nothing new is learned: the core's caches key on it). A class
        measured on fewer than two models takes the typical class's (``typical``): most
        jobs gain on the same newer GPUs, so a new class is best sent where they gain."""
        got = self._speeds.get(kind)
        if got is None:
            got = self.measured(kind) or self.typical()
            self._speeds[kind] = got
        return got

    def measured(self, kind: Hashable) -> tuple[tuple[str, float], ...]:
        """The class's own speeds: () until it was measured on two models or more."""
        rates = self._rates.get(kind, {})
        if len(rates) < 2:
            return ()
        top = max(rates.values())
        return tuple(sorted((m, r / top) for m, r in rates.items()))

    def typical(self) -> tuple[tuple[str, float], ...]:
        """Per model, the median speed of the classes measured on it and on another
        model, over the fastest such median; () while no class is."""
        got = self._speeds.get(_TYPICAL)
        if got is None:
            per: dict[str, list[float]] = {}
            for kind in self._rates:
                for m, v in self.measured(kind):
                    per.setdefault(m, []).append(v)
            med = {m: statistics.median(vs) for m, vs in per.items()}
            top = max(med.values(), default=0.0)
            got = tuple(sorted((m, v / top) for m, v in med.items())) if len(med) > 1 and top > 0 else ()
            self._speeds[_TYPICAL] = got
        return got
