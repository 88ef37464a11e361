"""Hostile events on every topic: whatever bytes arrive, a consumer either decodes them
or raises one of the errors it dead-letters (with the reason) and goes on; and events
that decode but make no sense to the scheduler (unknown jobs, nodes, tasks, attempts,
replays) change nothing and never raise.

The dead-lettering itself, over the real broker, is in tests/shared/test_bus.py."""

from __future__ import annotations

import json
from typing import Any

from aiokafka import ConsumerRecord
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from scheduling import first_fit
from services.scheduler.state import SchedulerState
from shared.bus import decode_record
from shared.events import (
    EVENT_TYPES,
    Binding,
    BindingAction,
    CommandAction,
    JobCommand,
    JobState,
    JobStatus,
    NodeHeartbeat,
    NodeLost,
    utcnow,
)
from shared.topics import ALL_TOPICS
from tests.services.builders import node, ready, step

DEAD_LETTERED = (ValidationError, KeyError, ValueError)  # what the consumer dead-letters

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=20)


def record(value: bytes, topic: str = "jobs.status") -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(topic=topic, partition=0, offset=0, timestamp=0, timestamp_type=0,
                          key=b"k", value=value, checksum=None, serialized_key_size=1,
                          serialized_value_size=len(value), headers=[])


def envelope(type_: str, data: Any, version: Any = 1, **extra: Any) -> bytes:
    return json.dumps({"id": "e1", "type": type_, "schema_version": version, "source": "x",
                       "key": "k", "occurred_at": "2026-01-01T00:00:00Z", "data": data,
                       **extra}).encode()


def decodes_or_dead_letters(value: bytes) -> bool:
    """True if it decoded; False if the consumer would dead-letter it; anything else
    raised (a crash of the consumer) fails the test."""
    try:
        decode_record(record(value))
        return True
    except DEAD_LETTERED:
        return False


@settings(max_examples=300, deadline=None)
@given(type_=st.sampled_from(sorted(EVENT_TYPES)), data=json_values,
       version=st.one_of(st.integers(), st.text(max_size=4), st.none()))
def test_any_payload_of_any_event_type_decodes_or_is_dead_lettered(
        type_: str, data: Any, version: Any) -> None:
    try:
        env, event = decode_record(record(envelope(type_, data, version)))
    except DEAD_LETTERED:
        return  # the consumer dead-letters it; any other exception fails the test
    assert env.type == type_ and type(event) is EVENT_TYPES[type_]  # decoded as its type


def test_malformed_envelopes_are_dead_lettered_not_crashes() -> None:
    for value in [b"", b"\x00\xff", b"null", b"[]", b'"a string"', b"{", b"1e999999",
                  b'{"id": 1}', envelope("no.such.type", {}), envelope("job.status", []),
                  envelope("job.status", {"job_id": "j"}),  # missing fields
                  envelope("job.status", {"job_id": ["x"], "state": "running", "reason": ""}),
                  envelope("job.status", {"job_id": "j", "state": "exploded", "reason": ""}),
                  envelope("binding", {"binding_id": "b", "action": "allocate", "node_id": "n",
                                       "epoch": "not a number", "job_id": "j"}),
                  b"[" * 100_000 + b"]" * 100_000]:  # deep nesting
        assert not decodes_or_dead_letters(value), value[:80]


def test_a_newer_version_with_unknown_fields_is_tolerated() -> None:
    data = {"job_id": "j", "state": "running", "reason": "", "a_field_from_v9": {"x": 1}}
    assert decodes_or_dead_letters(envelope("job.status", data, version=9, extra_field=1))


def test_every_topic_carries_only_types_the_registry_decodes() -> None:
    for topic in ALL_TOPICS:
        for model in topic.events:
            assert EVENT_TYPES[model.TYPE] is model, topic.name


def test_events_that_make_no_sense_to_the_scheduler_change_nothing() -> None:
    s = SchedulerState(1, first_fit)
    step(s, node("n1"), ready("J").gpus(1).build())
    before = (s.jobs["J"].state, s.jobs["J"].attempt, [p.to_json() for p in s.jobs["J"].placed])
    task = s.jobs["J"].placed[0].task_id
    nonsense = [
        JobStatus(job_id="nobody", state=JobState.SUCCEEDED, reason="x", task="w-0",
                  node_id="n1"),
        JobStatus(job_id="J", state=JobState.SUCCEEDED, reason="x", task="no-such-task",
                  node_id="n1"),
        JobStatus(job_id="J", state=JobState.SUCCEEDED, reason="x", attempt=99, task=task,
                  node_id="n1"),
        JobStatus(job_id="J", state=JobState.SUCCEEDED, reason="x", attempt=0, task=task,
                  node_id="n1"),
        NodeLost(node_id="never-registered", last_seen=utcnow()),
        NodeHeartbeat(node_id="never-registered"),
        JobCommand(job_id="nobody-either", action=CommandAction.RESIZE, replicas=3),
        JobCommand(job_id="J", action=CommandAction.RESIZE, replicas=10_000),
        Binding(binding_id="b", action=BindingAction.ALLOCATE, node_id="n1", epoch=99,
                job_id="J"),  # not the scheduler's to read: ignored
        ready("J").build(),  # a replay of its admission
    ]
    for ev in nonsense:
        out = step(s, ev)
        assert not [e for e, t in out.events if t == "bindings" and
                    e.data.get("action") == "allocate"], ev
    assert (s.jobs["J"].state, s.jobs["J"].attempt,
            [p.to_json() for p in s.jobs["J"].placed]) == before
