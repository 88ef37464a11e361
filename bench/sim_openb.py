"""The FGD "fill" experiment on Alibaba openb (data/traces/SOURCE_README.md): Random,
BestFit, FGD and Kairos' packing, all the core's placement plugins, seeds 42-51.

    python bench/sim_openb.py                       # 7 lists x 10 seeds -> bench/results/sim_openb.json
    python bench/sim_openb.py --seeds 2 --lists default path/to/openb_pod_list_x.csv

A list is a name (default, gpushare100, multigpu50, cpu050 .. cpu250) or a pod-list
CSV path; cpuNNN lists are made from the default one (sim/openb_experiment.py).

Writes mean allocation % at 130% arrived per list and policy, the published figures
beside them, and a plot of allocation vs arrived GPU request.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.openb_experiment import LISTS, main
from sim.traces import TraceError

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=10, help="seeds 42..42+n-1")
    p.add_argument("--lists", nargs="+", default=list(LISTS), help="names or pod-list CSV paths")
    p.add_argument("--out", default="bench/results/sim_openb.json")
    a = p.parse_args()
    try:
        main(a.lists, list(range(42, 42 + a.seeds)), Path(a.out))
    except TraceError as e:
        p.error(str(e))
