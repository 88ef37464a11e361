"""What the nodes' own records say, beside the history: the agents' journals.

The history (``kairos.check``) cannot show work whose reports were lost. Each agent
keeps a journal of its tasks (``services/node_agent/journal.py``: one JSON file a task,
with its time limit, first start and final report), so a chaos run reads it after each
phase and counts:

- ``wrongly_failed``: a job whose attempt finished its work on its nodes (every task of
  it, as bound, ended succeeded there) but that did not end succeeded, or ran again; and
  a job that ran out of retries on an attempt that only a platform cause ended (its
  node lost, fenced or restarted without it, a preemption, a drain);
- ``limit_overruns``: a task that ran longer than its time limit (plus its grace and a
  little slack for the agent's tick) on its node.

An attempt that finished on a node the monitor had declared lost (a partition: the
report could not get through in time) and ran again is not a violation: the platform
could not know, and running it again is what a lost node must mean. Those are counted
apart (``rerun_after_node_lost``), so that they stay visible.

Pure over what it is given (``journal_entries`` reads the files), as ``check`` is.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kairos.check import History, Violation
from shared.events import (
    PLATFORM_CAUSES,
    Binding,
    BindingAction,
    EndCause,
    JobState,
    JobStatus,
    NodeLost,
    TransitionReason,
)

LIMIT_SLACK_S = 3.0  # the agent checks a limit on a timer; a loaded machine runs it late
OWN_FAULTS = {EndCause.FAILED, EndCause.START_FAILED, EndCause.SHARE_EXCEEDED,
              EndCause.TIME_LIMIT}


@dataclass
class RecordReport:
    wrongly_failed: set[str] = field(default_factory=set)
    rerun_after_node_lost: set[str] = field(default_factory=set)
    limit_overruns: list[str] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)


def journal_entries(agents_dir: Path) -> list[dict[str, Any]]:
    """Every journal entry of every node under ``agents_dir`` (``<node>/journal/``)."""
    entries = []
    for file in sorted(agents_dir.glob("*/journal/*.json")):
        try:
            entries.append(json.loads(file.read_text()))
        except (OSError, ValueError):
            continue  # a file being replaced right now: the next read sees it
    return entries


def check_records(entries: list[dict[str, Any]], history: History,
                  job_states: dict[str, str]) -> RecordReport:
    """Judge the jobs of ``job_states`` (job id -> its final state) by the journals."""
    report = RecordReport()
    outcomes = {e["key"]: JobStatus.model_validate(e["outcome"]) for e in entries
                if e.get("outcome") and e["key"].split("/")[0] in job_states}
    _finished_work(outcomes, history, job_states, report)
    _platform_failures(history, job_states, report)
    for e in entries:
        if e["key"].split("/")[0] not in job_states or not e.get("time_limit_s"):
            continue
        ran = (e.get("outcome") or {}).get("ran_s")
        allowed = e["time_limit_s"] + e.get("grace_s", 0) + LIMIT_SLACK_S
        if ran is not None and ran > allowed:
            report.limit_overruns.append(e["key"])
            report.violations.append(Violation(
                "limit_overrun", e["key"],
                f"ran {ran:.1f}s on its node, limit {e['time_limit_s']:g}s"))
    return report


def _finished_work(outcomes: dict[str, JobStatus], history: History,
                   job_states: dict[str, str], report: RecordReport) -> None:
    bound: dict[tuple[str, int], set[str]] = defaultdict(set)  # (job, attempt) -> tasks
    on_lost: set[tuple[str, int]] = set()  # attempts on a node declared lost after binding
    nodes: dict[tuple[str, int], set[str]] = defaultdict(set)
    for _, ev in history.events:
        if isinstance(ev, Binding) and ev.action is BindingAction.ALLOCATE \
                and ev.job_id in job_states:
            bound[(ev.job_id, ev.attempt)].update(t.task_id for t in ev.tasks)
            nodes[(ev.job_id, ev.attempt)].add(ev.node_id)
        elif isinstance(ev, NodeLost):
            on_lost.update(a for a, held in nodes.items() if ev.node_id in held)
    last: dict[str, int] = {}  # the last attempt each job was bound with
    for job, attempt in bound:
        last[job] = max(last.get(job, 0), attempt)
    for (job, attempt), tasks in bound.items():
        if job_states[job] == "cancelled":  # its user stopped it: whatever its tasks did
            continue
        ends = [outcomes.get(f"{job}/{t}/{attempt}") for t in tasks]
        if not all(e is not None and e.state is JobState.SUCCEEDED for e in ends):
            continue
        if job_states[job] != "succeeded" or last[job] != attempt:
            if (job, attempt) in on_lost:
                report.rerun_after_node_lost.add(job)
                continue
            report.wrongly_failed.add(job)
            report.violations.append(Violation(
                "finished_not_recorded", job,
                f"attempt {attempt} succeeded on its nodes, yet the job "
                f"{'ran again' if last[job] != attempt else 'ended ' + job_states[job]}"))


def _platform_failures(history: History, job_states: dict[str, str],
                       report: RecordReport) -> None:
    ends: dict[tuple[str, int], list[EndCause]] = defaultdict(list)
    failed: dict[str, int] = {}
    for _, ev in history.events:
        if not isinstance(ev, JobStatus) or ev.job_id not in job_states:
            continue
        if ev.task is not None and ev.state in (JobState.FAILED, JobState.CANCELLED,
                                                JobState.PREEMPTED):
            ends[(ev.job_id, ev.attempt)].append(ev.end_cause())
        elif ev.task is None and ev.reason_code is TransitionReason.OUT_OF_RETRIES:
            failed[ev.job_id] = ev.attempt
    for job, attempt in failed.items():
        causes = ends.get((job, attempt), [])
        if causes and not OWN_FAULTS & set(causes) and set(causes) & PLATFORM_CAUSES:
            report.wrongly_failed.add(job)
            report.violations.append(Violation(
                "platform_cause_spent_retries", job,
                f"out of retries on attempt {attempt}, ended by "
                f"{sorted(c.value for c in set(causes))}"))
