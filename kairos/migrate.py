"""`python -m kairos.migrate`: create the database if needed and migrate it to head."""

import asyncio

from shared.config import CommonSettings
from shared.db import prepare_database

if __name__ == "__main__":
    asyncio.run(prepare_database(CommonSettings().database_url))
