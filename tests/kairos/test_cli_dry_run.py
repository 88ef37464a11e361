"""``kairos submit --dry-run [--what-if ...]``: the variants it builds from a spec file,
and the command against the real gateway (real PostgreSQL) with a stand-in forecaster
(``tests/services/forecaster_stub.py``: the service's HTTP contract, canned answers)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner, Result

from kairos import cli_common
from kairos.cli import app
from kairos.cli_dryrun import WhatIfError, parse_what_if, row_cells, variant, what_if_table
from shared.jobspec import parse_job_spec
from tests.services.forecaster_stub import running_stub
from tests.services.gateway_helpers import auth, gateway

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((EXAMPLES / name).read_text()))


def test_what_if_reads_a_key_and_its_values() -> None:
    assert parse_what_if("gpu=8,16,32") == ("gpu", [8, 16, 32])
    assert parse_what_if("replicas= 2, 4") == ("replicas", [2, 4])
    assert parse_what_if("gpu-per-replica=1") == ("gpu-per-replica", [1])


@pytest.mark.parametrize(("text", "says"), [
    ("gpus=8", "KEY one of gpu, replicas, gpu-per-replica"),
    ("8,16", "expected KEY=N"),
    ("gpu=8,x", "'x' is not a positive whole number"),
    ("gpu=0", "'0' is not a positive"),
    ("gpu=", "'' is not a positive"),
    ("gpu=8,8", "listed twice"),
])
def test_a_bad_what_if_says_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(WhatIfError) as e:
        parse_what_if(text)
    assert says in str(e.value)


def test_gpu_is_the_total_kept_per_replica_with_the_gang_scaled() -> None:
    gang = example("data-parallel-gang.yaml")  # 4 workers x 2 GPUs, minAvailable 4
    shapes = {n: variant(gang, "gpu", n) for n in (8, 16, 32, 1)}
    got = {n: (s["tasks"][0]["replicas"], s["tasks"][0]["resources"]["gpu"],
               s["minAvailable"]) for n, s in shapes.items()}
    assert got == {8: (4, 2, 4), 16: (8, 2, 8), 32: (16, 2, 16), 1: (1, 1, 1)}
    for s in shapes.values():  # each one a valid spec, the rest of the file kept
        spec = parse_job_spec(s)
        assert spec.name == "bert-ddp" and spec.tasks[0].resources.memory == 65536
    assert gang["tasks"][0]["replicas"] == 4  # the file's spec is left as it was
    with pytest.raises(WhatIfError, match="gpu=6: not a multiple of the 4 GPUs per replica"):
        variant(variant(gang, "gpu-per-replica", 4), "gpu", 6)


def test_only_the_task_with_gpus_changes_and_elastic_bounds_widen() -> None:
    ps = variant(example("ps-worker.yaml"), "gpu", 8)
    assert [(t["name"], t["replicas"]) for t in ps["tasks"]] == [("ps", 1), ("worker", 8)]
    el = variant(example("elastic.yaml"), "replicas", 8)  # 2 in 1..4
    assert (el["tasks"][0]["minReplicas"], el["tasks"][0]["replicas"],
            el["tasks"][0]["maxReplicas"]) == (1, 8, 8)
    parse_job_spec(el)
    wide = variant(example("single-gpu.yaml"), "gpu-per-replica", 4)
    assert (wide["tasks"][0].get("replicas", 1), wide["tasks"][0]["resources"]["gpu"]) == (1, 4)


def test_a_job_without_one_whole_gpu_task_cannot_be_varied() -> None:
    with pytest.raises(WhatIfError, match="one task with whole GPUs; this job has none"):
        variant(example("fractional-gpu.yaml"), "gpu", 2)
    two = {"name": "x", "tasks": [{"name": "a", "resources": {"gpu": 1}},
                                  {"name": "b", "resources": {"gpu": 2}}]}
    with pytest.raises(WhatIfError, match=r"has 2 \(a, b\)"):
        variant(two, "gpu", 4)


def answer(**forecast: Any) -> dict[str, Any]:
    quota = {"admitted": True, "borrowing": False, "blocked_by": None, "detail": "",
             "ask": {"gpus": 8, "cpu_milli": 0, "memory_mib": 0}, "waiting_ahead": 0}
    return {"name": "j", "queue": "default", "quota": quota, "summary": "",
            "forecast": forecast or None,
            "forecast_unavailable": None if forecast else "the forecaster is down"}


def test_the_table_has_a_row_per_variant_with_the_band_and_refusals() -> None:
    gang = example("data-parallel-gang.yaml")
    rows = [
        {"variant": "gpu=8", "spec": variant(gang, "gpu", 8), "answer": answer(
            start="2026-01-01T10:12:00+00:00", start_low="2026-01-01T10:08:00+00:00",
            start_high="2026-01-01T10:20:00+00:00", finish="2026-01-01T12:10:00+00:00",
            in_seconds=720.0, nodes=["node3-1", "node3-2"])},
        {"variant": "gpu=16", "spec": variant(gang, "gpu", 16), "answer": answer()},
        {"variant": "gpu=32", "spec": variant(gang, "gpu", 32),
         "refused": "422: tasks: queue default can never hold more than 16"},
    ]
    assert row_cells(rows[0]) == ["gpu=8", "8", "4 x 2 GPUs", "admits", "in 12 min",
                                  "8 min to 20 min", "in 2 h 10 min", "node3-1, node3-2"]
    assert row_cells(rows[1])[:5] == ["gpu=16", "16", "8 x 2 GPUs", "admits", "-"]
    assert row_cells(rows[2])[3].startswith("refused 422: tasks: queue default")
    out = Console(width=200, record=True)
    out.print(what_if_table(rows))
    text = out.export_text()
    assert "no forecast: the forecaster is down" in text
    assert [line.split("│")[1].strip() for line in text.splitlines()
            if line.startswith("│ gpu=")] == ["gpu=8", "gpu=16", "gpu=32"]


@pytest.mark.db
async def test_submit_dry_run_and_what_if_against_the_gateway(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_common.console, "width", 200)
    spec = tmp_path / "gang.yaml"
    spec.write_text((EXAMPLES / "data-parallel-gang.yaml").read_text().replace(
        "queue: default", "queue: small"))
    async with running_stub() as stub, gateway(db_url, forecaster_url=stub.url) as gw:
        # the stand-in forecaster: more GPUs start later (20 s past a minute: see
        # test_admission_dry_run's forecast test)
        def answer_for(c: dict[str, Any]) -> dict[str, Any]:
            gpus = sum(t["replicas"] * t["resources"]["gpu"] for t in c["spec"]["tasks"])
            return {"start": 60 * gpus + 20, "start_low": 60 * gpus - 100,
                    "start_high": 120 * gpus + 20, "finish": 7200 + 60 * gpus + 20,
                    "nodes": [f"node{i}" for i in range(gpus // 8)]}
        stub.answer_for = answer_for
        await gw.queue("small", guaranteed={"gpus": 16})
        token = await gw.token("vision")

        def run(*args: str) -> Result:  # the CLI blocks: off the gateway's event loop
            return CliRunner().invoke(app, [*args, "--url", str(gw.http.base_url),
                                            "--token", token])

        r = await asyncio.to_thread(run, "submit", "--dry-run", str(spec))
        assert r.exit_code == 0, r.output
        assert "dry run of bert-ddp to queue small: valid, nothing submitted" in r.output
        assert "would start in about 8 min (between 6 and 16) on node0; would finish " \
               "about 2 h 8 min from now" in r.output
        r = await asyncio.to_thread(run, "submit", "--dry-run", "-o", "json", str(spec))
        assert r.exit_code == 0, r.output
        assert json.loads(r.output)["quota"]["ask"]["gpus"] == 8
        r = await asyncio.to_thread(run, "submit", "--dry-run", "--what-if", "gpu=8,16,32",
                                    str(spec))
        assert r.exit_code == 0, r.output
        rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
                for line in r.output.splitlines() if line.startswith("│ gpu=")}
        assert rows["gpu=8"] == ["8", "4 x 2 GPUs", "admits", "in 8 min", "6 min to 16 min",
                                 "in 2 h 8 min", "node0"]
        assert rows["gpu=16"][:5] == ["16", "8 x 2 GPUs", "admits", "in 16 min",
                                      "14 min to 32 min"]
        assert rows["gpu=32"][2].startswith("refused 422: tasks: the job asks for 32 GPUs")
        r = await asyncio.to_thread(run, "submit", "--dry-run", "--what-if", "gpu=7",
                                    str(spec))
        assert r.exit_code == 2 and "not a multiple of the 2 GPUs per replica" in r.output
        r = await asyncio.to_thread(run, "submit", "--what-if", "gpu=8", str(spec))
        assert r.exit_code == 2 and "add --dry-run" in r.output
        bad = tmp_path / "bad.yaml"
        bad.write_text("name: Bad_Name\ntasks: []\n")
        r = await asyncio.to_thread(run, "submit", "--dry-run", str(bad))
        assert r.exit_code == 1 and "error 422" in r.output
        assert len(stub.asked) == 4  # one dry run, its json, two variants (32 was refused)
        jobs = (await gw.http.get("/v1/jobs", headers=auth(token))).json()["items"]
        assert jobs == []  # nothing was submitted
