"""A slice of the chaos suite (`make chaos` runs every fault, bench/chaos.py): the
embedded stack, supervised, under a steady workload of 1-GPU jobs, shares, gangs, urgent
jobs and cancels, and one fault at a time. After each, every accepted job has ended and
the invariant checker finds nothing: no job lost, none run in two places, no GPU over
capacity, no stale-epoch start, no 5xx but the designed 503s. Recovery time is measured
by the bench, never asserted here."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from kairos.chaos import (
    FAULTS,
    PARTITIONED_AGENT,
    Chaos,
    Client,
    Recorder,
    chaos_stack,
    print_crashes,
    unavailable,
)

pytestmark = [pytest.mark.e2e, pytest.mark.broker, pytest.mark.db, pytest.mark.timeout(1500)]


@pytest.fixture(scope="module")
def chaos() -> Iterator[Chaos]:
    workdir = Path(tempfile.mkdtemp(prefix="kairos-chaos-"))
    stack = chaos_stack(workdir, nodes=8)
    stack.start()
    assert stack.kafka_bootstrap
    recorder = Recorder(stack.kafka_bootstrap)
    recorder.start()
    client = Client(stack)
    try:
        yield Chaos(stack, recorder, client)
    finally:
        client.close()
        recorder.stop()
        stack.stop()
        print_crashes(workdir)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.mark.parametrize("fault", ["kill_scheduler_leader", "restart_broker",
                                   "restart_postgres", "agent_restart_with_limits",
                                   "full_restart_under_load"])
def test_a_fault_loses_nothing_and_runs_nothing_twice(chaos: Chaos, fault: str) -> None:
    """The last two also read the agents' journals (kairos/node_records.py): no task
    that finished on its node is recorded otherwise or run again, no platform cause
    spends a retry, and no task runs past its time limit."""
    res = chaos.phase(fault, FAULTS[fault], jobs=24, rate_per_s=3.0)
    assert res["jobs"] >= 24
    assert (res["lost"], res["double_runs"], res["errors_5xx"], res["violations"],
            res["wrongly_failed"], res["limit_overruns"]) == (0, 0, 0, 0, 0, 0), res["details"]
    assert res["recovery_s"] is not None, "the probe job never ran after the fault"
    if fault.startswith("restart_"):  # an outage every service waits out, exiting never
        assert res["service_restarts"] == [], res


def test_an_agent_cut_off_by_a_network_partition_runs_nothing_twice(chaos: Chaos) -> None:
    """The agent of node1-* runs in a network namespace of its own; its traffic is
    dropped for longer than the lost-node timeout while it and its tasks keep running.
    Its nodes are declared lost, it fences itself, its jobs run again elsewhere, and
    nothing runs in two places or is lost."""
    fault = "partition_agent_past_lost_timeout"
    if why := unavailable(fault):
        pytest.skip(why)
    res = chaos.phase(fault, FAULTS[fault], jobs=24, rate_per_s=3.0)
    cut_off = {f"{PARTITIONED_AGENT}-{i}" for i in range(4)}
    assert cut_off <= set(res["nodes_lost"]), res  # the partition was real
    assert (res["lost"], res["double_runs"], res["errors_5xx"], res["violations"]) == (
        0, 0, 0, 0), res["details"]
    assert res["recovery_s"] is not None, "the probe job never ran after the partition"
