"""The scheduler's placement and preemption counters, as the monitoring catalogue defines
them: replicas an elastic job grows into are placements; a shrink's stopped replicas are
preemptions with reason ``shrink``."""

from __future__ import annotations

from prometheus_client import REGISTRY

from services.scheduler.main import count_preemptions, placed_tasks
from services.scheduler.state import Output
from tests.services.builders import ready
from tests.services.test_scheduler_elastic import new_state, run_all
from tests.services.test_scheduler_state import step


def shrinks() -> float:
    value = REGISTRY.get_sample_value("kairos_scheduler_preemptions_total", {"reason": "shrink"})
    assert value is not None, "every preemption reason is exported from the start"
    return value


def test_grown_replicas_count_as_placements_and_a_shrink_as_preemptions() -> None:
    s = new_state()
    placed = step(s, ready("E").gpus(4).replicas(1).elastic(1, 4).duration(600).build())
    assert placed_tasks(placed.events) == 1
    grow = run_all(s, "E")  # fills n1 and n2: three more replicas, by resize bindings
    assert placed_tasks(grow.events) == 3
    run_all(s, "E")

    before = shrinks()
    out = Output()
    s.handle(ready("H").gpus(8).priority_class("high").build(), out)
    plan = s.cycle(0.0, out)
    count_preemptions(plan)
    assert shrinks() - before == 2  # two 4-GPU replicas give way to H
    assert placed_tasks(out.events) == 0  # a shrink's resize binding starts nothing
