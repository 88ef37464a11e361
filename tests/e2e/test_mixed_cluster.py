"""A mixed cluster on the real stack: nodes of three GPU models, one of them tainted,
and an A100 split by MIG. Jobs asking for a model, a family, a list of models, a node
label, a toleration or a MIG profile land only where they may; a job no node may take
waits, saying why; a model or a MIG profile no GPU has is refused at submit (422) before
anything is stored."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kairos.cluster_spec import ClusterSpec, MigSpec, NodeGroup
from kairos.stack import Stack
from tests.e2e.conftest import running_stack
from tests.e2e.test_supervisor import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.broker, pytest.mark.db]
CLUSTER = ClusterSpec(node_groups=[
    NodeGroup(name="hopper", count=1, gpu_model="NVIDIA H100 80GB HBM3", gpus=2,
              labels={"zone": "a"}),
    NodeGroup(name="volta", count=1, gpu_model="Tesla V100-SXM2-32GB", gpus=2,
              labels={"zone": "b"}),
    NodeGroup(name="ampere", count=1, gpu_model="NVIDIA A100-SXM4-80GB", gpus=2,
              taints=["dedicated=ml:NoSchedule"]),
    # one A100 in MIG mode: 2g.20gb at slice 0, 1g.10gb at 2 and 3, 3g.40gb at 4
    NodeGroup(name="migs", count=1, gpu_model="NVIDIA A100-SXM4-80GB", gpus=1,
              mig=MigSpec(profiles=["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"])),
])
NODE_OF = {"hopper": "hopper0-0", "volta": "volta0-0", "ampere": "ampere0-0", "migs": "migs0-0"}


@pytest.fixture(scope="module")
def mixed() -> Iterator[Stack]:
    with running_stack("mixed", cluster=CLUSTER, supervise=True,
                       env={"KAIROS_HEARTBEAT_S": "1", "KAIROS_TELEMETRY_S": "1",
                            "KAIROS_FORECAST_EVERY_S": "1"}) as s:
        yield s


def job(**extra: Any) -> dict[str, Any]:
    return {"name": "mixed", "duration": 0.5,
            "tasks": [{"name": "w", "resources": {"gpu": 1}}], **extra}


def submit(stack: Stack, spec: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{stack.url}/v1/jobs", json=spec, timeout=30,
                      headers={"Authorization": f"Bearer {stack.token}"})


def get(stack: Stack, job_id: str) -> dict[str, Any]:
    r = httpx.get(f"{stack.url}/v1/jobs/{job_id}", timeout=30,
                  headers={"Authorization": f"Bearer {stack.token}"})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def ran_on(stack: Stack, spec: dict[str, Any]) -> str:
    r = submit(stack, spec)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    done = wait_for(lambda: (j := get(stack, job_id))["state"] == "succeeded" and j, 120,
                    f"{spec} succeeded")
    nodes = {h["node_id"] for h in done["history"] if h["task"]}  # its tasks' reports
    assert len(nodes) == 1, done["history"]
    return str(nodes.pop())


def test_nodes_carry_their_model_labels_and_taints(mixed: Stack) -> None:
    r = httpx.get(f"{mixed.url}/v1/nodes", timeout=30,
                  headers={"Authorization": f"Bearer {mixed.token}"})
    nodes = {n["node_id"]: n for n in r.json()}
    assert set(nodes) == set(NODE_OF.values())
    inv = {k: n.get("inventory", n) for k, n in nodes.items()}
    assert inv["volta0-0"]["labels"]["kairos.io/gpu-model"] == "V100-32GB"
    assert inv["volta0-0"]["labels"]["zone"] == "b"
    assert {k: v for k, v in inv["volta0-0"]["labels"].items() if k != "kairos.io/rack"} == {
        "kairos.io/gpu-model": "V100-32GB", "kairos.io/gpu-family": "V100",
        "kairos.io/gpu-memory": "32GB", "kairos.io/gpu-count": "2", "kairos.io/mig": "disabled",
        "kairos.io/compute-capability": "7.0", "kairos.io/driver-version": "550.54.15",
        "kairos.io/cuda-version": "12.4", "zone": "b"}  # no NVLink domain: none given
    assert inv["ampere0-0"]["taints"] == ["dedicated=ml:NoSchedule"]
    # and `kairos nodes -o wide` shows what a job can ask for
    from typer.testing import CliRunner

    from kairos.cli import app
    out = CliRunner().invoke(app, ["nodes", "-o", "wide", "--url", mixed.url,
                                   "--token", mixed.token or ""], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    volta = next(line for line in out.output.splitlines() if "volta0-0" in line)
    ampere = next(line for line in out.output.splitlines() if "ampere0-0" in line)
    assert "V100-32GB" in volta and "zone=b" in volta, out.output
    assert "A100-80GB" in ampere and "dedicated=ml:NoSchedule" in ampere, out.output


def test_a_job_runs_only_where_its_constraints_allow(mixed: Stack) -> None:
    for _ in range(3):  # not by chance: each lands there every time
        assert ran_on(mixed, job(gpuModel="V100")) == NODE_OF["volta"]
        assert ran_on(mixed, job(gpuModel="H100-80GB")) == NODE_OF["hopper"]
        assert ran_on(mixed, job(nodeSelector={"zone": "b"})) == NODE_OF["volta"]
        assert ran_on(mixed, job(nodeSelector={"kairos.io/gpu-family": "H100"})) \
            == NODE_OF["hopper"]
        assert ran_on(mixed, job(gpuModel=["K80", "V100-32GB"])) == NODE_OF["volta"]
        assert ran_on(mixed, job(gpuModel="A100", tolerations=[
            {"key": "dedicated", "operator": "Equal", "value": "ml"}])) == NODE_OF["ampere"]
        # without constraints, never onto the tainted node
        assert ran_on(mixed, job()) in (NODE_OF["hopper"], NODE_OF["volta"])


def test_a_job_no_node_may_take_waits_and_says_why(mixed: Stack) -> None:
    r = submit(mixed, job(gpuModel="A100-80GB"))  # only on the tainted node
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    waiting = wait_for(lambda: (get(mixed, job_id).get("placement_wait") or None), 60,
                       "the scheduler said why it waits")
    assert waiting["reason"] in ("gpu_model", "no_matching_node"), waiting
    assert get(mixed, job_id)["state"] in ("pending", "admitted")
    httpx.delete(f"{mixed.url}/v1/jobs/{job_id}", timeout=30,
                 headers={"Authorization": f"Bearer {mixed.token}"})


def test_an_unknown_model_or_a_bad_toleration_is_refused_at_submit(mixed: Stack) -> None:
    r = submit(mixed, job(gpuModel="H1000"))
    assert r.status_code == 422 and "unknown GPU model 'H1000'" in r.text, r.text
    r = submit(mixed, job(gpuModel="A100-64GB"))
    assert r.status_code == 422 and "no A100 has 64 GB" in r.text, r.text
    r = submit(mixed, job(tolerations=[{"operator": "Exists"}]))
    assert r.status_code == 422 and "key" in r.text, r.text


def dry(stack: Stack, spec: dict[str, Any]) -> dict[str, Any]:
    """The dry run's answer, once the forecaster has a snapshot to forecast on."""
    def answer() -> dict[str, Any] | None:
        r = httpx.post(f"{stack.url}/v1/jobs?dryRun=All", json=spec, timeout=30,
                       headers={"Authorization": f"Bearer {stack.token}"})
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body if body["forecast"] is not None else None
    out: dict[str, Any] = wait_for(answer, 60, "a forecast")
    return out


