"""The validated config: every error with its field path."""

from __future__ import annotations

import pytest

from scheduling import ConfigError, Scheduler, SchedulerConfig


def test_defaults_enable_every_core_plugin() -> None:
    names = [p.name for p in SchedulerConfig().plugins]
    assert names[:4] == ["gang", "priority", "srpt", "fairshare"]
    assert {"backfill", "elastic", "kairos", "topology"} <= set(names)
    Scheduler()  # builds


def test_yaml() -> None:
    cfg = SchedulerConfig.from_yaml("""
plugins:
  - name: gang
  - name: priority
    args: {aging_per_hour: 10, starvation_bound_s: 3600}
  - name: binpack
    weight: 2
    args: {strategy: spread}
seed: 7
preemption: {max_preemptors_per_cycle: 2}
""")
    assert cfg.seed == 7
    assert cfg.plugins[2].weight == 2
    assert Scheduler(cfg).by_name["binpack"].args.strategy == "spread"


def test_every_error_is_reported_with_its_path() -> None:
    with pytest.raises(ConfigError) as e:
        SchedulerConfig.load({
            "plugins": [
                {"name": "gang"},
                {"name": "prioriti"},
                {"name": "priority", "args": {"aging_per_hour": -1, "nope": 1}},
                {"name": "binpack", "weight": -1, "args": {"strategy": "diagonal"}},
                {"name": "gang"},
            ],
            "preemption": {"max_preemptors_per_cycle": -3},
            "extra": 1,
        })
    paths = {p for p, _ in e.value.errors}
    assert {
        "plugins.1.name", "plugins.2.args.aging_per_hour", "plugins.2.args.nope",
        "plugins.3.weight", "preemption.max_preemptors_per_cycle", "extra",
    } <= paths
    assert "did you mean 'priority'" in str(e.value)


def test_plugin_args_are_checked_even_when_the_rest_is_valid() -> None:
    with pytest.raises(ConfigError) as e:
        SchedulerConfig.load({"plugins": [{"name": "binpack", "args": {"strategy": "diagonal"}},
                                          {"name": "gang"}, {"name": "gang"}]})
    assert [p for p, _ in e.value.errors] == ["plugins.0.args.strategy", "plugins.2.name"]


def test_bad_yaml_and_unknown_preset() -> None:
    with pytest.raises(ConfigError):
        SchedulerConfig.from_yaml("plugins: [")
    with pytest.raises(ConfigError):
        SchedulerConfig.from_yaml("- 1")
    with pytest.raises(ConfigError):
        SchedulerConfig.preset("magic")
