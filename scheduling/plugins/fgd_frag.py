"""FGD's pure parts (Weng et al., USENIX ATC'23): the workload's typical task types and
a node's fragmentation for them (``scheduling/plugins/fgd.py`` is the plugin).

Quantities are in GPUs. A typical type is ``_Type``: (popularity p, whole GPUs,
per-GPU memory MiB, per-GPU compute %, CPU milli, memory MiB, allowed model codes or
None), as the public simulator's typical pods are (CPU, per-GPU share, GPU count, GPU
type; it has no GPU memory or host memory in the key).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Literal

from scheduling.model import TaskRequest, TaskShape

_Type = tuple[float, int, int, int, int, int, frozenset[int] | None]


@lru_cache(maxsize=4096)
def _tie(s: TaskShape) -> str:
    """Equally popular types are ranked by their repr (a stable, total order)."""
    return repr(s)


def _paper_tie(s: TaskShape) -> tuple[int, int, int, str]:
    """The public simulator's order of equally popular types (its sort, reversed):
    more CPU first, then the larger per-GPU share, more GPUs, the later GPU type."""
    per_gpu = 100 if s.gpu else s.gpu_compute_pct
    spec = "".join(chr(0x10FFFF - ord(c)) for c in "|".join(s.gpu_models)) + chr(0x10FFFF)  # descending
    return (-s.cpu_milli, -per_gpu, -(s.gpu or (1 if per_gpu else 0)), spec)


def typical_mix(shapes: Iterable[TaskShape], popularity_pct: float = 60.0, step: int = 10,
                include_cpu: bool = False, ties: Literal["repr", "paper"] = "repr") -> list[TaskShape]:
    """Most popular task types covering ``popularity_pct`` of tasks, renormalised.
    Equally popular types are ranked by ``_tie`` (repr), or as the public simulator
    ranks them (``ties="paper"``: ``_paper_tie``); that decides which types a cut keeps."""
    count: dict[TaskShape, float] = {}
    for s in shapes:
        if not include_cpu and not (s.gpu or s.gpu_memory_mib or s.gpu_compute_pct):
            continue
        k = TaskShape(1.0, s.gpu, s.gpu_memory_mib, s.gpu_compute_pct, s.cpu_milli, s.memory_mib,
                      s.gpu_models)
        count[k] = count.get(k, 0.0) + s.weight
    total = sum(count.values())
    if total <= 0:
        return []
    tie = _paper_tie if ties == "paper" else _tie
    ranked = sorted(count.items(), key=lambda kv: (-kv[1], tie(kv[0])))
    kept: list[tuple[TaskShape, float]] = []
    covered = 0.0
    while covered < popularity_pct / 100.0 * total and len(kept) < len(ranked):
        for shape, w in ranked[len(kept): len(kept) + step]:
            kept.append((shape, w))
            covered += w
    return [TaskShape(w / covered, s.gpu, s.gpu_memory_mib, s.gpu_compute_pct, s.cpu_milli,
                      s.memory_mib, s.gpu_models) for s, w in kept]


def live_mix(shapes: list[TaskShape], step: float) -> list[TaskShape]:
    """The mix of the jobs pending and running now, its shares rounded to ``step``: it
    then stays the same object of comparison while jobs come and go (a new mix starts
    the fragmentation memo and every kept placement score over), and a type below half
    a step is dropped. Unchanged when rounding would drop every type."""
    if step <= 0:
        return shapes
    out = [TaskShape(round(s.weight / step) * step, s.gpu, s.gpu_memory_mib, s.gpu_compute_pct, s.cpu_milli,
                     s.memory_mib, s.gpu_models) for s in shapes]
    out = [s for s in out if s.weight > 0]
    return out or shapes


def task_shapes(tasks: Iterable[tuple[TaskRequest, tuple[str, ...], int]]) -> list[TaskShape]:
    """Task types of (task, allowed models, replicas), each once with its replicas
    summed (what ``typical_mix`` counts); FGD's key omits host memory."""
    count: dict[tuple[int, int, int, int, tuple[str, ...]], int] = {}
    for t, models, n in tasks:
        k = (t.gpu, t.gpu_memory_mib, t.gpu_compute_pct, t.cpu_milli, models)
        count[k] = count.get(k, 0) + n
    return [TaskShape(float(n), g, gm, gc, cpu, 0, models) for (g, gm, gc, cpu, models), n in count.items()]


def fragmentation(gm: Sequence[int], gc: Sequence[int], total_mem: Sequence[int], ok: Sequence[bool],
                  models: Sequence[int], cpu: int, mem: int, mix: Sequence[_Type]) -> float:
    """F_n(M) of one node, in GPUs: per GPU free memory ``gm`` and compute % ``gc``,
    ``ok`` usable (healthy, not MIG), ``models`` model codes; free host ``cpu``, ``mem``."""
    usable = [j for j in range(len(ok)) if ok[j]]
    free = sum(gc[j] for j in usable) / 100.0
    f = 0.0
    for p, g, mm, mc, tcpu, tmem, allowed in mix:
        cols = usable if allowed is None else [j for j in usable if models[j] in allowed]
        if not (g or mm or mc) or not cols:
            f += p * free  # GPU-less type or no GPU of its model: nothing here serves it
            continue
        if g:
            fits = [j for j in cols if gc[j] >= 100 and gm[j] >= total_mem[j]]
            host = len(fits) >= g
        else:
            fits = [j for j in cols if gm[j] >= mm and gc[j] >= mc]
            host = bool(fits)
        if host and cpu >= tcpu and mem >= tmem:
            fit = set(fits)  # the paper's Q3 case: only GPUs too small for m are fragments
            f += p * sum(gc[j] for j in usable if j not in fit) / 100.0
        else:
            f += p * free  # m cannot run here at all: every free GPU is a fragment
    return f
