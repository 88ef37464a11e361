"""Run-time estimates from the history of finished jobs: a point estimate for the policy
and quantiles of the time left for a forecast's band. Pure: no clock, no I/O; the
simulator and the live services feed it finished jobs and ask it about others.

Jobs are "similar" when they share a tenant and a GPU count (else the GPU count alone,
else any job): Philly's durations vary over five orders of magnitude, but a tenant's jobs
of one size repeat (the same sweep, the same model).

The point estimate is the median of the last ``HISTORY`` similar jobs (what the
``default`` policy ranks by; the simulator's results depend on it staying exactly this).
Quantiles come from a longer window (``WINDOW``) and, for a job that has run for a while,
only from similar jobs that ran longer than that (the duration *conditioned on attained
service*, minus what it has done): a job that has outlived most of its peers is expected
to run long, as heavy tails say.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from scheduling.arrays import FloatArray

HISTORY = 30  # finished jobs a point estimate looks back on (Philly 10k, 64x8: 50 -> 7.89 h, 30 -> 7.72 h)
WINDOW = 200  # finished jobs the quantiles look back on
# similar jobs' durations a job carries for its Gittins rank: a distribution needs more
# than a median (Philly 64x8: 30 -> 6.35 h, 200 -> 6.24 h; Muri trace4 8x8: 522 -> 350 h)
SAMPLES = WINDOW
MIN_SAMPLES = 5  # fewer similar jobs than this: widen to the next, coarser pool
Key = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Spread:
    """Seconds of running left at three quantiles (``low`` <= ``mid`` <= ``high``)."""

    low: float
    mid: float
    high: float

    @classmethod
    def exactly(cls, s: float) -> Spread:
        return cls(s, s, s)

    def at(self, which: int) -> float:
        """0: low, 1: mid, 2: high."""
        return (self.low, self.mid, self.high)[which]


class DurationHistory:
    """Durations of finished jobs by (tenant, GPUs) and by GPUs, in finishing order."""

    def __init__(self, quantiles: tuple[float, float] = (0.1, 0.9)) -> None:
        self.by_key: dict[Key, list[float]] = {}
        self.by_size: dict[int, list[float]] = {}
        self.every: list[float] = []
        self.gpu_s = 0.0  # GPU-seconds of every finished job
        self.quantiles = quantiles
        # (tenant, gpus) -> (version, estimate, samples): one tuple shared by every job of the key
        self._memo: dict[Key, tuple[object, float | None, tuple[float, ...]]] = {}

    def learn(self, tenant: str, gpus: int, duration_s: float) -> None:
        self.by_key.setdefault((tenant, gpus), []).append(duration_s)
        self.by_size.setdefault(gpus, []).append(duration_s)
        self.every.append(duration_s)
        self.gpu_s += gpus * duration_s

    def estimate(self, tenant: str, gpus: int) -> float | None:
        """The policy's estimate: the median of the last ``HISTORY`` similar jobs."""
        xs = self.by_key.get((tenant, gpus)) or self.by_size.get(gpus)
        return statistics.median(xs[-HISTORY:]) if xs else None

    def samples(self, tenant: str, gpus: int) -> tuple[float, ...]:
        """The durations the estimate is the median of (the same jobs), ascending: what
        the policy's Gittins rank (``gittins_rank``) reads the spread from."""
        xs = self.by_key.get((tenant, gpus)) or self.by_size.get(gpus)
        return tuple(sorted(xs[-SAMPLES:])) if xs else ()

    def version(self, gpus: int) -> object:
        """Changes whenever the estimate or samples of any job of ``gpus`` GPUs may have:
        both read only durations of that GPU count."""
        return len(self.by_size.get(gpus) or ())

    def known(self, tenant: str, gpus: int) -> tuple[float | None, tuple[float, ...]]:
        """``estimate`` and ``samples`` now, computed once per change of ``version``: jobs
        of a key share one samples tuple (and the Gittins rank's memo with it) until the
        history learns a job of their size."""
        key = (tenant, gpus)
        v = self.version(gpus)
        hit = self._memo.get(key)
        if hit is None or hit[0] != v:
            hit = self._memo[key] = (v, self.estimate(tenant, gpus), self.samples(tenant, gpus))
        return hit[1], hit[2]

    def mean_gpu_s(self) -> float | None:
        """Mean GPU-seconds of a finished job (the naive forecast's unit of work)."""
        return self.gpu_s / len(self.every) if self.every else None

    def spread(self, tenant: str, gpus: int, ran_s: float = 0.0, point: float | None = None) -> Spread | None:
        """Time left of a job that has run ``ran_s``: the (low, high) quantiles of
        ``duration - ran_s`` over similar jobs that ran longer than ``ran_s``, and
        ``point`` (else their median) as the middle. None: nothing finished yet."""
        for pool in (self.by_key.get((tenant, gpus)), self.by_size.get(gpus), self.every):
            left = _left(pool, ran_s)
            if left is not None and left.size >= MIN_SAMPLES:
                break
        else:
            if not self.every:
                return None
            # it outlived every similar job on record: as long again (the core's rule)
            left = np.asarray([max(ran_s, 1.0)])
        lo, mid, hi = np.quantile(left, (self.quantiles[0], 0.5, self.quantiles[1])).tolist()
        if point is not None and ran_s == 0.0:
            mid = point
        return Spread(min(lo, mid), mid, max(hi, mid))


