"""The scheduler's validated policy config: which plugins, in which order, with what,
and from that the cycle's actions.

``plugins`` lists the policy plugins and, with them, the entries that switch an action
of the cycle on (``backfill``, ``elastic``) with its settings. Loaded from a dict or YAML; every error is reported with its field path
(``plugins.2.args.aging_per_hour: ...``), all of them at once (Kueue's validation).
"""

from __future__ import annotations

import difflib
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from scheduling.framework import REGISTRY, Plugin


class ConfigError(ValueError):
    """Invalid scheduler config; ``errors`` lists (field path, message)."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        self.errors = errors
        super().__init__("invalid scheduler config:\n" + "\n".join(f"  {p}: {m}" for p, m in errors))


class PluginSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    weight: float = Field(1.0, ge=0, description="score weight (score plugins)")
    args: dict[str, Any] = Field(default_factory=dict)


class PreemptionSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    enabled: bool = True
    max_preemptors_per_cycle: int = Field(8, ge=0, description="blocked jobs that may preempt")
    candidate_nodes: int = Field(8, ge=1, description="nodes examined per replica for victims")


class BackfillArgs(BaseModel):
    """Settings of the backfill action (the ``backfill`` entry of ``plugins``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    depth: int = Field(1, ge=1, description="blocked jobs that get a reservation (1 = EASY)")
    default_runtime_s: float | None = Field(
        None, gt=0, description="assumed runtime of jobs without an estimate; None: they never end"
    )
    interval_s: float = Field(0.0, ge=0, description="a job's reservation is kept this long before it "
                              "is searched again (Slurm's bf_interval), while the job waits and its "
                              "start is ahead; 0: searched every cycle")


class ElasticArgs(BaseModel):
    """Settings of elastic resizing (the ``elastic`` entry of ``plugins``): the grow
    action, and whether preemption may shrink elastic jobs first."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    grow: bool = True
    shrink: bool = True


# ``plugins`` entries that switch on an action of the cycle rather than add a plugin
ACTION_ARGS: dict[str, type[BaseModel]] = {"backfill": BackfillArgs, "elastic": ElasticArgs}


def _spec(name: str, weight: float = 1.0, **args: Any) -> PluginSpec:
    return PluginSpec(name=name, weight=weight, args=args)


DEFAULT_PLUGINS: tuple[PluginSpec, ...] = (
    _spec("gang"),
    # class and user priority tiers, and within a tier the shortest expected run time
    # left first (srpt by time: on Philly 64 x 8, 7.88 h average JCT by GPU-seconds left,
    # 7.08 h by time; wide jobs are not pushed behind every narrow one). The starvation
    # bound is a safety net, not a scheduling tool: under overload a short bound turns
    # the queue into FIFO among the starved (measured on Philly: 4 h to 3 days all
    # cascade), so it is two weeks here; and under sustained overload, where no fixed
    # bound can be kept, it stretches to six times the time the cluster needs to clear
    # its backlog (the whole Philly trace on 64 x 8 with srpt by time: 7.08 h average
    # JCT with three times, 6.29 h with six, 6.31 h with ten; docs/design/simulator.md).
    # overtaken: a job that never ran goes first once jobs submitted after it and ordered
    # after it have started past it (they fitted, it did not: a wide job among narrow ones)
    # and it has waited as long as the work submitted before it needs of the cluster (what
    # FIFO would make it wait); starved jobs no longer hold the line (hold_line), they get
    # reservations. Cases whose longest first wait exceeds FIFO's: 5 -> 1; Philly 64 x 8
    # 0.738 -> 0.728 x Tiresias (bench/results/sim_robust.json, docs/design/simulator.md)
    _spec("priority", aging_per_hour=0.0, starvation_bound_s=14 * 86400.0, backlog_factor=6.0,
          overtaken=True, hold_line=False),
    # rank "gittins": with the durations of similar finished jobs (runtime_samples), the
    # inverse Gittins index given what the job ran: SRPT on tight history, least attained
    # service on dispersed history (Muri trace4 on 8 x 8: 3.0 -> 0.81 x Tiresias' average
    # JCT; Philly 64 x 8: 6.29 h -> 6.24 h; bench/results/sim_robust.json)
    # pay: a job is stopped for shorter work only when what it loses (work since its
    # checkpoint, the restore) is less than the time the shorter job would otherwise wait
    # for running jobs to end (syn-exp-steady-1t 1.16 -> 0.62 x Tiresias, Philly 64 x 8
    # 0.707 -> 0.701, with the Gittins rank's binomial bound; bench/results/sim_robust.json)
    # siblings (the plugin's default): a job that never ran ranks no worse than a later one
    # of its tenant and size; their samples differ only in when they were read (cases
    # whose longest first wait exceeds FIFO's 2 -> 0; docs/design/simulator.md)
    _spec("srpt", by="time", rank="gittins", pay=True),
    _spec("fairshare"),
    _spec("nodeaffinity"),
    _spec("gpumodel"),
    _spec("affinity"),
    _spec("topology", 2.0),
    _spec("binpack", 1.0),
    _spec("kairos", 2.0),
    _spec("loadaware", 0.5),
    _spec("locality", 0.5),
    # speed per GPU model, where jobs give it: 2x slower costs 8 points, more than the
    # whole range of the packing scores above, so speed comes first (bench/sim_hetero.py)
    _spec("throughput", 8.0),
    # the head job's reservation is searched again every 30 minutes, or once its start
    # has passed (Slurm's bf_interval): a free GPU still goes to it at once, only what
    # may backfill waits for the next search (the whole search was a fifth of a cycle)
    _spec("backfill", interval_s=1800.0),
    _spec("elastic"),
)

# Research baselines: the same core with one ordering or placement policy swapped in.
_PLACEMENT = ("gang", "nodeaffinity", "gpumodel")
PRESETS: dict[str, tuple[PluginSpec, ...]] = {
    "default": DEFAULT_PLUGINS,
    "fifo": (*map(_spec, _PLACEMENT), _spec("fifo"), _spec("topology"), _spec("binpack")),
    "sjf": (*map(_spec, _PLACEMENT), _spec("sjf"), _spec("fifo"), _spec("topology"), _spec("binpack")),
    "srtf": (*map(_spec, _PLACEMENT), _spec("srtf"), _spec("fifo"), _spec("topology"),
             _spec("binpack")),
    "tiresias": (*map(_spec, _PLACEMENT), _spec("tiresias"), _spec("topology"), _spec("binpack")),
    "drf": (*map(_spec, _PLACEMENT), _spec("drf"), _spec("fifo"), _spec("topology"), _spec("binpack")),
    "random": (*map(_spec, _PLACEMENT), _spec("fifo"), _spec("random")),
    "bestfit": (*map(_spec, _PLACEMENT), _spec("fifo"), _spec("bestfit")),
    "fgd": (*map(_spec, _PLACEMENT), _spec("fifo"), _spec("fgd")),
}


class SchedulerConfig(BaseModel):
    """Enabled plugins (order = tier order for ordering keys) and cycle settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    plugins: tuple[PluginSpec, ...] = DEFAULT_PLUGINS
    seed: int = Field(0, description="seed of the Random baseline and any tie draws")
    preemption: PreemptionSettings = Field(default_factory=PreemptionSettings)

    @classmethod
    def load(cls, data: dict[str, Any] | None) -> SchedulerConfig:
        """Validate a decoded dict; raises ``ConfigError`` listing every bad field."""
        errors: list[tuple[str, str]] = []
        try:
            cfg = cls.model_validate(data or {})
        except ValidationError as e:
            errors += [(_path(err["loc"]), err["msg"]) for err in e.errors()]
            cfg = None
        plugins = (data or {}).get("plugins")
        if cfg is not None:
            plugins = [p.model_dump() for p in cfg.plugins]
        if isinstance(plugins, list | tuple):
            errors += _check_plugins(plugins)
        if errors:
            raise ConfigError(errors)
        assert cfg is not None
        return cfg

    @classmethod
    def from_yaml(cls, text: str) -> SchedulerConfig:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError([("<yaml>", str(e))]) from e
        if data is not None and not isinstance(data, dict):
            raise ConfigError([("<root>", "must be a mapping")])
        return cls.load(data)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> SchedulerConfig:
        """A named policy: ``default`` or a research baseline (fifo, sjf, srtf, tiresias,
        drf, random, bestfit, fgd)."""
        if name not in PRESETS:
            raise ConfigError([("preset", f"unknown preset {name!r}; known: {sorted(PRESETS)}")])
        return cls.load({"plugins": [p.model_dump() for p in PRESETS[name]], **overrides})

    def build_plugins(self) -> list[Plugin]:
        _ensure_registered()
        out = []
        for spec in self.plugins:
            if spec.name in ACTION_ARGS:
                continue
            cls = REGISTRY[spec.name]
            out.append(cls(cls.Args.model_validate(spec.args), spec.weight))
        return out


    def actions(self) -> tuple[str, ...]:
        """The cycle's actions, in order (Volcano's ``actions:`` list): ``allocate``;
        ``preempt`` while preemption is enabled; ``backfill`` when listed; ``migrate``
        with preemption and the throughput plugin (unless its ``migrate`` is off); ``grow`` when
        ``elastic`` is listed with ``grow``."""
        elastic = self.elastic_args()
        return ("allocate", *(("preempt",) if self.preemption.enabled else ()),
                *(("backfill",) if self.backfill_args() is not None else ()),
                *(("migrate",) if self.preemption.enabled and self._migrates() else ()),
                *(("grow",) if elastic is not None and elastic.grow else ()))

    def backfill_args(self) -> BackfillArgs | None:
        """The backfill action's settings; None: no backfill."""
        args = self._action_args("backfill")
        return args if isinstance(args, BackfillArgs) else None

    def elastic_args(self) -> ElasticArgs | None:
        """Elastic resizing's settings; None: elastic jobs neither grow nor shrink."""
        args = self._action_args("elastic")
        return args if isinstance(args, ElasticArgs) else None

    def decay_half_life_s(self) -> float:
        """The fair-share plugin's ``half_life_s``: past use counts beside current shares
        (0: it does not, or no fair share); the caller keeps the ``DecayedUsage``."""
        return next((float(p.args.get("half_life_s", 0.0)) for p in self.plugins
                     if p.name == "fairshare"), 0.0)

    def _migrates(self) -> bool:
        """The throughput plugin is on and moves jobs to faster GPUs (its ``migrate``)."""
        return any(p.name == "throughput" and p.args.get("migrate", True) for p in self.plugins)

    def _action_args(self, name: str) -> BaseModel | None:
        spec = next((p for p in self.plugins if p.name == name), None)
        return None if spec is None else ACTION_ARGS[name].model_validate(spec.args)


def _path(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(x) for x in loc) or "<root>"


def _ensure_registered() -> None:
    import scheduling.plugins  # noqa: F401  (registers every plugin)


def _check_plugins(plugins: list[Any] | tuple[Any, ...]) -> list[tuple[str, str]]:
    _ensure_registered()
    errors: list[tuple[str, str]] = []
    seen: set[str] = set()
    for i, p in enumerate(plugins):
        if not isinstance(p, dict) or not isinstance(p.get("name"), str):
            continue  # already reported by the model validation
        name = p["name"]
        if name not in REGISTRY and name not in ACTION_ARGS:
            near = difflib.get_close_matches(name, [*REGISTRY, *ACTION_ARGS], n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            errors.append((f"plugins.{i}.name", f"unknown plugin {name!r}{hint}"))
            continue
        if name in seen:
            errors.append((f"plugins.{i}.name", f"plugin {name!r} is enabled twice"))
        seen.add(name)
        try:
            args = REGISTRY[name].Args if name in REGISTRY else ACTION_ARGS[name]
            args.model_validate(p.get("args") or {})
        except ValidationError as e:
            errors += [(f"plugins.{i}.args." + _path(err["loc"]), err["msg"]) for err in e.errors()]
    return errors
