"""A job array's %N in queueing, against real PostgreSQL and the real broker: at most N
elements hold quota at once, the rest wait with reason ``array_limit`` (and hold back
no other job, even in a strict queue), and each element that ends lets the next in."""

# ruff: noqa: F811 (the fixture imported from its home module is the tests' argument)
from __future__ import annotations

import pytest

from shared.events import Envelope, JobState, JobSubmitted, utcnow
from shared.jobspec import parse_job_spec
from tests.services.test_queueing_service import World, world  # noqa: F401 (fixture)

pytestmark = [pytest.mark.db, pytest.mark.broker]


async def submit_array(w: World, array_id: str, indices: range, cap: int | None,
                       queue: str = "nlp") -> list[str]:
    spec = parse_job_spec({"name": "sweep", "queue": queue,
                           "tasks": [{"name": "w", "resources": {"gpu": 1}}]})
    subs = [JobSubmitted(job_id=f"{array_id}-{i}", queue=queue, tenant="t", user="u",
                         spec=spec, submitted_at=utcnow(), array_id=array_id, array_index=i,
                         array_max_running=cap) for i in indices]
    await w.q.handle_batch([(Envelope.wrap(s, "admission"), s) for s in subs])
    return [s.job_id for s in subs]


async def test_an_array_holds_quota_for_at_most_its_cap(world: World) -> None:
    capped = await submit_array(world, "a-cap", range(5), cap=2)
    other = await world.submit("nlp")  # after the array: the cap does not hold it back
    uncapped = await submit_array(world, "a-free", range(2), cap=None)
    await world.q.cycle()
    assert world.ready() == [*capped[:2], other, *uncapped]
    waiting = world.last_status("nlp").waiting
    assert [(x.job_id, x.reason) for x in waiting] == [(j, "array_limit") for j in capped[2:]]
    assert waiting[0].detail == "array a-cap runs at most 2 elements at once"
    await world.q.cycle()
    assert len(world.ready()) == 5  # nothing more while both still hold their quota
    await world.status(capped[0], JobState.RUNNING)
    await world.status(capped[0], JobState.SUCCEEDED)
    await world.q.cycle()
    assert world.ready()[5:] == [capped[2]]  # one ended, one more starts
    await world.status(capped[1], JobState.FAILED)
    await world.status(capped[2], JobState.CANCELLED)
    await world.q.cycle()
    assert world.ready()[6:] == capped[3:]
    assert await world.state_of(capped[4]) == "admitted"


async def test_the_cap_holds_across_a_restart(world: World) -> None:
    capped = await submit_array(world, "a-restart", range(4), cap=1)
    await world.q.cycle()
    assert world.ready() == capped[:1]
    await world.restart()  # a new replica reads what holds quota from the table
    await world.q.cycle()
    assert world.ready() == capped[:1]
    assert [await world.state_of(j) for j in capped] == ["admitted", "queued", "queued", "queued"]