def gittins_rank(samples: Sequence[float], done: float) -> float | None:
    """The inverse of the Gittins index of a job that has run ``done`` seconds, its
    duration drawn from ``samples``: min over quanta q of E[min(left, q)] / P(left <= q),
    the expected service per unit of probability of finishing within q (Gittins;
    Scully et al. 2018). Tight history gives the time left (SRPT on the estimate); a
    spread of short and long gives the chance of finishing soon its due, so a job that
    has run past the short ones ranks behind fresh ones (least attained service, as
    Tiresias). The chance to finish within q is taken two binomial standard deviations
    below its share of samples: the minimum over quanta otherwise picks the few luckiest
    samples (200 samples of an exponential law ranked it at half its mean, median
    of 400 draws; with the bound, at its mean, and never below 0.76 of it). None: the job outlived every sample."""
    s = _sorted(samples)
    r = s[np.searchsorted(s, done, side="right"):] - done  # the same as sorting r[r > done]
    if not r.size:
        return None
    m = r.size
    k = np.arange(1, m + 1)
    # q = the k-th shortest time left: E[min(left, q)] = (sum of the k shortest + (m-k) q) / m
    # over P(left <= q) = k / m, taken two binomial standard deviations below: the minimum
    # over every quantum otherwise picks the few luckiest short samples
    sure = k - 2.0 * np.sqrt(k * (1.0 - k / m))
    return float(((np.cumsum(r) + (m - k) * r) / np.maximum(sure, 1e-9)).min())


# sorted copies of recent sample tuples (and their running sums), by identity: jobs of
# one class share one tuple (the history's), and a cycle ranks every running job of it again
_SORTED: dict[int, tuple[Sequence[float], np.ndarray, np.ndarray]] = {}


def _sorted_sums(samples: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """``samples`` sorted, NaN dropped, and their running sums from 0; kept for tuples
    only (a list may change)."""
    hit = _SORTED.get(id(samples))
    if hit is not None and hit[0] is samples:
        return hit[1], hit[2]
    s = np.asarray(samples, dtype=float)
    s = np.sort(s[~np.isnan(s)])
    sums = np.concatenate(([0.0], np.cumsum(s)))
    if isinstance(samples, tuple):
        if len(_SORTED) > 4096:
            _SORTED.clear()
        _SORTED[id(samples)] = (samples, s, sums)
    return s, sums


def _sorted(samples: Sequence[float]) -> np.ndarray:
    return _sorted_sums(samples)[0]


def mean_left(samples: Sequence[float], done: np.ndarray) -> np.ndarray:
    """Expected seconds left of jobs that have run ``done``, their durations drawn from
    ``samples``: the mean of what the longer ones ran past ``done`` (the work a queue
    holds; the median understates it under heavy tails). NaN: it outlived them all.
    Vectorised over jobs: a long queue's jobs of one class share one sorted copy."""
    s, sums = _sorted_sums(samples)
    i = np.searchsorted(s, done, side="right")
    n = len(s) - i
    out: np.ndarray = np.where(n > 0, (sums[-1] - sums[i]) / np.maximum(n, 1) - done, np.nan)
    return out


def _left(pool: Sequence[float] | None, ran_s: float) -> np.ndarray | None:
    if not pool:
        return None
    xs = np.asarray(pool[-WINDOW:], dtype=float)
    xs = xs[xs > ran_s] - ran_s
    return xs if xs.size else None


def remaining_by_rule(estimate_s: float | None, ran_s: float, unknown_s: float = 3600.0,
                      overrun: float = 1.0) -> float:
    """The core's own expectation (``expected_left``, of one job): the estimate minus what
    it did; past the estimate ``overrun`` times as long again; with none, as long again
    (at least ``unknown_s`` for a job that has not run)."""
    if estimate_s is None or math.isnan(estimate_s):  # NaN: none, as in expected_left
        return max(ran_s, unknown_s - ran_s, 1.0)
    if ran_s < estimate_s:
        return estimate_s - ran_s
    return max(overrun * ran_s, 1.0)


def expected_left(est: FloatArray, done: FloatArray, unknown_s: float, overrun: float) -> FloatArray:
    """Seconds a job is expected to run still, having run ``done``: its estimate minus
    what it did; past the estimate (or with none) heavy tails say as long again."""
    known = ~np.isnan(est)
    ahead = known & (done < est)
    past = np.where(known, overrun * done, np.maximum(done, unknown_s - done))
    return np.where(ahead, np.where(known, est, 0.0) - done, np.maximum(past, 1.0))
