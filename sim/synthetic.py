"""Synthetic workload families for the robustness suite: a duration law, an arrival
pattern and a number of tenants, at a stated offered load on a stated cluster.

Duration laws (mean ``mean_s``):
- ``exp``: exponential;
- ``pareto``: heavy-tailed Pareto, shape 1.5 (infinite variance);
- ``bimodal``: 80% short (mean/8) and 20% long, each exponential around its mode;
- ``uncorrelated``: log-normal, sigma 2, the same law for every job: nothing known at
  submit (tenant, size) says anything about the duration.
In the first three, each (tenant, GPU count) class has its own scale (log-uniform over
a factor 30), as real users' jobs repeat; in ``uncorrelated`` none has.

Arrivals: ``steady`` (Poisson), ``diurnal`` (Poisson, rate 1 +- 0.8 sin over a day),
``bursts`` (half the jobs in bursts of 2.5% of the trace within a minute, the rest
Poisson between them). The rate is set so that the offered work (GPU-seconds per second) is ``load``
times the cluster's GPUs.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from sim.traces import TraceJob

LAWS = ("exp", "pareto", "bimodal", "uncorrelated")
ARRIVALS = ("steady", "diurnal", "bursts")
SIZES: tuple[tuple[int, float], ...] = ((1, 0.6), (2, 0.12), (4, 0.12), (8, 0.12), (16, 0.04))
PARETO_SHAPE = 1.5


@dataclass(frozen=True, slots=True)
class Family:
    law: str
    arrivals: str
    tenants: int
    jobs: int = 2000
    load: float = 1.0  # offered GPU-seconds per second / the cluster's GPUs
    gpus: int = 64  # the cluster it is sized for
    mean_s: float = 3600.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.law not in LAWS:
            raise ValueError(f"unknown duration law {self.law!r}; known: {', '.join(LAWS)}")
        if self.arrivals not in ARRIVALS:
            raise ValueError(f"unknown arrival pattern {self.arrivals!r}; known: {', '.join(ARRIVALS)}")
        if self.tenants < 1 or self.jobs < 1 or self.load <= 0 or self.gpus < 1 or self.mean_s <= 0:
            raise ValueError("tenants, jobs, gpus must be >= 1; load and mean_s > 0")

    @property
    def name(self) -> str:
        return f"syn-{self.law}-{self.arrivals}-{self.tenants}t"


def _duration(rng: random.Random, law: str, mean: float) -> float:
    if law == "exp":
        return rng.expovariate(1.0 / mean)
    if law == "pareto":  # x_m * U^(-1/a), mean a x_m / (a - 1)
        xm = mean * (PARETO_SHAPE - 1) / PARETO_SHAPE
        return xm * rng.paretovariate(PARETO_SHAPE)
    if law == "bimodal":  # 0.8 short + 0.2 long = mean
        short = mean / 8
        return rng.expovariate(1.0 / short) if rng.random() < 0.8 else rng.expovariate(1.0 / ((mean - 0.8 * short) / 0.2))
    sigma = 2.0  # log-normal with the given mean
    return rng.lognormvariate(math.log(mean) - sigma**2 / 2, sigma)


def generate(f: Family) -> list[TraceJob]:
    rng = random.Random(f.seed)
    gs, ws = zip(*SIZES, strict=True)
    mean_gpus = sum(g * w for g, w in SIZES)
    rate = f.load * f.gpus / (mean_gpus * f.mean_s)  # jobs per second
    # a class's scale: log-uniform over x30, normalised so the mean over classes is 1
    classes = [(t, g) for t in range(f.tenants) for g in gs]
    raw = {c: math.exp(rng.uniform(0.0, math.log(30.0))) for c in classes}
    norm = sum(raw.values()) / len(raw)
    scale = {c: (v / norm if f.law != "uncorrelated" else 1.0) for c, v in raw.items()}
    times = _arrivals(rng, f.arrivals, f.jobs, rate)
    out = []
    for k, t in enumerate(times):
        g = rng.choices(gs, ws)[0]
        tenant = rng.randrange(f.tenants)
        d = max(1.0, round(_duration(rng, f.law, f.mean_s * scale[(tenant, g)])))
        out.append(TraceJob(f"syn-{k}", round(t, 3), d, g, f"t{tenant}"))
    return out


def _arrivals(rng: random.Random, pattern: str, n: int, rate: float) -> list[float]:
    out: list[float] = []
    t = 0.0
    if pattern == "steady":
        for _ in range(n):
            t += rng.expovariate(rate)
            out.append(t)
    elif pattern == "diurnal":  # thinning of a Poisson process at the peak rate 1.8 x rate
        peak = 1.8 * rate
        while len(out) < n:
            t += rng.expovariate(peak)
            if rng.random() < (1.0 + 0.8 * math.sin(2 * math.pi * t / 86400.0)) / 1.8:
                out.append(t)
    else:  # bursts: half the jobs come in bursts of 2.5% of the trace within a minute
        burst = max(1, n // 40)
        while len(out) < n:
            out += [t + rng.uniform(0.0, 60.0) for _ in range(min(burst, n - len(out)))]
            end = t + 2 * burst / rate  # the cycle's 2 x burst jobs at the mean rate
            while len(out) < n:
                t += rng.expovariate(rate / 2)
                if t >= end:
                    break
                out.append(t)
            t = end
    return sorted(out)