def test_the_dry_run_says_where_it_would_run_and_why_it_never_would(mixed: Stack) -> None:
    assert dry(mixed, job(gpuModel="V100"))["forecast"]["nodes"] == [NODE_OF["volta"]]
    tainted = dry(mixed, job(gpuModel="A100-80GB"))  # its only node is tainted
    assert tainted["forecast"]["start"] is None and tainted["forecast"]["reason"] == "gpu_model"
    assert "(gpuModel)" in tainted["summary"], tainted["summary"]
    nowhere = dry(mixed, job(nodeSelector={"zone": "z"}))
    assert nowhere["forecast"]["reason"] == "no_matching_node"
    assert "matches its nodeSelector" in nowhere["summary"], nowhere["summary"]


def test_a_job_runs_where_it_is_fastest_or_on_its_first_choice(mixed: Stack) -> None:
    """``throughput`` sends a job to its fastest model (whatever the node order), a list
    of models to the first choice that is free; the dry run forecasts the same node."""
    slow_on_hopper = {"H100": 1.0, "V100": 2.5}  # a job that, oddly, runs best on a V100
    for _ in range(2):
        assert ran_on(mixed, job(throughput={"H100": 3.0, "V100": 1.0})) == NODE_OF["hopper"]
        assert ran_on(mixed, job(throughput=slow_on_hopper)) == NODE_OF["volta"]
        assert ran_on(mixed, job(gpuModel=["V100", "H100"])) == NODE_OF["volta"]
        assert ran_on(mixed, job(gpuModel=["H100", "V100"])) == NODE_OF["hopper"]
    r = httpx.post(f"{mixed.url}/v1/jobs?dryRun=All", json=job(throughput=slow_on_hopper), timeout=30,
                   headers={"Authorization": f"Bearer {mixed.token}"})
    assert r.status_code == 200, r.text
    forecast = r.json()["forecast"]
    assert forecast is None or forecast["nodes"] == [NODE_OF["volta"]], forecast


