"""A Stack whose services are never started: `_spawn` is replaced by a stand-in
process, so what the stack would run (argv, environment, ports, logs) can be read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kairos import stack as stack_mod
from kairos.stack import SERVICES, Stack


class NoProcess:
    returncode = None

    def poll(self) -> None:
        return None


def fake_stack(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **kw: Any) -> Stack:
    """The stack's services and agents as `start()` would start them, none running."""
    monkeypatch.setattr(stack_mod, "_spawn", lambda argv, env, log: NoProcess())
    st = Stack(workdir=tmp_path / "kairos", kafka_bootstrap="broker.example:9092",
               database_url="postgresql+asyncpg://kairos:s3cret@db.example:5432/kairos",
               token="kdev-from-the-stack", **kw)
    (st.workdir / "logs").mkdir(parents=True)
    st.start_service("admission", port=st.admission_port)
    for name in SERVICES[1:]:
        st.start_service(name)
    st.start_agents()
    return st
