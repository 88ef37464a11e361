"""Trace loaders and a synthetic generator.

Every loader takes any file of the same format (held-back data), and returns plain
records in the core's units (seconds, millicores, MiB, GPU compute percent).
"""

from __future__ import annotations

import csv
import math
import random
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum
from pathlib import Path

from scheduling import GpuSlot, Node

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"
OPENB = DATA / "alibaba-openb"
PHILLY = DATA / "philly" / "philly.csv"
MURI = DATA / "muri"


class TraceError(ValueError):
    """A trace file that cannot be read (missing required column, bad value)."""


class TimeUnit(StrEnum):
    """The unit of a trace's times (``--time-unit``)."""

    S = "s"
    MS = "ms"
    US = "us"


PER_SECOND = {TimeUnit.S: 1.0, TimeUnit.MS: 1e3, TimeUnit.US: 1e6}  # a time / this = seconds
_NAMES = {TimeUnit.S: "seconds", TimeUnit.MS: "milliseconds", TimeUnit.US: "microseconds"}
# Where a trace's median job duration is expected, in seconds: one minute to a thousand
# minutes (Philly 19 min, the Muri traces 55 min to 4 h, the synthetic default 30 min).
# The window is 1,000x wide, so a file read 1,000x off lands outside it.
PLAUSIBLE_MEDIAN_S = (60.0, 60_000.0)
# What whole seconds written in a finer unit may still mean: a median from 1 s to a year
# (slices of a trace can be far from its median: Muri trace1's first 20 jobs, 27 days).
SANE_MEDIAN_S = (1.0, 365 * 86400.0)


def _plain(seconds: float) -> str:
    for unit, size in (("days", 86400.0), ("h", 3600.0), ("min", 60.0), ("s", 1.0), ("ms", 1e-3)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds * 1e6:.3g} us"


def whole_seconds_unit(durations: Sequence[float]) -> TimeUnit | None:
    """The finer unit (ms, us) in which every duration is a whole number of seconds
    (traces are mostly kept to the second: the Muri traces are whole seconds written in
    ms); None if there is none."""
    nz = [d for d in durations if d > 0]
    if not nz:
        return None
    for u in (TimeUnit.US, TimeUnit.MS):
        if all(d % PER_SECOND[u] == 0 for d in nz):
            return u
    return None


def guess_unit(durations: Sequence[float], expected: TimeUnit) -> TimeUnit:
    """The unit a file's times look like, from its durations: the finer unit they are
    whole seconds in (when the median read so is sane), else the unit in which the
    median job duration falls in (or nearest) ``PLAUSIBLE_MEDIAN_S``; ties go to
    ``expected``."""
    pos = [d for d in durations if d > 0]
    if not pos:
        return expected
    med = statistics.median(pos)
    whole = whole_seconds_unit(pos)
    if whole is not None and SANE_MEDIAN_S[0] <= med / PER_SECOND[whole] <= SANE_MEDIAN_S[1]:
        return whole
    lo, hi = PLAUSIBLE_MEDIAN_S

    def off(u: TimeUnit) -> float:  # how far (log) the median read in u lies outside the window
        x = med / PER_SECOND[u]
        return 0.0 if lo <= x < hi else min(abs(math.log(x / lo)), abs(math.log(x / hi)))

    return min(TimeUnit, key=lambda u: (off(u), u != expected))


def units_per_second(path: Path, fmt: str, durations: Sequence[float], expected: TimeUnit,
                     unit: TimeUnit | str | None) -> float:
    """The file's time units per second (a time / this = seconds): ``unit`` when given
    (taken at its word); else the format's ``expected`` unit, unless the durations look
    like another (``guess_unit``): such a file is refused (``TraceError``, saying what
    it looks like and how to say which), never scaled 1,000x silently."""
    if unit is not None:
        try:
            return PER_SECOND[TimeUnit(unit)]
        except ValueError:
            raise TraceError(f"unknown time unit {unit!r}; one of {[u.value for u in TimeUnit]}") from None
    best = guess_unit(durations, expected)
    if best == expected:
        return PER_SECOND[expected]
    med = statistics.median([d for d in durations if d > 0])
    whole = whole_seconds_unit(durations) == best
    why = f"every duration is whole seconds in {best.value}; " if whole else ""
    lo, hi = PLAUSIBLE_MEDIAN_S
    raise TraceError(
        f"{path}: its times look like {_NAMES[best]}, not the {_NAMES[expected]} of the {fmt} format: "
        f"{why}read as {expected.value}, the median job runs {_plain(med / PER_SECOND[expected])}; as "
        f"{best.value}, {_plain(med / PER_SECOND[best])} (typical: {_plain(lo)} to {_plain(hi)}). "
        f"Say which: --time-unit {best.value} (time_unit={best.value!r}) to read them as {_NAMES[best]}, "
        f"or --time-unit {expected.value} to read them as {_NAMES[expected]} anyway.")


