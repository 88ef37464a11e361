"""What one job costs the gateway, in isolation: its submit, then its events in the read model.

Runs the gateway (uvicorn, the real app) in this process against real PostgreSQL (the
one on 127.0.0.1:5432 when it answers, else the embedded one), warms it up, then sends
N submits 8 at a time and reports CPU milliseconds per submit (this process: the gateway
and its HTTP client together) and the socket sends per submit, the figure the submit
path's design works down (docs/design/gateway.md). Then the read model: each job's
events as the platform sends them (admitted, bound, its binding, task and job running,
task and job succeeded) through ``store.apply_events`` in batches of 50, as admission's
consumer applies a fetch: CPU milliseconds per job. ``--profile`` prints cProfile's top.

    python bench/admission_submit.py [--submits 400] [--profile] [--baseline REV]

Writes bench/results/admission_submit.json; ``--baseline REV`` first runs this same script
on another commit (a git worktree), in the same invocation, and puts its figures beside.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import text  # noqa: E402

from kairos.embedded import EmbeddedPostgres  # noqa: E402
from services.admission import store  # noqa: E402
from shared.db import prepare_database  # noqa: E402
from shared.events import (  # noqa: E402
    Binding,
    BindingAction,
    Envelope,
    Event,
    GpuAssignment,
    JobState,
    JobStatus,
    TaskBinding,
)
from tests.conftest import _system_pg_up  # noqa: E402
from tests.services.gateway_helpers import JOB, auth, gateway  # noqa: E402


async def measure(url: str, n: int, profile: bool) -> dict[str, float]:
    await prepare_database(url)
    async with gateway(url) as gw:
        tok = await gw.token("bench")
        for _ in range(20):  # connections, prepared statements, caches
            await gw.submit(tok)
        sem = asyncio.Semaphore(8)

        async def one() -> None:
            async with sem:
                r = await gw.http.post("/v1/jobs", json=JOB, headers={
                    **auth(tok), "Idempotency-Key": uuid.uuid4().hex})
                assert r.status_code == 201, r.text

        cpu0, wall0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        cpu1, wall1 = time.process_time(), time.perf_counter()
        # a second, smaller pass under cProfile counts the socket sends (and, asked, the
        # top functions); the profiler's own cost stays out of the CPU figure above
        prof = cProfile.Profile()
        prof.enable()
        await asyncio.gather(*(one() for _ in range(100)))
        prof.disable()
        stats = pstats.Stats(prof)
        sends = sum(row[1] for (_, _, name), row in stats.stats.items()  # type: ignore[attr-defined]
                    if name == "<method 'send' of '_socket.socket' objects>")
        if profile:
            stats.sort_stats("tottime").print_stats(25)
        read_model = await read_model_cost(gw, n)
        return {"submits": n, "cpu_ms_per_submit": round(1000 * (cpu1 - cpu0) / n, 2),
                "read_model_cpu_ms_per_job": read_model,
                "socket_sends_per_submit": round(sends / 100, 1),
                "submits_per_s": round(n / (wall1 - wall0), 1)}


def job_events(job_id: str) -> list[Event]:
    """A 1-GPU job's events on jobs.status and bindings, in the order they come."""
    task = f"{job_id}-w-0"
    gpu = GpuAssignment(index=0)
    binding = Binding(binding_id=f"b-{job_id}", action=BindingAction.ALLOCATE, node_id="n1",
                      epoch=1, job_id=job_id, tasks=[TaskBinding(
                          task_id=task, task_name="w", role="worker", replica=0, rank=0,
                          gpus=[gpu])])

    def st(state: JobState, reason: str, on_task: bool = False) -> JobStatus:
        return JobStatus(job_id=job_id, state=state, reason=reason,
                         task=task if on_task else None, node_id="n1" if on_task else None)

    return [st(JobState.ADMITTED, "quota reserved"), st(JobState.BOUND, "placed"), binding,
            st(JobState.RUNNING, "started", True), st(JobState.RUNNING, "all tasks running"),
            st(JobState.SUCCEEDED, "exit 0", True), st(JobState.SUCCEEDED, "all tasks done")]


async def read_model_cost(gw: Any, n: int) -> float:
    """CPU ms per job to apply its events, the jobs being the last ``n`` submitted."""
    async with gw.engine.connect() as conn:
        ids = [r[0] for r in await conn.execute(text(
            "SELECT id FROM jobs ORDER BY submitted_at DESC LIMIT :n"), {"n": n})]
    items = [(Envelope.wrap(ev, "bench"), ev) for j in ids for ev in job_events(j)]
    # interleaved as a busy platform's fetches are: each job's events spread over batches
    items.sort(key=lambda it: _order(it[1]))
    cpu0 = time.process_time()
    for i in range(0, len(items), 50):
        await store.apply_events(gw.engine, items[i:i + 50])
    return round(1000 * (time.process_time() - cpu0) / len(ids), 2)


def _order(ev: Event) -> tuple[int, str]:
    if isinstance(ev, Binding):
        return (2, ev.job_id)
    assert isinstance(ev, JobStatus)
    stage = {JobState.ADMITTED: 0, JobState.BOUND: 1}.get(ev.state)
    if stage is None:
        stage = (3 if ev.state is JobState.RUNNING else 5) + (0 if ev.task else 1)
    return (stage, ev.job_id)


def run_baseline(rev: str, submits: int) -> dict[str, Any]:
    """This script on another commit, from a git worktree: its figures and its rev."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", rev], check=True,
                         capture_output=True, text=True).stdout.strip()
    tree = Path(tempfile.mkdtemp(prefix="kairos-baseline-"))
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), sha],
                   check=True, capture_output=True)
    try:
        shutil.copy(ROOT / "bench" / "admission_submit.py", tree / "bench")
        out = tree / "baseline.json"
        subprocess.run([sys.executable, "bench/admission_submit.py", "--submits",
                        str(submits), "--out", str(out)], cwd=tree, check=True)
        data: dict[str, Any] = json.loads(out.read_text())
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                       capture_output=True)
    data.pop("baseline", None)
    return {"rev": sha, **data}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--submits", type=int, default=400)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--baseline", metavar="REV")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" /
                    "admission_submit.json")
    args = ap.parse_args()
    baseline = run_baseline(args.baseline, args.submits) if args.baseline else None
    pg = None
    workdir = None
    if _system_pg_up():
        url = f"postgresql+asyncpg://postgres@127.0.0.1:5432/bench_{uuid.uuid4().hex[:8]}"
    else:
        workdir = Path(tempfile.mkdtemp(prefix="kairos-bench-pg-"))
        pg = EmbeddedPostgres(workdir / "data")
        url = pg.start().replace("/kairos?", f"/bench_{uuid.uuid4().hex[:8]}?")
    try:
        result = asyncio.run(measure(url, args.submits, args.profile))
        print(result)
        args.out.write_text(json.dumps({**result, "baseline": baseline}, indent=2) + "\n")
    finally:
        if pg is not None:
            pg.stop()
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