def test_a_bad_throughput_is_refused_at_submit(mixed: Stack) -> None:
    r = submit(mixed, job(throughput={"H1000": 2.0}))
    assert r.status_code == 422 and "unknown GPU model 'H1000'" in r.text, r.text
    r = submit(mixed, job(throughput={"H100": 0}))
    assert r.status_code == 422 and "greater than 0" in r.text, r.text
    r = submit(mixed, job(throughput={}))
    assert r.status_code == 422 and "at least one GPU model" in r.text, r.text


def start_mover_on_volta(stack: Stack, duration: float) -> tuple[list[str], str]:
    """Fill the hopper node with two short H100 jobs, then submit a long job 4x faster on
    an H100, which can only start on the V100s: (the fillers, the mover)."""
    fillers = []
    for _ in range(2):
        r = submit(stack, job(gpuModel="H100", duration=6))
        assert r.status_code == 201, r.text
        fillers.append(r.json()["id"])
    wait_for(lambda: all(get(stack, f)["state"] == "running" for f in fillers), 60, "the hopper full")
    r = submit(stack, job(throughput={"H100": 4.0, "V100": 1.0}, runtimeEstimate=3600, duration=duration))
    assert r.status_code == 201, r.text
    return fillers, str(r.json()["id"])


def test_a_job_started_on_a_slow_model_moves_to_a_faster_one_once_it_is_free(mixed: Stack) -> None:
    """The hopper node is full, so a long job 4x faster on an H100 starts on a V100; when
    the hopper frees, the scheduler stops it and starts it again there: two attempts,
    the second on the H100, never both at once."""
    _, mover = start_mover_on_volta(mixed, duration=20)
    done = wait_for(lambda: (j := get(mixed, mover))["state"] == "succeeded" and j, 180, "the mover succeeded")
    reports = [h for h in done["history"] if h["task"]]
    nodes_by_attempt: dict[int, set[str]] = {}
    for h in reports:
        nodes_by_attempt.setdefault(int(h.get("attempt") or 0), set()).add(h["node_id"])
    assert NODE_OF["volta"] in set().union(*nodes_by_attempt.values()), done["history"]
    last = max(nodes_by_attempt)
    assert nodes_by_attempt[last] == {NODE_OF["hopper"]}, done["history"]
    assert done.get("attempt", last) >= 2, done


