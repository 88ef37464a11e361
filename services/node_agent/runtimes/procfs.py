"""Just enough of Linux /proc: process liveness without pid reuse, and a task's tree."""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat from field 3 (state) on; None if there is no such pid."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    return raw[raw.rfind(")") + 2:].split()  # comm may hold spaces and parentheses


def start_ticks(pid: int) -> int | None:
    """The process start time in clock ticks since boot: with the pid, a unique identity."""
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def alive(pid: int, ticks: int | None = None) -> bool:
    """Whether ``pid`` runs (not a zombie) and, if given, is still the process started at ``ticks``."""
    fields = _stat(pid)
    if fields is None:
        if not PROC.is_dir():  # not Linux: fall back to a signal probe
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
            return True
        return False
    if fields[0] in ("Z", "X"):
        return False
    return ticks is None or int(fields[19]) == ticks


def process_tree(root_pid: int) -> set[int]:
    """``root_pid``, the processes of its process group or session, and their descendants."""
    table: dict[int, tuple[int, int, int]] = {}
    for entry in PROC.iterdir() if PROC.is_dir() else ():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields and fields[0] not in ("Z", "X"):
                table[int(entry.name)] = (int(fields[1]), int(fields[2]), int(fields[3]))
    members = {pid for pid, (_, pgrp, sid) in table.items()
               if pid == root_pid or pgrp == root_pid or sid == root_pid}
    grew = True
    while grew:
        more = {pid for pid, (ppid, _, _) in table.items() if ppid in members} - members
        members |= more
        grew = bool(more)
    return members


def pids_of_pod(pod_uid: str) -> set[int]:
    """Host pids of a Kubernetes Pod's processes, found by its uid in their cgroup path
    (``pod<uid>`` with ``-`` or, under the systemd cgroup driver, ``_``). Needs the agent
    in the host pid namespace (``hostPID: true``), where NVML's pids also live."""
    if not pod_uid or not PROC.is_dir():
        return set()
    needles = (pod_uid, pod_uid.replace("-", "_"))
    pids = set()
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cgroup = (entry / "cgroup").read_text()
        except OSError:
            continue
        if any(n in cgroup for n in needles):
            pids.add(int(entry.name))
    return pids
