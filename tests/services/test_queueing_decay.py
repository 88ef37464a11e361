"""Fair share between queues over decayed past use (the queues file's
``ordering.half_life_s`` and ``fairshare_weight``): a queue that held the pool lately
goes after one that did not, and the figure is kept in ``queue_usage`` under the tree's
lock, so a restarted queueing goes on from it (real PostgreSQL, the real broker)."""

from __future__ import annotations

from sqlalchemy import text

from services.queueing import store
from services.queueing.config import OrderingSpec
from shared.events import JobState
from tests.services.test_queueing_service import World, world  # noqa: F401

HOUR = 3600.0
POOL = {"cohorts": [{"name": "pool", "guaranteed": {"gpus": 4}}],
        "queues": [{"name": "a", "cohort": "pool"}, {"name": "b", "cohort": "pool"}]}


async def run_after_a_burst(world: World, ordering: OrderingSpec) -> list[str]:  # noqa: F811
    """Queue a holds the pool's 4 GPUs for 2 h; then a and b each submit 4 one-GPU jobs,
    a first: the jobs admitted."""
    await world.restart(POOL, ordering)
    burst = [await world.submit("a", name=f"burst-{i}") for i in range(4)]
    await world.q.cycle()
    assert world.ready() == burst
    world.now[0] += 2 * HOUR
    await world.q.cycle()
    for j in burst:
        await world.status(j, JobState.SUCCEEDED)
    await world.q.cycle()
    world.now[0] += 1
    later = [await world.submit("a", name=f"a-{i}") for i in range(4)]
    later += [await world.submit("b", name=f"b-{i}") for i in range(4)]
    await world.q.cycle()
    return [j for j in world.ready() if j in later]


async def test_without_a_half_life_the_two_share_the_pool(world: World) -> None:  # noqa: F811
    assert await run_after_a_burst(world, OrderingSpec()) == ["a-0", "b-0", "a-1", "b-1"]


async def test_with_a_half_life_the_queue_that_held_the_pool_lately_goes_after(
        world: World) -> None:  # noqa: F811
    spec = OrderingSpec(half_life_s=HOUR, fairshare_weight=100.0)
    assert await run_after_a_burst(world, spec) == [f"b-{i}" for i in range(4)]
    async with world.engine.connect() as conn:
        rows = {r.queue: (r.gpu_s, r.held) for r in await conn.execute(
            text("SELECT queue, gpu_s, held FROM queue_usage"))}
    assert rows["a"][0] > 0 and rows["b"][1] == 4.0  # a's past; b holds the pool now
    # a restarted queueing goes on from the stored figure
    await world.restart(POOL, spec)
    async with world.engine.connect() as conn:
        usage = await store.load_usage(conn, ["pool", "a", "b"], HOUR)
    assert usage.gpu_s["a"] == rows["a"][0] and usage.held == {"b": 4.0}