def test_anti_affinity_spreads_replicas_and_an_impossible_rule_is_named(mixed: Stack) -> None:
    spread = {"name": "spread", "duration": 0.5, "tasks": [
        {"name": "w", "replicas": 2, "resources": {"gpu": 1},
         "antiAffinity": [{"task": "w", "topologyKey": "kubernetes.io/hostname", "required": True}]}]}
    for _ in range(2):
        r = submit(mixed, spread)
        assert r.status_code == 201, r.text
        done = wait_for(lambda jid=r.json()["id"]: (j := get(mixed, jid))["state"] == "succeeded" and j,
                        120, "spread succeeded")
        nodes = {h["node_id"] for h in done["history"] if h["task"]}
        assert nodes == {NODE_OF["hopper"], NODE_OF["volta"]}, done["history"]  # one per node
    three = {**spread, "tasks": [{**spread["tasks"][0], "replicas": 3}]}  # two untainted nodes
    answer = dry(mixed, three)
    assert answer["forecast"]["start"] is None and answer["forecast"]["reason"] == "affinity", answer
    assert "antiAffinity" in answer["summary"], answer["summary"]
    r = submit(mixed, {**spread, "tasks": [{**spread["tasks"][0], "antiAffinity": [{"task": "ps"}]}]})
    assert r.status_code == 422 and "names task 'ps'" in r.text, r.text


def test_a_move_survives_a_scheduler_killed_as_it_is_made(mixed: Stack) -> None:
    """The scheduler is killed (SIGKILL, the supervisor restarts it) as the H100s free
    and the move starts: the job still moves and succeeds once, its attempts never
    overlap, and nothing is lost."""
    import os
    import signal
    from datetime import datetime

    fillers, mover = start_mover_on_volta(mixed, duration=25)
    wait_for(lambda: get(mixed, mover)["state"] == "running", 60, "the mover running on the V100")
    wait_for(lambda: all(get(mixed, f)["state"] == "succeeded" for f in fillers), 60, "the hopper free")
    scheduler = mixed.proc("scheduler")
    old = scheduler.popen.pid
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: scheduler.popen.pid != old, 90, "the scheduler restarted")
    done = wait_for(lambda: (j := get(mixed, mover))["state"] == "succeeded" and j, 180, "the mover succeeded")
    tasks = [h for h in done["history"] if h["task"]]
    by_attempt: dict[int, list[dict[str, Any]]] = {}
    for h in tasks:
        by_attempt.setdefault(int(h["attempt"]), []).append(h)
    last = max(by_attempt)
    assert last >= 2 and {h["node_id"] for h in by_attempt[last]} == {NODE_OF["hopper"]}, done["history"]
    assert NODE_OF["volta"] in {h["node_id"] for h in by_attempt[min(by_attempt)]}, done["history"]
    for a in sorted(by_attempt)[:-1]:  # each attempt ended before the next one started
        ended = max(datetime.fromisoformat(h["occurred_at"]) for h in by_attempt[a])
        began = min(datetime.fromisoformat(h["occurred_at"]) for h in by_attempt[a + 1]) \
            if a + 1 in by_attempt else None
        assert began is None or ended <= began, done["history"]
    assert sum(h["state"] == "succeeded" for h in tasks) == 1, done["history"]


