"""Mixed clusters: FIFO, Tiresias, Kairos blind to GPU models and Kairos told each
job's speed per model, on Gavel's 36 V100 + 36 P100 + 36 K80 GPUs (sim/hetero_experiment.py)
-> bench/results/sim_hetero.json.

    python bench/sim_hetero.py                     # every case (about 10 min on 2 cores)
    python bench/sim_hetero.py --rates 3 6 --seeds 1 --no-msr --out /tmp/h.json   # a quick look

Prints average JCT per case and policy, Kairos-aware over Tiresias and over Kairos
blind to models where queues form, and every target missed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.hetero_experiment import RATES, SEEDS, cases, print_table, run

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", type=float, nargs="+", default=list(RATES), help="Poisson rates, jobs per hour")
    p.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    p.add_argument("--no-msr", action="store_true", help="leave out the MSR traces")
    p.add_argument("--workers", type=int, default=2, help="runs at once, in separate processes")
    p.add_argument("--out", default="bench/results/sim_hetero.json")
    a = p.parse_args()
    doc = run(cases(a.rates, a.seeds, not a.no_msr), out=Path(a.out), workers=a.workers)
    print_table(doc)
