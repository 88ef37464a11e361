"""Hundreds of simulated nodes fit in one agent process: ``bench/agents_scale.py``'s
``measure`` at a test's size (100 nodes, a 2-second window) against the session's real
broker. Every node registers, heartbeats and sends telemetry at its interval, and a
binding to each is carried out; the figures are the bench's business, not asserted."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.broker


def _bench() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "bench" / "agents_scale.py"
    spec = importlib.util.spec_from_file_location("agents_scale", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


async def test_a_hundred_simulated_nodes_in_one_process(broker: str) -> None:
    result = await _bench().measure(broker, nodes=100, seconds=2, heartbeat_s=0.5,
                                    telemetry_s=1.0, task_s=0.5)
    assert result["checks"] == {"all_registered": True, "first_heartbeats": True,
                                "all_heartbeat": True, "all_telemetry": True,
                                "all_ran": True, "agent_alive": True}, result
    assert result["registered"] == result["succeeded"] == 100
    assert result["heartbeats_per_node_min"] >= 3  # 2 s at 0.5 s, an interval of slack