def test_quota_per_gpu_model_falls_back_holds_and_survives_a_queueing_restart(
        mixed: Stack) -> None:
    """A queue with 1 H100 and 1 V100 of quota (the CLI's ``--model``): a job asking
    ``[H100, V100]`` takes the H100, the next falls back to the V100, and an H100-only
    job waits for quota though an H100 is free; queueing killed (SIGKILL) and restarted
    still counts each model's use; when the H100 job ends the waiting one runs there."""
    import os
    import signal
    import uuid

    from typer.testing import CliRunner

    from kairos.cli import app

    def cli(*args: str) -> str:
        out = CliRunner().invoke(app, [*args, "--url", mixed.url, "--token", mixed.token or ""],
                                 env={"COLUMNS": "200"})
        assert out.exit_code == 0, out.output
        return out.output

    name = f"models-{uuid.uuid4().hex[:6]}"
    assert f"queue {name} created" in cli("queue", "create", name, "--model", "H100=1",
                                          "--model", "V100=1")
    auth = {"Authorization": f"Bearer {mixed.token}"}
    queue = httpx.get(f"{mixed.url}/v1/queues/{name}", headers=auth, timeout=30).json()
    assert [(m["model"], m["guaranteed"]) for m in queue["gpu_models"]] == [
        ("H100", 1.0), ("V100", 1.0)], queue

    def running_on(job_id: str) -> tuple[str, dict[str, Any]]:
        j = wait_for(lambda: (j := get(mixed, job_id))["state"] == "running" and j, 120,
                     f"{job_id} running")
        nodes = {h["node_id"] for h in j["history"] if h["task"]}
        assert len(nodes) == 1, j["history"]
        return nodes.pop(), j

    ids = []
    for _ in range(2):
        r = submit(mixed, job(queue=name, duration=30, gpuModel=["H100", "V100"]))
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    (first_node, first), (second_node, second) = running_on(ids[0]), running_on(ids[1])
    assert (first_node, second_node) == (NODE_OF["hopper"], NODE_OF["volta"])
    assert f"admitted by queue {name} against its H100 quota" in {
        h["reason"] for h in first["history"]}, first["history"]
    assert f"admitted by queue {name} against its V100 quota" in {
        h["reason"] for h in second["history"]}, second["history"]
    # bigger than the H100 quota could ever hold: refused before anything is stored
    r = submit(mixed, job(queue=name, gpuModel="H100", tasks=[
        {"name": "w", "resources": {"gpu": 2}}]))
    assert r.status_code == 422 and "1 H100" in r.text and "wait forever" in r.text, r.text

    r = submit(mixed, job(queue=name, gpuModel="H100", duration=0.5))
    assert r.status_code == 201, r.text
    third = r.json()["id"]

    def waits_for_h100_quota() -> bool:
        j = get(mixed, third)
        return (j.get("waiting") or {}).get("reason") == "quota" and any(
            "H100" in (h.get("message") or "") for h in j["history"])
    wait_for(waits_for_h100_quota, 60, "the H100-only job waiting for its quota")
    import json

    from kairos.cli_queues import _by_model
    shown = next(q for q in json.loads(cli("queues", "-o", "json")) if q["name"] == name)
    assert _by_model(shown) == "H100 1/1, V100 1/1", shown  # the table's "by model" column

    queueing = mixed.proc("queueing")
    old = queueing.popen.pid
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: queueing.popen.pid != old, 90, "queueing restarted")
    # the restarted queueing admits again (a job of the default queue runs) ...
    assert ran_on(mixed, job(gpuModel="V100")) == NODE_OF["volta"]
    # ... and still counts the H100 held: the third waits on, an H100 free beside it
    assert get(mixed, third)["state"] == "pending", get(mixed, third)

    httpx.delete(f"{mixed.url}/v1/jobs/{ids[0]}", headers=auth, timeout=30)
    done = wait_for(lambda: (j := get(mixed, third))["state"] == "succeeded" and j, 120,
                    "the H100-only job ran once the H100 quota was free")
    assert {h["node_id"] for h in done["history"] if h["task"]} == {NODE_OF["hopper"]}
    httpx.delete(f"{mixed.url}/v1/jobs/{ids[1]}", headers=auth, timeout=30)


def test_quota_per_model_is_an_admins_to_set(mixed: Stack) -> None:
    body = {"name": "sneaky", "gpu_models": [{"model": "H100", "guaranteed": 64}],
            "billing_weights": {"H100": 0.01}}
    r = httpx.post(f"{mixed.url}/v1/queues", json=body, timeout=30)
    assert r.status_code == 401, r.text
    auth = {"Authorization": f"Bearer {mixed.token}"}
    user = httpx.post(f"{mixed.url}/v1/tokens", headers=auth, timeout=30,
                      json={"tenant": "other", "role": "user"}).json()["token"]
    r = httpx.post(f"{mixed.url}/v1/queues", json=body, timeout=30,
                   headers={"Authorization": f"Bearer {user}"})
    assert r.status_code == 403, r.text
    r = httpx.post(f"{mixed.url}/v1/queues", headers=auth, timeout=30, json={
        "name": "bad-models", "gpu_models": [{"model": "H1000", "guaranteed": 1}]})
    assert r.status_code == 422 and "unknown GPU model" in r.text, r.text


