"""Billing weights in fair share (``scheduling/billing.py``): a tenant's GPUs count at
what an hour of their model costs, for the GPUs it holds (the model they are on) and
for those it asks (the cheapest model it may run on)."""

from __future__ import annotations

from scheduling import Scheduler
from tests.scheduling.builders import World, config, job, node

FAIR = ("gang", "priority", "fairshare", "binpack")
PRICES = {"H100": 4.0, "V100": 1.0}


def hetero() -> tuple:  # type: ignore[type-arg]
    return (node("h").gpus(8, model="H100").build(), node("v").gpus(8, model="V100").build())


def test_gpus_held_on_a_dearer_model_count_more_in_fair_share() -> None:
    """Tenant a holds 4 H100s, tenant b 6 V100s: by GPU count b holds more, so a goes
    first; at 4 per H100-hour a holds more (16 against 6), so b goes first."""
    for priced, first in ((False, "a1"), (True, "b1")):
        w = World(hetero(), Scheduler(config(*FAIR)))
        a, b = job("a-run").tenant("a").gpus(4), job("b-run").tenant("b").gpus(6)
        if priced:
            a, b = a.prices(**PRICES), b.prices(**PRICES)
        w.start(a, h=list(range(4)))
        w.start(b, v=list(range(6)))
        w.submit(job("a1").tenant("a").gpus(1).submit(0), job("b1").tenant("b").gpus(1).submit(1))
        assert [j.job_id for j in w.scheduler.order(w.snapshot())] == [first, *({"a1", "b1"} - {first})], priced


def test_a_waiting_job_is_charged_the_cheapest_model_it_may_run_on() -> None:
    """Two tenants with nothing running: a asks 2 GPUs that must be H100s (8 at 4 each),
    b 3 GPUs of any model (3 at 1): b's projected share is smaller, so it goes first."""
    w = World(hetero(), Scheduler(config(*FAIR)))
    w.submit(job("a1").tenant("a").gpus(2).models("H100").prices(**PRICES).submit(0),
             job("b1").tenant("b").gpus(3).prices(**PRICES).submit(1))
    assert [j.job_id for j in w.scheduler.order(w.snapshot())] == ["b1", "a1"]
    plain = World(hetero(), Scheduler(config(*FAIR)))
    plain.submit(job("a1").tenant("a").gpus(2).models("H100").submit(0),
                 job("b1").tenant("b").gpus(3).submit(1))
    assert [j.job_id for j in plain.scheduler.order(plain.snapshot())] == ["a1", "b1"]
