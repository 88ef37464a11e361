"""`python -m kairos.topics`: create every topic of the registry (idempotent)."""

import asyncio

from shared.bus import ensure_topics, wait_for_broker
from shared.config import CommonSettings


async def _main() -> None:
    s = CommonSettings()
    await wait_for_broker(s.kafka_bootstrap)
    await ensure_topics(s.kafka_bootstrap, max_partitions=s.topic_partitions_max)


if __name__ == "__main__":
    asyncio.run(_main())