def test_an_admins_labels_and_taints_place_jobs_and_survive_a_scheduler_restart(
        mixed: Stack) -> None:
    """``kairos node label volta0-0 team=vision`` and ``kairos node taint hopper0-0
    maintenance=true:NoSchedule``: a job selecting the label lands on the V100s, plain
    jobs stay off the tainted H100s, and so it stays after the scheduler is killed
    (SIGKILL) and restarted; removing the taint lets jobs back."""
    import os
    import signal

    from typer.testing import CliRunner

    from kairos.cli import app

    def cli(*args: str) -> str:
        out = CliRunner().invoke(app, [*args, "--url", mixed.url, "--token", mixed.token or ""])
        assert out.exit_code == 0, out.output
        return out.output

    assert "labels team=vision" in cli("node", "label", NODE_OF["volta"], "team=vision")
    assert "maintenance=true:NoSchedule" in cli("node", "taint", NODE_OF["hopper"],
                                                "maintenance=true:NoSchedule")
    try:
        for _ in range(2):
            assert ran_on(mixed, job(nodeSelector={"team": "vision"})) == NODE_OF["volta"]
            assert ran_on(mixed, job()) == NODE_OF["volta"]  # hopper tainted, ampere too
        scheduler = mixed.proc("scheduler")
        old = scheduler.popen.pid
        os.kill(old, signal.SIGKILL)
        wait_for(lambda: scheduler.popen.pid != old, 90, "the scheduler restarted")
        for _ in range(2):
            assert ran_on(mixed, job()) == NODE_OF["volta"]
            assert ran_on(mixed, job(nodeSelector={"team": "vision"})) == NODE_OF["volta"]
        assert ran_on(mixed, job(gpuModel="H100", tolerations=[
            {"key": "maintenance", "operator": "Exists"}])) == NODE_OF["hopper"]
    finally:
        cli("node", "taint", NODE_OF["hopper"], "maintenance-")
        cli("node", "label", NODE_OF["volta"], "team-")
    nodes = {n["node_id"]: n for n in httpx.get(
        f"{mixed.url}/v1/nodes", timeout=30,
        headers={"Authorization": f"Bearer {mixed.token}"}).json()}
    assert nodes[NODE_OF["hopper"]]["admin_taints"] == [] \
        and nodes[NODE_OF["volta"]]["admin_labels"] == {}
    assert ran_on(mixed, job(gpuModel="H100")) == NODE_OF["hopper"]  # back in use


def mig_job(profile: str, replicas: int = 1, **extra: Any) -> dict[str, Any]:
    return {"name": "mig", "duration": 0.5, **extra,
            "tasks": [{"name": "w", "replicas": replicas, "resources": {"mig": profile}}]}


def test_a_mig_node_reports_its_geometry(mixed: Stack) -> None:
    r = httpx.get(f"{mixed.url}/v1/nodes", timeout=30,
                  headers={"Authorization": f"Bearer {mixed.token}"})
    node = next(n for n in r.json() if n["node_id"] == NODE_OF["migs"])
    gpu = node["inventory"]["gpus"][0]
    assert gpu["mig_mode"] and node["inventory"]["labels"]["kairos.io/mig"] == "enabled"
    assert [(m["profile"], m["start"], m["size"]) for m in gpu["mig_instances"]] == [
        ("2g.20gb", 0, 2), ("1g.10gb", 2, 1), ("1g.10gb", 3, 1), ("3g.40gb", 4, 4)]
    assert all(m["uuid"].startswith("MIG-") for m in gpu["mig_instances"])
    from typer.testing import CliRunner

    from kairos.cli import app
    out = CliRunner().invoke(app, ["nodes", "-o", "wide", "--url", mixed.url,
                                   "--token", mixed.token or ""], env={"COLUMNS": "250"})
    line = next(x for x in out.output.splitlines() if NODE_OF["migs"] in x)
    assert "1x 2g.20gb+1g.10gb+1g.10gb+3g.40gb" in line, out.output


