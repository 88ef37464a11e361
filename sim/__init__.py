"""Kairos' trace-driven simulator: replays public cluster traces through the SAME
scheduling core (``scheduling.Scheduler``) the live scheduler service runs.

- ``sim.traces``    loaders (Philly, Alibaba openb, Muri/Tiresias) and a synthetic generator
- ``sim.fill``      the FGD "fill" experiment on the openb traces (online placement)
- ``sim.engine``    the discrete-event simulator (arrivals, starts, completions,
                    preemptions with checkpoint loss, node failures)
- ``sim.metrics``   JCT, queueing, makespan, allocation over time, fairness
- ``sim.cli``       ``kairos sim`` (typer)
"""
