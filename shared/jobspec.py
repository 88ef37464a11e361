"""The job specification users submit (YAML or JSON), familiar to Volcano users.

Field names are camelCase on the wire (``minAvailable``, ``gpuMemory``) and snake_case
in Python. Unknown fields are refused so that a typo gets a 422 naming the field
instead of being silently ignored.

Every value is bounded, so that what admission accepts every other service can hold:
at most ``MAX_TASKS`` tasks and ``MAX_TOTAL_REPLICAS`` replicas (elastic tasks at
maxReplicas), finite numbers (PostgreSQL's jsonb has no NaN or Infinity), durations
within a year, no NUL in any string (neither jsonb, nor a process's argv or environment
holds one) and environment variable names a process environment accepts. Other text
(commands, environment values, labels) is kept verbatim: a command is an argv list,
never run through a shell.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from scheduling.mig import check_profile
from shared.gpu_models import expand, expand_all
from shared.job_array import ArrayIndices, parse_array
from shared.node_constraints import (
    MAX_SELECTOR,
    MAX_TOLERATIONS,
    LabelKey,
    LabelValue,
    Toleration,
    core_tolerations,
)
from shared.task_affinity import Rules, unknown_tasks

NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MAX_TASKS = 64
MAX_TOTAL_REPLICAS = 4096
MAX_SECONDS = 31_536_000  # a year: timeLimit, duration, runtimeEstimate


def _no_nul(v: str) -> str:
    if "\x00" in v:
        raise ValueError("must not contain NUL (\\u0000)")
    return v


Text = Annotated[str, AfterValidator(_no_nul)]
# Kubernetes' rule for environment variable names; "=" or NUL would make the launch fail
EnvName = Annotated[str, Field(min_length=1, max_length=255,
                               pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")]


class _Spec(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True,
        allow_inf_nan=False,
    )


class Resources(_Spec):
    """Per-replica resources. Units: CPU millicores, memory and GPU memory MiB, compute %."""

    gpu: Annotated[int, Field(ge=0, le=64, description="whole GPUs per replica")] = 0
    gpu_memory: Annotated[
        int, Field(ge=0, le=1_048_576, description="MiB of one shared GPU (fractional request)")
    ] = 0
    gpu_compute: Annotated[
        int, Field(ge=0, le=100, description="percent of one shared GPU's compute")
    ] = 0
    mig: Annotated[str | None, Field(max_length=32, description=(
        "one MIG instance of this profile per replica (1g.10gb, 3g.40gb): compute and memory "
        "isolated by the hardware (scheduling/mig.py lists the profiles per GPU model)"))] = None
    cpu: Annotated[int, Field(ge=0, le=1_024_000, description="millicores")] = 1000
    memory: Annotated[int, Field(ge=0, le=16_777_216, description="MiB")] = 1024

    @field_validator("mig")
    @classmethod
    def _profile(cls, v: str | None) -> str | None:
        return None if v is None else check_profile(v)  # a ValueError names the known ones

    @model_validator(mode="after")
    def _whole_or_share(self) -> Resources:
        if self.gpu and (self.gpu_memory or self.gpu_compute):
            raise ValueError("ask for whole GPUs (gpu) or a share (gpuMemory/gpuCompute), not both")
        if self.mig and (self.gpu or self.gpu_memory or self.gpu_compute):
            raise ValueError("ask for a MIG instance (mig) or for GPUs (gpu, gpuMemory, gpuCompute), not both")
        return self

    @property
    def is_shared(self) -> bool:
        return self.gpu == 0 and (self.gpu_memory > 0 or self.gpu_compute > 0)


class TaskSpec(_Spec):
    name: Annotated[str, Field(min_length=1, max_length=63,
                               description="the task's name: a DNS label, unique in the job")]
    role: Text | None = Field(default=None, description="ps, worker, chief...; defaults to name")
    replicas: Annotated[int, Field(
        ge=1, le=1024, description="copies of the task (elastic: the size it starts with)")] = 1
    min_replicas: Annotated[int | None, Field(
        ge=1, le=1024, description="elastic: fewest replicas the job runs with")] = None
    max_replicas: Annotated[int | None, Field(
        ge=1, le=1024, description="elastic: most replicas the job grows to")] = None
    image: Text = Field(default="kairos/simulated:latest",
                        description="container image the replicas run")
    command: list[Text] = Field(default_factory=list, description="argv: run as is, no shell")
    env: dict[EnvName, Text] = Field(default_factory=dict,
                                     description="environment variables of each replica")
    resources: Resources = Field(default_factory=Resources,
                                 description="what each replica needs (the fields below)")
    affinity: Rules = Field(default_factory=list, description=(
        "run near the replicas of these tasks: [{task, topologyKey: node|rack, required}] "
        "(shared/task_affinity.py)"))
    anti_affinity: Rules = Field(default_factory=list, description=(
        "run apart from the replicas of these tasks (itself: one replica per node or rack)"))

    @field_validator("name")
    @classmethod
    def _dns_name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError("must be lowercase letters, digits and '-' (a DNS label)")
        return v

    @model_validator(mode="after")
    def _elastic_range(self) -> TaskSpec:
        if not self.least_replicas <= self.replicas <= self.most_replicas:
            raise ValueError(f"elastic replicas must satisfy minReplicas ({self.min_replicas}) <= "
                             f"replicas ({self.replicas}) <= maxReplicas ({self.max_replicas})")
        return self

    @property
    def effective_role(self) -> str:
        return self.role or self.name

    @property
    def elastic(self) -> bool:
        """Resizable between minReplicas and maxReplicas while it runs."""
        return (self.min_replicas is not None or self.max_replicas is not None) and \
            self.least_replicas < self.most_replicas

    @property
    def least_replicas(self) -> int:
        return self.replicas if self.min_replicas is None else self.min_replicas

    @property
    def most_replicas(self) -> int:
        return self.replicas if self.max_replicas is None else self.max_replicas


class PriorityClass(StrEnum):
    LOW = "low"
    NORMAL = "normal"
    HIGH = "high"
    URGENT = "urgent"


JOB_KINDS = ("Job", "Interactive")


class JobSpec(_Spec):
    api_version: str = Field(default="kairos/v1",
                             description="the spec's version; only kairos/v1 is understood")
    kind: str = Field(default="Job", description="Job (batch) or Interactive (an environment "
                      "held until returned or its timeLimit)")
    name: Annotated[str, Field(min_length=1, max_length=63, description=(
        "the job's name: lowercase letters, digits and '-' (a DNS label)"))]
    queue: Annotated[str, Field(min_length=1, max_length=63, description=(
        "the queue it waits in for quota (a DNS label); `kairos queues` lists them"))] = "default"
    priority_class: PriorityClass = Field(default=PriorityClass.NORMAL, description=(
        "counts most in the order jobs start, ahead of `priority`; a job of a higher class "
        "may preempt preemptible work of a lower one"))
    priority: Annotated[int, Field(ge=-1000, le=1000, description="user priority")] = 0
    min_available: Annotated[int | None, Field(ge=1, description=(
        "the gang: replicas that must start together (default: all of them)"))] = None
    max_retry: Annotated[int, Field(ge=0, le=100, description=(
        "times a failed attempt is started again; preemptions, drains and lost nodes do "
        "not count"))] = 3
    time_limit: Annotated[int | None, Field(ge=1, le=MAX_SECONDS, description=(
        "seconds: a task running this long is stopped: a batch job fails, an Interactive "
        "one ends (required for Interactive)"))] = None
    duration: Annotated[
        float | None, Field(ge=0, le=MAX_SECONDS, description="simulated run length, seconds")
    ] = None
    runtime_estimate: Annotated[float | None, Field(ge=0, le=MAX_SECONDS, description=(
        "seconds: lets the scheduler start short work first and backfill around waiting "
        "gangs"))] = None
    preemptible: bool = Field(default=True, description=(
        "false: once running, it is never stopped to make room for other work (nor "
        "reclaimed when it borrowed quota)"))
    dataset: Annotated[str | None, Field(
        max_length=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$",
        description="the dataset it reads: nodes whose local cache holds it are preferred")] = None
    labels: dict[Text, Text] = Field(default_factory=dict,
                                     description="free-form key/value text kept with the job")
    gpu_model: Annotated[str | list[Annotated[str, Field(max_length=128)]] | None, Field(
        description=("the GPU models its GPUs may be: one (H100), or a list (H100, "
                     "A100-80GB); a family, a family with its memory, or a product name "
                     "as nodes report it (shared/gpu_models.py)"))] = None
    throughput: Annotated[dict[Annotated[str, Field(max_length=128)], Annotated[float, Field(
        gt=0, le=1e12, allow_inf_nan=False)]] | None, Field(max_length=16, description=(
            "how fast it runs on each GPU model, in any unit (steps/s, samples/s): "
            "{H100: 3.1, A100: 1.9, V100: 1}; the scheduler places it where it runs fastest, "
            "keeps it off a model where it loses more than the jobs waiting with it would, "
            "and moves it to a faster model left free when that pays for the restart. Its "
            "runtimeEstimate is read as the time on the fastest model named; a model not "
            "named counts as the slowest named"))] = None
    node_selector: Annotated[dict[LabelKey, LabelValue], Field(
        max_length=MAX_SELECTOR, description=(
            "node labels it must run on (every one), as Kubernetes' nodeSelector; nodes "
            "carry kairos.io/gpu-model, -family, -memory, kairos.io/mig, kairos.io/rack, "
            "kairos.io/nvlink-domain, kairos.io/driver-version and -cuda-version besides their own"))] = {}
    tolerations: Annotated[list[Toleration], Field(max_length=MAX_TOLERATIONS, description=(
        "node taints it tolerates, as Kubernetes' tolerations ({key, operator: "
        "Equal|Exists, value, effect})"))] = []
    array: Annotated[str | None, Field(max_length=4096, description=(
        "a job array, as Slurm's --array: 0-999, 1,3,5-7, 0-15:4, and %N to run at most "
        "N elements at once (0-999%50); each index is a job of its own"))] = None
    tasks: Annotated[list[TaskSpec], Field(min_length=1, max_length=MAX_TASKS, description=(
        "the job's tasks (roles), each with its replicas; names unique"))]

    @field_validator("name", "queue")
    @classmethod
    def _dns_name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError("must be lowercase letters, digits and '-' (a DNS label)")
        return v

    @field_validator("tasks")
    @classmethod
    def _bounded(cls, tasks: list[TaskSpec]) -> list[TaskSpec]:
        most = sum(t.most_replicas for t in tasks)
        if most > MAX_TOTAL_REPLICAS:
            raise ValueError(f"the job has {most} replicas (elastic tasks at maxReplicas); "
                             f"a job has at most {MAX_TOTAL_REPLICAS}")
        return tasks

    @field_validator("array")
    @classmethod
    def _array(cls, v: str | None) -> str | None:
        if v is None:
            return v
        parse_array(v)  # a ValueError names what is wrong
        return v.strip()

    @field_validator("gpu_model")
    @classmethod
    def _known_models(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and not 1 <= len(v) <= 8:
            raise ValueError("give one to eight GPU models")
        if v is not None:
            expand_all([v] if isinstance(v, str) else v)  # a ValueError names what is wrong
        return v

    @field_validator("throughput")
    @classmethod
    def _throughput_models(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v is not None:
            if not v:
                raise ValueError("name at least one GPU model, or leave throughput out")
            expand_all(list(v))  # a ValueError names an unknown model
        return v

    @field_validator("api_version")
    @classmethod
    def _version(cls, v: str) -> str:
        if v != "kairos/v1":
            raise ValueError("only kairos/v1 is understood")
        return v

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        if v not in JOB_KINDS:
            raise ValueError(f"must be one of {', '.join(JOB_KINDS)}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        names = [t.name for t in self.tasks]
        if len(set(names)) != len(names):
            raise ValueError("task names must be unique")
        wrong = unknown_tasks({t.name: (t.affinity, t.anti_affinity) for t in self.tasks})
        if wrong:
            raise ValueError("; ".join(wrong))
        for profile in self.mig_profiles:
            check_profile(profile, self.gpu_models)  # a profile none of its models has
        if self.min_available is not None and self.min_available > self.total_replicas:
            raise ValueError(
                f"minAvailable ({self.min_available}) exceeds total replicas ({self.total_replicas})"
            )
        if self.interactive:
            if self.total_replicas != 1 or any(t.elastic for t in self.tasks):
                raise ValueError("an Interactive job has one task with one replica")
            if self.time_limit is None:
                raise ValueError("an Interactive job needs a timeLimit (seconds)")
            if self.array is not None:
                raise ValueError("an Interactive job cannot be an array")
        return self

    @property
    def array_indices(self) -> ArrayIndices | None:
        return parse_array(self.array) if self.array is not None else None

    @property
    def interactive(self) -> bool:
        return self.kind == "Interactive"

    @property
    def total_replicas(self) -> int:
        return sum(t.replicas for t in self.tasks)

    @property
    def gang_size(self) -> int:
        """Replicas that must start together (all of them unless minAvailable says fewer)."""
        return self.min_available or self.total_replicas

    @property
    def gpu_model_names(self) -> tuple[str, ...]:
        """``gpuModel`` as written, in its order of preference (empty: any)."""
        if self.gpu_model is None:
            return ()
        return (self.gpu_model,) if isinstance(self.gpu_model, str) else tuple(self.gpu_model)

    @property
    def gpu_models(self) -> tuple[str, ...]:
        """Every GPU model name its ``gpuModel`` matches (empty: any)."""
        return expand_all(list(self.gpu_model_names))

    @property
    def gpu_model_ranks(self) -> tuple[int, ...]:
        """The preference rank of each of ``gpu_models`` (the position in ``gpuModel`` of
        the name that matched it first); empty unless a list names several."""
        if not isinstance(self.gpu_model, list) or len(self.gpu_model) < 2:
            return ()
        rank: dict[str, int] = {}
        for k, name in enumerate(self.gpu_model):
            for m in expand(name):
                rank.setdefault(m, k)
        return tuple(rank[m] for m in self.gpu_models)

    @property
    def gpu_speeds(self) -> tuple[tuple[str, float], ...]:
        """``throughput`` per model name, over the fastest named (1.0), sorted."""
        if not self.throughput:
            return ()
        top = max(self.throughput.values())
        out: dict[str, float] = {}
        for name, v in self.throughput.items():
            for m in expand(name):
                out.setdefault(m, v / top)
        return tuple(sorted(out.items()))

    @property
    def core_tolerations(self) -> tuple[str, ...]:
        return core_tolerations(self.tolerations)

    @property
    def total_gpus(self) -> int:
        return sum(t.replicas * t.resources.gpu for t in self.tasks)

    @property
    def mig_profiles(self) -> tuple[str, ...]:
        """The MIG profiles its tasks ask for, each once."""
        return tuple(dict.fromkeys(t.resources.mig for t in self.tasks if t.resources.mig))


def parse_job_spec(data: dict[str, Any]) -> JobSpec:
    """Validate a decoded YAML/JSON document; raises pydantic.ValidationError."""
    return JobSpec.model_validate(data)
