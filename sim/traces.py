"""Trace loaders and a synthetic generator.

Every loader takes any file of the same format (held-back data), and returns plain
records in the core's units (seconds, millicores, MiB, GPU compute percent).
"""

from __future__ import annotations

import csv
import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from scheduling import GpuSlot, Node

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"
OPENB = DATA / "alibaba-openb"
PHILLY = DATA / "philly" / "philly.csv"
MURI = DATA / "muri"


class TraceError(ValueError):
    """A trace file that cannot be read (missing required column, bad value)."""


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
    """One training job of a trace: submit time and true duration in seconds."""

    job_id: str
    submit_s: float
    duration_s: float
    num_gpus: int
    tenant: str = "default"


def load_philly(path: Path | str = PHILLY, limit: int | None = None) -> list[TraceJob]:
    """Philly (Pollux/Sia CSV): timestamp, duration, num_gpus[, gpu_time, cluster].

    Submit times are seconds since the earliest timestamp; jobs sorted by submit time
    (ties by file order). ``limit`` keeps the first jobs by submit time."""
    raw = []
    for k, r in enumerate(_rows(Path(path), ("timestamp", "duration", "num_gpus"))):
        ts = datetime.fromisoformat(r["timestamp"].strip()).timestamp()
        raw.append((ts, k, float(r["duration"]), int(float(r["num_gpus"])), (r.get("cluster") or "default").strip()))
    raw.sort()
    t0 = raw[0][0] if raw else 0.0
    jobs = [TraceJob(f"philly-{k}", ts - t0, max(d, 1.0), max(g, 1), vc) for ts, k, d, g, vc in raw]
    return jobs[:limit] if limit is not None else jobs


def load_muri(path: Path | str, limit: int | None = None) -> list[TraceJob]:
    """Muri / Tiresias CSV: job_id, num_gpu, submit_time, duration (ms), ... ."""
    jobs = []
    for r in _rows(Path(path), ("job_id", "num_gpu", "submit_time", "duration")):
        jobs.append(TraceJob(f"muri-{r['job_id'].strip()}", float(r["submit_time"]) / 1000.0,
                             max(float(r["duration"]) / 1000.0, 1.0), max(int(float(r["num_gpu"])), 1),
                             f"p{r.get('priority', '0').strip() or '0'}"))
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


def load_openb_pods(path: Path | str) -> list[OpenbPod]:
    """Pod list; the five columns name, cpu_milli, memory_mib, num_gpu, gpu_milli are
    required, ``gpu_spec`` (``|``-separated allowed models) and the rest optional."""
    out = []
    for r in _rows(Path(path), ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")):
        spec = (r.get("gpu_spec") or "").strip()
        out.append(OpenbPod(r["name"].strip(), int(float(r["cpu_milli"])), int(float(r["memory_mib"])),
                            int(float(r["num_gpu"])), int(float(r["gpu_milli"] or 0)),
                            tuple(m for m in spec.split("|") if m)))
    return out


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