def test_mig_jobs_take_only_free_instances_of_their_profile(mixed: Stack) -> None:
    """Two 1g.10gb jobs take the two 1g.10gb instances, each its own; a third waits
    though the 2g.20gb and 3g.40gb instances are free; a 3g.40gb job runs beside them;
    once the first two end, the third runs. Plain GPU jobs never land on the MIG GPU."""
    auth = {"Authorization": f"Bearer {mixed.token}"}
    ids = []
    for _ in range(3):
        r = submit(mixed, mig_job("1g.10gb", duration=60, runtimeEstimate=60))
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    try:
        running = wait_for(lambda: (js := [get(mixed, i) for i in ids]) and sum(
            j["state"] == "running" for j in js) == 2 and js, 120, "two 1g.10gb jobs running")
        held = [p["gpus"][0] for j in running if j["state"] == "running" for p in j["placement"]]
        assert sorted((g["mig_profile"], g["mig_start"]) for g in held) == [("1g.10gb", 2), ("1g.10gb", 3)]
        assert all(g["uuid"].startswith("MIG-") for g in held) and held[0]["uuid"] != held[1]["uuid"]
        third = next(j["id"] for j in running if j["state"] != "running")
        from typer.testing import CliRunner

        from kairos.cli import app
        one = next(j["id"] for j in running if j["state"] == "running")
        out = CliRunner().invoke(app, ["describe", one, "--url", mixed.url, "--token", mixed.token or ""],
                                 env={"COLUMNS": "200"})
        assert out.exit_code == 0 and "(MIG 1g.10gb at slice " in out.output, out.output
        # no room, or behind the two that took the instances (the first cycle's word)
        wait_for(lambda: (get(mixed, third).get("placement_wait") or {}).get("reason") in ("no_fit", "priority"),
                 60, "the third 1g.10gb job waiting for an instance")
        # the 3g.40gb instance is its own (an estimate lets it backfill: the node is
        # reserved for the third, and backfill reserves nodes, not MIG instances)
        big = ran_on(mixed, mig_job("3g.40gb", runtimeEstimate=5))
        assert big == NODE_OF["migs"]
        assert get(mixed, third)["state"] in ("pending", "admitted"), [
            (i, get(mixed, i)["state"]) for i in ids]
        for job_id in [i for i in ids if i != third]:
            httpx.delete(f"{mixed.url}/v1/jobs/{job_id}", headers=auth, timeout=30)
        j = wait_for(lambda: (j := get(mixed, third))["state"] == "running" and j, 120, "the third running")
        assert j["placement"][0]["gpus"][0]["mig_profile"] == "1g.10gb"
    finally:
        for job_id in ids:
            httpx.delete(f"{mixed.url}/v1/jobs/{job_id}", headers=auth, timeout=30)


def test_a_mig_profile_no_node_has_waits_says_why_and_a_wrong_one_is_refused(mixed: Stack) -> None:
    r = submit(mixed, mig_job("1g.5gb"))  # an A100-40GB profile: this cluster has none
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    try:
        waiting = wait_for(lambda: (get(mixed, job_id).get("placement_wait") or None), 60,
                           "the scheduler said why it waits")
        assert waiting["reason"] == "never_fits" and "MIG instances of 1g.5gb" in waiting["detail"], waiting
    finally:
        httpx.delete(f"{mixed.url}/v1/jobs/{job_id}", timeout=30,
                     headers={"Authorization": f"Bearer {mixed.token}"})

    assert dry(mixed, mig_job("2g.20gb"))["forecast"]["nodes"] == [NODE_OF["migs"]]
    nowhere = dry(mixed, mig_job("1g.5gb"))
    assert nowhere["forecast"]["start"] is None and nowhere["forecast"]["reason"] == "never_fits"
    assert "MIG instances of 1g.5gb" in nowhere["summary"], nowhere["summary"]
    r = submit(mixed, mig_job("1g.7gb"))
    assert r.status_code == 422 and "no MIG-capable GPU has profile '1g.7gb'" in r.text, r.text
    r = submit(mixed, mig_job("1g.10gb", gpuModel="V100"))
    assert r.status_code == 422 and "not on V100" in r.text, r.text
    r = submit(mixed, {"name": "both", "tasks": [{"name": "w", "resources": {"mig": "1g.10gb", "gpu": 1}}]})
    assert r.status_code == 422 and "not both" in r.text, r.text


