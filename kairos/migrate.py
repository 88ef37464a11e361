"""`python -m kairos.migrate`: create the database if needed and migrate it to head."""

import asyncio

from shared.config import CommonSettings
from shared.db import create_database, make_engine, migrate, wait_for_database


async def _main() -> None:
    s = CommonSettings()
    await create_database(s.database_url)
    engine = make_engine(s.database_url, pool_size=1)
    try:
        await wait_for_database(engine)
        await migrate(engine)
    finally:
        await engine.dispose()


if __name__ == "__main__":
    asyncio.run(_main())
