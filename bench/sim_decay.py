"""Fair share over decayed past use: each tenant's mean wait and JCT with the
fairshare plugin's half-life off, 1 h and 1 day (sim/decay_experiment.py)
-> bench/results/sim_decay.json.

    python bench/sim_decay.py              # every case (a few minutes on one core)
    python bench/sim_decay.py --no-philly --seeds 1 --out /tmp/d.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.decay_experiment import print_table, run

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--no-philly", action="store_true")
    p.add_argument("--out", default="bench/results/sim_decay.json")
    a = p.parse_args()
    print_table(run(a.seeds, not a.no_philly, Path(a.out)))
