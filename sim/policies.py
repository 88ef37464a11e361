"""The policies the JCT experiments compare, all presets of the same core.

Kairos is the core's ``default`` preset and knows only what is known at submit time
(estimates from the history of finished jobs); SJF gets the true durations (an oracle
bound, not a competitor); the others need no estimate.
"""

from __future__ import annotations

from dataclasses import replace

from scheduling import SchedulerConfig
from sim.engine import Estimates, SimSettings

POLICIES = ("FIFO", "SJF-oracle", "Tiresias", "DRF", "Kairos")
# mixed clusters: Kairos told each job's speed per GPU model, beside the same core blind to it
AWARE = "Kairos-aware"
LEARNED = "Kairos-learned"  # the same, with speeds learned from the jobs of each class that ran
HETERO_POLICIES = ("FIFO", "Tiresias", "Kairos", AWARE, LEARNED)
PRESET = {"FIFO": "fifo", "SJF-oracle": "sjf", "Tiresias": "tiresias", "DRF": "drf", "Kairos": "default",
          AWARE: "default", LEARNED: "default"}
ESTIMATES: dict[str, Estimates] = {"SJF-oracle": "oracle", "Kairos": "history", AWARE: "history",
                                   LEARNED: "history"}
ALIASES = {"SJF": "SJF-oracle"}  # what the command line also takes


# FIFO and SJF never name victims: preemption off only saves the core a search.
NON_PREEMPTIVE = ("FIFO", "SJF-oracle")
# Tiresias re-ranks running jobs as their attained service crosses a threshold: it needs
# cycles between events. The others' decisions change only at events.
TICKED = ("Tiresias",)


def policy_config(policy: str) -> SchedulerConfig:
    policy = ALIASES.get(policy, policy)
    if policy in NON_PREEMPTIVE:
        return SchedulerConfig.preset(PRESET[policy], preemption={"enabled": False})
    return SchedulerConfig.preset(PRESET.get(policy, policy))


def policy_settings(policy: str, base: SimSettings) -> SimSettings:
    """Estimates the policy may use; idle cycles skipped and no re-ranking ticks for the
    non-preemptive ones (nothing changes for them between events)."""
    policy = ALIASES.get(policy, policy)
    np_ = policy in NON_PREEMPTIVE
    return replace(base, estimates=ESTIMATES.get(policy, "none"), skip_idle_cycles=np_,
                   tick_s=base.tick_s if policy in TICKED else 0.0,
                   speeds="given" if policy == AWARE else "learned" if policy == LEARNED else "none")
