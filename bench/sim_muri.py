"""JCT on the Muri traces (trace1, trace2) on 8 x 8 GPUs: FIFO, SJF (oracle), Tiresias,
DRF and Kairos, side by side -> bench/results/sim_muri.json (+ _runs.json, plots).

    python bench/sim_muri.py                 # both traces
    python bench/sim_muri.py --traces trace2 --limit 1500   # updates trace2's rows only
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.engine import SimSettings
from sim.jct_experiment import run
from sim.traces import MURI, load_cluster_spec, load_muri

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--traces", nargs="+", default=["trace1", "trace2"])
    p.add_argument("--limit", type=int, default=None, help="first N jobs only")
    p.add_argument("--out", default="bench/results/sim_muri.json")
    p.add_argument("--workers", type=int, default=1, help="runs at once, in separate processes")
    a = p.parse_args()
    cluster = load_cluster_spec(MURI / "n8g8.csv")
    base = SimSettings(cycle_s=60.0, tick_s=1800.0)
    out_path = Path(a.out)
    merged: dict[str, object] = json.loads(out_path.read_text()) if out_path.exists() else {}  # other traces kept
    protocol: dict[str, object] = dict(merged.pop("protocol", {}))  # type: ignore[call-overload]
    for tr in a.traces:
        jobs = load_muri(MURI / f"{tr}.csv", a.limit)
        out = Path(a.out).with_name(f"sim_muri_{tr}.json")
        doc = run(f"muri-{tr}", jobs, [cluster], out, base,
                  note=f"first {a.limit} jobs" if a.limit else "all jobs", workers=a.workers)
        protocol[tr] = doc.pop("protocol")
        merged |= {f"{key}/{tr}": rows for key, rows in doc.items()}  # e.g. "8x8/trace1"
    merged["protocol"] = protocol
    Path(a.out).write_text(json.dumps(merged, indent=2) + "\n")