def _rows(path: Path, required: tuple[str, ...]) -> Iterator[dict[str, str]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        cols = [c.strip() for c in reader.fieldnames or []]
        missing = [c for c in required if c not in cols]
        if missing:
            raise TraceError(f"{path}: missing column(s) {missing}; has {cols}")
        reader.fieldnames = cols
        yield from reader


# --- training jobs (Philly, Muri, synthetic) -------------------------------------------
@dataclass(frozen=True, slots=True)
class TraceJob:
    """One training job of a trace: submit time and true duration in seconds.

    On a mixed cluster ``speeds`` holds the job's speed on each GPU model, relative to
    the model ``duration_s`` is measured on (1.0); a model it lacks cannot run it.
    Empty: every GPU runs it at full speed. ``kind`` names its job class (Gavel's job
    type), what a scheduler may learn speeds by."""

    job_id: str
    submit_s: float
    duration_s: float
    num_gpus: int
    tenant: str = "default"
    speeds: tuple[tuple[str, float], ...] = ()
    kind: str = ""


def load_philly(path: Path | str = PHILLY, limit: int | None = None,
                time_unit: TimeUnit | str | None = None) -> list[TraceJob]:
    """Philly (Pollux/Sia CSV): timestamp, duration (s), num_gpus[, gpu_time, cluster].

    Submit times are seconds since the earliest timestamp; jobs sorted by submit time
    (ties by file order). ``limit`` keeps the first jobs by submit time. Durations are
    read in ``time_unit``, else in seconds, and refused if they look like another unit
    (``units_per_second``)."""
    path = Path(path)
    raw = []
    for k, r in enumerate(_rows(path, ("timestamp", "duration", "num_gpus"))):
        ts = datetime.fromisoformat(r["timestamp"].strip()).timestamp()
        raw.append((ts, k, float(r["duration"]), int(float(r["num_gpus"])), (r.get("cluster") or "default").strip()))
    per_s = units_per_second(path, "Philly", [d for _, _, d, _, _ in raw], TimeUnit.S, time_unit)
    raw.sort()
    t0 = raw[0][0] if raw else 0.0
    jobs = [TraceJob(f"philly-{k}", ts - t0, max(d / per_s, 1.0), max(g, 1), vc) for ts, k, d, g, vc in raw]
    return jobs[:limit] if limit is not None else jobs


def load_muri(path: Path | str, limit: int | None = None,
              time_unit: TimeUnit | str | None = None) -> list[TraceJob]:
    """Muri / Tiresias CSV: job_id, num_gpu, submit_time, duration (both ms), ... .

    Times are read in ``time_unit``, else in milliseconds, and refused if they look like
    another unit (``units_per_second``)."""
    path = Path(path)
    raw = [(r["job_id"].strip(), float(r["submit_time"]), float(r["duration"]), int(float(r["num_gpu"])),
            r.get("priority", "0").strip() or "0")
           for r in _rows(path, ("job_id", "num_gpu", "submit_time", "duration"))]
    per_s = units_per_second(path, "Muri/Tiresias", [d for _, _, d, _, _ in raw], TimeUnit.MS, time_unit)
    jobs = [TraceJob(f"muri-{jid}", sub / per_s, max(d / per_s, 1.0), max(g, 1), f"p{prio}")
            for jid, sub, d, g, prio in raw]
    jobs.sort(key=lambda j: j.submit_s)
    return jobs[:limit] if limit is not None else jobs


def load_cluster_spec(path: Path | str) -> tuple[int, int]:
    """Muri cluster spec (num_switch, num_node_p_switch, num_gpu_p_node, ...) ->
    (nodes, GPUs per node)."""
    r = next(_rows(Path(path), ("num_switch", "num_node_p_switch", "num_gpu_p_node")))
    return int(r["num_switch"]) * int(r["num_node_p_switch"]), int(r["num_gpu_p_node"])


def synthetic(n: int, seed: int = 0, rate_per_h: float = 60.0, tenants: int = 4,
              sizes: tuple[tuple[int, float], ...] = ((1, 0.7), (2, 0.1), (4, 0.1), (8, 0.08), (16, 0.02)),
              median_duration_s: float = 1800.0, sigma: float = 1.5) -> list[TraceJob]:
    """Poisson arrivals at ``rate_per_h``, GPU sizes from ``sizes`` (size, probability),
    log-normal durations with the given median and sigma, tenants uniform."""
    rng = random.Random(seed)
    t = 0.0
    out = []
    gs, ws = zip(*sizes, strict=True)
    for k in range(n):
        t += rng.expovariate(rate_per_h / 3600.0)
        d = max(1.0, round(rng.lognormvariate(0.0, sigma) * median_duration_s))
        out.append(TraceJob(f"syn-{k}", round(t, 3), d, rng.choices(gs, ws)[0], f"t{rng.randrange(tenants)}"))
    return out


# --- Alibaba openb (GPU sharing) --------------------------------------------------------
@dataclass(frozen=True, slots=True)
class OpenbPod:
    """One openb task: ``num_gpu`` whole GPUs, or a share ``gpu_milli`` of one GPU."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_models: tuple[str, ...] = ()

    @property
    def shared(self) -> bool:
        return self.num_gpu == 1 and 0 < self.gpu_milli < 1000

    @property
    def gpu_request_milli(self) -> int:
        """The fill protocol's GPU request: gpu_milli for a share, else num_gpu x 1000."""
        return self.gpu_milli if self.shared else self.num_gpu * 1000


OPENB_POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


def load_openb_pods(path: Path | str) -> list[OpenbPod]:
    """Pod list; the five columns name, cpu_milli, memory_mib, num_gpu, gpu_milli are
    required, ``gpu_spec`` (``|``-separated allowed models) and the rest optional. A file
    that is not such a list (missing, not text, no rows, a bad value) is a ``TraceError``
    that names the file and the row."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such pod list" + (" (a directory)" if path.is_dir() else ""))
    out = []
    try:
        for k, r in enumerate(_rows(path, OPENB_POD_COLUMNS), start=2):
            try:
                spec = (r.get("gpu_spec") or "").strip()
                pod = OpenbPod(r["name"].strip(), int(float(r["cpu_milli"])), int(float(r["memory_mib"])),
                               int(float(r["num_gpu"])), int(float(r["gpu_milli"] or 0)),
                               tuple(m for m in spec.split("|") if m))
            except (TypeError, ValueError, AttributeError):
                raise TraceError(f"{path}, row {k}: not an openb pod ({ {c: r.get(c) for c in OPENB_POD_COLUMNS} })"
                                 ) from None
            if min(pod.cpu_milli, pod.memory_mib, pod.num_gpu, pod.gpu_milli) < 0 or pod.gpu_milli > 1000:
                raise TraceError(f"{path}, row {k}: a negative request or gpu_milli over 1000 ({pod})")
            out.append(pod)
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not a text (CSV) pod list") from None
    except csv.Error as e:
        raise TraceError(f"{path}: not a CSV pod list ({e})") from None
    if not out:
        raise TraceError(f"{path}: an openb pod list with no pods")
    return out


def with_cpu_share(pods: Sequence[OpenbPod], share: float, seed: int = 0) -> list[OpenbPod]:
    """An openb list whose CPU-only tasks are ``share`` of all tasks, as the FGD
    artifact's ``cpu050``-``cpu250`` lists were made from the default list: every GPU
    task kept, CPU-only tasks drawn (seeded, with replacement) from the list's own and
    put first (``openb_pod_list_cpu250`` has the default's 7,064 GPU tasks and 2,356
    CPU-only ones: 25.0%)."""
    if not 0 <= share < 1:
        raise TraceError(f"a CPU-only share must be in [0, 1), not {share}")
    gpu = [p for p in pods if p.num_gpu or p.gpu_milli]
    cpu = [p for p in pods if not (p.num_gpu or p.gpu_milli)]
    want = math.ceil(len(gpu) * share / (1 - share) - 1e-9)
    if want and not cpu:
        raise TraceError("the list has no CPU-only task to draw from")
    rng = random.Random(seed)
    drawn = [cpu[rng.randrange(len(cpu))] for _ in range(want)]
    return [replace(p, name=f"{p.name}-c{k}") for k, p in enumerate(drawn)] + gpu


def load_openb_nodes(path: Path | str = OPENB / "openb_node_list_gpu_node.csv") -> tuple[Node, ...]:
    """Node list (sn, cpu_milli, memory_mib, gpu, model) as core ``Node`` objects."""
    nodes = []
    for r in _rows(Path(path), ("sn", "cpu_milli", "memory_mib", "gpu")):
        model = (r.get("model") or "").strip()
        gpus = [GpuSlot(g, f"{r['sn'].strip()}-g{g}", model) for g in range(int(float(r["gpu"])))]
        nodes.append(Node(r["sn"].strip(), int(float(r["cpu_milli"])), int(float(r["memory_mib"])), gpus))
    return tuple(nodes)


def uniform_cluster(nodes: int, gpus_per_node: int, cpu_milli: int = 96_000, memory_mib: int = 1_048_576,
                    nodes_per_rack: int = 32, model: str = "V100") -> tuple[Node, ...]:
    """A described cluster: ``nodes`` x ``gpus_per_node`` identical GPUs, racks of 32."""
    return tuple(
        Node(f"n{i:04d}", cpu_milli, memory_mib,
             [GpuSlot(g, f"n{i}-g{g}", model, 32_768, g // 4) for g in range(gpus_per_node)],
             rack=f"r{i // nodes_per_rack:03d}")
        for i in range(nodes))
