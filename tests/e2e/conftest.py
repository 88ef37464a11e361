"""The whole platform as separate OS processes over the real broker and PostgreSQL."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from kairos.embedded import free_port
from kairos.stack import Stack


@contextmanager
def running_stack(prefix: str, **kw: Any) -> Iterator[Stack]:
    """A stack of a module's own (``Stack``'s fields in ``kw``), started, and removed
    after with its crashes' tracebacks printed."""
    from tests.e2e.test_supervisor import dump_tracebacks

    workdir = Path(tempfile.mkdtemp(prefix=f"kairos-{prefix}-"))  # outside pytest's 0700 tree
    s = Stack(workdir=workdir, admission_port=free_port(), **kw)
    try:
        s.start()
        yield s
    finally:
        s.stop()
        dump_tracebacks(workdir)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    # outside pytest's 0700 tmp tree: the embedded PostgreSQL runs as its own user
    workdir = Path(tempfile.mkdtemp(prefix="kairos-e2e-"))
    s = Stack(workdir=workdir, nodes=4, gpus_per_node=8,
              nodes_per_agent=2, admission_port=free_port(),
              env={"KAIROS_HEARTBEAT_S": "1", "KAIROS_TELEMETRY_S": "1",
                   "KAIROS_LOST_AFTER_S": "10", "KAIROS_SESSION_TIMEOUT_MS": "6000",
                   "KAIROS_REBALANCE_TIMEOUT_MS": "6000", "KAIROS_HEARTBEAT_INTERVAL_MS": "500",
                   "KAIROS_FORECAST_EVERY_S": "1"})
    s.start()
    yield s
    s.stop()
    for p in s.workdir.glob("logs/*.log"):  # surface crashes in the test output
        text = p.read_text(errors="replace")
        if "Traceback" in text:
            print(f"--- {p.name} ---\n{text[-4000:]}")
    shutil.rmtree(workdir, ignore_errors=True)