def test_affinity_to_other_jobs_follows_ones_own_and_never_another_tenants(mixed: Stack) -> None:
    """A job of tenant ta labelled app=cache runs on the V100s; ta's job with a required
    affinity to app=cache lands beside it; tb's same job does not see ta's (a selector
    selects its own tenant's jobs only): it waits, saying affinity; without credentials
    nothing is submitted."""
    auth = {"Authorization": f"Bearer {mixed.token}"}
    heads = {t: {"Authorization": "Bearer " + httpx.post(
        f"{mixed.url}/v1/tokens", headers=auth, timeout=30, json={"tenant": t, "role": "user"}).json()["token"]}
        for t in ("ta", "tb")}

    def post(tenant: str, spec: dict[str, Any]) -> str:
        r = httpx.post(f"{mixed.url}/v1/jobs", json=spec, timeout=30, headers=heads[tenant])
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def seen(tenant: str, job_id: str) -> dict[str, Any]:
        body: dict[str, Any] = httpx.get(f"{mixed.url}/v1/jobs/{job_id}", timeout=30, headers=heads[tenant]).json()
        return body

    follower = {"name": "follower", "duration": 0.5, "labels": {"app": "train"}, "tasks": [
        {"name": "w", "resources": {"gpu": 1},
         "affinity": [{"jobSelector": {"app": "cache"}, "topologyKey": "node", "required": True}]}]}
    cache = post("ta", job(gpuModel="V100", duration=60, labels={"app": "cache"}))
    others = []
    try:
        wait_for(lambda: seen("ta", cache)["state"] == "running", 60, "ta's cache running")
        for _ in range(2):
            mine = post("ta", follower)
            done = wait_for(lambda jid=mine: (j := seen("ta", jid))["state"] == "succeeded" and j, 120,
                            "ta's follower succeeded")
            assert {h["node_id"] for h in done["history"] if h["task"]} == {NODE_OF["volta"]}
        theirs = post("tb", follower)
        others.append(theirs)
        waiting = wait_for(lambda: seen("tb", theirs).get("placement_wait"), 60, "tb's follower waiting")
        assert waiting["reason"] == "affinity", waiting
        r = httpx.post(f"{mixed.url}/v1/jobs", json=follower, timeout=30)
        assert r.status_code == 401, r.text
        r = httpx.post(f"{mixed.url}/v1/jobs", headers=heads["ta"], timeout=30, json={
            **follower, "tasks": [{"name": "w", "affinity": [{"task": "w", "jobSelector": {"app": "x"}}]}]})
        assert r.status_code == 422 and "one of the two" in r.text, r.text
    finally:
        httpx.delete(f"{mixed.url}/v1/jobs/{cache}", headers=heads["ta"], timeout=30)
        for job_id in others:
            httpx.delete(f"{mixed.url}/v1/jobs/{job_id}", headers=heads["tb"], timeout=30)


def test_the_scheduler_learns_where_a_job_class_runs_fastest(mixed: Stack) -> None:
    """Jobs named ``learner`` took about 1 s on a V100 and 6 s on an H100 (asked for by
    model): the next ``learner`` asking for no model goes to the V100s, and its history
    says why. (Last in the module: once a class is measured on two models, every class
    not measured yet is placed by it, the typical class.)"""
    learner = {"name": "learner", "tasks": [{"name": "w", "resources": {"gpu": 1}}]}
    assert ran_on(mixed, {**learner, "duration": 1, "gpuModel": "V100"}) == NODE_OF["volta"]
    assert ran_on(mixed, {**learner, "duration": 6, "gpuModel": "H100"}) == NODE_OF["hopper"]
    for _ in range(2):
        r = submit(mixed, {**learner, "duration": 0.5})
        assert r.status_code == 201, r.text
        done = wait_for(lambda jid=r.json()["id"]: (j := get(mixed, jid))["state"] == "succeeded" and j,
                        120, "a learner succeeded")
        assert {h["node_id"] for h in done["history"] if h["task"]} == {NODE_OF["volta"]}, done["history"]
        placed = next(h["reason"] for h in done["history"] if h["state"] == "bound")
        assert "on V100-32GB: where it runs fastest (learnt from its earlier jobs)" in placed, placed
