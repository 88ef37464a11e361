"""openb pod lists by name or path, the lists made from the default one, and the
clear refusal of a file that is not a pod list."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.cli import app
from sim.fill import node_order
from sim.openb_experiment import fgd_against_published, resolve_list
from sim.traces import OPENB, TraceError, load_openb_nodes, load_openb_pods, with_cpu_share

ROOT = Path(__file__).resolve().parents[2]
HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (None, "no such pod list"),
        ("sn,cpu_milli,memory_mib,gpu,model\nn0,96000,1,8,V100\n", "missing column"),  # a node list
        (HEADER, "no pods"),
        (HEADER + "p0,4000,1024,one,0\n", "row 2"),
        (HEADER + "p0,4000,1024,1,1500\n", "over 1000"),
        (b"\x89PNG\r\n\x1a\n\xff\xfe\x00", "not a text"),
    ],
)
def test_a_file_that_is_not_a_pod_list_is_refused_clearly(tmp_path, content, why) -> None:
    path = tmp_path / "list.csv"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(TraceError, match=why) as e:
        load_openb_pods(path)
    assert str(path) in str(e.value)


def test_lists_by_name_or_by_path(slice_file) -> None:
    key, pods = resolve_list("default")
    assert key == "openb_pod_list_default" and len(pods) == 8152
    assert resolve_list("openb_pod_list_multigpu50")[0] == "openb_pod_list_multigpu50"
    mine = slice_file(OPENB / "openb_pod_list_default.csv", 30, name="held_out.csv")
    key, pods = resolve_list(str(mine))
    assert key == "held_out" and len(pods) == 30
    with pytest.raises(TraceError, match="no such pod list"):
        resolve_list(str(mine.parent / "missing.csv"))
    with pytest.raises(TraceError, match=r"gpushare100.*cpuNNN"):
        resolve_list("gpushare30")


def test_cpu_lists_are_made_as_the_artifact_made_its_own() -> None:
    """cpu250 = the default list's 7,064 GPU tasks + CPU-only ones drawn from its 1,088
    until they are 25% of tasks (the artifact's file: 2,356 of 9,420)."""
    default = load_openb_pods(OPENB / "openb_pod_list_default.csv")
    key, pods = resolve_list("cpu250")
    cpu = [p for p in pods if not p.num_gpu]
    assert key == "openb_pod_list_cpu250"
    assert len(pods) - len(cpu) == 7064 and len(cpu) == 2355 and len(cpu) / len(pods) == pytest.approx(0.25, abs=1e-3)
    shapes = {(p.cpu_milli, p.memory_mib) for p in default if not p.num_gpu}
    assert {(p.cpu_milli, p.memory_mib) for p in cpu} <= shapes
    assert resolve_list("cpu250")[1] == pods  # seeded
    assert len([p for p in with_cpu_share(default, 0.05) if not p.num_gpu]) == 372  # fewer than the default's
    with pytest.raises(TraceError, match="share"):
        with_cpu_share(default, 1.0)


def test_each_seed_sees_the_nodes_in_its_own_random_order() -> None:
    nodes = load_openb_nodes()
    a, b = node_order(nodes, 42), node_order(nodes, 43)
    assert a == node_order(nodes, 42) and a != b and a != nodes
    assert sorted(n.node_id for n in a) == sorted(n.node_id for n in nodes)


def test_gap_to_the_published_fgd() -> None:
    tab = {"openb_pod_list_default": {"FGD": 95.5, "Kairos": 96.1}, "mine": {"FGD": 90.0}}
    assert fgd_against_published(tab) == {"openb_pod_list_default": {"FGD": 95.5, "published": 95.39, "gap": 0.11}}


def test_the_cli_and_the_bench_refuse_a_bad_list_without_a_traceback(tmp_path) -> None:
    missing = tmp_path / "nope.csv"
    r = CliRunner().invoke(app, ["openb", "--list", str(missing), "--seeds", "1", "--out", str(tmp_path / "o.json")])
    said = " ".join(re.sub("[│╭╮╰╯─]", " ", r.output).split())  # the error box, unwrapped
    assert r.exit_code == 2 and "no such pod list" in said and "Traceback" not in r.output
    p = subprocess.run([sys.executable, "bench/sim_openb.py", "--seeds", "1", "--lists", "default", str(missing),
                        "--out", str(tmp_path / "o.json")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "no such pod list" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "o.json").exists()  # refused before any run
