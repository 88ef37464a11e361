"""The actions of a cycle (Volcano's ``pkg/scheduler/actions``), each a step over the
``Session``, run in the order ``SchedulerConfig.actions()`` lists them:

- ``allocate``: pending jobs in order, admitted and placed whole, else a reason; a job
  blocked for want of room is offered to the blocked-job actions right then:
- ``preempt``: it takes room from lower-priority running jobs (elastic ones shrink first)
- ``backfill``: it gets a reservation that later jobs may use only if they end before
- ``migrate``: running jobs move to faster GPU models left free, when it pays
- ``grow``: running elastic jobs take idle GPUs outside claims and reservations
"""

from __future__ import annotations

from scheduling.actions.allocate import Allocate
from scheduling.actions.backfill import Backfill
from scheduling.actions.base import Action, BlockedJobAction
from scheduling.actions.grow import Grow
from scheduling.actions.migrate import Migrate
from scheduling.actions.preempt import Preempt
from scheduling.config import SchedulerConfig
from scheduling.framework import Plugin

__all__ = ["Action", "Allocate", "Backfill", "BlockedJobAction", "Grow", "Migrate", "Preempt", "build_actions"]


def build_actions(config: SchedulerConfig, hooks: dict[str, list[Plugin]]) -> list[Action]:
    """The config's actions, in order, each given its settings and the plugin hooks it calls."""
    names = config.actions()
    elastic = config.elastic_args()
    backfill = config.backfill_args()
    rescuers: list[BlockedJobAction] = []
    if "preempt" in names:
        rescuers.append(Preempt(config.preemption, hooks["victims"], elastic is not None and elastic.shrink))
    if "backfill" in names:
        assert backfill is not None
        rescuers.append(Backfill(backfill))
    by_name: dict[str, Action] = {a.name: a for a in rescuers}
    by_name["allocate"] = Allocate(hooks["admit"], rescuers)
    by_name["grow"] = Grow()
    by_name["migrate"] = Migrate()
    return [by_name[n] for n in names]
