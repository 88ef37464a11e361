"""The chaos suite: one fault at a time under a steady workload, on the embedded stack
(16 simulated nodes x 8 GPUs, supervised), each phase judged by the invariant checker.

    python bench/chaos.py [--faults kill_admission,restart_broker] [--jobs 60]

Prints a table (fault, recovery s, lost, double runs, 5xx, violations) and writes
bench/results/chaos.json. The harness is kairos/chaos.py; `make chaos` runs every fault.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kairos.chaos import FAULTS, Chaos, Client, Recorder, chaos_stack, print_crashes, unavailable

RESULTS = Path(__file__).parent / "results" / "chaos.json"


def run(faults: list[str], jobs: int, nodes: int) -> dict[str, object]:
    workdir = Path(tempfile.mkdtemp(prefix="kairos-chaos-"))
    stack = chaos_stack(workdir, nodes)
    started = time.monotonic()
    stack.start()
    assert stack.kafka_bootstrap
    recorder = Recorder(stack.kafka_bootstrap)
    recorder.start()
    client = Client(stack)
    chaos = Chaos(stack, recorder, client)
    results: dict[str, object] = {}
    try:
        for name in faults:
            print(f"--- {name}", flush=True)
            why = unavailable(name)
            if why:  # reported, never silently dropped
                results[name] = {"skipped": why}
                print(f"    skipped: {why}", flush=True)
                continue
            results[name] = res = chaos.phase(name, FAULTS[name], jobs=jobs)
            print(json.dumps({k: v for k, v in res.items() if k != "details"}), flush=True)
            for d in res["details"]:  # type: ignore[attr-defined]
                print("   ", d, flush=True)
    finally:
        client.close()
        recorder.stop()
        stack.stop()
        print_crashes(workdir)
        shutil.rmtree(workdir, ignore_errors=True)
    return {"faults": results, "nodes": nodes, "gpus_per_node": 8,
            "jobs_per_fault": jobs, "jobs_total": sum(r.get("jobs", 0) for r in results.values()),  # type: ignore[attr-defined]
            "wall_s": round(time.monotonic() - started, 1),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                        "cpu_hog": os.environ.get("KAIROS_CPU_HOG")}}  # scripts/with-cpu-hog.sh


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--faults", default=",".join(FAULTS), help="comma-separated, in order")
    ap.add_argument("--jobs", type=int, default=60, help="jobs per fault")
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    out = run([f for f in args.faults.split(",") if f], args.jobs, args.nodes)
    print(f"\n{'fault':38} {'recovery_s':>10} {'lost':>5} {'double':>6} {'5xx':>4} "
          f"{'503':>4} {'violations':>10}")
    for name, r in out["faults"].items():  # type: ignore[attr-defined]
        if "skipped" in r:
            print(f"{name:38} skipped: {r['skipped']}")
            continue
        print(f"{name:38} {r['recovery_s']!s:>10} {r['lost']:>5} {r['double_runs']:>6} "
              f"{r['errors_5xx']:>4} {r['unavailable_503']:>4} {r['violations']:>10}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
