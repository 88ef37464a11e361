"""Contracts: envelope round trips, tolerance of newer fields, spec validation, schema doc."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from shared import schema_doc
from shared.events import (
    EVENT_TYPES,
    Binding,
    BindingAction,
    Envelope,
    GpuAssignment,
    JobState,
    JobStatus,
    JobSubmitted,
    TaskBinding,
    utcnow,
)
from shared.jobspec import JobSpec, parse_job_spec
from shared.topics import ALL_TOPICS, BY_NAME, topic_for

SPEC = {"name": "bert", "queue": "research", "minAvailable": 2,
        "tasks": [{"name": "worker", "replicas": 2, "resources": {"gpu": 4}}]}


def test_submitted_round_trips_through_the_envelope() -> None:
    ev = JobSubmitted(job_id="j-1", queue="research", tenant="t", user="u",
                      spec=parse_job_spec(SPEC), submitted_at=utcnow())
    env = Envelope.wrap(ev, "admission")
    back = Envelope.decode(env.encode())
    assert back.type == "job.submitted" and back.key == "research" and back.schema_version == 1
    assert back.payload() == ev


def test_binding_round_trip_keeps_shares_and_epoch() -> None:
    b = Binding(binding_id="b", action=BindingAction.ALLOCATE, node_id="n1", epoch=7,
                job_id="j", tasks=[TaskBinding(task_id="w-0", task_name="w", role="worker",
                                               replica=0, rank=0,
                                               gpus=[GpuAssignment(index=3, memory_mib=20480,
                                                                   compute_pct=25)])])
    back = Envelope.decode(Envelope.wrap(b, "scheduler").encode()).payload()
    assert isinstance(back, Binding)
    assert back.epoch == 7 and back.key() == "n1"
    assert back.tasks[0].gpus[0] == GpuAssignment(index=3, memory_mib=20480, compute_pct=25)


def test_newer_fields_are_tolerated() -> None:
    env = Envelope.wrap(JobStatus(job_id="j", state=JobState.RUNNING, reason="r"), "x")
    raw = json.loads(env.encode())
    raw["data"]["added_in_v2"] = {"anything": 1}
    raw["trace_parent"] = "00-abc"
    back = Envelope.decode(json.dumps(raw).encode()).payload()
    assert isinstance(back, JobStatus) and back.state is JobState.RUNNING


def test_unknown_type_and_bad_payload_are_errors() -> None:
    env = Envelope(type="no.such", schema_version=1, source="x", key="k", data={})
    with pytest.raises(KeyError):
        env.payload()
    bad = Envelope(type="job.status", schema_version=1, source="x", key="k",
                   data={"job_id": "j", "state": "flying", "reason": ""})
    with pytest.raises(ValidationError):
        bad.payload()


@pytest.mark.parametrize(("patch", "field"), [
    ({"tasks": []}, "tasks"),
    ({"name": "Bad_Name"}, "name"),
    ({"tasks": [{"name": "w", "resources": {"gpu": -1}}]}, "tasks.0.resources.gpu"),
    ({"tasks": [{"name": "w", "resources": {"gpu": 1, "gpuMemory": 100}}]}, "tasks.0.resources"),
    ({"tasks": [{"name": "w", "resources": {"gpuCompute": 150}}]},
     "tasks.0.resources.gpuCompute"),
    ({"minAvailable": 9}, "(root)"),
    ({"gpus": 4}, "gpus"),
    ({"tasks": [{"name": "w", "replicaz": 2}]}, "tasks.0.replicaz"),
])
def test_bad_specs_name_the_field(patch: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as exc:
        parse_job_spec({**SPEC, **patch})
    locs = {".".join(str(p) for p in e["loc"]) or "(root)" for e in exc.value.errors()}
    assert field in locs


def test_spec_accepts_camel_case_and_reports_gang_size() -> None:
    spec = JobSpec.model_validate({**SPEC, "priorityClass": "high", "maxRetry": 1})
    assert spec.gang_size == 2 and spec.total_gpus == 8 and spec.max_retry == 1


def test_every_event_has_exactly_one_topic() -> None:
    for name, model in EVENT_TYPES.items():
        carriers = [t for t in ALL_TOPICS if model in t.events]
        assert len(carriers) == 1, name
    assert BY_NAME["bindings"].key == "node id"
    assert topic_for(JobStatus(job_id="j", state=JobState.RUNNING, reason="")).name == \
        "jobs.status"


def test_schema_document_is_up_to_date() -> None:
    path = Path(__file__).parents[2] / "docs" / "events.schema.json"
    assert path.read_text() == schema_doc.render(), "run `make schemas`"
    doc = json.loads(path.read_text())
    assert set(doc["events"]) == set(EVENT_TYPES)
    assert doc["topics"]["jobs.submitted"]["key"] == "queue"
