"""How much of Kairos/Tiresias on a case is the policy and how much the draw: each case
run again on copies that differ only in what should not matter, Kairos and Tiresias side
by side on each copy -> bench/results/sim_sensitivity.json.

    python bench/sim_sensitivity.py -j 2                 # the default cases, 8 copies each
    python bench/sim_sensitivity.py --case 'muri-*' --copies 4
    python bench/sim_sensitivity.py --variant 'ratio 6={"srpt": {"preempt_ratio": 6}}'   # beside Kairos

Copy 0 is the suite's case itself (``sim/suite.py``; its ratio is the one in
``sim_robust.json``). Copy k > 0: for a public trace, every submit time moved later by
a uniform [0, 60) s (seed k): less than one scheduling round (60 s on Muri, 300 s on
Philly), the same jobs, sizes, tenants and durations; for a synthetic family, the same
family drawn again with seed k (another sample of the same laws). Per case: the ratio of
average JCTs on each copy, their geometric mean, spread, and on how many copies Kairos
is above Tiresias. A case whose ratio crosses 1 between copies that differ by less than a
round says the sign of its gap is not a property of the policy. ``--variant`` runs
overrides of the default preset beside it on the same copies (as in
``bench/starvation_tradeoff.py``): a rule is judged over the copies, not on copy 0.
``--fifo`` adds FIFO's runs (each copy's longest first wait against FIFO's, issue 17's
starvation rule); ``--resume`` keeps the runs already in ``--out`` (every variant's, named as it was) and runs the rest.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.starvation_tradeoff import parse_variant, variant_config
from sim.engine import Simulation
from sim.metrics import geomean, summarize
from sim.policies import policy_config, policy_settings
from sim.suite import Case, load, select
from sim.traces import TraceJob, uniform_cluster

OUT = Path("bench/results/sim_sensitivity.json")
JITTER_S = 60.0  # the Muri and synthetic round: a shift below it changes no decision's inputs much
# the cases above Tiresias in sim_robust.json (2026-12-04), the one known to swing
# (muri-trace1@16x8), and two with a clear lead, for contrast
CASES = ["muri-trace3@8x8", "muri-trace3@16x8", "muri-trace4@32x8", "syn-bimodal-steady-1t@8x8",
         "muri-trace1@16x8", "muri-trace1@8x8", "syn-exp-steady-4t@8x8"]
BASELINE = "Tiresias"
FIFO = "FIFO"  # with --fifo: the longest first wait's bound (issue 17: within FIFO's in the same run)


def copy_of(case: Case, k: int) -> list[TraceJob]:
    """The case's jobs, copy ``k`` (0: the case itself)."""
    if k == 0:
        return load(case)
    if case.family is not None:
        return load(replace(case, family=replace(case.family, seed=k)))
    rng = random.Random(k)
    return [replace(j, submit_s=j.submit_s + rng.uniform(0.0, JITTER_S)) for j in load(case)]


def run_one(task: tuple[str, int, str, dict[str, dict[str, Any]]]) -> tuple[str, int, str, dict[str, Any]]:
    """One policy (Tiresias, or Kairos with ``overrides`` of its preset) on one copy."""
    name, k, who, overrides = task
    case = select([name])[0]
    policy = who if who in (BASELINE, FIFO) else "Kairos"
    cfg = policy_config(policy) if policy != "Kairos" or not overrides else variant_config(overrides)
    t0 = time.perf_counter()
    res = Simulation(uniform_cluster(case.nodes, 8), copy_of(case, k), cfg,
                     policy_settings(policy, case.rules)).run()
    m = summarize(res)
    return name, k, who, {"avg_jct_s": m["avg_jct_s"], "max_first_wait_s": m["max_first_wait_s"],
                          "preemptions": m["preemptions"], "wall_s": round(time.perf_counter() - t0, 1)}


def summarise(runs: dict[str, dict[int, dict[str, Any]]], variant: str = "Kairos") -> dict[str, Any]:
    """Per case, ``variant``'s average JCT over Tiresias' on each copy both finished."""
    out: dict[str, Any] = {}
    for name, copies in runs.items():
        ratios = {k: r[variant]["avg_jct_s"] / r[BASELINE]["avg_jct_s"]
                  for k, r in sorted(copies.items()) if variant in r and BASELINE in r}
        if not ratios:
            continue
        xs = list(ratios.values())
        out[name] = {"ratio_by_copy": {str(k): round(v, 4) for k, v in ratios.items()},
                     "geomean": round(geomean(xs), 4), "min": round(min(xs), 4), "max": round(max(xs), 4),
                     "copies": len(xs), "copies_above_tiresias": sum(x > 1.0 for x in xs)}
        # the longest first wait against FIFO's on the same copy, where FIFO ran
        waits = {k: r[variant]["max_first_wait_s"] / max(r[FIFO]["max_first_wait_s"], 1e-9)
                 for k, r in sorted(copies.items()) if variant in r and FIFO in r}
        if waits:
            out[name] |= {"first_wait_over_fifo_by_copy": {str(k): round(v, 3) for k, v in waits.items()},
                          "copies_first_wait_above_fifo": sum(v > 1.0 for v in waits.values())}
    return out


