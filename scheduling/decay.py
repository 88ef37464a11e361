"""Fair share over past usage, decayed with a half-life (Slurm's
``PriorityDecayHalfLife``, KAI's time-based fair share).

Each tenant's past use is its GPU-seconds, each second weighted by ``2 ** (-age /
half_life)``. A tenant that held ``g`` GPUs for ever reaches ``g * tau`` GPU-seconds
(``tau = half_life / ln 2``), so ``past / (capacity * tau)`` is a share of the cluster
like the current one: the core's fair share (``plugins/fairshare.py``) orders tenants by
the sum of the two, so a tenant that ran much in the last half-lives waits behind one
that did not, even when neither holds anything now.

The caller (the simulator, the scheduler service) keeps one ``DecayedUsage``: at each
cycle ``advance(now)`` counts what was held since the last cycle and gives the
snapshot's ``past_usage``; once the cycle's binds are applied, ``hold`` records what is
held from then on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

LN2 = math.log(2.0)
FORGET = 1e-6  # GPU-seconds below which a tenant's past is dropped


@dataclass(slots=True)
class DecayedUsage:
    half_life_s: float
    gpu_s: dict[str, float] = field(default_factory=dict)  # each tenant's past, at ``at``
    at: float | None = None
    held: dict[str, float] = field(default_factory=dict)  # GPUs held since ``at``

    @property
    def tau_s(self) -> float:
        return self.half_life_s / LN2

    def advance(self, now: float) -> dict[str, float]:
        """Each tenant's decayed GPU-seconds at ``now``, counting what it held since the
        last call (a clock that goes back counts nothing)."""
        if self.at is not None and now > self.at:
            d = 2.0 ** (-(now - self.at) / self.half_life_s)
            gain = self.tau_s * (1.0 - d)  # the decayed seconds of a GPU held throughout
            past: dict[str, float] = {}
            for t in self.gpu_s.keys() | self.held.keys():
                v = self.gpu_s.get(t, 0.0) * d + self.held.get(t, 0.0) * gain
                if v > FORGET:
                    past[t] = v
            self.gpu_s = past
        if self.at is None or now > self.at:
            self.at = now
        return dict(self.gpu_s)

    def hold(self, held: Mapping[str, float]) -> None:
        """The GPUs each tenant holds from the last ``advance`` on."""
        self.held = {t: g for t, g in held.items() if g > 0}


def past_share(gpu_s: float, capacity_gpus: float, half_life_s: float) -> float:
    """A tenant's decayed GPU-seconds as a share of the cluster's GPUs (0..1 when it
    never held more than the whole cluster)."""
    if capacity_gpus <= 0 or half_life_s <= 0:
        return 0.0
    return gpu_s / (capacity_gpus * half_life_s / LN2)