def over_cases(summary: dict[str, Any]) -> dict[str, Any]:
    """Per copy, over the cases that have it: the geomean of the ratios and how many cases
    are above Tiresias (copy 0 is what the suite reports; the others, what it would)."""
    copies = sorted({k for row in summary.values() for k in row["ratio_by_copy"]}, key=int)
    out: dict[str, Any] = {}
    for k in copies:
        xs = [row["ratio_by_copy"][k] for row in summary.values() if k in row["ratio_by_copy"]]
        out[k] = {"cases": len(xs), "geomean": round(geomean(xs), 4), "cases_above_tiresias": sum(x > 1.0 for x in xs)}
    if summary:
        out["geomean_of_case_geomeans"] = round(geomean([row["geomean"] for row in summary.values()]), 4)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append", default=None, help="cases by glob (repeat; default: CASES)")
    ap.add_argument("--copies", type=int, default=8, help="copies per case, the case itself included")
    ap.add_argument("-j", "--jobs", type=int, default=1, help="runs at once, in separate processes")
    ap.add_argument("--variant", type=parse_variant, action="append", default=[],
                    help='also Kairos with these overrides of its preset: NAME={"plugin": {"arg": value}}')
    ap.add_argument("--fifo", action="store_true", help="also FIFO: each copy's longest first wait against FIFO's")
    ap.add_argument("--resume", action="store_true",
                    help="keep the runs already in --out, of every variant there, and run only the rest "
                         "(a --variant named as one there must have its overrides)")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    taken = [n for n, _ in a.variant if n in ("Kairos", BASELINE, FIFO)]
    if taken:
        ap.error(f"--variant {taken[0]!r}: the name is taken (Kairos is the default preset, {BASELINE} and "
                 f"{FIFO} the baselines)")
    variants = {"Kairos": {}, **dict(a.variant)}
    for overrides in variants.values():
        variant_config(overrides)  # a plugin not in the preset fails here, before any run
    if a.copies < 1:
        ap.error("--copies must be at least 1")
    try:
        names = [c.name for c in select(a.case or CASES)]
    except ValueError as e:
        ap.error(str(e))
    runs: dict[str, dict[int, dict[str, Any]]] = {}
    described = dict(variants)  # every variant with runs in --out: the protocol and summaries name them all
    if a.resume and a.out.exists():
        doc = json.loads(a.out.read_text())
        kept_variants = doc.get("protocol", {}).get("variants", {})
        for name, overrides in variants.items():
            if name in kept_variants and kept_variants[name] != overrides:
                ap.error(f"--variant {name!r}: the runs of {name!r} in {a.out} were made with "
                         f"{json.dumps(kept_variants[name])}, not {json.dumps(overrides)}; give it another name "
                         f"or another --out")
        described = {**kept_variants, **variants}
        runs = {n: {int(k): r for k, r in c.items()} for n, c in doc.get("runs", {}).items()}
    who = {BASELINE: {}, **({FIFO: {}} if a.fifo else {}), **variants}
    todo = [(n, k, w, o) for n in names for k in range(a.copies) for w, o in who.items()
            if w not in runs.get(n, {}).get(k, {})]
    t0 = time.perf_counter()

    def write(partial: bool) -> None:
        summary = summarise(runs)
        fifo = a.fifo or any(FIFO in r for c in runs.values() for r in c.values())
        copies = max([a.copies, *(len(c) for c in runs.values())])
        doc = {"protocol": {"copies": copies, "copy_0": "the suite's case (sim/suite.py)",
                            "copy_k_trace": f"every submit time + uniform [0, {JITTER_S:.0f}) s, seed k",
                            "copy_k_synthetic": "the family drawn with seed k", "baseline": BASELINE,
                            "variants": described, "fifo": fifo},
               "partial": partial, "wall_s": round(time.perf_counter() - t0, 1),  # this invocation's
               "summary": summary, "over_cases": over_cases(summary),
               **({"variant_summary": {v: summarise(runs, v) for v in described if v != "Kairos"}}
                  if len(described) > 1 else {}),
               "runs": {n: {str(k): r for k, r in sorted(c.items())} for n, c in runs.items()}}
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(doc, indent=2) + "\n")

    def record(name: str, k: int, policy: str, rec: dict[str, Any]) -> None:
        runs.setdefault(name, {}).setdefault(k, {})[policy] = rec
        write(partial=True)
        print(f"{name} copy {k} {policy}: avg JCT {rec['avg_jct_s'] / 3600:.2f} h ({rec['wall_s']} s)", flush=True)

    if a.jobs <= 1:
        for t in todo:
            record(*run_one(t))
    else:
        with ProcessPoolExecutor(a.jobs) as pool:
            for res in pool.map(run_one, todo):
                record(*res)
    write(partial=False)
    for v in variants:
        print(f"\n{'case':34s} {'geomean':>8s} {'min':>7s} {'max':>7s}  above Tiresias  ({v}/Tiresias, {a.copies} copies)")
        s = summarise(runs, v)
        for name, row in s.items():
            fifo = (f"   first wait > FIFO's on {row['copies_first_wait_above_fifo']}"
                    if "copies_first_wait_above_fifo" in row else "")
            print(f"{name:34s} {row['geomean']:8.3f} {row['min']:7.3f} {row['max']:7.3f}  "
                  f"{row['copies_above_tiresias']}/{row['copies']}   copy 0: {row['ratio_by_copy'].get('0', math.nan):.3f}"
                  f"{fifo}")
        every = over_cases(s)
        for k, row in every.items():
            if k.isdigit():
                print(f"copy {k}: geomean over {row['cases']} cases {row['geomean']:.3f}, "
                      f"{row['cases_above_tiresias']} above Tiresias")
        if s:
            print(f"geomean of the cases' geomeans: {every['geomean_of_case_geomeans']:.3f}")


if __name__ == "__main__":
    main()
